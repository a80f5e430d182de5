"""``voxgate bench calls --quick --json``: runs end to end and reports sane figures (this is no
timing assertion: the numbers depend on the machine)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) is not installed"),
]


COMMAND = [sys.executable, "-m", "voxgate.cli", "bench", "calls"]


def _pct(d: dict[str, Any]) -> None:
    for key in ("p50", "p95", "p99"):
        assert key in d, d
        assert isinstance(d[key], int | float), d
    assert 0 <= d["p50"] <= d["p95"] <= d["p99"], d


@pytest.mark.timeout(120)
def test_bench_calls_quick_json() -> None:
    out = subprocess.run(
        [*COMMAND, "--quick", "--json"], capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)

    c = r["conditions"]
    for key in ("cpu", "cores", "loadavg_1m_at_start", "engine", "calls", "rate_cps",
                "duration_s", "mode"):  # fmt: skip
        assert key in c
    assert c["calls"] == 6 and c["quick"] is True

    calls = r["calls"]
    assert calls["held_during_plateau"]["max"] == 6
    assert calls["sipp"]["successful"] == 6 - calls["sample_calls"]
    assert calls["sipp"]["failed"] == 0
    assert not calls["sample_errors"]

    ticker = r["pacing"]["ticker_send_error_ms"]
    _pct(ticker)
    assert ticker["n"] > 100  # 6 calls x 50 packets/s over the plateau
    assert ticker["p50"] < 20.0  # sane: well within one packet time
    assert r["pacing"]["ticker_timer"] == "timerfd"  # gateway.media_timer "auto" on Linux
    # Stall attribution: the collector's pauses and the loop thread's wait for a CPU.
    gcp = r["pacing"]["gc_pauses"]
    assert len(gcp["collections_by_generation"]) == 3
    assert all(n >= 0 for n in gcp["collections_by_generation"])
    assert 0.0 <= gcp["max_ms"] < 10_000
    sched = r["pacing"]["event_loop_sched"]
    assert 0.0 < sched["on_cpu_pct"] <= 101.0  # it ran: the calls were paced
    assert sched["runqueue_wait_pct"] >= 0.0
    jitter = r["pacing"]["receive_jitter_ms"]
    _pct(jitter)
    assert jitter["n"] > 100 and jitter["p50"] < 20.0

    g = r["greeting"]
    _pct(g["first_audio_after_ack_ms"])
    assert g["first_audio_after_ack_ms"]["n"] == 3
    assert 0 < g["first_audio_after_ack_ms"]["p50"] < 5000
    _pct(g["under_load_first_audio_ms"])
    assert g["under_load_first_audio_ms"]["never"] == 0

    u = r["underruns"]
    assert u["playout_underrun_frames_total"] >= 0
    assert u["receiver_seq_gaps"] == 0

    cpu = r["cpu"]
    assert 0 < cpu["plateau"]["process_pct"] < 100 * (c["cores"] or 1) + 1
    assert cpu["idle"]["process_pct"] >= 0
    assert isinstance(cpu["per_call_pct_core"], float)
    assert set(r["pass"]) == {"calls", "ticker_p99", "underruns", "cpu_per_call", "greeting_p95"}


@pytest.mark.redis
@pytest.mark.timeout(150)
def test_bench_calls_quick_redis_json() -> None:
    """``--redis``: ``voxgate gateway`` and a ``voxgate worker`` process over Redis (the gateway
    takes no synthesis options); the figures are the gateway process's alone."""
    from tests.conftest import REDIS_URL

    out = subprocess.run(
        [*COMMAND, "--quick", "--json", "--redis", REDIS_URL],
        capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["conditions"]["mode"].startswith("voxgate gateway + voxgate worker")
    assert r["calls"]["held_during_plateau"]["max"] == 6
    assert r["calls"]["sipp"]["failed"] == 0
    assert r["greeting"]["under_load_first_audio_ms"]["never"] == 0  # the worker spoke
    assert "worker" in r["cpu"]["other_processes"]
    assert r["pacing"]["ticker_send_error_ms"]["n"] > 100
