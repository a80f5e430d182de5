"""The NumPy-only designs (dsp.kaiser, the EQ's impulse response) against scipy.signal, and
the start-up path that they keep free of importing scipy.signal."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.signal

from dsp.eq import Equalizer, impulse_response, midband_eq, midband_sections, response_db
from dsp.kaiser import firwin_lowpass, kaiser_beta, kaiserord


@pytest.mark.parametrize("atten", [8.0, 15.0, 21.0, 30.0, 50.0, 60.0, 80.0, 100.0])
def test_kaiserord_and_beta_equal_scipy(atten: float) -> None:
    for width in (0.01, 0.05, 0.2):
        assert kaiserord(atten, width) == pytest.approx(scipy.signal.kaiserord(atten, width))
    assert kaiser_beta(atten) == pytest.approx(scipy.signal.kaiser_beta(atten), abs=1e-15)


def test_kaiserord_rejects_what_scipy_rejects() -> None:
    with pytest.raises(ValueError):
        kaiserord(7.0, 0.1)
    with pytest.raises(ValueError):
        kaiserord(60.0, 0.0)


@pytest.mark.parametrize(
    ("numtaps", "cutoff", "beta", "fs"),
    [(1, 1000.0, 5.0, 8000.0), (31, 1000.0, 0.0, 8000.0), (255, 3900.0, 7.857, 176400.0),
     (1021, 3800.0, 7.857, 1764000.0), (64, 0.3, 3.0, 2.0)],
)  # fmt: skip
def test_firwin_lowpass_equals_scipy(numtaps: int, cutoff: float, beta: float, fs: float) -> None:
    ref = scipy.signal.firwin(numtaps, cutoff, window=("kaiser", beta), fs=fs)
    np.testing.assert_allclose(firwin_lowpass(numtaps, cutoff, beta, fs), ref, rtol=0, atol=1e-14)


def test_firwin_lowpass_rejects_bad_cutoffs() -> None:
    for cutoff in (0.0, 4000.0, 5000.0):
        with pytest.raises(ValueError):
            firwin_lowpass(31, cutoff, 5.0, 8000.0)


@pytest.mark.parametrize("gain_db", [-12.0, -2.0, 1.0, 2.0, 6.0, 12.0])
def test_eq_at_any_gain_equals_the_recursive_filter(gain_db: float) -> None:
    x = np.random.default_rng(3).standard_normal(6000)
    sections = midband_sections(8000, gain_db)
    sos = np.array([np.r_[b, a] for b, a in sections])
    np.testing.assert_allclose(
        midband_eq(x, 8000, gain_db), scipy.signal.sosfilt(sos, x), rtol=0, atol=1e-12
    )


def test_impulse_response_rejects_an_unstable_or_ringing_cascade() -> None:
    unstable = (np.array([1.0, 0.0, 0.0]), np.array([1.0, 0.0, -1.0001]))
    with pytest.raises(ValueError, match="unstable"):
        impulse_response([unstable])
    ringing = (np.array([1.0, 0.0, 0.0]), np.array([1.0, 0.0, -0.9999]))
    with pytest.raises(ValueError, match="rings"):
        impulse_response([ringing])
    fir_only = (np.array([0.5, 0.25, 0.0]), np.array([1.0, 0.0, 0.0]))
    np.testing.assert_allclose(impulse_response([fir_only])[:3], [0.5, 0.25, 0.0])
    assert Equalizer([fir_only]).process(np.array([1.0, 0.0, 0.0])).tolist() == [0.5, 0.25, 0.0]


def test_response_db_equals_freqz() -> None:
    f = np.linspace(0.0, 4000.0, 97)
    sections = midband_sections(8000, 3.0)
    h = np.ones(f.shape, dtype=np.complex128)
    for b, a in sections:
        h *= scipy.signal.freqz(b, a, worN=f, fs=8000)[1]
    np.testing.assert_allclose(response_db(sections, f, 8000), 20 * np.log10(np.abs(h)), atol=1e-10)


def test_worker_and_gateway_start_without_importing_scipy_signal() -> None:
    # What `voxgate worker` and `voxgate serve` import before ready (voxgate.bench.cold_child
    # follows the worker's path); scipy.signal alone was 1.4 s of a 2.3 s start on a 2-core box.
    code = (
        "import sys, redis.asyncio, synth.app, synth.health, gateway.app\n"
        "from voxgate.contract.runtime import run\n"
        "from dsp.telephone import TelephoneChain\n"
        "from dsp.wideband import WidebandChain\n"
        "TelephoneChain(22050).process(__import__('numpy').zeros(2205), last=True)\n"
        "print(sorted(m for m in sys.modules if m.startswith('scipy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
