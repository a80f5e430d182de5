import numpy as np
import scipy.signal

from dsp.eq import MidbandEQ, midband_eq, midband_sections, response_db
from tests.dsp.helpers import chunkings, split, tone_power_db


def test_cascade_equals_scipy_sosfilt_of_the_sections() -> None:
    x = np.random.default_rng(8).standard_normal(4000)
    sos = np.array([np.r_[b, a] for b, a in midband_sections(8000, 2.0)])
    np.testing.assert_allclose(midband_eq(x), scipy.signal.sosfilt(sos, x), rtol=0, atol=1e-12)


def test_streaming_equals_one_shot() -> None:
    x = np.random.default_rng(9).standard_normal(9000)
    ref = midband_eq(x, 8000, 2.0)
    for name, sizes in chunkings(x.size):
        eq = MidbandEQ(8000, 2.0)
        got = np.concatenate([eq.process(c) for c in split(x, sizes)])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9, err_msg=name)


def test_measured_response_meets_the_mask() -> None:
    def run(x: np.ndarray) -> np.ndarray:
        return midband_eq(x)

    def gain(f: float) -> float:
        return tone_power_db(run, f, 8000, trim=400)

    for f in (300, 400, 500, 600):
        assert abs(gain(f)) <= 0.5, f
    for fm in np.arange(1200.0, 2801.0, 100.0):
        assert 1.5 <= gain(fm) <= 2.5, fm
    assert gain(1000) >= 1.0 and gain(3000) >= 1.0


def test_gain_is_configurable() -> None:
    f = np.array([400.0, 2000.0, 3800.0])
    assert midband_sections(8000, 0.0) == []
    x = np.random.default_rng(1).standard_normal(100)
    np.testing.assert_array_equal(midband_eq(x, 8000, 0.0), x)
    r4 = response_db(midband_sections(8000, 4.0), f, 8000)
    r2 = response_db(midband_sections(8000, 2.0), f, 8000)
    assert 3.5 < r4[1] < 4.5 and 1.8 < r2[1] < 2.2
    assert abs(r4[0]) < 0.6 and abs(r2[2]) < 0.2
