"""``voxgate bench bridge``: the caller-side measures on synthetic packets (where silence starts,
which packet carries a burst), and a short real run of the probe part end to end (no timing
assertion: the figures depend on the machine; their consistency is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from voxgate.bench.bridge import (
    AUDIBLE,
    RATE,
    SPF,
    bargein_trial,
    burst_arrivals,
    distinct,
    silence_after,
    tone,
)


def _packets(frames: list[np.ndarray], t0: float = 100.0) -> list[tuple[float, np.ndarray]]:
    return [(t0 + i * 0.02, f.astype(np.int16)) for i, f in enumerate(frames)]


def test_silence_is_the_last_audible_sample_before_quiet() -> None:
    loud = tone(SPF, amp=10000.0)
    faded = loud.copy()
    faded[40:] = 0  # the fade ended 5 ms into this packet
    quiet = np.zeros(SPF, np.int16)
    pk = _packets([loud, loud, faded, quiet, quiet, quiet, quiet, quiet, loud, quiet])
    last_idx = int(np.nonzero(np.abs(faded.astype(np.int32)) >= AUDIBLE)[0][-1])
    assert silence_after(pk, 100.0, 100.16) == pytest.approx(100.04 + (last_idx + 1) / RATE)
    # A pause is not the end: the sound after it counts, and then it had not stopped in time.
    assert silence_after(pk, 100.0, 100.2) is None
    assert silence_after(pk, 100.0, 100.3) == pytest.approx(100.16 + SPF / RATE)
    assert silence_after(_packets([quiet] * 8), 100.0, 101.0) is None


def test_a_burst_is_found_once_in_the_packet_that_starts_it() -> None:
    quiet = np.zeros(SPF, np.int16)
    half = np.concatenate((np.zeros(SPF // 2), tone(SPF // 2))).astype(np.int16)
    rest = np.concatenate((tone(SPF // 2), np.zeros(SPF // 2))).astype(np.int16)
    pk = _packets([quiet, half, rest, quiet, quiet, tone(SPF), quiet])
    assert burst_arrivals(pk, 0.0) == pytest.approx([100.02, 100.10])
    assert burst_arrivals(pk, 100.05) == pytest.approx([100.10])


def test_a_barge_in_trial_is_measured_only_where_the_bot_was_talking() -> None:
    # Silent 20 ms after the decision: measured, split at the decision.
    t = bargein_trial(10.0, 10.4, 10.42)
    assert t == pytest.approx(
        {"total_ms": 420.0, "onset_to_decision_ms": 400.0, "decision_to_silence_ms": 20.0}
    )
    # A pause between words just before the decision is still the interruption.
    assert "total_ms" in bargein_trial(10.0, 10.4, 10.3)
    # Silent half a second before its VAD decided: a gap in the bot's own speech, not a cut.
    assert bargein_trial(10.0, 10.5, 10.06) == {"bot_gap": 1.0}
    assert bargein_trial(10.0, None, None) == {"missed": 1.0}
    assert bargein_trial(10.0, 10.4, None) == {"missed": 1.0}


def test_interruption_frames_seen_twice_count_once() -> None:
    assert distinct([5.0, 1.0, 1.0001, 1.05, 3.0]) == [1.0, 3.0, 5.0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_bridge_probe_part_runs(tmp_path: Path) -> None:
    out = tmp_path / "bridge.json"
    run = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "bridge", "--probe-calls", "1",
         "--bursts", "12", "--clears", "4", "--parts", "probe",
         "--json", str(out)],
        capture_output=True, text=True, timeout=230,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "clear → silence at the caller" in run.stdout
    r = json.loads(out.read_text())
    p = r["probe"]
    assert p["counts"]["bot_bursts"] == 12 and p["counts"]["clears"] == 4, p["counts"]
    assert p["counts"]["caller_probes"] >= 20, p["counts"]  # one every 260 ms for ≥ 8 s
    for key in ("caller_to_bot_added", "bot_to_caller_added", "clear_to_silence"):
        d = p[key]
        assert d["n"] > 0 and 0 <= d["p50"] <= d["p95"] <= d["p99"] <= d["max"], (key, d)
    # Each burst waits for the next 20 ms tick at most once; silence follows a clear within
    # the tick, the 10 ms fade and scheduling noise (a loose bound: this is not the benchmark).
    assert p["bot_to_caller_tick_wait"]["max"] < 20 + 50
    assert p["clear_to_silence"]["p50"] < 200
    assert "pipecat" not in r and "capacity" not in r
