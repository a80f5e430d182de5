import json
import wave
from pathlib import Path

import numpy as np
import pytest
import scipy.io.wavfile

from tests.dsp.helpers import tone
from voxgate.cli import main


def run_cli(argv: list[str]) -> int:
    """Through the real ``voxgate`` command line."""
    return main(argv)


def read_wav(path: Path) -> tuple[int, int, int, np.ndarray]:
    with wave.open(str(path), "rb") as w:
        frames = w.readframes(w.getnframes())
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), np.frombuffer(frames, "<i2")


def test_telephone_writes_8k_16bit_mono(tmp_path: Path) -> None:
    src = tmp_path / "in.wav"
    x = tone(1000, 22050, 0.5, amp=0.3)
    scipy.io.wavfile.write(src, 22050, (x * 32767).astype(np.int16))
    out = tmp_path / "out.wav"
    assert run_cli(["dsp", "telephone", str(src), str(out)]) == 0
    rate, channels, width, y = read_wav(out)
    assert (rate, channels, width) == (8000, 1, 2)
    assert y.size == -(-x.size * 8000 // 22050)
    assert 0.3 * 32768 < np.abs(y.astype(np.int32)).max() < 0.4 * 32768  # +1.2 dB EQ at 1 kHz


@pytest.mark.parametrize("codec", ["pcmu", "pcma"])
def test_telephone_stereo_float_input_with_codec(tmp_path: Path, codec: str) -> None:
    src = tmp_path / "in.wav"
    x = tone(500, 16000, 0.25, amp=0.2).astype(np.float32)
    scipy.io.wavfile.write(src, 16000, np.stack([x, x], axis=1))
    out = tmp_path / "out.wav"
    argv = ["dsp", "telephone", str(src), str(out), "--codec", codec, "--eq-gain-db", "0"]
    assert run_cli(argv) == 0
    rate, channels, _, y = read_wav(out)
    assert rate == 8000 and channels == 1 and y.size == 2000
    assert abs(np.abs(y[300:-300].astype(np.int32)).max() / 32768 - 0.2) < 0.01


def test_telephone_missing_or_bad_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["dsp", "telephone", str(tmp_path / "nope.wav"), str(tmp_path / "o.wav")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such file" in err
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav file at all")
    assert run_cli(["dsp", "telephone", str(bad), str(tmp_path / "o.wav")]) == 2
    assert "not a readable WAV" in capsys.readouterr().err


def test_telephone_unsupported_rate_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.wav"
    scipy.io.wavfile.write(src, 6000, np.zeros(600, dtype=np.int16))
    assert run_cli(["dsp", "telephone", str(src), str(tmp_path / "o.wav")]) == 2
    assert "unsupported sample rate 6000" in capsys.readouterr().err


def test_bench_dsp_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["bench", "dsp", "--json", "--iterations", "30"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("p50", "p95", "p99"):
        assert report["per_block_us"][key] > 0
    assert report["conditions"]["iterations"] == 30
    assert report["conditions"]["in_rate"] == 22050
    assert report["percent_core"]["wall"] > 0


def test_bench_dsp_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["bench", "dsp", "--iterations", "10"]) == 0
    assert "p99" in capsys.readouterr().out
