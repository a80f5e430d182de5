import math

import numpy as np

from dsp.limiter import Limiter, limit
from tests.dsp.helpers import chunkings, split, tone

RATE = 8000


def reference_limiter(x: np.ndarray, ceiling_db: float, release_ms: float) -> np.ndarray:
    """The per-sample definition, as a plain loop (the module evaluates it in closed form)."""
    c = 10 ** (ceiling_db / 20)
    r = math.exp(-1.0 / (release_ms * 1e-3 * RATE))
    d, out = 0.0, np.empty_like(x)
    for n, v in enumerate(x):
        target = max(0.0, 1.0 - c / abs(v)) if v != 0 else 0.0
        d = max(target, d * r)
        out[n] = v * (1.0 - d)
    return out


def loud_signal() -> np.ndarray:
    rng = np.random.default_rng(11)
    x = tone(440, RATE, 1.0, amp=1.0) * np.repeat(rng.uniform(0.05, 1.8, 20), RATE // 20)
    return x + 0.05 * rng.standard_normal(x.size)


def test_closed_form_equals_per_sample_definition() -> None:
    x = loud_signal()
    np.testing.assert_allclose(limit(x, RATE), reference_limiter(x, -1.0, 50.0), atol=1e-9)


def test_output_never_exceeds_the_ceiling() -> None:
    x = loud_signal() * 4.0
    y = limit(x, RATE, ceiling_db=-1.0)
    assert np.max(np.abs(y)) <= 10 ** (-1 / 20)
    assert np.max(np.abs(x)) > 5.0


def test_quiet_signal_passes_untouched() -> None:
    x = tone(1000, RATE, 0.5, amp=0.5)
    np.testing.assert_array_equal(limit(x, RATE), x)


def test_gain_recovers_with_the_release_time_constant() -> None:
    lim = Limiter(RATE, ceiling_db=-6.0, release_ms=50.0)
    lim.process(np.array([1.0]))  # -6 dB reduction on one sample
    before = 1 - 10 ** (lim.gain_reduction_db / 20)
    lim.process(np.zeros(400))  # 50 ms of silence: one time constant
    after = 1 - 10 ** (lim.gain_reduction_db / 20)
    assert abs(after / before - math.exp(-1.0)) < 1e-9


def test_streaming_equals_one_shot() -> None:
    x = loud_signal()
    ref = limit(x, RATE)
    for name, sizes in chunkings(x.size):
        lim = Limiter(RATE)
        got = np.concatenate([lim.process(c) for c in split(x, sizes)])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9, err_msg=name)
