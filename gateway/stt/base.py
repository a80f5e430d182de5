"""The speech-to-text interface the gateway's agents use, so that a GPU or remote engine can
replace the bundled CPU one: 16 kHz mono float audio in, words out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dsp.resample import Resampler

STT_RATE = 16000
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str  # what was said, normalised to single spaces ("" when nothing was)
    seconds: float  # audio transcribed
    compute_s: float  # time the engine took


class SpeechToText(Protocol):
    """Synchronous and CPU-bound: callers run it off the event loop."""

    name: str

    def transcribe(self, audio: FloatArray) -> Transcript:
        """``audio``: 16 kHz mono, full scale ±1.0, any length (empty gives "")."""
        ...


def to_stt_rate(x: npt.ArrayLike, rate: int) -> FloatArray:
    """Mono audio at ``rate`` (int16, or float at full scale ±1.0) → 16 kHz float32 (one-shot;
    below 16 kHz the band the call had is kept, above it the speech band)."""
    a = np.asarray(x)
    f = a.astype(np.float64) / 32768.0 if a.dtype == np.int16 else a.astype(np.float64)
    if rate == STT_RATE:
        return f.astype(np.float32)
    if rate < 4000:
        raise ValueError(f"speech-to-text needs at least 4 kHz audio, got {rate} Hz")
    low = min(rate, STT_RATE)
    rs = Resampler.for_rates(rate, STT_RATE, pass_hz=0.45 * low, stop_hz=0.5 * low)
    return rs.process(f.reshape(-1), last=True)
