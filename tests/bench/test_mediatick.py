"""``python -m voxgate.bench.mediatick``: the media tick in process on a simulated clock.

Its batch count is deterministic (seeded audio and phases, simulated time), so it guards the
barge-in batching policy without timing anything: with each phone's echo on its own clock
(``--phase random``), a batch before every pull of a staged call ran ~190 batches/s at 20 calls
(~400 at 100); the timer plus pulls whose frames could confirm speech run about one per timer
period (8f276dc)."""

from __future__ import annotations

from gateway.call.manager import DETECT_BATCH_S
from voxgate.bench import mediatick


def test_random_echo_phase_keeps_the_detector_batches_to_the_timer() -> None:
    r = mediatick.run(mediatick.Options(calls=20, seconds=3.0, phase="random"))
    per_timer = 1.0 / DETECT_BATCH_S
    assert 0.5 * per_timer <= r["detector_batches_per_s"] <= 1.25 * per_timer, r
    # The media really flowed: every call's packets, no stall, no false barge-in on the echo.
    assert r["packets_sent"] >= 20 * 3.0 / 0.02
    assert r["skipped_ticks"] == 0 and r["calls_cut_short"] == 0
    assert r["conditions"]["echo_phase"] == "random"
    report = mediatick.format_report(r)
    assert "echo phase random" in report and "detector batches/s" in report


def test_the_sipp_phase_echo_follows_the_send() -> None:
    r = mediatick.run(mediatick.Options(calls=10, seconds=1.0, workload="idle"))
    assert r["conditions"]["echo_phase"] == "sipp"
    assert r["detector_batches_per_s"] == 0  # idle: the gate spares the detectors
    assert r["stats"]["arrival_us_per_packet"]["p50"] > 0
