"""CPU guard: ``voxgate bench calls`` at a small load, the gateway's event-loop CPU per call
against the budget stored in ``cpu_budget.toml`` (CPU-seconds per call-minute, scaled to this
machine by the calibration workload measured in the same run).

It caught, and now guards, the collapse of 100-call loads: every call's barge-in detector ran
alone, ~130 µs of numpy calls per 20 ms frame, until the detectors were batched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (sip-tester) is not installed"),
]

BUDGET = Path(__file__).with_name("cpu_budget.toml")


@pytest.mark.timeout(240)
def test_event_loop_cpu_per_call_within_budget() -> None:
    spec = tomllib.loads(BUDGET.read_text())
    argv = [
        sys.executable, "-m", "voxgate.cli", "bench", "calls", "--json",
        "--calls", str(spec["calls"]), "--rate", str(spec["rate"]),
        "--duration", str(spec["duration"]), "--latency-calls", "1", "--idle", "1",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=220)
    assert out.returncode in (0, 1), out.stderr[-2000:]  # 1: some target missed (reported)
    result = json.loads(out.stdout)
    held = result["calls"]["held_during_plateau"]
    assert held["min"] >= spec["calls"] * 0.9, held  # the load really was there
    cpu = result["cpu"]
    used = cpu["event_loop_cpu_s_per_call_minute"]
    calibration = cpu["calibration_cpu_s"]
    scale = max(calibration / spec["reference_calibration_cpu_s"], 1.0)
    budget = spec["budget_cpu_s_per_call_minute"] * scale
    print(
        f"\nevent loop: {used:.3f} CPU-s per call-minute "
        f"({cpu['per_call_event_loop_pct_core']:.3f} % of a core per call) at "
        f"{spec['calls']} calls; budget {budget:.3f} (stored "
        f"{spec['budget_cpu_s_per_call_minute']} x calibration {calibration:.3f} / "
        f"{spec['reference_calibration_cpu_s']}); skipped ticks "
        f"{result['pacing']['skipped_ticks_total']}"
    )
    assert used > 0.0, cpu  # measured something
    assert used <= budget, (
        f"the gateway's event loop spends {used:.3f} CPU-s per call-minute at "
        f"{spec['calls']} calls; budget {budget:.3f}: profile `voxgate bench calls` "
        "(py-spy or cProfile on the plateau) before raising it"
    )
