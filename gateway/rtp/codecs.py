"""G.711 codec table for the RTP layer (wraps :mod:`dsp.g711`, no codec code here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dsp.g711 import alaw_decode, alaw_encode, encode_frames, ulaw_decode, ulaw_encode

Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    static_pt: int
    encode: Callable[[npt.ArrayLike], bytes]
    decode: Callable[[bytes], Int16Array]
    law: str  # dsp.g711's name for it: the tables the batched encode gathers from

    def encode_frames(self, frames: Int16Array, out: UInt8Array | None = None) -> UInt8Array:
        """Many frames at once (a 2-D block, one row per call): row for row ``encode``'s bytes,
        written into ``out`` when given (see :func:`dsp.g711.encode_frames`)."""
        return encode_frames(self.law, frames, out)

    @property
    def silence_byte(self) -> int:
        """Code of digital zero: 0xFF for μ-law, 0xD5 for A-law."""
        return self.encode(np.zeros(1, dtype=np.int16))[0]

    def silence(self, samples: int) -> bytes:
        return bytes([self.silence_byte]) * samples


CODECS: dict[str, Codec] = {
    "PCMU": Codec("PCMU", 0, ulaw_encode, ulaw_decode, "ulaw"),
    "PCMA": Codec("PCMA", 8, alaw_encode, alaw_decode, "alaw"),
}


def get_codec(name: str) -> Codec:
    try:
        return CODECS[name.upper()]
    except KeyError:
        raise ValueError(f"unsupported codec {name!r}; expected one of {sorted(CODECS)}") from None
