"""Shared measurement helpers for the DSP tests: deterministic tones and spectra."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Chain = Callable[[FloatArray], npt.NDArray[np.floating]]

LEVEL = 0.1  # -20 dBFS peak


def tone(
    freq: float, rate: int, seconds: float, phase: float = 0.0, amp: float = LEVEL
) -> FloatArray:
    n = round(seconds * rate)
    return amp * np.sin(2 * np.pi * freq * np.arange(n) / rate + phase)


def tone_power_db(
    run: Chain, freq: float, rate: int, trim: int, seconds: float = 0.25, amp: float = LEVEL
) -> float:
    """Steady-state output power of a tone relative to the input tone's, in dB.

    The sine and the cosine are both run and their output powers added: for any linear system
    the sum is independent of phase (sin² + cos² = 1), so a tone at the output Nyquist or an
    alias that happens to sample its zero crossings cannot hide.  ``trim`` output samples are
    dropped at each end (filter start-up and flush transients).
    """
    power = 0.0
    for phase in (0.0, np.pi / 2):
        y = np.asarray(run(tone(freq, rate, seconds, phase, amp)), dtype=np.float64)
        seg = y[trim:-trim]
        power += float(np.mean(seg**2))
    return float(10.0 * np.log10(max(power, 1e-300) / amp**2))


def spectrum_db(x: FloatArray) -> FloatArray:
    """Hann-windowed magnitude spectrum in dB (rfft bins)."""
    w = np.hanning(x.size)
    return 20.0 * np.log10(np.abs(np.fft.rfft(x * w)) + 1e-300)


def chunkings(n: int, seed: int = 7) -> Iterator[tuple[str, list[int]]]:
    """The awkward chunk-size patterns every streaming block is fed."""
    for size in (1, 7, 160, 441, 4095):
        yield f"size{size}", [size] * (n // size) + ([n % size] if n % size else [])
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(int(rng.choice([0, 1, 2, 3, 7, 64, 159, 160, 161, 441, 1000, 4095])))
    sizes[-1] -= sum(sizes) - n
    yield "mixed", sizes


def split(x: npt.NDArray[Any], sizes: list[int]) -> list[npt.NDArray[Any]]:
    out: list[npt.NDArray[Any]] = []
    i = 0
    for s in sizes:
        out.append(x[i : i + s])
        i += s
    assert i == x.size
    return out
