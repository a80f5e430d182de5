import audioop
from collections.abc import Callable

import numpy as np
import pytest

from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

Codec = Callable[[np.ndarray], bytes]
Decoder = Callable[[bytes], np.ndarray]
ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_ulaw_encode_matches_audioop_for_every_int16() -> None:
    assert ulaw_encode(ALL_SAMPLES) == audioop.lin2ulaw(ALL_SAMPLES.astype("<i2").tobytes(), 2)


def test_alaw_encode_matches_audioop_for_every_int16() -> None:
    assert alaw_encode(ALL_SAMPLES) == audioop.lin2alaw(ALL_SAMPLES.astype("<i2").tobytes(), 2)


def test_ulaw_decode_matches_audioop_for_every_code() -> None:
    ref = np.frombuffer(audioop.ulaw2lin(ALL_CODES, 2), dtype="<i2")
    got = ulaw_decode(ALL_CODES)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, ref)


def test_alaw_decode_matches_audioop_for_every_code() -> None:
    ref = np.frombuffer(audioop.alaw2lin(ALL_CODES, 2), dtype="<i2")
    got = alaw_decode(ALL_CODES)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize(
    ("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)]
)
def test_decoded_values_are_fixed_points(encode: Codec, decode: Decoder) -> None:
    levels = decode(ALL_CODES)
    np.testing.assert_array_equal(decode(encode(levels)), levels)


def test_empty_and_wrong_dtype() -> None:
    assert ulaw_encode(np.zeros(0, dtype=np.int16)) == b""
    assert ulaw_decode(b"").size == 0
    with pytest.raises(TypeError, match="int16"):
        ulaw_encode(np.zeros(4, dtype=np.int32))
    with pytest.raises(TypeError, match="int16"):
        alaw_encode(np.zeros(4, dtype=np.float32))
