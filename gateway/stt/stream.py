"""Streaming speech-to-text for a call: caller frames in (an agent's ``caller_audio(16000)``),
partial and final transcripts out, with the recognition itself off the event loop in a small
shared pool.

Reading frames never waits for recognition: the reader feeds the segmenter and queues jobs; one
job runs at a time per call. A partial that is still queued when a newer one (or the final)
arrives is dropped, so a slow engine costs captions, never audio or memory."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import numpy as np

from gateway.stt.base import SpeechToText
from gateway.stt.segmenter import (
    RATE,
    Final,
    Int16Array,
    Partial,
    Pause,
    SegmenterConfig,
    SpeechSegmenter,
)

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def stt_pool(workers: int = 1) -> ThreadPoolExecutor:
    """The process-wide pool recognition runs in (bounded: the engine uses its own threads)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stt")
        return _pool


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    kind: Literal["partial", "final"]
    text: str
    start_ms: float  # media time of the utterance's start (caller audio clock)
    end_ms: float  # its end (finals), or how far the partial reaches
    compute_s: float


class EventPump(abc.ABC, Generic[T]):
    """An async iterator fed by a background task that starts on first use: ``_run`` puts
    events on ``_out``, then None once it is done; ``aclose`` stops it early."""

    def __init__(self) -> None:
        self._out: asyncio.Queue[T | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def __aiter__(self) -> EventPump[T]:
        return self

    async def __anext__(self) -> T:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        ev = await self._out.get()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @abc.abstractmethod
    async def _run(self) -> None:
        """Produce the events (ending with None on ``_out``)."""


class StreamingTranscriber(EventPump["TranscriptEvent"]):
    """``async for event in StreamingTranscriber(stt, frames)``: ends after the frames end and
    the last final is out."""

    def __init__(
        self,
        stt: SpeechToText,
        frames: AsyncIterator[Int16Array],
        config: SegmenterConfig | None = None,
        *,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.stt = stt
        self.segmenter = SpeechSegmenter(config)
        self._frames = frames
        self._pool = pool or stt_pool()
        super().__init__()
        self._jobs: list[Partial | Final] = []
        self._wake = asyncio.Event()
        self._eof = False
        self.dropped_partials = 0

    async def _run(self) -> None:
        worker = asyncio.get_running_loop().create_task(self._work())
        try:
            async for frame in self._frames:
                for ev in self.segmenter.feed(frame):
                    self._queue(ev)
            for ev in self.segmenter.flush():
                self._queue(ev)
        finally:
            self._eof = True
            self._wake.set()
            await worker
            await self._out.put(None)

    def _queue(self, ev: Partial | Pause | Final) -> None:
        if isinstance(ev, Pause):
            return  # captions need no eager transcript
        # Only the newest partial is worth recognising; a final makes queued partials moot.
        kept = [j for j in self._jobs if isinstance(j, Final)]
        self.dropped_partials += len(self._jobs) - len(kept)
        self._jobs = [*kept, ev]
        self._wake.set()

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._jobs:
                if self._eof:
                    return
                self._wake.clear()
                await self._wake.wait()
            job = self._jobs.pop(0)
            audio = job.audio.astype(np.float32) / 32768.0
            result = await loop.run_in_executor(self._pool, self.stt.transcribe, audio)
            start_ms = job.start * 1000 / RATE
            if isinstance(job, Final) and result.text:  # noise that passed the VAD: no turn
                end_ms = job.end * 1000 / RATE
                await self._out.put(TranscriptEvent(
                    "final", result.text, start_ms, end_ms, result.compute_s
                ))  # fmt: skip
            elif result.text:
                end_ms = start_ms + job.audio.size * 1000 / RATE
                await self._out.put(TranscriptEvent(
                    "partial", result.text, start_ms, end_ms, result.compute_s
                ))  # fmt: skip
