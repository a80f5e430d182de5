"""What a conversational agent hears: the caller's audio in, live partial transcripts and
finished turns out.

    caller_audio(16 kHz, echo-gated) ─▶ SpeechSegmenter (webrtcvad)
        Partial every partial_every_ms ──▶ STT ──▶ CallerPartial (captions; dropped when busy)
        Pause at 60 ms of silence ───────▶ STT + end-of-turn model, started early (eager)
        Final at turn.min_silence_ms ────▶ (the eager result when nothing more was said)
                                            ──▶ complete? ──▶ CallerTurn
                                            └─ not yet: wait for more speech, or for
                                               turn.max_silence_ms of silence ──▶ CallerTurn

End of turn is VAD silence plus the semantic end-of-turn model (smart-turn v3): after
``min_silence_ms`` the model is asked whether the words so far sound finished ("I'd like to
pay my bill" vs "I'd like to pay my bill and…"); when it says not yet, the turn waits for
more speech up to ``max_silence_ms`` of silence. Recognition for the final transcript starts at
the first 60 ms pause (the segment's audio is then already what the final will carry), so the
recogniser runs while the silence that ends the turn is still being waited for.

All CPU work (recogniser, end-of-turn model) runs off the event loop in the shared STT pool,
one job at a time per call; a partial that is still waiting when a newer one comes is dropped,
so a slow recogniser costs captions, never audio, turns or memory. Silence is counted on the
media clock (frames received), not the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np

from gateway.stt.base import SpeechToText
from gateway.stt.segmenter import (
    FRAME,
    RATE,
    TAIL_FRAMES,
    Final,
    Int16Array,
    Partial,
    Pause,
    SegmenterConfig,
    SpeechSegmenter,
)
from gateway.stt.stream import EventPump, stt_pool
from gateway.stt.turn import EndOfTurnModel
from voxgate.contract.config import TurnConfig

log = logging.getLogger("voxgate.agents")
_T = TypeVar("_T")

# Recognition jobs queued or running in the shared pool, over all calls: captions are only
# worth the CPU when nothing else waits (a caption must never delay another call's turn).
_busy = 0

_pools: dict[str, ThreadPoolExecutor] = {}


def _named_pool(name: str) -> ThreadPoolExecutor:
    pool = _pools.get(name)
    if pool is None:
        pool = _pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    return pool


def turn_pool() -> ThreadPoolExecutor:
    """The end-of-turn model's thread (one prediction at a time; ~60 ms each)."""
    return _named_pool("turn")


def caption_pool() -> ThreadPoolExecutor:
    """Live captions' thread: beside the turns' recognition, never in front of it."""
    return _named_pool("caption")


# The end-of-turn model judges a pause: smart-turn was trained on turns followed by ~200 ms of
# silence (pipecat asks it at VAD stop_secs 0.2) and calls cut-off phrases complete when it gets
# less. A segment carries ~60-110 ms of tail; this quiet makes up the rest (measured: a cut
# sentence went from p 0.66 to below 0.2 with it).
_QUIET = np.zeros(int(0.14 * RATE), dtype=np.int16)

# The end-of-turn model looks at the last 8 s of the turn; keep a little more.
TURN_AUDIO_S = 10
PARTIAL_EVERY_MS = 1000


@dataclass(frozen=True, slots=True)
class CallerPartial:
    text: str
    start_ms: float  # media time (caller audio clock) of the utterance's start


@dataclass(frozen=True, slots=True)
class CallerTurn:
    text: str
    start_ms: float
    end_ms: float  # media time just after the caller's last speech frame
    # What ended it: the model said finished ("model"), silence alone ("silence": no model, or
    # max_silence_ms passed with the model saying not yet), a monologue cut at
    # turn.max_segment_s ("cut"), or the call ended mid-turn ("hangup").
    reason: Literal["model", "silence", "cut", "hangup"]
    probability: float | None  # the model's last "finished" probability
    stt_s: float  # recogniser compute for the final transcript(s)
    eot_s: float  # end-of-turn model compute
    decided_at: float = field(default_factory=time.time)  # wall clock of the decision


HeardEvent = CallerPartial | CallerTurn


@dataclass(slots=True)
class _Recognised:
    text: str
    stt_s: float
    complete: bool | None  # None: no model
    probability: float | None
    eot_s: float
    context: tuple[int, int] = (0, 0)  # the turn (sequence, samples) the verdict heard first


@dataclass(slots=True)
class _Turn:
    """The caller's turn so far: segments heard, waiting for the end of the turn."""

    texts: list[str] = field(default_factory=list)
    audio: list[Int16Array] = field(default_factory=list)
    start: int = 0
    end: int = 0
    stt_s: float = 0.0
    eot_s: float = 0.0
    probability: float | None = None

    def samples(self) -> int:
        return sum(a.size for a in self.audio)

    def add_audio(self, audio: Int16Array) -> None:
        self.audio.append(audio)
        # Bounded: only the end of a long turn matters to the model.
        while self.samples() - self.audio[0].size >= TURN_AUDIO_S * RATE:
            self.audio.pop(0)


def segmenter_config(cfg: TurnConfig) -> SegmenterConfig:
    return SegmenterConfig(
        aggressiveness=cfg.vad_aggressiveness,
        min_silence_ms=cfg.min_silence_ms,
        partial_every_ms=PARTIAL_EVERY_MS,
        max_segment_s=cfg.max_segment_s,
        pause_ms=TAIL_FRAMES * 20 if cfg.min_silence_ms > TAIL_FRAMES * 20 else 0,
    )


class Hearing(EventPump[HeardEvent]):
    """``async for event in Hearing(frames, stt, model, cfg)``: CallerPartial and CallerTurn
    events until the frames end (the call did) and the last turn is out."""

    def __init__(
        self,
        frames: AsyncIterator[Int16Array],
        stt: SpeechToText,
        model: EndOfTurnModel | None,
        cfg: TurnConfig,
        *,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.stt = stt
        self.model = model if cfg.smart_turn else None
        self.cfg = cfg
        self.segmenter = SpeechSegmenter(segmenter_config(cfg))
        self._frames = frames
        self._pool = pool or stt_pool()
        super().__init__()
        # Finals in order, each with its recognition job (eager or not).
        self._finals: asyncio.Queue[tuple[Final, asyncio.Future[_Recognised]] | None] = (
            asyncio.Queue()
        )
        self._eager: dict[tuple[int, int], asyncio.Future[_Recognised]] = {}
        self._partial: Partial | None = None
        self._partial_busy = False
        self._turn: _Turn | None = None  # waiting for more speech or max_silence
        self._turn_seq = 0  # which turn _turn is (a verdict names the turn it heard)
        self._pending = 0  # finals queued, not yet decided
        self._gate = asyncio.Lock()  # one recognition job at a time per call
        self.dropped_partials = 0
        self.turns = 0
        self.errors = 0

    @property
    def buffered_samples(self) -> int:
        """Audio held for the turn in progress (bounded: tests hold it to that)."""
        turn = self._turn.samples() if self._turn is not None else 0
        return self.segmenter.buffered_samples + turn

    # --- the frame side ------------------------------------------------------------------
    async def _run(self) -> None:
        decider = asyncio.get_running_loop().create_task(self._decide())
        try:
            async for frame in self._frames:
                for ev in self.segmenter.feed(frame):
                    self._on_segment(ev)
                self._check_max_silence()
            for ev in self.segmenter.flush():
                self._on_segment(ev)
        finally:
            await self._finals.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await decider
            await self._out.put(None)

    def _on_segment(self, ev: Partial | Pause | Final) -> None:
        if isinstance(ev, Partial):
            if self._partial_busy or self._gate.locked() or _busy:
                self.dropped_partials += 1  # captions only: never queue them before turns
                return
            self._partial_busy = True
            asyncio.get_running_loop().create_task(self._caption(ev))
        elif isinstance(ev, Pause):
            # New speech since an earlier pause makes that one's job moot.
            for key, fut in list(self._eager.items()):
                if key[0] == ev.start:
                    fut.cancel()
                    del self._eager[key]
            self._eager[(ev.start, ev.end)] = self._recognise(ev.audio)
        else:
            job = self._eager.pop((ev.start, ev.end), None)
            for fut in self._eager.values():
                fut.cancel()
            self._eager.clear()
            self._pending += 1
            self._finals.put_nowait((ev, job or self._recognise(ev.audio)))

    def _check_max_silence(self) -> None:
        turn = self._turn
        # Speech still being recognised is the caller talking, not silence.
        if turn is None or self.segmenter.speaking or self._pending:
            return
        silence = self.segmenter.pos - turn.end
        if silence * 1000 >= self.cfg.max_silence_ms * RATE:
            self._emit_turn("silence")

    # --- recognition (off the loop) ------------------------------------------------------
    def _context(self) -> tuple[int, int]:
        return (self._turn_seq, self._turn.samples()) if self._turn is not None else (0, 0)

    def _recognise(self, audio: Int16Array) -> asyncio.Future[_Recognised]:
        before = list(self._turn.audio) if self._turn is not None else []
        return asyncio.ensure_future(self._job(audio, before, self._context()))

    async def _job(
        self, audio: Int16Array, before: list[Int16Array], context: tuple[int, int]
    ) -> _Recognised:
        whole = np.concatenate([*before, audio, _QUIET])
        async with self._gate:
            # The recogniser and the end-of-turn model at once, on their own threads: the
            # turn's decision waits for the slower of the two, not for both in a row.
            x = audio.astype(np.float32) / 32768.0
            loop = asyncio.get_running_loop()
            model = self.model
            verdict = (
                loop.run_in_executor(turn_pool(), model.predict, whole.astype(np.float32) / 32768.0)
                if model is not None
                else None
            )
            try:
                result = await self._in_pool(self.stt.transcribe, x)
            finally:
                v = await verdict if verdict is not None else None
        if v is None or not result.text:
            rec = _Recognised(result.text, result.compute_s, None, None, 0.0)
        else:
            rec = _Recognised(result.text, result.compute_s, v.complete, v.probability, v.compute_s)
        rec.context = context
        return rec

    async def _reverdict(self, final: Final, rec: _Recognised) -> None:
        """The verdict was given on a turn that has changed since (an earlier phrase was
        still being recognised): ask again with the turn as it is now."""
        if self.model is None or not rec.text or rec.context == self._context():
            return
        before = self._turn.audio if self._turn is not None else []
        whole = np.concatenate([*before, final.audio, _QUIET])
        x = whole.astype(np.float32) / 32768.0
        async with self._gate:
            loop = asyncio.get_running_loop()
            verdict = await loop.run_in_executor(turn_pool(), self.model.predict, x)
        rec.complete, rec.probability = verdict.complete, verdict.probability
        rec.eot_s += verdict.compute_s

    async def _in_pool(self, fn: Callable[..., _T], *args: object) -> _T:
        global _busy
        _busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            _busy -= 1

    async def _caption(self, p: Partial) -> None:
        try:
            # Its own thread (and its own decoder worker in the recogniser), outside the call's
            # gate: a caption still decoding when the caller stops must not hold up the turn.
            x = p.audio.astype(np.float32) / 32768.0
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(caption_pool(), self.stt.transcribe, x)
            if result.text:
                await self._out.put(CallerPartial(result.text, p.start * 1000 / RATE))
        except Exception:
            log.exception("speech-to-text failed on a partial")
            self.errors += 1
        finally:
            self._partial_busy = False

    # --- turn decisions, in order --------------------------------------------------------
    async def _decide(self) -> None:
        while (item := await self._finals.get()) is not None:
            final, job = item
            if job.cancelled():
                job = self._recognise(final.audio)
            try:
                rec = await job
                await self._reverdict(final, rec)
            except Exception:
                # A failing recogniser loses this utterance, not the call's hearing.
                log.exception("speech-to-text failed on a %.1f s utterance",
                              final.audio.size / RATE)  # fmt: skip
                self.errors += 1
                continue
            finally:
                self._pending -= 1
            self._on_final(final, rec)
        if self._turn is not None:
            self._emit_turn("hangup")

    def _on_final(self, final: Final, rec: _Recognised) -> None:
        if not rec.text:
            # Noise that passed the VAD, or silence: no turn (a waiting turn keeps waiting).
            return
        turn = self._turn
        if turn is None:
            turn = self._turn = _Turn(start=final.start)
            self._turn_seq += 1
        turn.texts.append(rec.text)
        turn.add_audio(final.audio)
        turn.end = final.end
        turn.stt_s += rec.stt_s
        turn.eot_s += rec.eot_s
        turn.probability = rec.probability
        if final.cut:
            self._emit_turn("cut")
        elif rec.complete is None:
            self._emit_turn("silence")
        elif rec.complete:
            self._emit_turn("model")
        # else: not finished yet; more speech joins this turn, or max_silence_ms ends it.
        elif not self.segmenter.speaking:
            self._check_max_silence()

    def _emit_turn(self, reason: Literal["model", "silence", "cut", "hangup"]) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        self.turns += 1
        self._out.put_nowait(CallerTurn(
            " ".join(turn.texts), turn.start * 1000 / RATE, turn.end * 1000 / RATE, reason,
            turn.probability, turn.stt_s, turn.eot_s,
        ))  # fmt: skip


__all__ = ["FRAME", "CallerPartial", "CallerTurn", "HeardEvent", "Hearing", "segmenter_config"]
