"""G.711 codec table for the RTP layer (wraps :mod:`dsp.g711`, no codec code here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

Int16Array = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    static_pt: int
    encode: Callable[[npt.ArrayLike], bytes]
    decode: Callable[[bytes], Int16Array]

    @property
    def silence_byte(self) -> int:
        """Code of digital zero: 0xFF for μ-law, 0xD5 for A-law."""
        return self.encode(np.zeros(1, dtype=np.int16))[0]

    def silence(self, samples: int) -> bytes:
        return bytes([self.silence_byte]) * samples


CODECS: dict[str, Codec] = {
    "PCMU": Codec("PCMU", 0, ulaw_encode, ulaw_decode),
    "PCMA": Codec("PCMA", 8, alaw_encode, alaw_decode),
}


def get_codec(name: str) -> Codec:
    try:
        return CODECS[name.upper()]
    except KeyError:
        raise ValueError(f"unsupported codec {name!r}; expected one of {sorted(CODECS)}") from None
