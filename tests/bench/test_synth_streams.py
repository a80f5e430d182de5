"""``voxgate bench synth --streams``: N calls talking continuously, batched and per-stream modes
in one run (issue 16). A quick real run on the onnx engine (two levels, a few seconds each)
checks the JSON's structure and that its figures hang together; the pure helpers are checked on
numbers worked out by hand."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from synth.engines.onnx_engine import OnnxEngine
from voxgate.bench.synth_streams import (
    MAX_UNDERRUN_RATE,
    Mode,
    bench_streams,
    sustained_streams,
    underrun_ms,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[2]


def test_underrun_is_lateness_against_playback_from_the_first_chunk() -> None:
    rate = 8000
    # 0.2 s chunks: the second is due at 0.2 s, comes at 0.15 (early); the third is due at
    # 0.4 s and comes at 0.45: 50 ms late.
    chunks = [(10.0, 1600, rate), (10.15, 1600, rate), (10.45, 1600, rate)]
    assert underrun_ms(chunks) == pytest.approx(50.0)
    assert underrun_ms(chunks[:2]) == pytest.approx(0.0)  # the first chunk is never late
    assert underrun_ms([]) == 0.0


def test_sustained_is_the_largest_level_within_target_and_underruns() -> None:
    def point(n: int, p95: float, rate: float = 0.0) -> dict[str, Any]:
        return {"streams": n, "ttfa_ms": {"p95": p95}, "underrun_rate": rate}

    points = [point(1, 40), point(2, 90), point(4, 120), point(8, 80, 2 * MAX_UNDERRUN_RATE)]
    assert sustained_streams(points, 100.0) == 2  # 4 too slow, 8 underruns
    assert sustained_streams(points, 150.0) == 4
    assert sustained_streams([point(1, 300)], 250.0) == 0
    assert sustained_streams([point(1, math.nan)], 250.0) == 0  # no utterance: not sustained


def test_time_budget_skips_levels_it_cannot_fit() -> None:
    engine = OnnxEngine(threads=1)
    r = asyncio.run(
        bench_streams([Mode("per-stream", engine)], (1, 2), ["Hello."], time_budget_s=0.0)
    )
    assert r["modes"] == {"per-stream": []} and r["complete"]
    assert [(s["mode"], s["streams"]) for s in r["skipped"]] == [
        ("per-stream", 1),
        ("per-stream", 2),
    ]
    assert r["sustained_streams"] == {"per-stream": 0}


def _check_percentiles(p: dict[str, float], n: int) -> None:
    assert p["n"] == n
    assert 0 < p["p50"] <= p["p95"] <= p["p99"]


@pytest.mark.slow
def test_quick_streams_run_interleaves_both_modes(tmp_path: Path) -> None:
    out, plot = tmp_path / "streams.json", tmp_path / "streams.png"
    cmd = [
        sys.executable, "-m", "voxgate.cli", "bench", "synth", "--engine", "onnx",
        "--streams", "1,2", "--modes", "batched,per-stream", "--duration-s", "2",
        "--out", str(out), "--plot", str(plot), "--log-level", "warning",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "streams sustained in real time" in run.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["ttfa_target_ms"] == 250.0 and r["complete"]
    assert r["conditions"]["engine"] == "onnx" and r["conditions"]["cores"] >= 1
    assert set(r["warmup_s"]) == {"batched", "per-stream"}
    assert set(r["modes"]) == {"batched", "per-stream"}
    for name, points in r["modes"].items():
        assert [p["streams"] for p in points] == [1, 2], name  # neither mode dropped at 1-2
        for p in points:
            n = p["utterances"]
            assert n >= p["streams"]  # every call spoke at least once
            assert p["errors"] == 0
            _check_percentiles(p["ttfa_ms"], n)
            _check_percentiles(p["rtf_per_stream"], n)
            assert 0 <= p["underruns"] <= n
            assert p["underrun_rate"] == pytest.approx(p["underruns"] / n)
            assert p["audio_s"] > 0 and p["wall_s"] >= 2.0
            assert p["audio_s_per_s"] == pytest.approx(p["audio_s"] / p["wall_s"])
            assert p["gpu_memory"] == {}  # a CPU run has none
        batched = [p for p in points if "batches" in p]
        if name == "batched":
            assert len(batched) == len(points)
            for p in batched:
                decode = p["batches"]["decode"]
                assert decode["batches"] >= 1 and 1 <= decode["mean_size"] <= decode["max_size"]
                assert 0 < p["scheduler_busy"] <= 1.0
            assert points[0]["worker_threads"] == 1 and points[1]["worker_threads"] == 2
        else:
            assert batched == []  # per-stream: no scheduler
        assert r["sustained_streams"][name] == sustained_streams(points, 250.0)
