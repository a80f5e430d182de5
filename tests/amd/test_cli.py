"""``voxgate amd FILE.wav`` on WAVs the test writes (one at 16 kHz, resampled to 8 kHz)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dsp.wavio import write_wav_s16
from tests.amd.signals import burst, join, silence, tone
from voxgate.cli import main


def _human_16k(path: Path) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [np.zeros(8000), rng.normal(0.0, 0.1, 6400), np.zeros(48000)]  # 0.5 s, 0.4 s, 3 s
    )
    write_wav_s16(path, 16000, x)


def _machine_8k(path: Path) -> None:
    x = join(silence(300), burst(3000), silence(500), tone(1000.0, 500), silence(1000))
    write_wav_s16(path, 8000, x.astype(np.float64) / 32768.0)


def test_a_person_at_16_khz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "hello.wav"
    _human_16k(wav)
    assert main(["amd", str(wav), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["result"], out["cause"]) == ("human", "HUMAN")
    assert abs(out["decision_ms"] - 1700) <= 40
    assert out["duration_ms"] == 3900
    assert [e["event"] for e in out["events"]] == ["amd.human"]


def test_a_machine_with_a_beep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "vm.wav"
    _machine_8k(wav)
    assert main(["amd", str(wav), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["result"], out["cause"], out["decision_ms"]) == ("machine", "LONGGREETING", 1800)
    beep = out["events"][1]
    assert beep["event"] == "amd.beep" and abs(beep["frequency_hz"] - 1000.0) < 5
    assert out["voicemail_from_ms"] == beep["at_ms"]
    assert main(["amd", str(wav)]) == 0
    text = capsys.readouterr().out
    assert "machine (LONGGREETING) at 1800 ms" in text and "amd.beep" in text


def test_a_setting_changes_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "vm.wav"
    _machine_8k(wav)
    assert main(["amd", str(wav), "--json", "--set", "greeting=4000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["result"], out["cause"]) == ("machine", "BEEP")


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["amd", str(tmp_path / "missing.wav")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav")
    assert main(["amd", str(bad)]) == 2
    wav = tmp_path / "vm.wav"
    _machine_8k(wav)
    assert main(["amd", str(wav), "--set", "nonsense=1"]) == 2
    assert main(["amd", str(wav), "--set", "greeting=0"]) == 2
    assert "amd:" in capsys.readouterr().err
