"""Agent audio playout for one call: the sans-I/O join between the bus and the RTP pacer.

Bus messages go in with ``on_message``; the pacer takes exactly one frame of PCM per tick with
``pull(n)``. The rules (the bus contract, voxgate/contract/bus/schema.py):
- utterances play in the order they were queued; a chunk plays only if its utterance is known and
  not stopped, and its ``seq`` is the next one expected — an earlier seq (a claimed request being
  re-rendered from the start by another worker) is dropped, a later one held until the gap fills;
- after an interrupt, the audio already queued fades to zero with a cosine ramp over at most
  ``fade_samples`` (10 ms: no click, no splatter), everything else of that utterance is dropped,
  and its late chunks are discarded as they arrive;
- when the worker is late the call sends silence, never a burst; an underrun is counted only
  while an utterance is playing (it started and has not ended).

Media time is an integer sample count at ``rate``. No clock, no I/O: every effect is returned
as a ``PlayoutEvent`` from ``on_message``/``pull``/``interrupt``, for the call to act on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dsp.fades import fade_out_gain
from voxgate.contract.bus.schema import AudioChunk, AudioMessage, UtteranceEnd, UtteranceError, Word

Int16Array = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class PlayoutStarted:
    utterance_id: str


@dataclass(frozen=True, slots=True)
class PlayoutFinished:
    utterance_id: str
    outcome: str  # done | interrupted | cancelled | error
    heard: tuple[str, ...]  # words whose audio was fully played
    played_samples: int
    error: str | None = None


PlayoutEvent = PlayoutStarted | PlayoutFinished


@dataclass
class _Utterance:
    id: str
    text: str
    next_seq: int = 0
    held: dict[int, AudioChunk] = field(default_factory=dict)  # out-of-order chunks by seq
    audio: deque[Int16Array] = field(default_factory=deque)
    queued: int = 0  # samples in ``audio``
    words: list[Word] = field(default_factory=list)
    played: int = 0
    started: bool = False
    ended: bool = False  # the worker sent end (or error)
    error: str | None = None
    end_reason: str = "done"


@dataclass
class PlayoutStats:
    frames: int = 0
    speech_frames: int = 0
    underruns: int = 0  # frames of silence sent while an utterance was playing
    dropped_chunks: int = 0  # stale seq, stopped utterance, or unknown utterance
    interrupted: int = 0
    dropped_samples: int = 0  # queued audio dropped to bound the queue (drop_oldest)


class Playout:
    def __init__(self, rate: int = 8000, fade_ms: float = 10.0) -> None:
        self.rate = rate
        self.fade_samples = max(1, round(rate * fade_ms / 1000))
        self._queue: deque[_Utterance] = deque()
        self._by_id: dict[str, _Utterance] = {}
        self._stopped: set[str] = set()
        self._fade: Int16Array | None = None  # a faded tail still to be sent
        self.stats = PlayoutStats()

    # --- queueing ------------------------------------------------------------------------
    def enqueue(self, utterance_id: str, text: str = "") -> None:
        """Announce an utterance (before its request goes to the bus) so its chunks are kept."""
        if utterance_id in self._by_id or utterance_id in self._stopped:
            raise ValueError(f"utterance {utterance_id!r} already queued")
        u = _Utterance(utterance_id, text)
        self._queue.append(u)
        self._by_id[utterance_id] = u

    @property
    def current(self) -> str | None:
        return self._queue[0].id if self._queue else None

    @property
    def speaking(self) -> bool:
        """Agent audio is audible now (playing, or fading out)."""
        if self._fade is not None:
            return True
        return bool(self._queue) and self._queue[0].started

    def silent_since_enqueued(self, utterance_id: str) -> bool:
        """Queued, and nothing has come for it from the worker yet (no chunk, no end)."""
        u = self._by_id.get(utterance_id)
        return u is not None and not u.ended and u.next_seq == 0 and not u.held

    def pending_ids(self) -> list[str]:
        return [u.id for u in self._queue]

    @property
    def queued_samples(self) -> int:
        """Audio queued and not yet played, over every utterance (a bridged bot that sends
        faster than real time builds this up; see :meth:`drop_oldest`)."""
        return sum(u.queued for u in self._queue)

    def drop_oldest(self, n: int) -> int:
        """Drop up to ``n`` of the oldest queued samples, in play order, without ending any
        utterance (one that has ended and is left empty finishes on the next pull). Bounds
        what a source sending faster than real time can queue; returns the samples dropped."""
        dropped = 0
        for u in self._queue:
            while u.audio and dropped < n:
                head = u.audio[0]
                k = min(n - dropped, len(head))
                if k == len(head):
                    u.audio.popleft()
                else:
                    u.audio[0] = head[k:]
                u.queued -= k
                dropped += k
            if dropped >= n:
                break
        self.stats.dropped_samples += dropped
        return dropped

    # --- bus side ------------------------------------------------------------------------
    def on_message(self, msg: AudioMessage) -> list[PlayoutEvent]:
        u = self._by_id.get(msg.utterance_id)
        if u is None:
            self.stats.dropped_chunks += isinstance(msg, AudioChunk)
            return []
        if isinstance(msg, AudioChunk) and msg.rate != self.rate:
            # Audio at another rate would play too fast or too slow (a worker configured with
            # another wideband rate): end the utterance with an error rather than garble it.
            self.stats.dropped_chunks += 1
            if u.ended:
                return []
            u.ended = True
            u.error = f"rate_mismatch: audio at {msg.rate} Hz on a {self.rate} Hz call"
            u.end_reason = "error"
            return self._advance()
        if isinstance(msg, AudioChunk):
            if msg.seq < u.next_seq:
                self.stats.dropped_chunks += 1
                return []
            u.held[msg.seq] = msg
            while u.next_seq in u.held:
                chunk = u.held.pop(u.next_seq)
                u.next_seq += 1
                pcm = np.frombuffer(chunk.data, "<i2").astype(np.int16)
                if len(pcm):
                    u.audio.append(pcm)
                    u.queued += len(pcm)
                u.words.extend(chunk.words)
            return []
        u.ended = True
        if isinstance(msg, UtteranceError):
            u.error = f"{msg.code}: {msg.message}"
            u.end_reason = "error"
        elif isinstance(msg, UtteranceEnd) and msg.reason != "done":
            u.end_reason = msg.reason
        return self._advance()

    # --- pacer side ----------------------------------------------------------------------
    def pull(self, n: int) -> tuple[Int16Array, list[PlayoutEvent]]:
        """The next ``n`` samples to send (silence where there is no agent audio)."""
        stats = self.stats
        queue = self._queue
        if self._fade is None:
            # The two cases of almost every tick, without the general loop: nothing queued
            # (the agent is quiet), or the playing utterance's head chunk holds more than a
            # frame (nothing starts, ends or runs short on this tick).
            if not queue:
                stats.frames += 1
                return np.zeros(n, np.int16), []
            u = queue[0]
            if u.started and u.audio:
                head = u.audio[0]
                if len(head) > n:
                    stats.frames += 1
                    stats.speech_frames += 1
                    u.audio[0] = head[n:]
                    u.queued -= n
                    u.played += n
                    return head[:n].copy(), []
        return self._pull_any(n)

    def _pull_any(self, n: int) -> tuple[Int16Array, list[PlayoutEvent]]:
        """:meth:`pull` in every case (a fade, an utterance starting, ending or short of audio,
        a frame spanning chunks); the tests hold the fast cases to it."""
        out = np.zeros(n, np.int16)
        events: list[PlayoutEvent] = []
        filled = 0
        self.stats.frames += 1
        if self._fade is not None:
            k = min(n, len(self._fade))
            out[:k] = self._fade[:k]
            self._fade = self._fade[k:] if k < len(self._fade) else None
            filled = k
        while filled < n and self._queue:
            u = self._queue[0]
            if not u.audio:
                if u.ended:
                    events += self._finish(self._queue.popleft())
                    continue
                if u.started:
                    self.stats.underruns += 1
                break
            if not u.started:
                u.started = True
                events.append(PlayoutStarted(u.id))
            head = u.audio[0]
            k = min(n - filled, len(head))
            out[filled : filled + k] = head[:k]
            if k == len(head):
                u.audio.popleft()
            else:
                u.audio[0] = head[k:]
            u.queued -= k
            u.played += k
            filled += k
        if filled:
            self.stats.speech_frames += 1
        # An utterance that has just ended with nothing left finishes on this tick.
        events += self._advance()
        return out, events

    def interrupt(self, *, clear_queue: bool = True) -> list[PlayoutEvent]:
        """Stop the playing utterance now: fade its next ``fade_samples`` to zero, drop the rest.

        With ``clear_queue`` the utterances waiting behind it are dropped too (barge-in);
        otherwise the next one starts after the fade. Returns their ``PlayoutFinished`` events;
        the caller cancels them on the bus.
        """
        events: list[PlayoutEvent] = []
        if self._queue:
            u = self._queue.popleft()
            if u.started and u.audio:
                tail = np.concatenate(list(u.audio))[: self.fade_samples].astype(np.float64)
                faded = tail * fade_out_gain(self.fade_samples, 0, len(tail))
                self._fade = np.round(faded).astype(np.int16)
                u.played += len(tail)
            events += self._finish(u, "interrupted" if u.started else "cancelled")
            self.stats.interrupted += 1
        while clear_queue and self._queue:
            events += self._finish(self._queue.popleft(), "cancelled")
        return events

    def cancel(self, utterance_id: str) -> list[PlayoutEvent]:
        """Drop one utterance (playing: as ``interrupt`` without clearing the queue)."""
        if self._queue and self._queue[0].id == utterance_id:
            return self.interrupt(clear_queue=False)
        for u in list(self._queue):
            if u.id == utterance_id:
                self._queue.remove(u)
                return self._finish(u, "cancelled")
        return []

    # --- internals -----------------------------------------------------------------------
    def _advance(self) -> list[PlayoutEvent]:
        events: list[PlayoutEvent] = []
        while self._queue and self._queue[0].ended and not self._queue[0].audio:
            events += self._finish(self._queue.popleft())
        return events

    def _finish(self, u: _Utterance, outcome: str | None = None) -> list[PlayoutEvent]:
        self._by_id.pop(u.id, None)
        self._stopped.add(u.id)
        if outcome is None:
            outcome = "error" if u.error else ("done" if u.end_reason == "done" else "cancelled")
        heard = tuple(w.word for w in u.words if w.end <= u.played)
        return [PlayoutFinished(u.id, outcome, heard, u.played, u.error)]
