"""The word rule offline (``classify(..., stt)``, ``voxgate amd --words``, ``voxgate bench amd
--words``): transcripts reach the detector once the media time has advanced by the recogniser's
compute time, as on a live call."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dsp.wavio import write_wav_s16
from gateway.amd.detector import AmdMachine
from gateway.amd.offline import classify
from gateway.amd.speech import AmdEars
from gateway.stt.base import STT_RATE, FloatArray, Transcript
from tests.amd.signals import frames
from tests.amd.test_oncall_words import quiet_greeting
from voxgate.bench import amd as bench
from voxgate.cli import main

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (deploy/ensure-test-tools.sh installs it)",
)


class SlowPhraseStt:
    """Says "please leave a message" for anything, taking ``compute_s`` to do it."""

    name = "fake"

    def __init__(self, compute_s: float) -> None:
        self.compute_s = compute_s
        self.calls = 0

    def transcribe(self, audio: FloatArray) -> Transcript:
        self.calls += 1
        return Transcript("please leave a message", audio.size / STT_RATE, self.compute_s)


def test_a_transcript_counts_after_its_compute_time() -> None:
    pcm = quiet_greeting(-45.0)
    # When the ears hand over their first utterance (the media time of that frame's end).
    ears = AmdEars()
    first = next(i for i, f in enumerate(frames(pcm)) if ears.feed(f) is not None)
    submitted_ms = (first + 1) * 20
    stt = SlowPhraseStt(0.25)
    c = classify(pcm, stt=stt)
    assert (c.result, c.cause) == ("machine", "HINT")
    # The first frame at or after submitted + 250 ms: one recognition, none after it.
    assert c.decision_ms == submitted_ms + 260
    assert c.recognitions == stt.calls == 1 and c.stt_s == pytest.approx(0.25)
    assert isinstance(c.events[0], AmdMachine)
    assert classify(pcm).result != "machine"  # without the words: not a machine


@pytest.fixture(scope="module")
def have_whisper() -> None:
    from gateway.stt.whisper import SttUnavailable, model_dir

    try:
        model_dir()
    except (SttUnavailable, ImportError) as exc:
        pytest.skip(f"the speech-to-text model is not installed: {exc}")


@pytest.mark.usefixtures("have_whisper")
def test_voxgate_amd_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "quiet.wav"
    write_wav_s16(wav, 8000, quiet_greeting(-43.0).astype(np.float64) / 32768.0)
    assert main(["amd", str(wav), "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["result"] != "machine" and alone["recognitions"] == 0
    assert main(["amd", str(wav), "--json", "--words"]) == 0
    words = json.loads(capsys.readouterr().out)
    assert words["result"] == "machine" and words["cause"] in ("WORDCOUNT", "HINT")
    assert words["recognitions"] >= 1 and words["stt_s"] > 0
    assert main(["amd", str(wav), "--words"]) == 0
    assert "machine" in capsys.readouterr().out


@pytest.mark.usefixtures("have_whisper")
def test_bench_amd_words_reports_both(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--people", "1", "--machines", "2", "--no-piper", "--words"]
    quiet = ["--speech-dbfs", "-43", "--noise-dbfs", "-55"]
    assert bench.main([*args, *quiet, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plain, words = out["results"], out["words"]
    assert plain["words"] is False and plain["recognitions"] == 0
    assert words["words"] is True and words["recognitions"] >= 1 and words["stt_s"] > 0
    # The same greetings both ways.
    key = [(r["truth"], r["text"], r["voice"]) for r in plain["rows"]]
    assert key == [(r["truth"], r["text"], r["voice"]) for r in words["rows"]]
    assert sum(r["recognitions"] for r in words["rows"]) == words["recognitions"]
    assert out["conditions"]["speech_dbfs"] == -43 and out["conditions"]["stt"]
    assert bench.main(args) == 0
    text = capsys.readouterr().out
    assert "heuristic + beep: " in text and "heuristic + beep + word rule (" in text
    assert text.count("confusion") == 2
