import math

import numpy as np
import pytest
import scipy.signal

from dsp.resample import Resampler, design, output_length, resample
from tests.dsp.helpers import chunkings, split

# (in, out, pass, stop): the telephone and wideband designs the chains use.
PAIRS = [
    (22050, 8000, 3800.0, 4000.0),
    (16000, 8000, 3800.0, 4000.0),
    (24000, 8000, 3800.0, 4000.0),
    (44100, 8000, 3800.0, 4000.0),
    (48000, 8000, 3800.0, 4000.0),
    (8000, 8000, 3800.0, 4000.0),
    (22050, 48000, 9922.5, 11025.0),
    (22050, 16000, 7200.0, 8000.0),
    (16000, 48000, 7200.0, 8000.0),
]
IDS = [f"{a}-{b}" for a, b, _, _ in PAIRS]


@pytest.mark.parametrize(("fin", "fout", "fp", "fs"), PAIRS, ids=IDS)
def test_polyphase_equals_direct_upfirdn_reference(
    fin: int, fout: int, fp: float, fs: float
) -> None:
    """Every output sample equals the filter applied at the up-sampled rate (independent path)."""
    d = design(fin, fout, fp, fs)
    x = np.random.default_rng(5).standard_normal(1500)
    z = scipy.signal.upfirdn(d.taps, x, d.up, 1)  # zero-stuff by L, filter: no decimation
    n = output_length(x.size, fin, fout)
    idx = np.arange(n) * d.down + d.delay  # output j sits at up-rate time jM, delay removed
    ref = np.where(idx < z.size, z[np.minimum(idx, z.size - 1)], 0.0)
    got = Resampler(d).process_f64(x, last=True)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("fin", "fout", "fp", "fs"), PAIRS, ids=IDS)
def test_streaming_equals_one_shot(fin: int, fout: int, fp: float, fs: float) -> None:
    x = np.random.default_rng(6).standard_normal(fin // 4 + 13)
    ref = resample(x, fin, fout, fp, fs)
    assert ref.size == math.ceil(x.size * fout / fin)
    r = Resampler.for_rates(fin, fout, fp, fs)
    for name, sizes in chunkings(x.size):
        r.reset()
        parts = [r.process(c) for c in split(x, sizes)]
        parts.append(r.process(np.zeros(0), last=True))
        got = np.concatenate(parts)
        assert got.size == ref.size, name
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=name)


def test_output_length_is_ceil_for_any_input_length() -> None:
    r = Resampler.for_rates(22050, 8000, 3800.0, 4000.0)
    for n in [0, 1, 2, 3, 440, 441, 442, 1000, 2205]:
        r.reset()
        y = np.concatenate([r.process(np.ones(n)), r.process([], last=True)])
        assert y.size == -(-n * 8000 // 22050) == output_length(n, 22050, 8000), n


def test_streaming_holds_back_only_the_filter_delay() -> None:
    r = Resampler.for_rates(22050, 8000, 3800.0, 4000.0)
    assert r.latency_samples == 101  # 12.6 ms at 8 kHz
    got = r.process(np.zeros(22050)).size
    expected = 8000 - r.latency_samples
    assert abs(got - expected) <= 1


def test_dc_passes_at_unity_and_output_is_aligned() -> None:
    y = resample(np.ones(22050), 22050, 8000, 3800.0, 4000.0)
    np.testing.assert_allclose(y[200:-200], 1.0, atol=2e-4)
    # Output sample j is the input signal at time j / 8000: no delay, no phase shift.
    t_in, t_out = np.arange(22050) / 22050, np.arange(8000) / 8000
    z = resample(np.sin(2 * np.pi * 1234.5 * t_in), 22050, 8000, 3800.0, 4000.0)
    np.testing.assert_allclose(z[200:-200], np.sin(2 * np.pi * 1234.5 * t_out)[200:-200], atol=2e-4)


def test_flushed_stream_refuses_more_input_until_reset() -> None:
    r = Resampler.for_rates(16000, 8000, 3800.0, 4000.0)
    r.process(np.ones(10), last=True)
    with pytest.raises(RuntimeError, match="reset"):
        r.process(np.ones(10))
    r.reset()
    assert r.process(np.ones(1000)).size > 0


def test_bad_designs_are_rejected() -> None:
    with pytest.raises(ValueError):
        design(8000, 8000, 3800.0, 4100.0)  # stopband past Nyquist
    with pytest.raises(ValueError):
        design(22050, 8000, 4000.0, 3800.0)
    with pytest.raises(ValueError, match="unsupported rate pair"):
        design(22051, 8000, 3800.0, 4000.0)
