"""``voxgate bench campaign``: its figures from a campaign record, and one small real run
(a ``voxgate serve`` process dialling a sipp UAS through the REST API)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from voxgate.bench.campaign import peak_overlap, summarise


def test_peak_overlap_counts_calls_open_at_once() -> None:
    assert peak_overlap([]) == 0
    assert peak_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # one ends as the next starts
    assert peak_overlap([(0, 10), (1, 2), (1.5, 3), (2.5, 4)]) == 3


def _record(starts: list[float], length: float) -> dict[str, object]:
    return {
        "contacts": [
            {"attempts": [{"started_at": s, "ended_at": s + length, "outcome": "human"}]}
            for s in starts
        ]
    }


def test_summarise_reports_rate_spacing_and_peak() -> None:
    starts = [i * 0.1 for i in range(11)]  # 10 cps for 1 s
    r = summarise(_record(starts, 0.35), cps=10, max_concurrent=5)
    assert r["attempts"] == 11
    assert r["dials_per_s"] == pytest.approx(10.0)
    assert r["dial_gap_min_ms"] == pytest.approx(100.0)
    assert r["dial_gap_ms"]["p50"] == pytest.approx(100.0)
    assert r["peak_concurrent"] == 4  # 0.35 s calls, one every 0.1 s
    assert r["outcomes"] == {"human": 11}


def test_small_campaign_run_against_sipp() -> None:
    if shutil.which("sipp") is None:
        pytest.skip("sipp is not installed (deploy/ensure-test-tools.sh installs it)")
    out = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "campaign", "--contacts", "12",
         "--cps", "8", "--concurrency", "4", "--hold-ms", "800", "--json"],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    r = json.loads(out.stdout)
    assert r["attempts"] == 12
    assert r["outcomes"] == {"human": 12}
    # The pacer's promises, on the attempts' recorded times: never two dials within 1/cps,
    # never more than max_concurrent calls up at once.
    assert r["dial_gap_min_ms"] >= 125.0 - 1.0
    assert r["peak_concurrent"] <= 4
    assert r["gateway_cpu"]["cpu_s_per_call"] > 0
