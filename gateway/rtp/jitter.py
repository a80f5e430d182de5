"""Inbound jitter buffer (sans-I/O): RTP packets in, fixed-size frames of decoded PCM out.

Placement is by RTP timestamp, not by sequence number: the media clock is what the sender
sampled against (RFC 3550 §5.1), so silence-suppression gaps, a different remote ptime (30 ms
packets pulled as 20 ms frames) and telephone-event packets that share the sequence space
all fall out naturally.  Sequence numbers drive the statistics (RFC 3550 §A.1/§A.3: received,
lost, duplicate, reordered) and duplicate detection.

Playout: ``pull()`` is called once per frame by the media ticker.  Playback starts once
``target`` ms of audio are buffered; after that the playout point advances one frame per
pull.  A frame with no audio is concealed by repeating the last frame with a linear fade to
zero over ``plc_ms``, then silence (a simple form of the G.711 Appendix I idea: hide short
gaps, never loop a stale frame).

Adaptation (``adaptive=True``): a packet that arrives after its playout time raises the target
by one frame (up to ``max_ms``) and the next pull inserts one concealed frame without
advancing, which creates the extra depth.  Once per second, if no packet was late and the
smallest depth seen exceeded the target by a frame, one frame is dropped to cut latency; the
target itself decays by a frame per quiet second toward ``max(min_ms, 3·jitter + frame)``.
A marker bit (RFC 3551 §4.1, start of a talkspurt) on an empty buffer re-primes playout, so
each talkspurt starts with the target delay.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from gateway.rtp.codecs import get_codec
from gateway.rtp.packet import SEQ_MOD, RtpPacket, TimestampUnwrapper

Int16Array = npt.NDArray[np.int16]
FrameKind = Literal["audio", "concealed", "silence"]

# RFC 3550 §A.1 constants.
MAX_DROPOUT = 3000
MAX_MISORDER = 100
_SEEN_WINDOW = 1024  # sequence numbers remembered for duplicate detection
_RESYNC_AFTER_LATE = 4  # consecutive late packets: the sender's clock jumped back
_ADAPT_WINDOW_PULLS_MS = 1000


class JitterFrame(NamedTuple):
    """One frame of output.  ``timestamp`` is the RTP timestamp of its first sample (None
    before playout has started).  (A named tuple: immutable like the frozen dataclass it was,
    built in a third of the time, once per call per tick.)"""

    pcm: Int16Array
    kind: FrameKind
    timestamp: int | None


@dataclass(frozen=True, slots=True)
class JitterStats:
    received: int
    expected: int
    lost: int
    late: int
    duplicate: int
    reordered: int
    depth_ms: float
    target_ms: float
    jitter: float
    jitter_ms: float
    played: int
    concealed: int
    silent: int
    dropped: int
    resyncs: int


class _SeqTracker:
    """RFC 3550 §A.1 ``update_seq`` without probation: extended seq numbers, restart logic."""

    __slots__ = ("bad_seq", "base", "max_ext", "restarted")

    def __init__(self) -> None:
        self.max_ext: int | None = None
        self.base = 0
        self.bad_seq: int | None = None
        self.restarted = False

    def update(self, seq: int) -> int | None:
        """Extended sequence number of ``seq``, or None for a packet to discard.

        Sets ``restarted`` when the sender evidently restarted its sequence (§A.1: two
        sequential packets after a jump larger than MAX_DROPOUT).
        """
        self.restarted = False
        if self.max_ext is None:
            self.max_ext = self.base = seq
            return seq
        udelta = (seq - self.max_ext) & 0xFFFF
        if udelta < MAX_DROPOUT:
            self.max_ext += udelta  # in order, with a permissible gap (or a duplicate: 0)
            return self.max_ext
        if udelta <= SEQ_MOD - MAX_MISORDER:
            if seq == self.bad_seq:
                self.max_ext = self.base = seq
                self.bad_seq = None
                self.restarted = True
                return seq
            self.bad_seq = (seq + 1) & 0xFFFF
            return None
        return self.max_ext - (SEQ_MOD - udelta)  # from the recent past: reordered or dup

    @property
    def expected(self) -> int:
        return 0 if self.max_ext is None else self.max_ext - self.base + 1


class JitterBuffer:
    """See the module docstring.  ``audio_pts`` maps payload type → codec name; packets of
    any other PT (telephone-event, CN) count toward the sequence statistics only."""

    def __init__(
        self,
        audio_pts: Mapping[int, str] | None = None,
        *,
        clock_rate: int = 8000,
        frame_ms: int = 20,
        target_ms: int = 60,
        min_ms: int = 40,
        max_ms: int = 200,
        adaptive: bool = True,
        plc_ms: int = 60,
    ) -> None:
        if not 0 < min_ms <= target_ms <= max_ms:
            raise ValueError("need 0 < min_ms <= target_ms <= max_ms")
        self.set_payload_types(audio_pts or {0: "PCMU", 8: "PCMA"})
        self.clock_rate = clock_rate
        self.frame = clock_rate * frame_ms // 1000
        self._ms = clock_rate // 1000
        self._min = min_ms * self._ms
        self._max = max_ms * self._ms
        self._target = target_ms * self._ms
        if not adaptive:
            self._min = self._max = self._target
        self.adaptive = adaptive
        self._plc_frames = max(plc_ms // frame_ms, 0)
        self._silence = np.zeros(self.frame, dtype=np.int16)
        self._silence.setflags(write=False)  # shared by every silent frame handed out
        self._window_pulls = max(_ADAPT_WINDOW_PULLS_MS // frame_ms, 1)
        # counters (cumulative over sources)
        self._received = 0
        self._lost_prev_sources = 0
        self._expected_prev_sources = 0
        self._late = 0
        self._dup = 0
        self._reordered = 0
        self._played = 0
        self._concealed = 0
        self._silent = 0
        self._dropped = 0
        self._resyncs = 0
        self._jitter = 0.0
        self._received_source = 0
        self._ssrc: int | None = None
        # The last push's audio on its RTP timeline, whatever playout does with it (see push).
        self.decoded: tuple[int, Int16Array] | None = None
        # Whether push stores audio for pull (see set_playing).
        self.playing = True
        self._reset_source()

    def set_payload_types(self, audio_pts: Mapping[int, str]) -> None:
        """Audio payload type → codec name (a re-INVITE may change the numbers)."""
        self._decoders = {pt: get_codec(name).decode for pt, name in audio_pts.items()}

    # -- state -----------------------------------------------------------------------------
    def _reset_source(self) -> None:
        self._seq = _SeqTracker()
        self._ts = TimestampUnwrapper()
        self._seen: set[int] = set()
        self._last_transit: float | None = None
        self._received_source = 0
        self._reset_playout()

    def _reset_playout(self) -> None:
        self._frames: dict[int, Int16Array] = {}
        self._keys: list[int] = []
        self._high_end: int | None = None
        self._play: int | None = None
        self._last: Int16Array | None = None
        self._conceal_run = 0
        self._late_run = 0
        self._hold = 0
        self._window_count = 0
        self._window_min_depth: int | None = None
        self._window_late = False

    def _resync(self) -> None:
        self._resyncs += 1
        self._reset_playout()

    def set_playing(self, on: bool) -> None:
        """Whether pushed audio is stored for :meth:`pull`.  Off while nothing takes the
        stream in playout time (the gateway: no recording and no bridged party, the barge-in
        detector and the agents hear the caller on arrival): push still tracks the sequence,
        counts, measures interarrival jitter and decodes (``decoded``), but stores nothing,
        and pull is not called.  On again, playout primes afresh from the next packet (the
        target delay: a recording or a bridge started mid-call begins ~40-60 ms later)."""
        if on != self.playing:
            self.playing = on
            self._reset_playout()

    # -- input -----------------------------------------------------------------------------
    def push(self, pkt: RtpPacket, arrival: float) -> bool:
        """Add a packet that arrived at ``arrival`` seconds (any monotonic clock).

        Returns True when its audio was stored for playout.  ``decoded`` then holds the
        packet's (extended RTP timestamp, PCM) — also for a packet too late for playout, which
        a consumer that does not wait for playout (the barge-in detector) may still use; None
        for a duplicate or a packet without audio.
        """
        self.decoded = None
        if pkt.ssrc != self._ssrc:
            if self._ssrc is not None:
                # A new source (RFC 3550 §8.2): statistics restart, playout re-primes.
                self._lost_prev_sources += self._lost_source()
                self._expected_prev_sources += self._seq.expected
                self._reset_source()
                self._resyncs += 1
            self._ssrc = pkt.ssrc
        prev_max = self._seq.max_ext
        prev_expected = self._seq.expected
        ext_seq = self._seq.update(pkt.sequence_number)
        if ext_seq is None:
            return False
        if self._seq.restarted:
            # §A.1: the sender restarted its sequence; account the old run, start a new one.
            self._lost_prev_sources += max(prev_expected - self._received_source, 0)
            self._expected_prev_sources += prev_expected
            self._seen.clear()
            self._received_source = 0
            self._ts = TimestampUnwrapper()
            self._last_transit = None
            self._resync()
        elif ext_seq in self._seen:
            self._dup += 1
            return False
        self._seen.add(ext_seq)
        if len(self._seen) > 2 * _SEEN_WINDOW:
            floor = (self._seq.max_ext or 0) - _SEEN_WINDOW
            self._seen = {s for s in self._seen if s >= floor}
        self._received += 1
        self._received_source += 1
        if prev_max is not None and ext_seq < prev_max and not self._seq.restarted:
            self._reordered += 1

        decode = self._decoders.get(pkt.payload_type)
        if decode is None or not pkt.payload:
            return False  # telephone-event / CN / unknown: sequence accounting only
        pcm = decode(pkt.payload)
        ext_ts = self._ts.unwrap(pkt.timestamp)
        self.decoded = (ext_ts, pcm)

        # RFC 3550 §6.4.1 / §A.8 interarrival jitter, in timestamp units, audio packets only
        # (RFC 4733 §2.5.1.2 event packets repeat one timestamp and would inflate it).
        transit = arrival * self.clock_rate - ext_ts
        if self._last_transit is not None:
            d = abs(transit - self._last_transit)
            self._jitter += (d - self._jitter) / 16.0
        self._last_transit = transit
        if not self.playing:
            return False

        end = ext_ts + len(pcm)
        if self._play is not None:
            if end <= self._play:
                self._late += 1
                self._late_run += 1
                self._window_late = True
                self._on_late()
                if self._late_run < _RESYNC_AFTER_LATE:
                    return False
                self._resync()  # consistently behind: the sender's timeline jumped back
            elif ext_ts - self._play > self._max + 50 * self.frame:
                self._resync()  # far ahead: the sender's timeline jumped forward
            elif pkt.marker and not self._keys and ext_ts >= self._play:
                # RFC 3551 §4.1: a talkspurt starts; re-prime so it gets the target delay.
                self._reset_playout()
            else:
                self._late_run = 0
        if ext_ts in self._frames:
            self._dup += 1
            return False
        self._frames[ext_ts] = pcm
        bisect.insort(self._keys, ext_ts)
        self._high_end = end if self._high_end is None else max(self._high_end, end)
        # Bound memory: never hold more than max depth plus a second.
        horizon = self._high_end - self._max - self.clock_rate
        while self._keys and self._keys[0] + len(self._frames[self._keys[0]]) < horizon:
            del self._frames[self._keys.pop(0)]
        return True

    def _lost_source(self) -> int:
        return max(self._seq.expected - self._received_source, 0)

    def _on_late(self) -> None:
        if self.adaptive and self._target < self._max:
            self._target = min(self._target + self.frame, self._max)
            self._hold += 1

    # -- output ----------------------------------------------------------------------------
    def pull(self) -> JitterFrame:
        """The next frame of audio (``frame_ms`` of samples), always exactly one frame."""
        play = self._play
        if play is not None and not self._hold:
            # The common case, once per call per tick: the packet stored at the playout point
            # is exactly one frame, nothing else overlaps it, the buffer is not too deep.
            keys = self._keys
            f = self.frame
            stop = play + f
            high_end = self._high_end
            if (
                keys
                and keys[0] == play
                and (len(keys) == 1 or keys[1] >= stop)
                and high_end is not None
                and high_end - play <= self._max + f
            ):
                out = self._frames[play]
                if len(out) == f:
                    del self._frames[play]
                    del keys[0]
                    self._play = stop
                    # _adapt(play), its per-pull part inline.
                    depth = high_end - play
                    low = self._window_min_depth
                    if low is None or depth < low:
                        self._window_min_depth = depth
                    self._window_count += 1
                    if self._window_count >= self._window_pulls:
                        self._adapt_window()
                    self._played += 1
                    self._conceal_run = 0
                    self._last = out
                    return JitterFrame(out, "audio", play & 0xFFFFFFFF)
        return self._pull_any()

    def _pull_any(self) -> JitterFrame:
        """:meth:`pull` in every case (priming, concealment, adaptation, overlapping or
        partial packets)."""
        if self._play is None:
            if not self._keys or self._high_end is None:
                return self._emit_silence(None)
            if self._high_end - self._keys[0] < self._target:
                return self._emit_silence(None)
            self._play = self._keys[0]
        if self._hold:
            self._hold -= 1
            return self._emit_conceal()

        play = self._play
        f = self.frame
        # Too deep (e.g. the consumer stalled): jump to the target depth at once.
        if self._high_end is not None and self._high_end - play > self._max + f:
            new_play = self._high_end - self._target
            self._dropped += (new_play - play) // f
            play = new_play
        stop = play + f
        out: Int16Array | None = None
        covered = 0
        i = bisect.bisect_right(self._keys, play) - 1
        i = max(i, 0)
        while i < len(self._keys) and self._keys[i] < stop:
            start = self._keys[i]
            pcm = self._frames[start]
            lo, hi = max(start, play), min(start + len(pcm), stop)
            if hi > lo:
                if lo == play and hi == stop and out is None:
                    out = pcm[lo - start : hi - start]
                    covered = f
                else:
                    if out is None:
                        out = np.zeros(f, dtype=np.int16)
                    elif not out.flags.writeable or out.base is not None:
                        out = out.copy()
                    out[lo - play : hi - play] = pcm[lo - start : hi - start]
                    covered += hi - lo
            i += 1
        self._play = stop
        # Drop everything that is now entirely in the past.
        while self._keys and self._keys[0] + len(self._frames[self._keys[0]]) <= stop:
            del self._frames[self._keys.pop(0)]
        self._adapt(play)
        ts = play & 0xFFFFFFFF
        if out is None or covered == 0:
            return self._emit_conceal(ts)
        self._played += 1
        self._conceal_run = 0
        self._last = out
        return JitterFrame(out, "audio", ts)

    def _emit_silence(self, ts: int | None) -> JitterFrame:
        self._silent += 1
        return JitterFrame(self._silence, "silence", ts)

    def _emit_conceal(self, ts: int | None = None) -> JitterFrame:
        k = self._conceal_run
        self._conceal_run += 1
        if self._last is None or k >= self._plc_frames:
            return self._emit_silence(ts)
        n = self._plc_frames * self.frame
        pos = np.arange(k * self.frame, (k + 1) * self.frame, dtype=np.float64)
        gain = 1.0 - pos / n
        self._concealed += 1
        pcm = np.rint(self._last.astype(np.float64) * gain).astype(np.int16)
        return JitterFrame(pcm, "concealed", ts)

    def _adapt(self, play: int) -> None:
        depth = (self._high_end or play) - play
        if self._window_min_depth is None or depth < self._window_min_depth:
            self._window_min_depth = depth
        self._window_count += 1
        if self._window_count >= self._window_pulls:
            self._adapt_window()

    def _adapt_window(self) -> None:
        """Once per adaptation window (a second of pulls): lower the target and cut a frame
        of latency if nothing was late (see the module docstring)."""
        if self.adaptive and not self._window_late:
            wanted = max(self._min, int(3 * self._jitter) + self.frame)
            if self._target > wanted:
                self._target = max(self._target - self.frame, wanted)
            if (
                self._window_min_depth is not None
                and self._window_min_depth > self._target + self.frame
                and self._play is not None
            ):
                self._play += self.frame  # cut one frame of latency
                self._dropped += 1
        self._window_count = 0
        self._window_min_depth = None
        self._window_late = False

    # -- stats -----------------------------------------------------------------------------
    @property
    def depth_samples(self) -> int:
        if self._high_end is None:
            return 0
        if self._play is None:
            return self._high_end - self._keys[0] if self._keys else 0
        return max(self._high_end - self._play, 0)

    @property
    def target_ms(self) -> float:
        return self._target / self._ms

    def stats(self) -> JitterStats:
        expected = self._expected_prev_sources + self._seq.expected
        return JitterStats(
            received=self._received,
            expected=expected,
            lost=self._lost_prev_sources + self._lost_source(),
            late=self._late,
            duplicate=self._dup,
            reordered=self._reordered,
            depth_ms=self.depth_samples / self._ms,
            target_ms=self.target_ms,
            jitter=self._jitter,
            jitter_ms=self._jitter / self._ms,
            played=self._played,
            concealed=self._concealed,
            silent=self._silent,
            dropped=self._dropped,
            resyncs=self._resyncs,
        )
