import numpy as np
import pytest

from dsp.pcm import (
    float_to_s16,
    float_to_s16le_bytes,
    s16_to_float,
    s16le_bytes_to_float,
    s16le_bytes_to_int16,
)


def test_every_int16_round_trips_exactly() -> None:
    v = np.arange(-32768, 32768, dtype=np.int16)
    f = s16_to_float(v)
    assert f.dtype == np.float32
    assert f.min() == -1.0 and f.max() < 1.0
    np.testing.assert_array_equal(float_to_s16(f), v)


def test_rounding_and_saturation() -> None:
    x = np.array(
        [0.0, 0.4 / 32768, 0.6 / 32768, -0.6 / 32768, 1.0, 1.5, -1.0, -2.0, np.nan, np.inf]
    )
    np.testing.assert_array_equal(
        float_to_s16(x), [0, 0, 1, -1, 32767, 32767, -32768, -32768, 0, 32767]
    )


def test_bytes_are_little_endian_and_round_trip() -> None:
    b = float_to_s16le_bytes(np.array([1.0 / 32768, -1.0]))
    assert b == b"\x01\x00\x00\x80"
    np.testing.assert_array_equal(s16le_bytes_to_int16(b), [1, -32768])
    np.testing.assert_array_equal(
        s16le_bytes_to_float(b), np.array([1 / 32768, -1.0], dtype=np.float32)
    )


def test_odd_length_bytes_and_wrong_dtype_are_rejected() -> None:
    with pytest.raises(ValueError, match="even"):
        s16le_bytes_to_float(b"\x00\x00\x00")
    with pytest.raises(TypeError, match="int16"):
        s16_to_float(np.zeros(2, dtype=np.int32))
