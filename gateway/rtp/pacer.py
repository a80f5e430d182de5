"""Outbound pacing (sans-I/O): a per-call send queue and the shared drift-free schedule.

:class:`Pacer` turns queued PCM into one RTP packet per packet time.  Packet ``n`` of a call
is due at ``start + n·ptime`` and carries timestamp ``ts0 + n·samples_per_packet``: both are
computed from ``n``, never accumulated, so there is no drift however long the call.

* No queued audio at a tick → a packet of silence (or, with RFC 3389 CN negotiated, a CN
  packet at the start of the pause and every ``cn_refresh_ms``; nothing in between).  An
  *underrun* is counted only while an utterance is playing (audio queued and not yet ended).
* A stalled process is not caught up with a burst: ``tick(now)`` sends only the packet for
  the latest due tick, skips the missed ones (counted in ``skipped_ticks``), moves the
  timestamp on by the skipped media time and sets the marker (RFC 3551 §4.1 treats a
  timestamp jump like a new talkspurt, so the receiver re-syncs its playout).  Queued audio is
  delayed, not dropped: the agent's words all get played.
* ``send error = now - scheduled`` is recorded for every packet.

:class:`Ticker` runs many pacing items from one timer: a heap of due times; the asyncio
adapter sleeps until the earliest, calls :meth:`Ticker.run` and re-arms.  Starts are put on
a grid of ``align`` seconds, in the least-loaded of the ``period/align`` phases: calls share
wake-ups (one timer per phase, not per call) yet no single wake-up carries every call, which
would make the last calls of the batch late (measured: 300 calls in 2 phases ≈3 ms p50 error,
in 10 balanced phases well under 1 ms).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from dsp.fades import cosine_fade_out
from gateway.rtp.codecs import get_codec
from gateway.rtp.dtmf import dtmf_train
from gateway.rtp.packet import pack_rtp, random_sequence, random_ssrc, random_timestamp

Int16Array = npt.NDArray[np.int16]


class SendTimeStats:
    """Histogram of send-time error (actual - scheduled) in ``bin_ms`` bins up to ``max_ms``.

    Fixed memory however long it runs; percentiles are bin-accurate.  Negative errors (a
    timer that fired a little early) land in bin 0.

    Errors are appended to a list and binned ``FLUSH_AT`` at a time (or when a figure is
    read): one ``bincount`` over the whole histogram per media wake-up cost ~20 µs, a fifth
    of the ticker's own time at 100 calls.
    """

    FLUSH_AT = 4096

    def __init__(self, bin_ms: float = 0.1, max_ms: float = 500.0) -> None:
        self.bin_ms = bin_ms
        self._hist = np.zeros(int(max_ms / bin_ms) + 1, dtype=np.int64)
        self._pending: list[float] = []
        self._count = 0
        self._total_ms = 0.0
        self._max_ms = 0.0
        self._min_ms = 0.0

    def record(self, errors_s: Iterable[float] | npt.NDArray[np.float64]) -> None:
        if isinstance(errors_s, np.ndarray):
            self._pending += errors_s.astype(np.float64).ravel().tolist()
        else:
            self._pending += errors_s
        if len(self._pending) >= self.FLUSH_AT:
            self._flush()

    def add(self, errors_s: list[float]) -> None:
        """The hot path: a wake-up's errors (seconds), kept until the next bulk binning."""
        self._pending += errors_s
        if len(self._pending) >= self.FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        ms = np.array(self._pending, dtype=np.float64) * 1000.0
        self._pending.clear()
        idx = np.clip((ms / self.bin_ms).astype(np.int64), 0, self._hist.size - 1)
        self._hist += np.bincount(idx, minlength=self._hist.size)
        hi, lo = float(ms.max()), float(ms.min())
        if self._count == 0:
            self._max_ms, self._min_ms = hi, lo
        else:
            self._max_ms = max(self._max_ms, hi)
            self._min_ms = min(self._min_ms, lo)
        self._count += int(ms.size)
        self._total_ms += float(ms.sum())

    @property
    def _bins(self) -> npt.NDArray[np.int64]:
        """The histogram (counts per bin), everything recorded so far binned."""
        self._flush()
        return self._hist

    @property
    def count(self) -> int:
        self._flush()
        return self._count

    @property
    def total_ms(self) -> float:
        self._flush()
        return self._total_ms

    @property
    def max_ms(self) -> float:
        self._flush()
        return self._max_ms

    @property
    def min_ms(self) -> float:
        self._flush()
        return self._min_ms

    @property
    def mean_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0

    def percentile(self, p: float) -> float:
        """Upper edge of the bin holding the ``p``-th percentile, in ms (0 when empty)."""
        if not self.count:
            return 0.0
        rank = math.ceil(self.count * p / 100.0)
        i = int(np.searchsorted(np.cumsum(self._bins), max(rank, 1)))
        return (i + 1) * self.bin_ms

    def summary(self) -> dict[str, float]:
        return {
            "count": float(self.count),
            "mean_ms": self.mean_ms,
            "p50_ms": self.percentile(50),
            "p95_ms": self.percentile(95),
            "p99_ms": self.percentile(99),
            "max_ms": self.max_ms,
        }


@dataclass(frozen=True, slots=True)
class PacerStats:
    sent: int
    audio: int
    silence: int
    dtmf: int
    cn: int
    underruns: int
    skipped_ticks: int
    late_sends: int
    queued_ms: float
    mean_error_ms: float
    max_error_ms: float


class Pacer:
    """One call's outbound RTP stream.  ``tick(now)`` is called when ``next_due`` has come.

    ``payload_type`` defaults to the codec's static PT; ``dtmf_pt``/``cn_pt`` are the
    negotiated telephone-event and CN payload types (None: not negotiated).
    """

    def __init__(
        self,
        codec: str = "PCMU",
        payload_type: int | None = None,
        *,
        ptime_ms: int = 20,
        clock_rate: int = 8000,
        ssrc: int | None = None,
        sequence: int | None = None,
        timestamp: int | None = None,
        dtmf_pt: int | None = None,
        cn_pt: int | None = None,
        cn_refresh_ms: int = 200,
        cn_level_dbov: int = 80,
        late_ms: float | None = None,
    ) -> None:
        self.codec = get_codec(codec)
        self.payload_type = self.codec.static_pt if payload_type is None else payload_type
        self.ptime_ms = ptime_ms
        self.ptime = ptime_ms / 1000.0
        self.clock_rate = clock_rate
        self.spf = clock_rate * ptime_ms // 1000
        # RFC 3550 §5.1/§8.1: random SSRC, initial sequence number and timestamp.
        self.ssrc = random_ssrc() if ssrc is None else ssrc
        self._seq = random_sequence() if sequence is None else sequence
        self.ts0 = random_timestamp() if timestamp is None else timestamp
        self.dtmf_pt = dtmf_pt
        self.cn_pt = cn_pt
        self._cn_refresh = max(cn_refresh_ms // ptime_ms, 1)
        self._cn_payload = bytes([min(max(cn_level_dbov, 0), 127)])  # RFC 3389 §3.1 level
        self.late = (ptime_ms / 2000.0) if late_ms is None else late_ms / 1000.0
        self.sending = True  # False while on hold: ticks run, nothing is sent
        # A tick this early still counts as due (timers fire early by up to their
        # granularity, ~1 ms on uvloop); must be at least the Ticker's slack.
        self.early = 0.002
        self._silence = self.codec.silence(self.spf)
        self._start: float | None = None
        self._n = 0
        self._queue = bytearray()
        self._playing = False
        self._ended = False
        self._marker = True  # first packet of the stream (RFC 3551 §4.1)
        self._dtmf: deque[tuple[bool, bytes]] = deque()
        self._dtmf_ts = 0
        self._dtmf_pending: deque[tuple[str, int]] = deque()
        self._gap = 0
        self._gap_ticks = 3
        self._idle_ticks = 0
        self._talkspurt = False
        self._err_count = 0
        self._err_sum = 0.0
        self._err_max = 0.0
        self._sent = self._audio = self._silent = self._dtmf_sent = self._cn = 0
        self.underruns = 0
        # Optional pull source: called once per due tick as ``source(spf, media_sample)`` for
        # ``spf`` samples of int16 PCM (silence when there is nothing to say); the call's
        # playout in the gateway. ``media_sample`` is the frame's position on the stream's
        # clock (tick index × spf), skipped ticks included, so callers can time events.
        self.source: Callable[[int, int], npt.NDArray[np.int16]] | None = None
        self.skipped_ticks = 0
        self.late_sends = 0

    # -- schedule --------------------------------------------------------------------------
    def start(self, at: float) -> None:
        """Packet 0 is due at ``at`` (seconds on the caller's monotonic clock)."""
        self._start = at
        self._n = 0

    @property
    def started(self) -> bool:
        return self._start is not None

    def due_time(self, n: int) -> float:
        assert self._start is not None
        return self._start + n * self.ptime

    @property
    def next_due(self) -> float:
        return math.inf if self._start is None else self._start + self._n * self.ptime

    @property
    def ticks(self) -> int:
        """Ticks consumed so far (sent or skipped)."""
        return self._n

    # -- send queue ------------------------------------------------------------------------
    def enqueue(self, pcm: npt.ArrayLike) -> None:
        """Queue int16 PCM at the stream's clock rate (encoded here, vectorised per chunk)."""
        self.enqueue_encoded(self.codec.encode(pcm))

    def enqueue_encoded(self, data: bytes) -> None:
        """Queue audio already in this stream's codec."""
        if not data:
            return
        if not self._playing or self._ended:
            self._playing, self._ended = True, False
        self._queue += data

    def end_utterance(self) -> None:
        """No more audio for this utterance: flush the tail padded with silence, and stop
        counting underruns."""
        if self._playing:
            self._ended = True

    def barge_in(self, fade_ms: float = 10.0) -> int:
        """Cosine-fade the next ``fade_ms`` of queued audio to zero and drop the rest.

        Returns the number of samples dropped.  Barge-in fades the ≤10 ms next in the
        queue, never a hard cut.
        """
        n = min(int(fade_ms * self.clock_rate / 1000), len(self._queue))
        dropped = len(self._queue) - n
        if n:
            head = self.codec.decode(bytes(self._queue[:n]))
            faded = np.rint(cosine_fade_out(head, n)).astype(np.int16)
            self._queue = bytearray(self.codec.encode(faded))
        else:
            self._queue.clear()
        self.end_utterance()
        return dropped

    def clear(self) -> None:
        self._queue.clear()
        self._playing = self._ended = False

    @property
    def queued_samples(self) -> int:
        return len(self._queue)

    @property
    def queued_ms(self) -> float:
        return len(self._queue) * 1000.0 / self.clock_rate

    @property
    def playing(self) -> bool:
        return self._playing

    def send_dtmf(self, digits: str, duration_ms: int = 160, gap_ms: int = 60) -> None:
        """Queue key presses as RFC 4733 events; audio is held back while they play."""
        if self.dtmf_pt is None:
            raise ValueError("telephone-event was not negotiated")
        for d in digits:
            dtmf_train(d, duration_ms, ptime_ms=self.ptime_ms)  # validate now, not at tick time
            self._dtmf_pending.append((d, duration_ms))
        self._gap_ticks = max(math.ceil(gap_ms / self.ptime_ms), 1)

    # -- the tick --------------------------------------------------------------------------
    def tick(self, now: float) -> bytes | None:
        """The packet for the latest due tick at ``now`` (None: nothing to send)."""
        k = self.due_tick(now)
        if k is None:
            return None
        pcm = self.source(self.spf, k * self.spf) if self.source is not None else None
        return self.finish_tick(k, pcm)

    def due_tick(self, now: float) -> int | None:
        """Consume the latest tick due at ``now`` and return its index (None: not due yet).

        The scheduling half of :meth:`tick`, shared with the batched tick
        (:class:`gateway.rtp.batch.OutboundBatch`): the send-time error, skipped ticks and
        the marker for a timestamp jump are accounted here, once per tick."""
        start = self._start
        if start is None or now < start + self._n * self.ptime - self.early:
            return None
        k = math.floor((now - start) / self.ptime + 1e-9)
        k = max(k, self._n)  # woke slightly early: this is tick n
        skipped = k - self._n
        error = now - (start + k * self.ptime)
        # Scalars only here (cheap per packet); the Ticker keeps the vectorised histogram.
        self._err_count += 1
        self._err_sum += error
        if error > self._err_max:
            self._err_max = error
        if skipped:
            # Never a burst to catch up: the missed ticks are gone.  Their media time still
            # passes (timestamp below is from k), and the marker flags the jump.
            self.skipped_ticks += skipped
            self._marker = True
        if skipped or error > self.late:
            self.late_sends += 1
        self._n = k + 1
        return k

    def finish_tick(self, k: int, pcm: Int16Array | None) -> bytes | None:
        """The packet of tick ``k`` (from :meth:`due_tick`) given the frame its source pulled
        (None: no source), one call at a time: every case (DTMF, CN, hold, queued audio)."""
        ts = self.ts0 + k * self.spf
        if pcm is not None:
            # Pull mode: the call's playout hands over exactly one frame per tick, so a fade or
            # a dropped utterance takes effect on the very next packet (no queue to flush).
            if pcm.any():
                self.enqueue(pcm)
            elif not self._queue:
                self.end_utterance()  # the source counts its own underruns; don't double up
        pt, marker, payload, ts = self._next_payload(ts)
        if payload is None or not self.sending:
            return None
        if pt == self.payload_type:
            marker = marker or self._talkspurt
            self._talkspurt = False
        marker = marker or self._marker
        self._marker = False
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFF
        self._sent += 1
        return pack_rtp(pt, marker, seq, ts, self.ssrc, payload)

    @property
    def batchable(self) -> bool:
        """The next tick's payload is exactly the G.711 of the frame the source pulls, so it
        can be encoded and packed with the other calls' (:class:`gateway.rtp.batch`): a pull
        source, nothing queued, no DTMF playing or waiting, no CN (RFC 3389 DTX decides
        per frame whether to send at all), not on hold.  Anything else takes
        :meth:`finish_tick`."""
        return (
            self.source is not None
            and self.cn_pt is None
            and self.sending
            and not self._queue
            and not self._dtmf
            and not self._dtmf_pending
        )

    def commit_frame(self, k: int, audible: bool) -> tuple[int, int, int]:
        """The batched twin of :meth:`finish_tick` for a :attr:`batchable` tick whose frame
        is the payload: the same state changes and counters (``audible``: the frame is not
        all zeros), returning the header's second octet (marker, PT), sequence number and
        timestamp (RFC 3550 §5.1).  The batch checks that the two give the same bytes."""
        if self._gap > 0:
            self._gap -= 1  # the pause after a DTMF train counts down on every tick
        if audible:
            # finish_tick: enqueue (an utterance plays), then the whole frame goes out.
            self._playing = True
            self._ended = False
            self._audio += 1
            self._idle_ticks = 0
        elif self._playing:
            # finish_tick: end_utterance, then the (empty) tail padded with silence.
            self._playing = self._ended = False
            self._audio += 1
            self._idle_ticks = 0
        else:
            self._silent += 1
        marker = self._talkspurt or self._marker
        self._talkspurt = self._marker = False
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFF
        self._sent += 1
        return (
            (0x80 | self.payload_type) if marker else self.payload_type,
            seq,
            (self.ts0 + k * self.spf) & 0xFFFFFFFF,
        )

    def _next_payload(self, ts: int) -> tuple[int, bool, bytes | None, int]:
        if not self._dtmf and self._dtmf_pending and self._gap <= 0:
            digit, duration = self._dtmf_pending.popleft()
            self._dtmf.extend(dtmf_train(digit, duration, ptime_ms=self.ptime_ms))
            self._dtmf_ts = ts  # RFC 4733 §2.3.1: every packet of the event carries its start
        if self._dtmf:
            marker, payload = self._dtmf.popleft()
            if not self._dtmf:
                self._gap = self._gap_ticks
            self._dtmf_sent += 1
            assert self.dtmf_pt is not None
            return self.dtmf_pt, marker, payload, self._dtmf_ts
        if self._gap > 0:
            self._gap -= 1
        q = self._queue
        spf = self.spf
        if len(q) >= spf:
            payload = bytes(q[:spf])
            del q[:spf]  # bytearray: deleting from the front is amortised O(1) in CPython
            self._audio += 1
            self._idle_ticks = 0
            if not q and self._ended:
                self._playing = self._ended = False
            return self.payload_type, False, payload, ts
        if self._playing and self._ended:
            payload = bytes(q) + self._silence[len(q) :]
            q.clear()
            self._playing = self._ended = False
            self._audio += 1
            self._idle_ticks = 0
            return self.payload_type, False, payload, ts
        if self._playing:
            self.underruns += 1  # mid-utterance and the synthesiser is behind
        elif self.cn_pt is not None:
            # RFC 3389 §4: a CN packet starts the pause and refreshes it; no packets between.
            idle = self._idle_ticks
            self._idle_ticks += 1
            self._talkspurt = True  # audio after DTX starts a talkspurt (RFC 3551 §4.1)
            if idle % self._cn_refresh == 0:
                self._cn += 1
                return self.cn_pt, False, self._cn_payload, ts
            return self.payload_type, False, None, ts
        self._silent += 1
        return self.payload_type, False, self._silence, ts

    def stats(self) -> PacerStats:
        return PacerStats(
            sent=self._sent,
            audio=self._audio,
            silence=self._silent,
            dtmf=self._dtmf_sent,
            cn=self._cn,
            underruns=self.underruns,
            skipped_ticks=self.skipped_ticks,
            late_sends=self.late_sends,
            queued_ms=self.queued_ms,
            mean_error_ms=1000.0 * self._err_sum / self._err_count if self._err_count else 0.0,
            max_error_ms=1000.0 * self._err_max,
        )


class Scheduled(Protocol):
    """What the :class:`Ticker` drives: a pacer, or an endpoint wrapping one."""

    @property
    def next_due(self) -> float: ...

    def start(self, at: float) -> None: ...

    def tick(self, now: float) -> object: ...


T = TypeVar("T", bound=Scheduled)


class Ticker(Generic[T]):
    """Shared schedule for all calls (sans-I/O; the asyncio adapter is ``MediaTicker``).

    Items are kept in *slots* of the ``align`` grid (slot ``s`` is due at ``s·align``): the
    calls of one phase share a slot, so a wake-up pops one list, not one heap entry per call,
    and hands the whole list to the batched tick.  An item whose due time is off the grid (a
    ptime that is not a multiple of ``align``) goes to the next slot, at most ``align`` late.

    ``run(now)`` ticks every item due by ``now + slack`` (slack absorbs timers that fire a
    little early, e.g. uvloop's millisecond timer granularity) one by one and records each
    one's send-time error in ``error``; the batched adapter uses :meth:`pop_due` and
    :meth:`reschedule` around its own tick instead.
    """

    def __init__(self, align: float = 0.002, slack: float = 0.001, period: float = 0.02) -> None:
        if align <= 0 or period < align:
            raise ValueError("need 0 < align <= period")
        self.align = align
        self.slack = slack
        self._phases = max(round(period / align), 1)
        self._load = [0] * self._phases
        self._phase_of: dict[int, int] = {}
        self._members: dict[int, T] = {}  # id → item: everything added and not removed
        self._slots: dict[int, list[T]] = {}  # slot → items due then
        self._slot_of: dict[int, int] = {}  # id → its slot (absent while being ticked)
        self._heap: list[int] = []  # slots that have a list in _slots, each once
        self.error = SendTimeStats()
        self.wakeups = 0

    def __len__(self) -> int:
        return len(self._members)

    def add(self, item: T, now: float) -> float:
        """Start ``item`` on the least-loaded grid phase after ``now``; returns the start."""
        base = math.ceil(now / self.align - 1e-9)
        best = min(range(self._phases), key=lambda j: (self._load[(base + j) % self._phases], j))
        phase = (base + best) % self._phases
        at = (base + best) * self.align
        self.remove(item)
        self._load[phase] += 1
        self._phase_of[id(item)] = phase
        self._members[id(item)] = item
        item.start(at)
        self._push(item)
        return at

    def remove(self, item: T) -> None:
        key = id(item)
        if self._members.pop(key, None) is None:
            return
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            group = self._slots[slot]
            for i, other in enumerate(group):
                if other is item:
                    del group[i]
                    break
        phase = self._phase_of.pop(key, None)
        if phase is not None:
            self._load[phase] -= 1

    def _push(self, item: T) -> None:
        due = item.next_due
        if math.isinf(due):
            return
        slot = math.ceil(due / self.align - 1e-6)  # float noise of start + n·ptime: same slot
        group = self._slots.get(slot)
        if group is None:
            group = self._slots[slot] = []
            heapq.heappush(self._heap, slot)
        group.append(item)
        self._slot_of[id(item)] = slot

    def next_due(self) -> float | None:
        heap, slots = self._heap, self._slots
        while heap and not slots[heap[0]]:
            del slots[heapq.heappop(heap)]  # every item of that slot was removed
        return heap[0] * self.align if heap else None

    def pop_due(self, now: float) -> list[T]:
        """Take every item due by ``now + slack`` off the schedule, earliest slot first; give
        them back with :meth:`reschedule` once ticked."""
        self.wakeups += 1
        heap, slots, slot_of = self._heap, self._slots, self._slot_of
        limit = (now + self.slack) / self.align + 1e-6
        due: list[T] = []
        while heap and heap[0] <= limit:
            group = slots.pop(heapq.heappop(heap))
            for item in group:
                del slot_of[id(item)]
            due += group
        return due

    def reschedule(self, items: list[T]) -> None:
        """Put ticked items back at their next due time; an item removed meanwhile stays out,
        one re-added meanwhile (``add`` from its own tick) is already in."""
        members, slot_of, slots = self._members, self._slot_of, self._slots
        align = self.align
        last_slot = -1
        group: list[T] = []
        for item in items:
            key = id(item)
            if key not in members or key in slot_of:
                continue
            due = item.next_due
            if math.isinf(due):
                continue
            # _push, with the slot's list kept from the previous item: a phase's calls move
            # on to the same next slot together.
            slot = math.ceil(due / align - 1e-6)
            if slot != last_slot:
                found = slots.get(slot)
                if found is None:
                    found = slots[slot] = []
                    heapq.heappush(self._heap, slot)
                group, last_slot = found, slot
            group.append(item)
            slot_of[key] = slot

    def is_member(self, item: T) -> bool:
        """Still scheduled (not removed), e.g. by an earlier call's tick in the same batch."""
        return id(item) in self._members

    def run(self, now: float, clock: Callable[[], float] | None = None) -> list[tuple[T, object]]:
        """Tick everything due at ``now``, one item at a time; returns ``(item, tick result)``
        pairs.

        With ``clock`` (the adapter passes ``loop.time``), each item's send-time error is
        measured just before its tick, so the later calls of a large batch record their
        real lateness; without it, every item is measured at ``now``.
        """
        items = self.pop_due(now)
        done: list[tuple[T, object]] = []
        errors: list[float] = []
        try:
            for item in items:
                if id(item) not in self._members:
                    continue  # removed by an earlier item's tick
                t = clock() if clock is not None else now
                errors.append(t - item.next_due)
                done.append((item, item.tick(t)))
        finally:
            self.reschedule(items)
            self.error.add(errors)
        return done
