"""Measured response of the narrowband chain, for every supported engine rate."""

import math

import numpy as np
import pytest

from dsp.g711 import ulaw_decode, ulaw_encode
from dsp.pcm import float_to_s16
from dsp.telephone import TelephoneChain, telephone
from tests.dsp.helpers import LEVEL, chunkings, spectrum_db, split, tone, tone_power_db

RATES = [22050, 16000, 24000, 44100, 48000]
TRIM = 250  # 8 kHz samples dropped at each end: filter start-up / flush tails (101 + EQ)


def gain_db(f: float, rate: int, eq_gain_db: float = 2.0) -> float:
    return tone_power_db(lambda x: telephone(x, rate, eq_gain_db), f, rate, TRIM)


@pytest.mark.parametrize("rate", RATES)
def test_passband_and_presence_eq(rate: int) -> None:
    for f in (300, 400, 500, 600):
        assert abs(gain_db(f, rate)) <= 0.5, f
    for fm in np.arange(1200.0, 2801.0, 100.0):
        assert 1.5 <= gain_db(fm, rate) <= 2.5, fm
    assert gain_db(1000, rate) >= 1.0
    assert gain_db(3000, rate) >= 1.0


@pytest.mark.parametrize("rate", RATES)
def test_nothing_from_4khz_to_nyquist_folds_back(rate: int) -> None:
    """Every input tone from 4.0 kHz to the input Nyquist: total output energy >= 70 dB down."""
    ref = gain_db(1000, rate)
    freqs = np.r_[np.arange(4000.0, 4500.0, 20.0), np.arange(4500.0, rate / 2, 100.0), rate / 2]
    worst = max(gain_db(f, rate) - ref for f in freqs)
    assert worst <= -70.0, worst  # measured about -85 dB (the design is 80 dB)


@pytest.mark.parametrize(("rate", "f_in", "f_alias"), [(22050, 5000, 3000), (48000, 9000, 1000)])
def test_alias_line_is_absent_from_the_output_spectrum(rate: int, f_in: int, f_alias: int) -> None:
    ref = spectrum_db(telephone(tone(1000, rate, 0.5), rate)[TRIM:-TRIM].astype(np.float64))
    y = telephone(tone(f_in, rate, 0.5), rate)[TRIM:-TRIM].astype(np.float64)
    spec = spectrum_db(y)
    f = np.fft.rfftfreq(y.size, 1 / 8000)
    near = np.abs(f - f_alias) < 20
    assert spec[near].max() < ref.max() - 70.0


def test_eq_gain_is_configurable() -> None:
    assert abs(gain_db(2000, 22050, eq_gain_db=0.0)) < 0.05
    assert 3.5 < gain_db(2000, 22050, eq_gain_db=4.0) < 4.5


@pytest.mark.parametrize("rate", [22050, 16000])
def test_streaming_equals_one_shot(rate: int) -> None:
    rng = np.random.default_rng(rate)
    x = (0.3 * rng.standard_normal(rate // 3 + 17)).astype(np.float32)
    x[1000:1200] *= 8  # drive the limiter too
    ref = telephone(x, rate)
    assert ref.dtype == np.float32
    assert ref.size == math.ceil(x.size * 8000 / rate)
    chain = TelephoneChain(rate)
    for name, sizes in chunkings(x.size):
        chain.reset()
        parts = [chain.process(c) for c in split(x, sizes)]
        parts.append(chain.process(np.zeros(0, dtype=np.float32), last=True))
        got = np.concatenate(parts)
        assert got.size == ref.size == chain.output_length(x.size), name
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=name)


def test_loud_input_never_clips_g711() -> None:
    rate = 22050
    x = np.clip(3.0 * tone(2000, rate, 0.5, amp=1.0) + tone(300, rate, 0.5, amp=1.0), -1, 1)
    y = telephone(x, rate)
    ceiling = 10 ** (-1 / 20)
    assert np.max(np.abs(y)) <= ceiling + 1e-7
    s16 = float_to_s16(y)
    assert np.max(np.abs(s16.astype(np.int32))) < 32767
    back = ulaw_decode(ulaw_encode(s16))
    assert np.max(np.abs(back.astype(np.int32))) < 32124  # largest mu-law level: no code clips


def test_latency_is_reported() -> None:
    chain = TelephoneChain(22050)
    assert chain.latency_samples == 101
    assert chain.out_rate == 8000
    # -20 dBFS tone: the limiter stays out of the way
    y = telephone(tone(500, 22050, 0.3), 22050)
    assert abs(np.max(np.abs(y[TRIM:-TRIM])) - LEVEL) < 0.01
