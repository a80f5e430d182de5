"""The gateway runs the barge-in detectors of many calls in one vectorised batch
(``DetectorBank`` + ``run_batch``): a detector's events and state must not depend on the calls
it is batched with, on which bank slot it got, or on a slot's previous tenant."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.media.bargein import BargeInConfig, BargeInDetector, DetectorBank, VadEvent, run_batch
from tests.bargein import audio as A

RATE = A.RATE
CFG = BargeInConfig(frame_ms=20)


def scene(i: int) -> tuple[A.Int16Array, A.Int16Array]:
    """(near, far) of one call, 6 s: agent speech, its echo at a call-specific delay and loss,
    line noise, and (on odd calls) a caller talking over the agent at a call-specific time."""
    n = 6 * RATE
    agent = A.agent_speech()
    start = (i * 7919) % (agent.size - n)
    far = agent[start : start + n]
    near = A.echo_of(far, delay_ms=40 + 35 * (i % 6), erl_db=10 + 3 * (i % 4), seed=i)
    near = near + A.noise(n, -60.0, seed=i)
    if i % 2:
        caller = A.caller_utterances()[i % len(A.caller_utterances())]
        at = int((1.2 + 0.37 * i % 3.0) * RATE)
        k = min(caller.size, n - at)
        near[at : at + k] += caller[:k]
    return A.phone_leg(near), A.to_s16(far)


def alone(near: A.Int16Array, far: A.Int16Array) -> tuple[list[VadEvent], list[float]]:
    det = BargeInDetector(CFG)
    frame = CFG.frame_samples
    events: list[VadEvent] = []
    shares = []
    for s in range(0, near.size, frame):
        det.far_end(far[s : s + frame], s)
        events += det.near_end(near[s : s + frame], s)
        shares.append(det.last_caller_share)
    return events, shares


def test_a_batch_gives_each_call_what_it_gets_alone() -> None:
    scenes = [scene(i) for i in range(7)]
    bank = DetectorBank(CFG, capacity=2)  # grows while the detectors take their slots
    # A slot that had a tenant before: its state must be reset for the next one.
    old = BargeInDetector(bank=bank)
    for s in range(0, 2 * RATE, CFG.frame_samples):
        old.far_end(scenes[0][1][s : s + CFG.frame_samples], s)
        old.near_end(scenes[0][0][s : s + CFG.frame_samples], s)
    old.close()
    dets = [BargeInDetector(bank=bank) for _ in scenes]
    frame = CFG.frame_samples
    events: list[list[VadEvent]] = [[] for _ in scenes]
    shares: list[list[float]] = [[] for _ in scenes]
    n = scenes[0][0].size
    for s in range(0, n, frame):
        # Calls drop in and out of the batch (the idle gate skips quiet frames in the gateway):
        # call i sits out every (i+3)-th tick, fed the next time with both ticks at once.
        active = [i for i in range(len(scenes)) if (s // frame) % (i + 3) != 0 or s + frame >= n]
        for i in active:
            near, far = scenes[i]
            lo = s - frame if (s // frame) % (i + 3) == 1 and s >= frame else s
            dets[i].stage_far(far[lo : s + frame], lo)
            dets[i].stage_near(near[lo : s + frame], lo)
        for i, evs in zip(active, run_batch([dets[i] for i in active]), strict=True):
            events[i] += evs
            shares[i].append(dets[i].last_caller_share)
    found = 0
    for i, (near, far) in enumerate(scenes):
        want, want_shares = alone(near, far)
        assert events[i] == want, f"call {i}"
        # The last share of each batch step equals the one the lone detector had then.
        assert shares[i][-1] == pytest.approx(want_shares[-1], abs=1e-12)
        found += sum(1 for e in want if type(e).__name__ == "VoiceStarted")
    assert found >= 3  # the scenes do contain barge-ins (the comparison is not vacuous)


def test_slots_are_reused_and_closed_detectors_refused() -> None:
    bank = DetectorBank(CFG, capacity=1)
    a = BargeInDetector(bank=bank)
    b = BargeInDetector(bank=bank)
    assert bank.capacity >= 2 and bank.in_use == 2
    a.close()
    a.close()  # idempotent
    assert bank.in_use == 1
    c = BargeInDetector(bank=bank)
    assert bank.in_use == 2
    with pytest.raises(RuntimeError):
        a.stage_near(np.zeros(CFG.frame_samples, np.int16), 0)
        run_batch([a])
    with pytest.raises(ValueError):
        run_batch([b, BargeInDetector(CFG)])  # another bank
    with pytest.raises(ValueError):
        BargeInDetector(BargeInConfig(frame_ms=10), bank=bank)
    assert run_batch([]) == []
    del c


@pytest.mark.parametrize("per_batch", [1, 2, 3])
def test_could_confirm_is_never_false_before_a_confirmation(per_batch: int) -> None:
    """The media tick runs the batch before a call's frame is pulled only when the call's
    staged frames ``could_confirm`` caller speech; a False answer followed by a VoiceStarted
    from those very frames would fade a packet late.  Frames staged one, two or three at a
    time (the batch timer is not tied to one call's packets)."""
    frame = CFG.frame_samples
    confirmed = skipped = 0
    for i in range(1, 8, 2):  # the scenes with a caller talking over the agent
        near, far = scene(i)
        det = BargeInDetector(CFG)
        for s in range(0, near.size - per_batch * frame + 1, per_batch * frame):
            det.stage_far(far[s : s + per_batch * frame], s)
            det.stage_near(near[s : s + per_batch * frame], s)
            could = det.could_confirm
            events = run_batch([det])[0]
            started = any(type(e).__name__ == "VoiceStarted" for e in events)
            assert could or not started, f"scene {i} at sample {s}"
            confirmed += started
            skipped += not could
    assert confirmed >= 3  # barge-ins happened (not vacuous) ...
    assert skipped > confirmed  # ... and most batches could wait (the bound is not always True)
