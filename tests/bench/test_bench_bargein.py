"""``voxgate bench bargein --quick --json``: runs end to end and reports consistent figures (no
timing assertion: the numbers depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _pct(d: dict[str, Any], n: int | None = None) -> None:
    for key in ("n", "p50", "p95", "p99"):
        assert key in d, d
    if n is not None:
        assert d["n"] == n, d
    if d["n"]:
        assert d["p50"] <= d["p95"] <= d["p99"], d
    else:
        assert d["p50"] is None, d


@pytest.mark.timeout(120)
def test_bench_bargein_quick_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "bargein", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)

    c = r["conditions"]
    for key in ("cpu", "cores", "loadavg_1m_at_start", "loadavg_1m_at_end", "python", "engine",
                "trials", "quick", "bargein_settings"):  # fmt: skip
        assert key in c, key
    assert c["quick"] is True and c["trials"] == 4

    t = r["trials"]
    assert t["speech"] == 4 == len(r["per_trial"])
    assert t["with_echo"] + t["without_echo"] == t["speech"]
    assert t["with_echo"] == 2
    assert t["measured"] + t["missed"] + len(t["errors"]) == t["speech"]
    assert t["measured"] == sum(1 for x in r["per_trial"] if x.get("onset_to_zero_ms") is not None)

    m = t["measured"]
    for key in ("decision_to_zero_ms", "onset_to_zero_ms", "detector_onset_to_zero_ms",
                "onset_to_decision_ms"):  # fmt: skip
        _pct(r[key], m)
        assert not m or r[key]["p50"] >= 0, (key, r[key])
    _pct(r["detector_onset_error_ms"], m)
    _pct(r["decision_to_client_silence_ms"])
    assert r["decision_to_client_silence_ms"]["n"] <= m
    _pct(r["worker_stop_ms"], r["worker_stops_acknowledged"])
    assert r["worker_stops_acknowledged"] <= m
    by = r["by_echo"]
    assert by["with_echo"]["trials"] + by["without_echo"]["trials"] == t["speech"]
    assert by["with_echo"]["missed"] + by["without_echo"]["missed"] == t["missed"]
    assert (
        by["with_echo"]["onset_to_zero_ms"]["n"] + by["without_echo"]["onset_to_zero_ms"]["n"] == m
    )

    e = r["echo_only"]
    assert e["calls"] >= 1 and e["echo_s"] > 0
    assert isinstance(e["false_bargeins"], int) and e["false_bargeins"] >= 0
    assert e["false_per_min"] == pytest.approx(e["false_bargeins"] / (e["echo_s"] / 60))

    # The caller-side figure: sent speech packet -> first silent packet back, at the client.
    _pct(r["caller_onset_to_silent_packet_ms"])
    assert r["caller_onset_to_silent_packet_ms"]["n"] <= m
    assert set(r["met"]) == {"caller_onset_to_silence", "decision_to_zero", "onset_to_zero",
                             "false_bargeins_on_echo", "missed"}  # fmt: skip
    assert all(isinstance(v, bool) for v in r["met"].values())
