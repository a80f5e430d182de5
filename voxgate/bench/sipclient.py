"""A small SIP UAC with an RTP endpoint, for tests and benchmarks (not a softphone).

It places a call the way a phone does (INVITE with an SDP offer of PCMU/PCMA and
telephone-event 101, ACK, BYE), answers the gateway's in-dialog BYE/OPTIONS with 200, and runs
one RTP port that

* records every packet it receives with its kernel arrival time (``SO_TIMESTAMPNS``, wall
  clock), so pacing can be measured without the receiver's own scheduling noise;
* sends a continuous 20 ms stream on an absolute schedule (packet ``n`` at ``t0 + n·20 ms``,
  timestamp ``ts0 + n·160``): queued PCM, RFC 4733 key presses, otherwise silence.

Built on ``gateway.sip`` message classes and ``gateway.sdp`` over plain asyncio UDP; there is
no retransmission layer (meant for loopback). Linux only (kernel timestamps).

Usage::

    client = await SipClient.open("127.0.0.1")
    call = await client.invite(("127.0.0.1", 5060))
    assert call.status == 200
    await call.media.wait_for_audio(timeout=2)
    await call.media.send_dtmf("1")
    await call.bye()
    client.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway import sdp
from gateway.rtp.codecs import get_codec
from gateway.rtp.dtmf import dtmf_train
from gateway.rtp.packet import (
    RtpError,
    RtpPacket,
    SequenceUnwrapper,
    TimestampUnwrapper,
    pack_rtp,
    random_sequence,
    random_ssrc,
    random_timestamp,
)
from gateway.sip import (
    Dialog,
    Headers,
    Request,
    Response,
    SipParseError,
    generate_branch,
    generate_call_id,
    generate_tag,
    make_response,
    parse,
    parse_uri,
)
from gateway.sip.message import Address

Int16Array = npt.NDArray[np.int16]

# Linux values (socket(7)); Python's socket module does not export them.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("@qq")

PTIME = 0.020
SPF = 160  # samples per 20 ms frame at 8 kHz
USER_AGENT = "voxgate-testclient/0.1"


class SipClientError(Exception):
    """No answer in time, or an answer the client cannot use."""


# --- RTP ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RxPacket:
    """One received RTP packet; ``arrival`` is the kernel receive time (``time.time`` clock)."""

    arrival: float
    seq: int
    ts: int
    pt: int
    marker: bool
    payload: bytes


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """What the receive side saw of the gateway's stream (``RtpPeer.check``)."""

    packets: int
    seq_gaps: int  # missing sequence numbers (loss or skipped packets)
    seq_disorder: int  # packets that arrived out of order or twice
    bad_ts_steps: int  # consecutive packets whose timestamp step is not 160 per seq step
    skipped_frames: int  # media time the sender skipped (timestamp jumps), in frames
    unmarked_jumps: int  # timestamp jumps without the marker bit (RFC 3551 §4.1 wants it)


class RtpPeer:
    """One RTP port: records what arrives, sends a paced stream once started."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self._loop = loop
        self.local_ip, self.local_port = sock.getsockname()[:2]
        self.received: list[RxPacket] = []
        self.invalid = 0
        self.remote: Address | None = None
        self.codec = get_codec("PCMU")
        self.payload_type = 0
        self.dtmf_pt: int | None = None
        self.ssrc = random_ssrc()
        self._seq = random_sequence()
        self.ts0 = random_timestamp()
        self._pcm: list[Int16Array] = []
        self._pcm_pos = 0
        self._dtmf: list[tuple[list[tuple[bool, bytes]], asyncio.Future[float]]] = []
        self._send_task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        self.sent = 0
        # Wall time (``time.time``, the clock of the kernel's receive timestamps) each audio
        # frame from ``_next_frame`` went out, in frame order: caller-side latencies start here.
        self.sent_at: list[float] = []
        # The 20 ms slot being sent (audio or a key press's event packet): a frame source
        # that must keep time through key presses (an echo) reads it.
        self.slot = 0
        self.send_late_max = 0.0
        loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    async def open(cls, local_ip: str = "127.0.0.1", port: int = 0) -> RtpPeer:
        """Bind ``port`` (0: an even free port, RFC 3550 §11)."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in local_ip else socket.AF_INET
        for _ in range(64):
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.setblocking(False)
            try:
                sock.bind((local_ip, port))
            except OSError:
                sock.close()
                raise
            if port or sock.getsockname()[1] % 2 == 0:
                return cls(sock, loop)
            sock.close()
        raise OSError("no even UDP port found")

    # -- receive -----------------------------------------------------------------------
    def _readable(self) -> None:
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(2048, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. ICMP port unreachable reported on the socket
            arrival = time.time()
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    arrival = sec + nsec * 1e-9
            try:
                pkt = RtpPacket.parse(data)
            except RtpError:
                self.invalid += 1
                continue
            self.received.append(
                RxPacket(arrival, pkt.sequence_number, pkt.timestamp, pkt.payload_type,
                         pkt.marker, pkt.payload)
            )  # fmt: skip
            self._arrived.set()

    def audio(self) -> list[RxPacket]:
        """Received packets of the negotiated audio payload type, in arrival order."""
        return [p for p in self.received if p.pt == self.payload_type]

    def frames(self, since: float = 0.0) -> tuple[list[RxPacket], list[Int16Array]]:
        """Audio packets arrived at or after ``since`` and their decoded PCM."""
        pkts = [p for p in self.audio() if p.arrival >= since]
        return pkts, [self.codec.decode(p.payload) for p in pkts]

    async def wait_for_audio(
        self, *, after: float = 0.0, threshold: float = 200.0, timeout: float = 5.0
    ) -> RxPacket:
        """The first audio packet arriving after ``after`` whose RMS exceeds ``threshold``."""
        deadline = self._loop.time() + timeout
        checked = 0
        while True:
            pkts = self.received
            for p in pkts[checked:]:
                if (
                    p.pt == self.payload_type
                    and p.arrival >= after
                    and rms(self.codec.decode(p.payload)) > threshold
                ):
                    return p
            checked = len(pkts)
            left = deadline - self._loop.time()
            if left <= 0:
                raise TimeoutError(f"no audio above RMS {threshold} within {timeout} s")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def wait_for_quiet(
        self, *, quiet_s: float, threshold: float = 30.0, timeout: float = 30.0
    ) -> float:
        """Wait until audio above ``threshold`` RMS has been heard and then ``quiet_s`` of
        packets below it arrived; returns the arrival time of the last loud packet."""
        deadline = self._loop.time() + timeout
        while True:
            loud = [
                p.arrival for p in self.audio() if rms(self.codec.decode(p.payload)) > threshold
            ]
            last = self.received[-1].arrival if self.received else 0.0
            if loud and last - loud[-1] >= quiet_s:
                return loud[-1]
            if self._loop.time() > deadline:
                raise TimeoutError(f"no {quiet_s} s of quiet after speech within {timeout} s")
            await asyncio.sleep(0.1)

    def check(self, packets: Sequence[RxPacket] | None = None) -> StreamCheck:
        """Sequence gaps, disorder and timestamp steps of (by default) all audio packets."""
        pkts = list(self.audio() if packets is None else packets)
        su, tu = SequenceUnwrapper(), TimestampUnwrapper()
        gaps = disorder = bad_ts = skipped = unmarked = 0
        prev: tuple[int, int] | None = None
        for p in pkts:
            s, t = su.unwrap(p.seq), tu.unwrap(p.ts)
            if prev is not None:
                ds, dt = s - prev[0], t - prev[1]
                if ds <= 0:
                    disorder += 1
                    continue
                gaps += ds - 1
                if dt != ds * SPF:
                    bad_ts += 1
                    if dt > ds * SPF:
                        skipped += (dt - ds * SPF) // SPF
                        unmarked += not p.marker
            prev = (s, t)
        return StreamCheck(len(pkts), gaps, disorder, bad_ts, skipped, unmarked)

    def pacing_errors_ms(self, packets: Sequence[RxPacket] | None = None) -> list[float]:
        """Arrival lateness against the stream's own 20 ms grid, in ms, per packet.

        Packet with timestamp ``ts`` is due at ``t0 + (ts - ts_first)/8000``; ``t0`` is the
        earliest-arriving packet's offset, so the error is ≥ 0 like a send-time error (one-way
        loopback delay is constant and drops out). Arrival times are the kernel's.
        """
        pkts = list(self.audio() if packets is None else packets)
        if not pkts:
            return []
        tu = TimestampUnwrapper()
        ts = np.array([tu.unwrap(p.ts) for p in pkts], dtype=np.float64)
        arr = np.array([p.arrival for p in pkts], dtype=np.float64)
        offset = arr - (ts - ts[0]) / 8000.0
        err = (offset - offset.min()) * 1000.0
        return [float(x) for x in err]

    # -- send ----------------------------------------------------------------------------
    def configure(
        self, remote: Address, codec: str, payload_type: int, dtmf_pt: int | None
    ) -> None:
        self.remote = remote
        self.codec = get_codec(codec)
        self.payload_type = payload_type
        self.dtmf_pt = dtmf_pt

    def start_sending(self) -> None:
        """Start the paced outbound stream (silence until audio or a key press is queued)."""
        if self._send_task is None:
            self._send_task = self._loop.create_task(self._send_loop())

    def send_audio(self, pcm: npt.ArrayLike) -> None:
        """Queue int16 PCM (8 kHz) to go out after what is already queued."""
        self._pcm.append(np.asarray(pcm, dtype=np.int16))

    def send_dtmf(self, digit: str, duration_ms: int = 160) -> asyncio.Future[float]:
        """Queue one RFC 4733 key press; the future gives the time (``time.time``) its first
        packet was sent, and is done once that packet is out."""
        if self.dtmf_pt is None:
            raise SipClientError("telephone-event was not negotiated")
        fut: asyncio.Future[float] = self._loop.create_future()
        self._dtmf.append((dtmf_train(digit, duration_ms), fut))
        self.start_sending()
        return fut

    def _next_frame(self) -> bytes:
        out = np.zeros(SPF, np.int16)
        filled = 0
        while filled < SPF and self._pcm:
            head = self._pcm[0]
            k = min(SPF - filled, len(head) - self._pcm_pos)
            out[filled : filled + k] = head[self._pcm_pos : self._pcm_pos + k]
            filled += k
            self._pcm_pos += k
            if self._pcm_pos >= len(head):
                self._pcm.pop(0)
                self._pcm_pos = 0
        return self.codec.encode(out)

    async def _send_loop(self) -> None:
        loop = self._loop
        t0 = loop.time()
        n = 0
        train: list[tuple[bool, bytes]] = []
        train_ts = 0
        while True:
            due = t0 + n * PTIME
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.send_late_max = max(self.send_late_max, loop.time() - due)
            ts = self.ts0 + n * SPF
            self.slot = n
            if not train and self._dtmf:
                train, fut = self._dtmf.pop(0)
                train_ts = ts
                if not fut.done():
                    fut.set_result(time.time())
            if train and self.dtmf_pt is not None:
                marker, payload = train.pop(0)
                data = pack_rtp(self.dtmf_pt, marker, self._seq, train_ts, self.ssrc, payload)
                audio = False
            else:
                data = pack_rtp(self.payload_type, n == 0, self._seq, ts, self.ssrc,
                                self._next_frame())  # fmt: skip
                audio = True
            self._seq = (self._seq + 1) & 0xFFFF
            if self.remote is not None:
                with contextlib.suppress(OSError):
                    self.sock.sendto(data, self.remote)
                    self.sent += 1
            if audio:
                self.sent_at.append(time.time())
            n += 1

    def close(self) -> None:
        if self._send_task is not None:
            self._send_task.cancel()
            self._send_task = None
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


def rms(pcm: npt.ArrayLike) -> float:
    x = np.asarray(pcm, dtype=np.float64)
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


# --- SIP ------------------------------------------------------------------------------------
class _SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, owner: SipClient) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.owner._datagram(data, (addr[0], addr[1]))


@dataclass
class ClientCall:
    """One call placed by :class:`SipClient`."""

    client: SipClient
    invite: Request
    target: Address
    media: RtpPeer
    status: int = 0
    response: Response | None = None
    dialog: Dialog | None = None
    params: sdp.MediaParams | None = None
    invite_sent: float = 0.0  # time.time()
    answered_at: float = 0.0  # 200 received
    acked_at: float = 0.0  # ACK sent
    remote_bye: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False

    @property
    def call_id(self) -> str:
        return self.invite.call_id

    async def bye(self, timeout: float = 5.0) -> int:
        """Hang up; returns the BYE's final status (or the status of an earlier remote BYE)."""
        self.media.close()
        if self.ended or self.dialog is None:
            self.ended = True
            return 200
        self.ended = True
        req = self.dialog.create_request("BYE", sent_by=self.client.sent_by)
        req.headers.add("User-Agent", USER_AGENT)
        resp = await self.client.request(req, self.target, timeout=timeout)
        self.client.calls.pop(self.call_id, None)
        return resp.status


class SipClient:
    """A SIP UAC on one UDP port; many calls at once."""

    def __init__(self, local_ip: str) -> None:
        self.local_ip = local_ip
        self.port = 0
        self.transport: asyncio.DatagramTransport | None = None
        self.calls: dict[str, ClientCall] = {}
        # (Call-ID, CSeq number, method) -> waiter for the final response
        self._waiters: dict[tuple[str, int, str], asyncio.Future[Response]] = {}
        self._provisional: dict[tuple[str, int, str], list[Response]] = {}
        self.unmatched = 0

    @classmethod
    async def open(cls, local_ip: str = "127.0.0.1") -> SipClient:
        self = cls(local_ip)
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(
            lambda: _SipProtocol(self), local_addr=(local_ip, 0)
        )
        self.port = self.transport.get_extra_info("sockname")[1]
        return self

    @property
    def sent_by(self) -> str:
        host = f"[{self.local_ip}]" if ":" in self.local_ip else self.local_ip
        return f"{host}:{self.port}"

    def close(self) -> None:
        for call in self.calls.values():
            call.media.close()
        if self.transport is not None:
            self.transport.close()

    def send(self, message: Request | Response, addr: Address) -> None:
        assert self.transport is not None
        self.transport.sendto(bytes(message), addr)

    async def request(self, req: Request, addr: Address, timeout: float = 5.0) -> Response:
        """Send ``req`` and wait for its final response (no retransmission)."""
        key = (req.call_id, req.cseq.seq, req.method)
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        self.send(req, addr)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise SipClientError(f"no final response to {req.method} within {timeout} s") from None
        finally:
            self._waiters.pop(key, None)

    async def invite(
        self,
        target: Address,
        *,
        codecs: Sequence[str] = ("PCMU", "PCMA"),
        user: str = "testclient",
        to_user: str = "ivr",
        timeout: float = 5.0,
        send_media: bool = True,
    ) -> ClientCall:
        """Place a call; on 2xx it is ACKed and (with ``send_media``) our stream starts.

        The returned call has ``status`` set; anything but 2xx leaves it without a dialog.
        """
        media = await RtpPeer.open(self.local_ip)
        offer = sdp.make_offer(self.local_ip, media.local_port, codecs)
        host = f"[{target[0]}]" if ":" in target[0] else target[0]
        uri = parse_uri(f"sip:{to_user}@{host}:{target[1]}")
        h = Headers()
        h.add("Via", f"SIP/2.0/UDP {self.sent_by};branch={generate_branch()};rport")
        h.add("Max-Forwards", "70")
        h.add("From", f"<sip:{user}@{self.sent_by}>;tag={generate_tag()}")
        h.add("To", f"<{uri}>")
        h.add("Call-ID", generate_call_id(self.local_ip))
        h.add("CSeq", "1 INVITE")
        h.add("Contact", f"<sip:{user}@{self.sent_by}>")
        h.add("User-Agent", USER_AGENT)
        h.add("Content-Type", "application/sdp")
        invite = Request("INVITE", uri, h, bytes(offer))
        call = ClientCall(self, invite, target, media)
        self.calls[call.call_id] = call
        call.invite_sent = time.time()
        try:
            resp = await self.request(invite, target, timeout=timeout)
        except SipClientError:
            media.close()
            self.calls.pop(call.call_id, None)
            raise
        call.status, call.response = resp.status, resp
        if resp.status >= 300:
            media.close()
            self.calls.pop(call.call_id, None)
            return call
        call.answered_at = time.time()
        try:
            call.dialog = Dialog.from_uac_response(invite, resp)
            ack = call.dialog.create_ack(invite, sent_by=self.sent_by)
            call.params = sdp.negotiated(sdp.parse(resp.body), offer)
        except (SipParseError, sdp.SdpError, sdp.SdpNegotiationError) as exc:
            media.close()
            raise SipClientError(f"unusable 2xx: {exc}") from exc
        self.send(ack, target)
        call.acked_at = time.time()
        p = call.params
        media.configure((p.remote_addr, p.remote_port), p.codec, p.payload_type, p.dtmf_pt)
        if send_media:
            media.start_sending()
        return call

    # -- input ---------------------------------------------------------------------------
    def _datagram(self, data: bytes, addr: Address) -> None:
        if not data.strip():
            return  # keep-alive
        try:
            msg = parse(data)
        except SipParseError:
            self.unmatched += 1
            return
        if isinstance(msg, Response):
            key = (msg.call_id, msg.cseq.seq, msg.cseq.method)
            fut = self._waiters.get(key)
            if fut is None or fut.done():
                if msg.status >= 200 and msg.cseq.method == "INVITE":
                    self._reack(msg, addr)  # a retransmitted 2xx: ACK it again
                return
            if msg.status >= 200:
                fut.set_result(msg)
            return
        self._on_request(msg, addr)

    def _reack(self, resp: Response, addr: Address) -> None:
        call = self.calls.get(resp.call_id)
        if call is not None and call.dialog is not None and resp.status < 300:
            self.send(call.dialog.create_ack(call.invite, sent_by=self.sent_by), addr)

    def _on_request(self, req: Request, addr: Address) -> None:
        if req.method == "ACK":
            return
        call = self.calls.get(req.call_id)
        if req.method == "BYE" and call is not None:
            self.send(make_response(req, 200), addr)
            call.ended = True
            call.media.close()
            call.remote_bye.set()
            self.calls.pop(req.call_id, None)
        elif req.method == "OPTIONS" or (call is not None and req.method == "INFO"):
            self.send(make_response(req, 200), addr)
        elif call is None:
            self.send(make_response(req, 481), addr)
        else:
            self.send(make_response(req, 501), addr)


def frame_rms(frames: Sequence[Int16Array]) -> list[float]:
    return [rms(f) for f in frames]
