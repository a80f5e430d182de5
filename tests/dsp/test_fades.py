import numpy as np
import pytest

from dsp.fades import FadeOut, cosine_fade_out, hann_crossfade, hann_crossfade_weights
from tests.dsp.helpers import chunkings, spectrum_db, split, tone

RATE = 8000


def test_fade_gain_shape() -> None:
    y = cosine_fade_out(np.ones(100), 80)
    assert y[0] == 1.0
    assert np.all(np.diff(y[:81]) <= 0)  # monotone
    assert abs(y[40] - 0.5) < 1e-12  # half-way point of the raised cosine
    assert np.all(y[80:] == 0.0)
    assert 0 < y[79] < 1e-3  # lands on zero with zero slope, no step


def test_streaming_fade_equals_one_shot_across_chunk_boundaries() -> None:
    x = np.random.default_rng(1).standard_normal(5000)
    ref = cosine_fade_out(x, 4001)
    for name, sizes in chunkings(x.size):
        f = FadeOut(4001)
        got = np.concatenate([f.process(c) for c in split(x, sizes)])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12, err_msg=name)
        assert f.done and f.remaining == 0


def test_zero_length_fade_is_a_cut() -> None:
    assert np.all(cosine_fade_out(np.ones(5), 0) == 0.0)
    with pytest.raises(ValueError):
        FadeOut(-1)


def _splatter_db(x: np.ndarray, centre: float, guard: float) -> float:
    """Energy of the spectrum farther than ``guard`` Hz from ``centre``, in dB."""
    spec = spectrum_db(x)
    f = np.fft.rfftfreq(x.size, 1 / RATE)
    far = np.abs(f - centre) > guard
    return float(10 * np.log10(np.sum(10 ** (spec[far] / 10))))


def test_cosine_fade_splatters_far_less_than_a_hard_cut() -> None:
    # 1 kHz tone, stopped 0.25 s into a 0.5 s analysis window: faded over 10 ms vs cut dead.
    x = tone(1000, RATE, 0.5)
    stop = RATE // 4
    faded = x.copy()
    faded[stop:] = cosine_fade_out(x[stop:], RATE // 100)
    cut = x.copy()
    cut[stop:] = 0.0
    for guard in (300.0, 500.0, 1000.0):
        fade_db = _splatter_db(faded, 1000.0, guard)
        cut_db = _splatter_db(cut, 1000.0, guard)
        # Measured: 40 / 49 / 59 dB less splatter than the hard cut.
        assert fade_db < cut_db - 30.0, (guard, fade_db, cut_db)
    # And relative to the tone itself the fade's splatter beyond 500 Hz is tiny.
    tone_db = float(np.max(spectrum_db(faded)))
    assert _splatter_db(faded, 1000.0, 500.0) < tone_db - 60.0


def test_equal_gain_crossfade_of_identical_signals_is_transparent() -> None:
    a = np.random.default_rng(2).standard_normal(80)
    np.testing.assert_allclose(hann_crossfade(a, a), a, rtol=0, atol=1e-15)


def test_crossfade_weights_are_complementary_and_symmetric() -> None:
    for n in (1, 2, 80, 81):
        w = hann_crossfade_weights(n)
        np.testing.assert_allclose(w + w[::-1], 1.0, atol=1e-15)
        assert np.all(np.diff(w) > 0) and w[0] > 0 and w[-1] < 1
    y = hann_crossfade(np.ones(80), np.zeros(80))
    np.testing.assert_allclose(y, 1.0 - hann_crossfade_weights(80), atol=1e-15)


def test_crossfade_rejects_length_mismatch() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        hann_crossfade(np.ones(3), np.ones(4))
