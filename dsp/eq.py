"""Mid-band presence EQ for the telephone band: a cascade of peaking biquads with explicit state.

The +2 dB "presence" lift across 1–3 kHz is two RBJ-cookbook peaking filters whose centre,
gain and Q were fitted (minimax, offline) to the telephone mask at 8 kHz for the default
+2 dB: 300–600 Hz within ±0.3 dB of unity, 1.2–2.8 kHz at +1.7…+2.2 dB, ≥ +1.2 dB at 1.0 and
3.0 kHz, back to ~0 dB at 3.8 kHz.  One bell cannot be both flat across 1.2–2.8 kHz and
under 0.5 dB at 600 Hz.  Other gains scale both bells' dB linearly, which keeps the shape.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import scipy.signal

FloatArray = npt.NDArray[np.float64]

# (centre Hz, gain dB at eq_gain_db == 2.0, Q)
_MIDBAND_BELLS: tuple[tuple[float, float, float], ...] = (
    (1216.271, 1.5384, 2.2118),
    (2356.2879, 2.1993, 0.6655),
)
_DESIGN_GAIN_DB = 2.0

Section = tuple[FloatArray, FloatArray]


def peaking_biquad(rate: int, f0: float, gain_db: float, q: float) -> Section:
    """RBJ Audio-EQ-Cookbook peaking filter, normalised so that a[0] == 1."""
    amp = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * f0 / rate
    alpha = math.sin(w0) / (2.0 * q)
    cw = math.cos(w0)
    b = np.array([1.0 + alpha * amp, -2.0 * cw, 1.0 - alpha * amp])
    a = np.array([1.0 + alpha / amp, -2.0 * cw, 1.0 - alpha / amp])
    return b / a[0], a / a[0]


def midband_sections(rate: int = 8000, gain_db: float = 2.0) -> list[Section]:
    """The presence-EQ cascade; empty (identity) for a gain of 0 dB."""
    if gain_db == 0.0:
        return []
    scale = gain_db / _DESIGN_GAIN_DB
    return [peaking_biquad(rate, f0, g * scale, q) for f0, g, q in _MIDBAND_BELLS]


class Equalizer:
    """Streaming biquad cascade: ``process(x)`` continues exactly where the last call ended.

    Runs through ``scipy.signal.lfilter`` with explicit ``zi``: for 160-sample blocks its fixed
    cost is about a fifth of ``sosfilt``'s (4 vs 19 us here), and the blocks are that small.
    """

    def __init__(self, sections: list[Section]) -> None:
        self.sections = sections
        # The gentle bells (poles well inside the unit circle) are safe to run as one
        # direct-form filter in float64: one lfilter call per block instead of one per section.
        b: FloatArray = np.ones(1)
        a: FloatArray = np.ones(1)
        for bs, as_ in sections:
            b, a = np.convolve(b, bs), np.convolve(a, as_)
        self._b, self._a = b, a
        self.reset()

    def reset(self) -> None:
        self._zi = np.zeros(self._a.size - 1, dtype=np.float64)

    def process(self, x: npt.ArrayLike) -> FloatArray:
        y = np.asarray(x, dtype=np.float64).reshape(-1)
        if y.size == 0 or not self.sections:
            return y.copy()
        y, self._zi = scipy.signal.lfilter(self._b, self._a, y, zi=self._zi)
        return np.asarray(y, dtype=np.float64)


class MidbandEQ(Equalizer):
    """The telephone presence EQ (:func:`midband_sections`) as a streaming block."""

    def __init__(self, rate: int = 8000, gain_db: float = 2.0) -> None:
        super().__init__(midband_sections(rate, gain_db))


def midband_eq(x: npt.ArrayLike, rate: int = 8000, gain_db: float = 2.0) -> FloatArray:
    """One-shot twin of :class:`MidbandEQ` (zero initial state)."""
    return MidbandEQ(rate, gain_db).process(x)


def response_db(sections: list[Section], freqs_hz: npt.ArrayLike, rate: int) -> FloatArray:
    """Designed magnitude response of a cascade in dB (the tests measure, this documents)."""
    f = np.asarray(freqs_hz, dtype=np.float64)
    h = np.ones(f.shape, dtype=np.complex128)
    for b, a in sections:
        h *= scipy.signal.freqz(b, a, worN=f, fs=rate)[1]
    return np.asarray(20.0 * np.log10(np.abs(h)), dtype=np.float64)
