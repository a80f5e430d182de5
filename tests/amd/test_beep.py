"""The beep detector: steady tones of 200 ms or more in 400–2000 Hz are beeps, with their
frequency and end time; shorter tones, tones out of band, two-tone signals, noise and speech
are not."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import pytest

from dsp.pcm import float_to_s16
from dsp.telephone import telephone
from gateway.amd.beep import Beep, BeepConfig, BeepDetector
from tests.amd.signals import Int16Array, burst, frames, join, noise, silence, tone


def beeps(x: Int16Array, config: BeepConfig | None = None) -> list[Beep]:
    d = BeepDetector(config)
    out = [b for f in frames(x) if (b := d.process(f)) is not None]
    last = d.flush()
    return out + ([last] if last else [])


@pytest.mark.parametrize("freq", [440.0, 850.0, 1000.0, 1400.0, 1990.0])
@pytest.mark.parametrize("ms", [200, 300, 1000])
def test_tones_in_band_are_beeps(freq: float, ms: int) -> None:
    found = beeps(join(silence(500), tone(freq, ms), silence(500)))
    assert len(found) == 1
    b = found[0]
    assert abs(b.frequency_hz - freq) < 5.0
    assert abs(b.start_ms - 500) <= 20
    assert abs(b.end_ms - (500 + ms)) <= 20


@pytest.mark.parametrize("ms", [60, 100, 160])
def test_short_tones_are_not_beeps(ms: int) -> None:
    assert beeps(join(silence(500), tone(1000.0, ms), silence(500))) == []


@pytest.mark.parametrize("freq", [250.0, 350.0, 2300.0, 3000.0])
def test_tones_out_of_band_are_not_beeps(freq: float) -> None:
    assert beeps(join(silence(500), tone(freq, 1000), silence(500))) == []


def test_a_beep_in_background_noise() -> None:
    x = noise(join(silence(500), tone(850.0, 400, amp=5000.0), silence(500)), 200.0)
    found = beeps(x)
    assert len(found) == 1 and abs(found[0].frequency_hz - 850.0) < 5.0


def test_quiet_tones_are_ignored() -> None:
    assert beeps(join(silence(500), tone(1000.0, 500, amp=100.0), silence(500))) == []


def test_dual_tone_and_noise_are_not_beeps() -> None:
    dtmf = (tone(697.0, 600, 6000.0).astype(np.int32) + tone(1209.0, 600, 6000.0)).astype(np.int16)
    assert beeps(join(silence(300), dtmf, silence(300), burst(1500), silence(300))) == []


def test_a_tone_to_the_end_counts_on_flush() -> None:
    found = beeps(join(silence(500), tone(1000.0, 500)))
    assert len(found) == 1 and found[0].end_ms == 1000


def test_two_beeps_are_two() -> None:
    x = join(silence(300), tone(440.0, 300), silence(300), tone(1000.0, 300), silence(300))
    assert [round(b.frequency_hz, -1) for b in beeps(x)] == [440.0, 1000.0]


def test_a_frequency_jump_ends_the_beep() -> None:
    x = join(silence(300), tone(440.0, 300), tone(1400.0, 300), silence(300))
    found = beeps(x)
    assert [round(b.frequency_hz, -1) for b in found] == [440.0, 1400.0]


def _espeak(text: str, voice: str) -> Int16Array:
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed (deploy/ensure-test-tools.sh installs it)")
    out = subprocess.run(
        [exe, "-v", voice, "--stdout", text], capture_output=True, check=True
    ).stdout
    with wave.open(io.BytesIO(out)) as w:
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    y = telephone(data.astype(np.float64) / 32768.0, rate)
    return float_to_s16(y * 0.5 / max(float(np.max(np.abs(y))), 1e-9))


@pytest.mark.parametrize("voice", ["en-us", "en-us+f3", "en-us+m7"])
def test_speech_is_not_a_beep(voice: str) -> None:
    text = "Hellooo? Hi, you've reached Dana. Aaaah. Ooooh. Please leave a message after the tone."
    speech = _espeak(text, voice)
    assert len(speech) > 8000 * 3
    assert beeps(speech) == []
    # and a beep right after the speech is still found
    found = beeps(join(speech, silence(300), tone(1000.0, 400, 6000.0), silence(300)))
    assert len(found) == 1 and abs(found[0].frequency_hz - 1000.0) < 5.0


def test_analyse_reports_concentration() -> None:
    d = BeepDetector()
    hops = [d.analyse(f) for f in frames(tone(1000.0, 200))]
    assert all(h.tonal and h.concentration > 0.95 for h in hops[1:])
    d = BeepDetector()
    hops = [d.analyse(f) for f in frames(burst(200))]
    assert not any(h.tonal for h in hops)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_hz": 10.0},
        {"min_hz": 1500.0, "max_hz": 1000.0},
        {"max_hz": 3990.0},
        {"min_ms": 30},
        {"min_ms": 210},
        {"concentration": 0.0},
        {"concentration": 1.5},
        {"min_dbfs": 3.0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="amd:"):
        BeepConfig(**kwargs)  # type: ignore[arg-type]


def test_frames_must_be_20_ms() -> None:
    with pytest.raises(ValueError, match="160"):
        BeepDetector().process(np.zeros(100, np.int16))
