"""``python -m voxgate.bench.tickcurve``: the calls-vs-CPU table and curve of two builds, from
``voxgate bench calls --json`` files named ``{build}_{calls}_{try}.json`` (synthetic here, with
the keys the bench writes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from voxgate.bench import tickcurve


def _run(calls: int, loop_pct: float, per_call: float, p99: float, skipped: int) -> dict[str, Any]:
    return {
        "conditions": {"calls": calls, "loadavg_1m_at_start": 0.456, "cpu": "Test CPU"},
        "calls": {"held_during_plateau": {"min": calls - 1, "max": calls, "polls": 9}},
        "cpu": {
            "plateau": {"event_loop_thread_pct": loop_pct},
            "per_call_event_loop_pct_core": per_call,
            "event_loop_cpu_s_per_call_minute": per_call / 100.0 * 60.0,
            "calibration_cpu_s": 0.2,
        },
        "pacing": {
            "ticker_send_error_ms": {"p50": 0.1, "p95": 0.5, "p99": p99, "max": 2 * p99},
            "skipped_ticks_total": skipped,
        },
    }


def _write(d: Path, name: str, r: dict[str, Any]) -> None:
    (d / f"{name}.json").write_text(json.dumps(r))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    _write(tmp_path, "before_100_a", _run(100, 60.0, 0.55, 9.0, 40))
    _write(tmp_path, "before_100_b", _run(100, 70.0, 0.65, 15.0, 90))
    _write(tmp_path, "before_100_c", _run(100, 65.0, 0.60, 11.0, 50))
    _write(tmp_path, "after_100_a", _run(100, 30.0, 0.25, 1.5, 0))
    _write(tmp_path, "after_10_a", _run(10, 8.0, 0.40, 0.4, 0))
    _write(tmp_path, "after_200_a", _run(200, 55.0, 0.26, 1.9, 3))
    (tmp_path / "after_50_a.json").write_text("{not json")  # an interrupted run: skipped
    (tmp_path / "notes.json").write_text("{}")  # not a run's name: skipped
    return tmp_path


def test_points_are_medians_over_tries_and_keep_every_try(runs: Path) -> None:
    data = tickcurve.load(runs)
    assert sorted(data) == ["after", "before"]
    assert sorted(data["after"]) == [10, 100, 200]  # the broken 50-call file is left out
    p = tickcurve.point(data["before"][100])
    assert p["tries"] == 3
    assert p["event_loop_pct"] == pytest.approx(65.0)
    assert p["per_call_event_loop_pct"] == pytest.approx(0.60)
    assert p["cpu_s_per_call_minute"] == pytest.approx(0.60 / 100 * 60)
    assert p["ticker"]["p99"] == pytest.approx(11.0)
    assert p["worst_p99"] == pytest.approx(15.0)
    assert p["each_per_call"] == [0.55, 0.65, 0.60]  # file-name order
    assert p["skipped"] == [40, 90, 50]
    assert p["held_min"] == 99
    assert p["load"] == [0.46, 0.46, 0.46]


def test_table_rows_per_count_and_build(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = runs / "curve.png"
    assert tickcurve.main([str(runs), "--png", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln for ln in out if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split("|")[1:3] for r in rows] == [
        [" 10 ", " after "],
        [" 100 ", " after "],
        [" 100 ", " before "],
        [" 200 ", " after "],
    ]
    before = rows[2]
    assert "0.600 (0.550, 0.650, 0.600)" in before
    assert "0.1 / 0.5 / 11.0 / 22.0" in before
    assert "40, 90, 50" in before
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_json_output(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tickcurve.main([str(runs), "--json"]) == 0
    curves = json.loads(capsys.readouterr().out)
    assert [p["calls"] for p in curves["after"]] == [10, 100, 200]
    assert curves["after"][2]["skipped"] == [3]
