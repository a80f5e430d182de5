"""``voxgate bench amd`` on a few greetings (espeak-ng voices): the report adds up."""

from __future__ import annotations

import json
import shutil

import pytest

from voxgate.bench import amd as bench

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (deploy/ensure-test-tools.sh installs it)",
)


def test_greetings_are_what_they_say() -> None:
    gs = bench.make_greetings(2, 3, seed=5, piper=False)
    assert [g.truth for g in gs] == ["human"] * 2 + ["machine"] * 3
    for g in gs:
        duration_ms = len(g.pcm) * 1000 // bench.RATE
        if g.truth == "human":
            assert g.beep_hz is None and duration_ms > 4000 + g.speech_ms
        else:
            assert g.speech_ms >= 2500  # voicemail greetings are long
        if g.beep_end_ms is not None:
            assert g.beep_hz in bench.BEEPS_HZ
            assert g.beep_end_ms + 3000 <= duration_ms + 1
    assert any(g.beep_hz for g in gs) and any(g.noise for g in gs)


def test_a_small_run_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--people", "3", "--machines", "3", "--no-piper", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    res, cond = out["results"], out["conditions"]
    assert res["n"] == 6 == len(res["rows"])
    conf = res["confusion"]
    assert sum(conf["human"].values()) == 3 and sum(conf["machine"].values()) == 3
    assert res["correct"] == conf["human"]["human"] + conf["machine"]["machine"]
    assert res["correct"] == sum(r["result"] == r["truth"] for r in res["rows"])
    assert res["accuracy"] == pytest.approx(res["correct"] / 6)
    assert res["correct"] >= 5  # short answers and long greetings: the easy cases
    for truth in ("human", "machine"):
        decided = [r for r in res["rows"] if r["truth"] == truth and r["decision_ms"] is not None]
        assert res["decision_ms"][truth]["n"] == len(decided)
    with_beep = [r for r in res["rows"] if r["beep_end_ms"] is not None]
    assert res["beeps"]["n"] == len(with_beep) >= 1
    for r in res["rows"]:
        if r["voicemail_from_ms"] is not None:
            assert r["result"] == "machine" and r["voicemail_from_ms"] >= r["decision_ms"]
    assert cond["people"] == 3 and "piper" not in cond["voices"]
    assert cond["amd_config"]["maximum_number_of_words"] == 3


def test_the_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--people", "1", "--machines", "1", "--no-piper", "--set", "greeting=1500"]
    assert bench.main(args) == 0
    text = capsys.readouterr().out
    assert "AMD on 2 generated greetings" in text and "confusion" in text
    assert "decision after answer,   human" in text and "run conditions:" in text
    assert bench.main(["--set", "bogus=1"]) == 2
