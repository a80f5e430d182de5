"""Caller audio for the agents' tests: synthetic voiced sound that webrtcvad calls speech (no
TTS needed), silence, 20 ms frames, and frames delivered at a chosen multiple of real time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import numpy.typing as npt

from gateway.stt.segmenter import FRAME, RATE

Int16Array = npt.NDArray[np.int16]


def voiced(seconds: float, *, f0: float = 130.0, level: float = 8000.0) -> Int16Array:
    """A vowel-like harmonic sound (formants near 700, 1200 and 2500 Hz, a slow vibrato, a
    syllable-rate swell that never falls silent): every 20 ms frame of it is speech to the
    VAD, so an utterance lasts exactly as long as this does."""
    n = round(seconds * RATE)
    t = np.arange(n) / RATE
    f = f0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(f) / RATE
    x = np.zeros(n)
    for k in range(1, 25):
        fk = k * f0
        w = (
            np.exp(-(((fk - 700) / 300) ** 2))
            + 0.6 * np.exp(-(((fk - 1200) / 400) ** 2))
            + 0.3 * np.exp(-(((fk - 2500) / 500) ** 2))
            + 0.05
        )
        x += w * np.sin(k * phase)
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)
    peak = float(np.abs(x).max()) if n else 1.0
    return (x / peak * level).astype(np.int16)


def silence(seconds: float) -> Int16Array:
    return np.zeros(round(seconds * RATE), np.int16)


def frames_of(x: Int16Array) -> list[Int16Array]:
    """``x`` in 20 ms frames (zero-padded to a whole frame)."""
    pad = (-x.size) % FRAME
    if pad:
        x = np.concatenate([x, np.zeros(pad, np.int16)])
    return list(x.reshape(-1, FRAME))


async def paced(
    frames: list[Int16Array],
    speed: float,
    on_frame: Callable[[int], None] | None = None,
    *,
    fast_from: int | None = None,
    fast_speed: float = 8.0,
) -> AsyncIterator[Int16Array]:
    """The frames as a call delivers them, at ``speed`` times real time (from frame
    ``fast_from`` on, at ``fast_speed``); ``on_frame(i)`` is called before frame ``i`` goes
    out."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    for i, f in enumerate(frames):
        ahead = due - loop.time()
        await asyncio.sleep(ahead if ahead > 0 else 0)
        if on_frame is not None:
            on_frame(i)
        yield f
        fast = fast_from is not None and i >= fast_from
        due += 0.020 / (fast_speed if fast else speed)
