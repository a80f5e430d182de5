"""``voxgate bench webrtc --quick --json``: runs end to end over real WebRTC and reports sane
figures (no timing assertion: the numbers depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
def test_bench_webrtc_quick_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "webrtc", "--quick", "--json"],
        capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["conditions"]["quick"] is True and r["conditions"]["cores"]
    ttfa = r["connect_to_first_audio_ms"]
    assert ttfa["n"] == 3 and not r["errors"]
    assert 0 < ttfa["p50"] <= ttfa["p95"] <= ttfa["p99"] < 10_000
    assert len(r["samples"]["connect_to_first_audio_ms"]) == 3
    # Both parts of the breakdown are measured and add up to no more than the whole.
    assert r["offer_round_trip_ms"]["p50"] + r["answer_to_first_audio_ms"]["p50"] <= ttfa["p99"] + 1
    steps = r["concurrency"]
    assert [s["target"] for s in steps][:1] == [2]
    assert all(s["connect_failures"] == 0 for s in steps)
    assert r["max_legs_held"] in (0, 2, 4)
    assert steps[0]["worst_client_frames_pct"] > 50  # audio flowed to every client
    assert isinstance(r["met"]["connect_to_first_audio"], bool)
    assert r["gateway_exit"] == 0
