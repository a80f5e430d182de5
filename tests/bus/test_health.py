"""The bus's outage bookkeeping (sans-I/O, fake clock, seeded jitter)."""

from __future__ import annotations

import random

import pytest

from voxgate.contract.bus.health import BusHealth


def test_up_until_a_failure_then_fails_fast_until_the_backoff_has_passed() -> None:
    h = BusHealth(base_s=0.1, cap_s=1.0, rng=random.Random(1))
    assert h.up and h.allow(0.0) and h.retry_in(0.0) == 0.0
    assert h.failed(10.0, "Connection refused")  # the outage begins: log it
    assert not h.up and h.down_since == 10.0 and h.outages == 1
    # The first retry is due 0.05..0.1 s later; before that, refused without I/O.
    assert 10.05 <= h.next_try_at <= 10.1
    assert not h.allow(10.04)
    assert h.allow(h.next_try_at)
    assert not h.failed(h.next_try_at, "Connection refused")  # same outage: no second line
    assert h.outages == 1 and h.failures == 2


def test_backoff_doubles_with_equal_jitter_and_is_capped() -> None:
    h = BusHealth(base_s=0.05, cap_s=1.0, rng=random.Random(7))
    now = 0.0
    delays = []
    for _ in range(12):
        h.failed(now, "down")
        delays.append(h.next_try_at - now)
        now = h.next_try_at
    for n, d in enumerate(delays, start=1):
        ceiling = min(1.0, 0.05 * 2 ** (n - 1))
        assert ceiling / 2 <= d <= ceiling, (n, d)  # never 0, never above the cap
    assert max(delays) <= 1.0 and min(delays[-4:]) >= 0.5  # capped from the 6th on
    # Two processes with their own generators do not retry in lock step.
    a = BusHealth(rng=random.Random(1))
    b = BusHealth(rng=random.Random(2))
    for _ in range(5):
        a.failed(0.0, "down")
        b.failed(0.0, "down")
    assert a.next_try_at != b.next_try_at


def test_a_success_ends_the_outage_once_and_counts_it() -> None:
    h = BusHealth(rng=random.Random(3))
    assert h.succeeded(1.0) is None  # up already: nothing to report
    h.failed(5.0, "Connection refused")
    h.failed(5.5, "Connection refused")
    assert h.down_for(7.0) == pytest.approx(2.0)
    assert h.outage_seconds(7.0) == pytest.approx(2.0)  # the running outage counts
    assert h.succeeded(8.25) == pytest.approx(3.25)
    assert h.succeeded(8.5) is None  # a second success is no second reconnect
    assert h.up and h.allow(8.5) and h.failures == 0 and h.reconnects == 1
    assert h.outage_seconds(100.0) == pytest.approx(3.25)
    assert h.up_for(9.25) == pytest.approx(1.0)
    # A second outage starts its backoff from the base again.
    assert h.failed(20.0, "Connection reset")
    assert h.next_try_at - 20.0 <= h.base_s
    assert h.up_for(21.0) is None and h.last_error == "Connection reset"
    h.succeeded(22.0)
    assert h.outages == 2 and h.reconnects == 2
    assert h.outage_seconds(30.0) == pytest.approx(5.25)


def test_no_outage_yet_has_no_time_since_one() -> None:
    h = BusHealth()
    assert h.up_for(5.0) is None and h.outage_seconds(5.0) == 0.0 and h.down_for(5.0) == 0.0
