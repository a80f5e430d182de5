"""Synthetic call starts for the AMD tests: silence, voiced bursts (noise, not tonal) and tones,
as int16 at 8 kHz; times in ms."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

RATE = 8000
Int16Array = npt.NDArray[np.int16]

_rng = np.random.default_rng(7)


def silence(ms: int) -> Int16Array:
    return np.zeros(RATE * ms // 1000, np.int16)


def burst(ms: int, rms: float = 3000.0) -> Int16Array:
    """A voiced stretch: white noise well above app_amd's silence threshold, and not a tone."""
    n = RATE * ms // 1000
    return np.clip(_rng.normal(0.0, rms, n), -32768, 32767).astype(np.int16)


def tone(freq: float, ms: int, amp: float = 8000.0) -> Int16Array:
    t = np.arange(RATE * ms // 1000) / RATE
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def noise(x: Int16Array, rms: float) -> Int16Array:
    y = x.astype(np.float64) + _rng.normal(0.0, rms, len(x))
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


def join(*parts: Int16Array) -> Int16Array:
    return np.concatenate(parts)


def frames(x: Int16Array) -> list[Int16Array]:
    return [x[i : i + 160] for i in range(0, len(x) // 160 * 160, 160)]
