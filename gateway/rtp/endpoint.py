"""Thin asyncio adapters: a UDP endpoint per call and one shared media ticker.

Everything interesting lives in the sans-I/O classes (:class:`RtpSession`, :class:`Ticker`);
these only move datagrams and fire timers, in the aioquic ``asyncio/protocol.py`` manner.

Usage (the SIP layer wires it)::

    ticker = MediaTicker()                          # one per process
    ep = await RtpEndpoint.open("192.0.2.10", port_range=(10000, 20000))
    sdp_answer = answer(offer, "192.0.2.10", ep.local_port)
    ep.configure(negotiated(offer, sdp_answer), on_audio=..., on_dtmf=...)
    ticker.add(ep)                                  # paced from the next grid point
    ep.session.pacer.enqueue(pcm)                   # agent audio
    ...
    ticker.remove(ep); ep.close()
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from gateway.rtp.batch import OutboundBatch
from gateway.rtp.dtmf import DtmfDigit
from gateway.rtp.jitter import Int16Array, JitterFrame
from gateway.rtp.latch import Addr
from gateway.rtp.pacer import Pacer, Ticker
from gateway.rtp.session import JitterConfig, RtpSession, TickResult
from gateway.rtp.srtp import SrtpContext, srtp_for
from gateway.rtp.timerfd import TimerFd
from gateway.sdp import MediaParams

DEFAULT_PORT_RANGE = (10000, 20000)
log = logging.getLogger(__name__)


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: RtpEndpoint) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.owner._datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable etc. on a connected-less UDP socket: the peer is not there
        # (yet); RTP is best-effort, keep going.
        self.owner.send_errors += 1


class RtpEndpoint:
    """A bound RTP port and the call's :class:`RtpSession` (after :meth:`configure`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.DatagramTransport | None = None
        self.local_ip = ""
        self.local_port = 0
        self.session: RtpSession | None = None
        self.on_audio: Callable[[JitterFrame], None] | None = None
        # Each datagram's audio as it arrives (extended RTP timestamp, PCM), before the jitter
        # buffer's playout delay: for the barge-in detector and agents' ears.
        self.on_arrival: Callable[[int, Int16Array], None] | None = None
        self.on_dtmf: Callable[[DtmfDigit], None] | None = None
        # Whether anything takes the caller's audio in playout time (on_audio's frames): while
        # it says no, the batched tick neither fills nor pulls the jitter buffer (None: always).
        self.playout_wanted: Callable[[], bool] | None = None
        self.send_errors = 0
        self.dropped_early = 0
        # SRTP (SDES) when negotiated: unprotect before the session parses, protect after the
        # pacer builds (gateway.rtp.srtp); None: plain RTP.
        self.srtp: SrtpContext | None = None

    @classmethod
    async def open(
        cls,
        local_ip: str = "0.0.0.0",
        port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
        *,
        attempts: int = 64,
    ) -> RtpEndpoint:
        """Bind an even port in ``[lo, hi)`` (RFC 3550 §11: RTP on even ports, RTCP on the
        next odd one), starting at a random one; raises OSError if none is free."""
        loop = asyncio.get_running_loop()
        self = cls(loop)
        lo, hi = port_range
        evens = list(range(lo + (lo & 1), hi, 2))
        if not evens:
            raise ValueError(f"no even port in range {port_range}")
        first = secrets.randbelow(len(evens))
        family = socket.AF_INET6 if ipaddress.ip_address(local_ip).version == 6 else socket.AF_INET
        last_exc: OSError | None = None
        for i in range(min(attempts, len(evens))):
            port = evens[(first + i) % len(evens)]
            try:
                transport, _ = await loop.create_datagram_endpoint(
                    lambda: _Protocol(self), local_addr=(local_ip, port), family=family
                )
            except OSError as exc:
                last_exc = exc
                continue
            self.transport = transport
            self.local_ip = local_ip
            self.local_port = transport.get_extra_info("sockname")[1]
            return self
        raise OSError(f"no free RTP port in {port_range} after {attempts} tries") from last_exc

    def configure(
        self,
        params: MediaParams,
        *,
        jitter: JitterConfig | None = None,
        on_audio: Callable[[JitterFrame], None] | None = None,
        on_arrival: Callable[[int, Int16Array], None] | None = None,
        on_dtmf: Callable[[DtmfDigit], None] | None = None,
        playout_wanted: Callable[[], bool] | None = None,
        cn: bool = False,
    ) -> RtpSession:
        """Create (or, on a re-INVITE, update) the session from the negotiated parameters."""
        if on_audio is not None:
            self.on_audio = on_audio
        if playout_wanted is not None:
            self.playout_wanted = playout_wanted
        if on_arrival is not None:
            self.on_arrival = on_arrival
        if on_dtmf is not None:
            self.on_dtmf = on_dtmf
        if self.session is None:
            self.session = RtpSession(params, jitter=jitter, cn=cn)
        else:
            self.session.update(params)
        self.srtp = srtp_for(params.srtp, self.srtp)
        return self.session

    # -- inbound ---------------------------------------------------------------------------
    def _datagram(self, data: bytes, addr: Addr) -> None:
        session = self.session
        if session is None:
            self.dropped_early += 1  # media before the answer was built: nothing to do yet
            return
        if self.srtp is not None and (plain := self.srtp.unprotect(data)) is not None:
            data = plain
        elif self.srtp is not None:
            return  # not authentic, a replay or garbage: counted in srtp.stats
        digits = session.receive(data, addr, self._loop.time())
        try:
            arrived = session.arrived
            if arrived is not None and self.on_arrival is not None:
                self.on_arrival(*arrived)
            if digits and self.on_dtmf is not None:
                for d in digits:
                    self.on_dtmf(d)
        except Exception:
            # One call's consumer must not take down the socket's protocol (every packet).
            log.exception("inbound media callback failed on port %d", self.local_port)

    # -- Scheduled protocol (driven by MediaTicker) ----------------------------------------
    @property
    def next_due(self) -> float:
        session = self.session
        return session.pacer.next_due if session is not None else math.inf

    def start(self, at: float) -> None:
        if self.session is None:
            raise RuntimeError("configure() the endpoint before adding it to the ticker")
        self.session.start(at)

    def tick(self, now: float) -> TickResult | None:
        """One call's whole tick (the per-call path; the batched one is
        :meth:`MediaTicker._tick_batch` with :meth:`send_now` and :meth:`inbound_tick`)."""
        session = self.session
        if session is None:
            return None
        result = session.tick(now)
        if result.packet is not None:
            self.send_now(result.packet)
        self._deliver(result.frame, result.digits)
        return result

    def send_now(self, packet: bytes) -> None:
        """This tick's packet to wherever the session sends (nowhere while nothing is latched
        or the SDP says hold)."""
        session = self.session
        if session is not None and self.transport is not None:
            remote = session.remote
            if remote is not None:
                self.send_packet(packet, remote)

    def inbound_tick(self, now: float) -> None:
        """The inbound half of a tick: the jitter buffer's frame for it, and any DTMF press
        whose end never came, to the callbacks (after the batch's packets are sent)."""
        session = self.session
        if session is None:
            return
        jitter = session.jitter
        wanted = self.playout_wanted
        playing = wanted is None or wanted()
        if playing != jitter.playing:
            jitter.set_playing(playing)
        if playing:
            frame = jitter.pull()
            self._deliver(frame, session.dtmf.poll(now))
        elif digits := session.dtmf.poll(now):
            self._deliver(None, digits)

    def _deliver(self, frame: JitterFrame | None, digits: list[DtmfDigit]) -> None:
        try:
            if frame is not None and self.on_audio is not None:
                self.on_audio(frame)
            if digits and self.on_dtmf is not None:
                for d in digits:
                    self.on_dtmf(d)
        except Exception:
            # One call's consumer must not stop the ticker that paces every other call.
            log.exception("media callback failed on port %d", self.local_port)

    def send_packet(self, packet: bytes, remote: Addr) -> None:
        """One RTP packet the pacer built onto the socket, SRTP-protected when negotiated."""
        if self.srtp is not None:
            protected = self.srtp.protect(packet)
            if protected is None:
                return  # counted in srtp.stats.protect_errors
            packet = protected
        if self.transport is not None:
            self.transport.sendto(packet, remote)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


class MediaTicker:
    """One timer for every call: sleeps until the earliest due packet (``loop.call_at``),
    sends everything due, re-arms.  No per-call task, no ``sleep(0.02)`` loops.

    ``batched`` (the default): a wake-up ticks its due calls together
    (:class:`gateway.rtp.batch.OutboundBatch`): every call's agent frame pulled, all frames
    encoded and packed in one step, then the packets sent back to back, then each call's
    jitter-buffer frame delivered.  ``batched=False`` ticks them one call at a time (the
    reference the batched path is tested and measured against).  Either way one call that
    raises is logged and the others are paced as usual.

    ``error`` (a :class:`SendTimeStats`) holds the send-time error of every packet: the time
    just before the call's ``sendto`` (batched; per call: before its tick) minus its schedule.
    ``batch_max_s`` is the longest wake-up (all due calls' work together).  Both are read from
    :attr:`clock`: ``time.monotonic`` where the loop's clock is on that base (asyncio's own loop;
    uvloop, whose ``loop.time()`` is libuv's ``uv_now``, CLOCK_MONOTONIC truncated to whole
    milliseconds, which would report an error of 0.0-0.99 ms as 0 and 2.0-2.99 ms as 2),
    else the loop's ``time`` (a simulated loop).

    ``timer``: what wakes the ticker. ``"timerfd"``: a Linux timerfd armed at the due time on
    CLOCK_MONOTONIC (:mod:`gateway.rtp.timerfd`), watched by the loop like a socket: it wakes
    within ~0.1 ms, where ``loop.call_at`` under uvloop wakes 0-1 ms late (libuv's
    millisecond clock and ``epoll`` timeout), which every packet of the wake-up carries.
    ``"loop"``: ``loop.call_at``. ``"auto"`` (the default): the timerfd where the loop's clock
    is CLOCK_MONOTONIC (a real loop on Linux), else the loop's timer (a simulated loop keeps
    its own time). :attr:`timer_kind` says which one runs, once the first call is added.
    """

    TIMERS = ("auto", "timerfd", "loop")

    def __init__(
        self,
        *,
        align: float = 0.002,
        slack: float = 0.001,
        period: float = 0.02,
        batched: bool = True,
        timer: str = "auto",
    ) -> None:
        if timer not in self.TIMERS:
            raise ValueError(f"timer must be one of {self.TIMERS}, got {timer!r}")
        self._ticker: Ticker[RtpEndpoint] = Ticker(align=align, slack=slack, period=period)
        self._timer = timer
        self._tfd: TimerFd | None = None
        self.timer_kind = ""  # "timerfd" or "loop", chosen at the first add
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batched = batched
        self._batch = OutboundBatch()
        self.batch_max_s = 0.0
        self.failures = 0  # calls whose tick raised (logged)
        self.clock: Callable[[], float] | None = None  # set from the loop at the first add

    def _precise_clock(self, loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
        # The same base within uvloop's millisecond truncation (and the call's own gap).
        if abs(loop.time() - time.monotonic()) < 0.005:
            return time.monotonic
        return loop.time

    @property
    def error(self) -> Any:
        return self._ticker.error

    @property
    def wakeups(self) -> int:
        return self._ticker.wakeups

    def __len__(self) -> int:
        return len(self._ticker)

    def add(self, endpoint: RtpEndpoint) -> float:
        """Start pacing ``endpoint`` from the next grid point; returns its start time."""
        loop = self._loop = asyncio.get_running_loop()
        if self.clock is None:
            self.clock = self._precise_clock(loop)
        if not self.timer_kind:
            self._choose_timer(loop)
        at = self._ticker.add(endpoint, loop.time())
        self._arm()
        return at

    def remove(self, endpoint: RtpEndpoint) -> None:
        self._ticker.remove(endpoint)
        if self._tfd is not None and not len(self._ticker):
            self._release_timerfd()  # idle: no fd held (the soak counts them), made again
        self._arm()

    def _choose_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        tfd = None
        if self._timer != "loop" and self.clock is time.monotonic:
            tfd = TimerFd.create()
        if tfd is None and self._timer == "timerfd":
            raise RuntimeError(
                "media timer 'timerfd' needs Linux and a loop on CLOCK_MONOTONIC; use 'auto'"
            )
        if tfd is not None:
            try:
                loop.add_reader(tfd.fileno(), self._on_timerfd)
            except (NotImplementedError, RuntimeError):
                # A loop that cannot watch an fd (a proactor loop raises NotImplementedError,
                # a closing one RuntimeError) keeps its own timer: "auto" never fails a call.
                tfd.close()
                tfd = None
        self._tfd = tfd
        self.timer_kind = "timerfd" if tfd is not None else "loop"

    def _on_timerfd(self) -> None:
        if self._tfd is None or not self._tfd.clear():
            return  # a wake-up for an expiry already consumed, or after close
        self._armed_at = None
        self._wake()

    def _arm(self) -> None:
        due = self._ticker.next_due()
        tfd = self._tfd
        if tfd is not None:
            if due == self._armed_at:
                return
            if due is None or self._loop is None:
                tfd.disarm()
                self._armed_at = None
            else:
                tfd.arm_at(due)  # loop.time()'s base is CLOCK_MONOTONIC (_choose_timer)
                self._armed_at = due
            return
        if due is not None and due == self._armed_at and self._handle is not None:
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._armed_at = None
        if due is None or self._loop is None:
            return
        self._handle = self._loop.call_at(due, self._wake)
        self._armed_at = due

    def _wake(self) -> None:
        self._handle = None
        self._armed_at = None
        assert self._loop is not None
        now = self._loop.time()
        clock = self.clock or self._loop.time
        started = clock()
        if self._tfd is not None:
            # Woken on CLOCK_MONOTONIC at the due time; uv_now may still read the millisecond
            # before it, which would leave the due calls off this wake-up (and re-arm at once).
            now = max(now, started)
        items = self._ticker.pop_due(now)
        try:
            if self.batched:
                self._tick_batch(items, now)
            else:
                self._tick_each(items)
        finally:
            self._ticker.reschedule(items)
            self.batch_max_s = max(self.batch_max_s, clock() - started)
            self._arm()

    def _tick_each(self, items: list[RtpEndpoint]) -> None:
        assert self._loop is not None
        loop_time = self._loop.time
        clock = self.clock or loop_time
        ticker = self._ticker
        errors: list[float] = []
        precise = self._tfd is not None  # see _wake
        for ep in items:
            if not ticker.is_member(ep):
                continue  # removed by an earlier call's tick
            t = max(loop_time(), clock()) if precise else loop_time()
            errors.append(clock() - ep.next_due)
            try:
                ep.tick(t)
            except Exception:
                self.failures += 1
                log.exception("media tick failed on port %d", ep.local_port)
        ticker.error.add(errors)

    def _tick_batch(self, items: list[RtpEndpoint], now: float) -> None:
        assert self._loop is not None
        ticker = self._ticker
        eps: list[RtpEndpoint] = []
        pacers: list[Pacer] = []
        for ep in items:
            session = ep.session
            if session is not None and ticker.is_member(ep):
                eps.append(ep)
                pacers.append(session.pacer)
        batch = self._batch
        packets = batch.build(pacers, now, lambda i: ticker.is_member(eps[i]))
        for i, exc in batch.failures:
            self.failures += 1
            log.error("media tick failed on port %d", eps[i].local_port, exc_info=exc)
        scheduled = batch.scheduled
        clock = self.clock or self._loop.time
        errors: list[float] = []
        # The packets first, back to back: a call's send time does not wait for the other
        # calls' inbound work.
        for i, ep in enumerate(eps):
            due = scheduled[i]
            if due is None:
                continue  # removed from the schedule before its turn came
            errors.append(clock() - due)
            packet = packets[i]
            if packet is not None and ticker.is_member(ep):
                try:
                    ep.send_now(packet)
                except Exception:
                    self.failures += 1
                    log.exception("RTP send failed on port %d", ep.local_port)
        ticker.error.add(errors)
        for ep in eps:
            if ticker.is_member(ep):
                try:
                    ep.inbound_tick(now)
                except Exception:
                    self.failures += 1
                    log.exception("inbound media tick failed on port %d", ep.local_port)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._release_timerfd()

    def _release_timerfd(self) -> None:
        if self._tfd is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._tfd.fileno())
            self._tfd.close()
            self._tfd = None
            self._armed_at = None
        self.timer_kind = ""  # chosen again when a call is added
