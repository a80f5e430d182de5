"""Minimal WAV file I/O for the DSP tools: read mono float, write 16-bit PCM mono."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import scipy.io.wavfile

from dsp.pcm import float_to_s16le_bytes

Float32Array = npt.NDArray[np.float32]


class WavError(Exception):
    """A WAV file that cannot be read or is not a format we accept (message is user-facing)."""


def read_wav_mono(path: str | Path) -> tuple[int, Float32Array]:
    """Read 8/16/24/32-bit PCM or 32/64-bit float WAV; downmix channels by averaging."""
    try:
        rate, data = scipy.io.wavfile.read(str(path))
    except FileNotFoundError as exc:
        raise WavError(f"{path}: no such file") from exc
    except (OSError, ValueError, EOFError) as exc:
        raise WavError(f"{path}: not a readable WAV file ({exc})") from exc
    arr = np.asarray(data)
    if arr.dtype == np.uint8:
        x = (arr.astype(np.float64) - 128.0) / 128.0
    elif arr.dtype == np.int16:
        x = arr.astype(np.float64) / 32768.0
    elif arr.dtype == np.int32:  # 24-bit files are returned left-justified in int32
        x = arr.astype(np.float64) / 2147483648.0
    elif arr.dtype in (np.float32, np.float64):
        x = arr.astype(np.float64)
    else:
        raise WavError(f"{path}: unsupported sample format {arr.dtype}")
    if x.ndim == 2:
        x = x.mean(axis=1)
    if x.ndim != 1:
        raise WavError(f"{path}: unexpected data shape {arr.shape}")
    return int(rate), x.astype(np.float32)


def write_wav_s16(path: str | Path, rate: int, x: npt.ArrayLike) -> None:
    """Write float samples as a 16-bit PCM mono WAV (rounded, saturated)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(float_to_s16le_bytes(x))
