"""The pacer with a fake clock: 1/cps spacing exactly, max_concurrent, windows, 503 back-off,
and retry timing; and the SIP status to outcome mapping."""

from __future__ import annotations

import heapq
import itertools
from datetime import UTC, datetime

import pytest

from gateway.campaign.outcomes import Outcome, outcome_for_status
from gateway.campaign.pacing import MAX_TRUNK_PAUSE_S, Pacer, retry_at
from gateway.campaign.spec import RetryRule, parse_window


def test_invites_are_exactly_one_over_cps_apart() -> None:
    pacer = Pacer(cps=4, max_concurrent=100)
    now = 1000.0
    starts = []
    for _ in range(20):
        at = pacer.next_dial_at(now)
        assert at is not None
        now = at
        assert pacer.may_dial(now)
        pacer.started(now)
        starts.append(now)
        # A moment before the next slot is refused.
        assert not pacer.may_dial(now + 0.2499)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([0.25] * 19, abs=1e-9)
    assert starts[-1] - starts[0] == pytest.approx(19 * 0.25)


def test_a_dial_before_its_slot_is_a_bug() -> None:
    pacer = Pacer(cps=1, max_concurrent=10)
    pacer.started(0.0)
    with pytest.raises(RuntimeError):
        pacer.started(0.5)


def test_max_concurrent_blocks_until_a_call_ends() -> None:
    pacer = Pacer(cps=100, max_concurrent=3)
    now = 0.0
    for _ in range(3):
        at = pacer.next_dial_at(now)
        assert at is not None
        now = at
        pacer.started(now)
    assert pacer.in_flight == 3
    assert pacer.next_dial_at(now + 60) is None
    pacer.finished()
    assert pacer.next_dial_at(now + 60) == now + 60
    with pytest.raises(RuntimeError):
        Pacer(cps=1, max_concurrent=1).finished()


def test_no_dial_outside_the_window() -> None:
    w = parse_window(
        {"start": "09:00", "end": "20:00", "days": "mon-fri", "tz": "America/New_York"}
    )
    pacer = Pacer(cps=1, max_concurrent=5, window=w)
    sat = datetime(2026, 3, 7, 15, 0, tzinfo=UTC).timestamp()
    assert pacer.next_dial_at(sat) == datetime(2026, 3, 9, 13, 0, tzinfo=UTC).timestamp()
    assert not pacer.may_dial(sat)


def test_a_503_pauses_all_dialling_until_retry_after() -> None:
    pacer = Pacer(cps=10, max_concurrent=5, default_trunk_pause_s=30)
    pacer.started(0.0)
    assert pacer.trunk_overloaded(0.5, retry_after=120) == 120.5
    assert pacer.next_dial_at(1.0) == 120.5
    # A later, shorter Retry-After does not cut the pause short.
    pacer.trunk_overloaded(2.0, retry_after=10)
    assert pacer.next_dial_at(3.0) == 120.5
    fresh = Pacer(cps=10, max_concurrent=5, default_trunk_pause_s=30)
    assert fresh.trunk_overloaded(100.0, retry_after=None) == 130.0
    assert fresh.trunk_overloaded(100.0, retry_after=10**9) == 100.0 + MAX_TRUNK_PAUSE_S


def test_retry_back_off_per_outcome_and_its_maximum() -> None:
    rules = {Outcome.BUSY: RetryRule(max=2, backoff_s=300), Outcome.NO_ANSWER: RetryRule(1, 60)}
    assert retry_at(Outcome.BUSY, [], 1000.0, rules) == 1300.0
    assert retry_at(Outcome.BUSY, [Outcome.BUSY], 2000.0, rules) == 2300.0
    assert retry_at(Outcome.BUSY, [Outcome.BUSY, Outcome.BUSY], 3000.0, rules) is None
    # Counted per outcome: busy retries do not use up the no-answer ones.
    assert retry_at(Outcome.NO_ANSWER, [Outcome.BUSY, Outcome.BUSY], 3000.0, rules) == 3060.0
    assert retry_at(Outcome.NO_ANSWER, [Outcome.NO_ANSWER], 3000.0, rules) is None
    assert retry_at(Outcome.FAILED, [], 1000.0, rules) is None
    assert retry_at(Outcome.HUMAN, [], 1000.0, rules) is None


def test_pacing_holds_across_retries_in_a_simulated_campaign() -> None:
    """Event-driven simulation: 30 contacts, every first attempt busy, calls last 1.7 s; the
    retries interleave with first attempts and still keep the 1/cps gap and the cap."""
    cps, cap = 5.0, 4
    pacer = Pacer(cps=cps, max_concurrent=cap)
    rules = {Outcome.BUSY: RetryRule(max=1, backoff_s=2.0)}
    due: list[tuple[float, int]] = [(0.0, i) for i in range(30)]
    history: dict[int, list[Outcome]] = {i: [] for i in range(30)}
    ends: list[tuple[float, int]] = []
    invites: list[float] = []
    peak = 0
    now = 0.0
    while due or ends:
        nxt = pacer.next_dial_at(now)
        candidates = [t for t in (ends[0][0] if ends else None,) if t is not None]
        if due and nxt is not None:
            candidates.append(max(nxt, due[0][0]))
        now = min(candidates)
        if ends and ends[0][0] == now:
            _, i = heapq.heappop(ends)
            pacer.finished()
            outcome = Outcome.BUSY if not history[i] else Outcome.HUMAN
            again = retry_at(outcome, history[i], now, rules)
            history[i].append(outcome)
            if again is not None:
                heapq.heappush(due, (again, i))
            continue
        if due and due[0][0] <= now and pacer.may_dial(now):
            _, i = heapq.heappop(due)
            pacer.started(now)
            invites.append(now)
            peak = max(peak, pacer.in_flight)
            heapq.heappush(ends, (now + 1.7, i))
    assert len(invites) == 60
    assert all(h == [Outcome.BUSY, Outcome.HUMAN] for h in history.values())
    assert min(b - a for a, b in itertools.pairwise(invites)) >= 1 / cps - 1e-9
    assert peak == cap


@pytest.mark.parametrize(
    ("status", "ring_timeout", "outcome"),
    [
        (486, False, Outcome.BUSY),
        (600, False, Outcome.BUSY),
        (408, False, Outcome.NO_ANSWER),
        (480, False, Outcome.NO_ANSWER),
        (487, True, Outcome.NO_ANSWER),
        (487, False, Outcome.CANCELLED),
        (603, False, Outcome.REJECTED),
        (403, False, Outcome.REJECTED),
        (404, False, Outcome.INVALID_NUMBER),
        (484, False, Outcome.INVALID_NUMBER),
        (604, False, Outcome.INVALID_NUMBER),
        (503, False, Outcome.FAILED),
        (500, False, Outcome.FAILED),
        (488, False, Outcome.FAILED),
    ],
)
def test_sip_status_to_outcome(status: int, ring_timeout: bool, outcome: Outcome) -> None:
    assert outcome_for_status(status, ring_timeout=ring_timeout) == outcome


def test_a_2xx_has_no_status_outcome() -> None:
    with pytest.raises(ValueError):
        outcome_for_status(200)
