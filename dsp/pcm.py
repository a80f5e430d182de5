"""PCM conversions: float samples (full scale ±1.0) ↔ int16 ↔ little-endian s16 bytes.

Convention: int16 ``v`` ↔ float ``v / 32768``.  Every int16 value therefore round-trips
exactly, and float → int16 rounds to nearest (ties to even) then saturates to
[-32768, 32767], so +1.0 becomes 32767 instead of wrapping.  NaN becomes 0.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Int16Array = npt.NDArray[np.int16]
Float32Array = npt.NDArray[np.float32]

_SCALE = 32768.0


def float_to_s16(x: npt.ArrayLike) -> Int16Array:
    """Float samples → int16 (rounded, saturated; NaN → 0, ±inf saturate)."""
    xa = np.asarray(x, dtype=np.float64)
    scaled = np.rint(np.nan_to_num(xa, nan=0.0, posinf=2.0, neginf=-2.0) * _SCALE)
    return np.clip(scaled, -32768.0, 32767.0).astype(np.int16)


def s16_to_float(x: npt.ArrayLike) -> Float32Array:
    """int16 samples → float32 in [-1.0, 1.0)."""
    xa = np.asarray(x)
    if xa.dtype != np.int16:
        raise TypeError(f"expected int16 samples, got {xa.dtype}")
    return (xa.astype(np.float32) / np.float32(_SCALE)).astype(np.float32)


def float_to_s16le_bytes(x: npt.ArrayLike) -> bytes:
    """Float samples → little-endian signed 16-bit PCM bytes."""
    return float_to_s16(x).astype("<i2").tobytes()


def s16le_bytes_to_int16(data: bytes) -> Int16Array:
    """Little-endian s16 bytes → native int16 array (copy)."""
    if len(data) % 2:
        raise ValueError(f"s16le data must have an even length, got {len(data)} bytes")
    return np.frombuffer(data, dtype="<i2").astype(np.int16)


def s16le_bytes_to_float(data: bytes) -> Float32Array:
    """Little-endian signed 16-bit PCM bytes → float32."""
    return s16_to_float(s16le_bytes_to_int16(data))
