"""The campaign spec: each bad field named; windows in their time zone, across DST changes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.campaign.outcomes import Outcome
from gateway.campaign.spec import RetryRule, SpecError, parse_spec, parse_window

AGENT = {"kind": "ivr", "flow": "hello"}


def _ts(year: int, month: int, day: int, hour: int, minute: int) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def test_a_full_spec_round_trips() -> None:
    obj: dict[str, Any] = {
        "agent": AGENT,
        "cps": 2,
        "max_concurrent": 50,
        "window": {"start": "09:00", "end": "20:00", "days": "mon-fri", "tz": "America/New_York"},
        "retries": {"busy": {"max": 3, "backoff_s": 300}, "no_answer": {"max": 1, "backoff_s": 60}},
        "amd": True,
        "voicemail": "Hi, call us back.",
    }
    spec = parse_spec(obj)
    assert spec.cps == 2.0 and spec.max_concurrent == 50
    assert spec.retries == {
        Outcome.BUSY: RetryRule(3, 300.0),
        Outcome.NO_ANSWER: RetryRule(1, 60.0),
    }
    assert spec.window is not None and spec.window.days == frozenset(range(5))
    again = parse_spec(spec.to_json())
    assert again == spec


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"agent": None}, "agent"),
        ({"agent": {}}, "agent"),
        ({"cps": 0}, "cps"),
        ({"cps": 1000}, "cps"),
        ({"cps": "2"}, "cps"),
        ({"cps": True}, "cps"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": 2.5}, "max_concurrent"),
        ({"window": {"start": "9:00", "end": "20:00"}}, "window.start"),
        ({"window": {"start": "09:00", "end": "24:00"}}, "window.end"),
        ({"window": {"start": "09:00", "end": "09:00"}}, "window.end"),
        ({"window": {"start": "09:00", "end": "20:00", "tz": "Mars/Olympus"}}, "window.tz"),
        ({"window": {"start": "09:00", "end": "20:00", "days": "mon-fry"}}, "window.days"),
        ({"window": {"start": "09:00", "end": "20:00", "when": 1}}, "window.when"),
        ({"retries": {"human": {"max": 1, "backoff_s": 1}}}, "retries.human"),
        ({"retries": {"busy": {"max": -1, "backoff_s": 1}}}, "retries.busy.max"),
        ({"retries": {"busy": {"max": 1, "backoff_s": -1}}}, "retries.busy.backoff_s"),
        ({"retries": {"busy": 3}}, "retries.busy"),
        ({"amd": "yes"}, "amd"),
        ({"voicemail": "hi"}, "voicemail"),  # without amd
        ({"amd": True, "voicemail": ""}, "voicemail"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_fields_are_named(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({"agent": AGENT, **patch})
    assert exc.value.field == field


def test_days_lists_and_ranges_across_the_week_end() -> None:
    w = parse_window({"start": "09:00", "end": "17:00", "days": "fri-mon"})
    assert w.days == frozenset({4, 5, 6, 0})
    w = parse_window({"start": "09:00", "end": "17:00", "days": ["sat", "sun"]})
    assert w.days == frozenset({5, 6})


def test_window_follows_local_time_across_spring_forward() -> None:
    # US DST starts Sunday 2026-03-08: 09:00 New York is 14:00 UTC before, 13:00 UTC after.
    w = parse_window(
        {"start": "09:00", "end": "20:00", "days": "mon-fri", "tz": "America/New_York"}
    )
    friday_evening = _ts(2026, 3, 7, 2, 0)  # Fri 21:00 EST
    assert not w.is_open(friday_evening)
    assert w.next_open(friday_evening) == _ts(2026, 3, 9, 13, 0)  # Mon 09:00 EDT
    assert not w.is_open(_ts(2026, 3, 6, 13, 30))  # Fri 08:30 EST
    assert w.is_open(_ts(2026, 3, 6, 14, 0))  # Fri 09:00 EST
    assert w.is_open(_ts(2026, 3, 9, 13, 30))  # Mon 09:30 EDT
    assert not w.is_open(_ts(2026, 3, 10, 0, 0))  # Mon 20:00 EDT: end is exclusive
    assert not w.is_open(_ts(2026, 3, 8, 15, 0))  # Sunday


def test_window_across_fall_back_and_a_start_inside_the_gap() -> None:
    # US DST ends Sunday 2026-11-01: 09:00 New York is 13:00 UTC before, 14:00 UTC after.
    w = parse_window(
        {"start": "09:00", "end": "20:00", "days": "mon-sun", "tz": "America/New_York"}
    )
    assert w.next_open(_ts(2026, 11, 1, 2, 0)) == _ts(2026, 11, 1, 14, 0)  # from 22:00 EDT
    # 02:30 does not exist on 2026-03-08 in New York; the window opens at the first instant
    # after the gap that is inside it (03:30 EDT = 07:30 UTC).
    gap = parse_window({"start": "02:30", "end": "04:00", "tz": "America/New_York"})
    opening = gap.next_open(_ts(2026, 3, 8, 5, 0))  # 00:00 EST
    assert opening == _ts(2026, 3, 8, 7, 30)
    assert gap.is_open(opening)


def test_window_past_midnight() -> None:
    w = parse_window({"start": "22:00", "end": "02:00", "days": "fri", "tz": "Europe/Berlin"})
    # Friday 2026-06-05 23:00 CEST (21:00 UTC) is in; Saturday 01:00 too; Saturday 22:00 not.
    assert w.is_open(_ts(2026, 6, 5, 21, 0))
    assert w.is_open(_ts(2026, 6, 5, 23, 0))
    assert not w.is_open(_ts(2026, 6, 6, 20, 0))
    assert w.next_open(_ts(2026, 6, 6, 1, 0)) == _ts(2026, 6, 12, 20, 0)
