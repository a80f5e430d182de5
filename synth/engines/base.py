"""The engine interface every TTS engine implements (onnx and torch share it).

Engines are synchronous and single-utterance-at-a-time per ``stream()`` generator; the worker
drives several generators at once from a thread pool, stepping each one chunk at a time so a long
utterance never blocks another call's first audio. Audio is float32 mono in [-1, 1] at
``engine.sample_rate``; the worker's DSP turns it into the requested output profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class WordMark:
    """A word of the spoken text and where it lies in the utterance's audio.

    ``start``/``end`` are sample offsets at the engine rate, counted from the first sample of the
    text passed to ``stream()``. Barge-in uses these to tell the agent which words were heard.
    """

    word: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class EngineChunk:
    """One piece of streamed audio.

    ``offset`` is the sample index of ``audio[0]`` within the utterance; ``words`` are the marks
    that start inside this chunk; ``final`` is set on the last chunk of the call to ``stream()``.
    """

    audio: FloatArray
    offset: int
    final: bool = False
    words: tuple[WordMark, ...] = field(default_factory=tuple)


class EngineError(Exception):
    """Input the engine cannot speak (e.g. text with no pronounceable content)."""


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int
    voice: str

    def warmup(self) -> None:
        """Run silent inputs through every graph and chunk shape used by ``stream``."""

    def stream(
        self,
        text: str,
        should_stop: Callable[[], bool] | None = None,
        *,
        urgent: bool = True,
    ) -> Iterator[EngineChunk]:
        """Synthesize already-normalized ``text`` in growing chunks.

        ``should_stop`` is polled between chunks; when it returns True the generator ends early
        (its last chunk is then not ``final``). Concatenating the chunks' audio equals
        ``synthesize(text)`` (within the engine's documented tolerance). ``urgent=False`` says
        nobody waits for this text's first audio yet (a later piece of an utterance already
        playing): the engine may start with large, cheaper chunks.
        """
        ...

    def synthesize(self, text: str) -> FloatArray:
        """One-shot twin of ``stream``: the whole utterance at once (the latency baseline)."""
        ...


WarmStep = Callable[[], None]


@runtime_checkable
class StagedWarmup(Protocol):
    """An engine whose warm-up splits into what the first request needs and the rest.

    A worker runs ``first`` before it reports ready and ``rest`` in the background afterwards
    (one step at a time, between requests), so a fresh worker takes calls within a second or
    two instead of after the whole warm-up. Running both equals ``Engine.warmup``.
    """

    def warmup_steps(self) -> tuple[list[WarmStep], list[WarmStep]]: ...
