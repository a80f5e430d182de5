"""Turning one speak request into output-profile audio, one chunk per ``step()``.

This is the synchronous, I/O-free core of the worker: text frontend → chunker → engine stream →
telephone or wideband DSP → s16le bytes. The worker calls ``step()`` on a pool thread and
publishes what it returns; tests drive it directly. ``whole=True`` renders each text piece in one
engine call (the non-streaming baseline the benchmark compares against).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dsp.pcm import float_to_s16le_bytes
from dsp.telephone import TelephoneChain
from dsp.wideband import WidebandChain
from synth.engines.base import Engine, EngineChunk, FloatArray, WordMark
from synth.text.normalize import normalize
from voxgate.contract.bus.schema import Profile, Word
from voxgate.contract.chunker import chunk_text

NARROWBAND_RATE = 8000


class RenderError(ValueError):
    """The request cannot be spoken; ``code`` is one of the schema's ERR_* codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Rendered:
    data: bytes  # s16le at ``rate``
    offset: int  # output sample index of data[0] within the utterance
    words: tuple[Word, ...]
    final: bool
    compute_s: float  # wall time spent producing it (engine + DSP)


# Spoken text may be this many times longer than the request's character limit (numbers read
# digit by digit expand ~5x); past that a request is rejected instead of talking for an hour.
SPOKEN_EXPANSION = 3

# C0/C1 controls (but tab and newline), and bidi/zero-width format characters: never speakable,
# and NUL crashes espeak's C API. Replaced by spaces so words on either side stay apart.
_UNSPEAKABLE = {
    c: " " for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0)]
}
_UNSPEAKABLE.update(
    {
        c: None
        for c in [
            0x200B,
            0x200C,
            0x200D,
            0x2060,
            0xFEFF,
            *range(0x202A, 0x202F),
            *range(0x2066, 0x206A),
        ]
    }
)


def prepare_text(text: str, *, raw: bool, max_chars: int) -> list[str]:
    """Validate, normalize and chunk request text; raise RenderError with a stable code."""
    from voxgate.contract.bus.schema import ERR_EMPTY_TEXT, ERR_TEXT_TOO_LONG

    if len(text) > max_chars:
        raise RenderError(
            ERR_TEXT_TOO_LONG, f"text is {len(text)} characters; the limit is {max_chars}"
        )
    text = text.translate(_UNSPEAKABLE)
    spoken = text if raw else normalize(text)
    if len(spoken) > SPOKEN_EXPANSION * max_chars:
        raise RenderError(
            ERR_TEXT_TOO_LONG,
            f"text expands to {len(spoken)} characters when spoken; the limit is "
            f"{SPOKEN_EXPANSION * max_chars} ({SPOKEN_EXPANSION} x {max_chars})",
        )
    pieces = [p for p in chunk_text(spoken) if any(c.isalnum() for c in p)]
    if not pieces:
        raise RenderError(ERR_EMPTY_TEXT, "text has nothing to speak")
    return pieces


class Renderer:
    """Render ``pieces`` (already normalized and chunked) with ``engine`` into ``profile`` audio."""

    def __init__(
        self,
        engine: Engine,
        pieces: list[str],
        profile: Profile,
        *,
        eq_gain_db: float = 2.0,
        wideband_rate: int = 48000,
        whole: bool = False,
    ) -> None:
        self.engine = engine
        self.profile = profile
        self.rate = NARROWBAND_RATE if profile == "narrowband" else wideband_rate
        self._chain: TelephoneChain | WidebandChain = (
            TelephoneChain(engine.sample_rate, eq_gain_db=eq_gain_db)
            if profile == "narrowband"
            else WidebandChain(engine.sample_rate, out_rate=wideband_rate)
        )
        self._chunks = self._engine_chunks(pieces, whole)
        self._out_offset = 0
        self._done = False
        self.stop_requested = False

    def _engine_chunks(self, pieces: list[str], whole: bool) -> Iterator[tuple[EngineChunk, int]]:
        """Yield (chunk, engine-rate offset of the piece it belongs to) across all pieces."""
        base = 0
        for piece in pieces:
            if whole:
                audio = self.engine.synthesize(piece)
                yield EngineChunk(audio=audio, offset=0, final=True), base
                base += len(audio)
                continue
            produced = 0
            urgent = base == 0  # later pieces play after audio that is already queued
            stream = self.engine.stream(piece, lambda: self.stop_requested, urgent=urgent)
            for chunk in stream:
                yield chunk, base
                produced = chunk.offset + len(chunk.audio)
            base += produced
            if self.stop_requested:
                return

    def _words(self, marks: tuple[WordMark, ...], base: int) -> tuple[Word, ...]:
        scale = self.rate / self.engine.sample_rate
        return tuple(
            # The chains are time-aligned (output j is input time j/out_rate), so no delay term.
            Word(m.word, round((base + m.start) * scale), round((base + m.end) * scale))
            for m in marks
        )

    def step(self) -> Rendered | None:
        """Produce the next output chunk; None once the utterance is complete.

        A chunk may be empty (``data == b""``) while the chain is still filling; the final one
        flushes the chain. After ``stop_requested`` is set the engine ends within one chunk.
        """
        if self._done:
            return None
        t0 = time.perf_counter()
        nxt = next(self._chunks, None)
        if nxt is None or self.stop_requested:
            self._done = True
            audio: FloatArray = self._chain.process(np.zeros(0, np.float32), last=True)
            words: tuple[Word, ...] = ()
            final = True
        else:
            chunk, base = nxt
            audio = self._chain.process(chunk.audio, last=False)
            words = self._words(chunk.words, base)
            final = False
        data = float_to_s16le_bytes(audio)
        out = Rendered(data, self._out_offset, words, final, time.perf_counter() - t0)
        self._out_offset += len(audio)
        return out

    @property
    def samples(self) -> int:
        return self._out_offset
