import math

import numpy as np
import pytest

from dsp.wideband import WidebandChain, wideband
from tests.dsp.helpers import chunkings, split, tone, tone_power_db

TRIM = 800


def gain_db(f: float, rate: int, out_rate: int) -> float:
    return tone_power_db(lambda x: wideband(x, rate, out_rate), f, rate, TRIM)


@pytest.mark.parametrize("rate", [22050, 16000, 24000, 44100])
def test_passband_at_48k(rate: int) -> None:
    for f in (300, 1000, 3000, 5000, 7000):
        assert abs(gain_db(f, rate, 48000)) <= 0.5, f


@pytest.mark.parametrize("rate", [22050, 24000, 44100, 48000])
def test_passband_and_no_aliasing_at_16k(rate: int) -> None:
    for f in (1000, 5000, 7000):
        assert abs(gain_db(f, rate, 16000)) <= 0.5, f
    ref = gain_db(1000, rate, 16000)
    freqs = np.r_[np.arange(8000.0, 8500.0, 50.0), np.arange(8500.0, rate / 2, 250.0), rate / 2]
    worst = max(gain_db(f, rate, 16000) - ref for f in freqs)
    assert worst <= -70.0, worst


def test_no_images_when_upsampling() -> None:
    """22050 -> 48000: a 9 kHz tone must not leave an image at 22050 - 9000 = 13050 Hz."""
    y = wideband(tone(9000, 22050, 0.5), 22050, 48000)[TRIM:-TRIM].astype(np.float64)
    spec = np.abs(np.fft.rfft(y * np.hanning(y.size)))
    f = np.fft.rfftfreq(y.size, 1 / 48000)
    image = spec[np.abs(f - 13050) < 50].max()
    assert 20 * np.log10(image / spec.max()) < -70


@pytest.mark.parametrize(("rate", "out_rate"), [(22050, 48000), (22050, 16000), (48000, 48000)])
def test_streaming_equals_one_shot(rate: int, out_rate: int) -> None:
    x = (0.4 * np.random.default_rng(4).standard_normal(rate // 4 + 5)).astype(np.float32)
    ref = wideband(x, rate, out_rate)
    assert ref.size == math.ceil(x.size * out_rate / rate)
    chain = WidebandChain(rate, out_rate)
    for name, sizes in chunkings(x.size):
        chain.reset()
        parts = [chain.process(c) for c in split(x, sizes)]
        parts.append(chain.process(np.zeros(0, dtype=np.float32), last=True))
        got = np.concatenate(parts)
        assert got.size == ref.size == chain.output_length(x.size), name
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=name)
    assert np.max(np.abs(ref)) <= 10 ** (-1 / 20) + 1e-7


def test_same_rate_is_a_limiter_only() -> None:
    chain = WidebandChain(48000, 48000)
    assert chain.latency_samples == 0
    x = tone(1000, 48000, 0.1)
    np.testing.assert_allclose(chain.process(x, last=True), x, atol=1e-7)
    with pytest.raises(RuntimeError):
        chain.process(x)
