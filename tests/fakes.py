"""Stand-ins that isolate one layer in unit tests (the real parts have their own suites)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from synth.engines.base import EngineChunk, FloatArray, WordMark


class ToneEngine:
    """A stand-in engine isolating the worker layer: a 440 Hz tone, one chunk per word.

    ``step_s`` sleeps per chunk to emulate decode time; ``fail_on`` raises for matching text.
    """

    name = "tone"
    voice = "tone-voice"
    sample_rate = 16000

    def __init__(
        self,
        step_s: float = 0.0,
        samples_per_word: int = 1600,
        fail_on: str = "",
        warmup_s: float = 0.0,
    ) -> None:
        self.step_s = step_s
        self.samples_per_word = samples_per_word
        self.fail_on = fail_on
        self.warmup_s = warmup_s
        self.warmed = False
        self.chunks_made = 0

    def warmup(self) -> None:
        import time

        time.sleep(self.warmup_s)
        self.warmed = True

    def _tone(self, n: int, start: int) -> FloatArray:
        t = (np.arange(n) + start) / self.sample_rate
        return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)

    def stream(
        self, text: str, should_stop: Callable[[], bool] | None = None, *, urgent: bool = True
    ) -> Iterator[EngineChunk]:
        import time

        if self.fail_on and self.fail_on in text:
            raise RuntimeError("engine exploded")
        words = text.split()
        off = 0
        for i, w in enumerate(words):
            if should_stop is not None and should_stop():
                return
            time.sleep(self.step_s)
            self.chunks_made += 1
            n = self.samples_per_word
            yield EngineChunk(
                self._tone(n, off),
                off,
                final=i == len(words) - 1,
                words=(WordMark(w, off, off + n),),
            )
            off += n

    def synthesize(self, text: str) -> FloatArray:
        return np.concatenate([c.audio for c in self.stream(text)])
