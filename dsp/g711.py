"""G.711 μ-law and A-law, table-driven, bit-exact with CPython's ``audioop``.

The tables are built once at import from the classic CCITT/Sun reference algorithm that
``audioop`` implements (``st_14linear2ulaw`` on ``sample >> 2``, ``st_linear2alaw`` on
``sample >> 3``), vectorised over all 65536 int16 values; encoding and decoding are then one
numpy gather.  ``audioop`` itself is deprecated (gone in Python 3.13) and is only used by the
tests as the reference.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159  # 14-bit magnitude limit


def _segment(mag: npt.NDArray[np.int64], seg_end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Index of the first segment end >= mag (8 when above all: out of range)."""
    return np.searchsorted(seg_end, mag, side="left").astype(np.int64)


def _build_ulaw_encode() -> UInt8Array:
    pcm = np.arange(-32768, 32768, dtype=np.int64) >> 2  # 14-bit, arithmetic shift
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg_end = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int64)
    seg = _segment(mag, seg_end)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0xF))
    return _by_uint16_index((code ^ mask).astype(np.uint8))


def _build_alaw_encode() -> UInt8Array:
    pcm = np.arange(-32768, 32768, dtype=np.int64) >> 3  # 13-bit, arithmetic shift
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg_end = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int64)
    seg = _segment(mag, seg_end)
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> shift) & 0xF))
    return _by_uint16_index((code ^ mask).astype(np.uint8))


def _by_uint16_index(codes_from_min: UInt8Array) -> UInt8Array:
    """Reorder a table built over -32768..32767 so it is indexed by ``int16.view(uint16)``."""
    return np.ascontiguousarray(np.roll(codes_from_min, -32768))


def _build_ulaw_decode() -> Int16Array:
    u = (~np.arange(256, dtype=np.int64)) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _build_alaw_decode() -> Int16Array:
    a = np.arange(256, dtype=np.int64) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENC = _build_ulaw_encode()
_ALAW_ENC = _build_alaw_encode()
_ULAW_DEC = _build_ulaw_decode()
_ALAW_DEC = _build_alaw_decode()
for _table in (_ULAW_ENC, _ALAW_ENC, _ULAW_DEC, _ALAW_DEC):
    _table.setflags(write=False)


def _as_int16(samples: npt.ArrayLike) -> Int16Array:
    xa = np.asarray(samples)
    if xa.dtype != np.int16:
        raise TypeError(f"expected int16 samples, got {xa.dtype}")
    return xa.reshape(-1)


# ``ndarray.take`` rather than fancy indexing: the same gather, without the index-parsing
# overhead that dominates at 160 samples (about 0.65 against 0.95 µs here).
def ulaw_encode(samples: npt.ArrayLike) -> bytes:
    """int16 samples → μ-law bytes (one per sample); same as ``audioop.lin2ulaw(b, 2)``."""
    return _ULAW_ENC.take(_as_int16(samples).view(np.uint16)).tobytes()


def alaw_encode(samples: npt.ArrayLike) -> bytes:
    """int16 samples → A-law bytes; same as ``audioop.lin2alaw(b, 2)``."""
    return _ALAW_ENC.take(_as_int16(samples).view(np.uint16)).tobytes()


def ulaw_decode(data: bytes) -> Int16Array:
    """μ-law bytes → int16 samples; same as ``audioop.ulaw2lin(b, 2)``."""
    return _ULAW_DEC.take(np.frombuffer(data, dtype=np.uint8))


def alaw_decode(data: bytes) -> Int16Array:
    """A-law bytes → int16 samples; same as ``audioop.alaw2lin(b, 2)``."""
    return _ALAW_DEC.take(np.frombuffer(data, dtype=np.uint8))


# --- many frames at once (the media tick's batch: every due call's frame in one gather) ---------
ENCODE_TABLES: dict[str, UInt8Array] = {"ulaw": _ULAW_ENC, "alaw": _ALAW_ENC}
DECODE_TABLES: dict[str, Int16Array] = {"ulaw": _ULAW_DEC, "alaw": _ALAW_DEC}


def encode_frames(
    law: str, frames: npt.NDArray[np.int16], out: npt.NDArray[np.uint8] | None = None
) -> UInt8Array:
    """G.711 of a 2-D block of int16 frames (one row per call), written into ``out`` (same
    shape, uint8; any strides, e.g. the payload columns of a block of RTP packets) or a new
    array.  Row for row the bytes of :func:`ulaw_encode`/:func:`alaw_encode`: one gather over
    the whole block instead of one per frame."""
    table = ENCODE_TABLES[law]
    if frames.dtype != np.int16 or frames.ndim != 2:
        raise TypeError(f"expected a 2-D int16 block, got {frames.ndim}-D {frames.dtype}")
    idx = frames.view(np.uint16)
    if out is None:
        return table.take(idx)
    if out.shape != frames.shape or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 {frames.shape}, got {out.dtype} {out.shape}")
    # mode="clip": uint16 indices are always within the 65536-entry table, and a checked mode
    # would make numpy buffer the whole output when ``out`` is not contiguous.
    table.take(idx, out=out, mode="clip")
    return out
