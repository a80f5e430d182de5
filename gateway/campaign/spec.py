"""A campaign's spec: the agent for answered calls, pacing (``cps``, ``max_concurrent``), the
calling window in its own time zone, retries with back-off per outcome, AMD and voicemail.

:func:`parse_spec` validates a JSON object and raises :class:`SpecError` naming the field, so the
REST API can answer 400 with ``{"field", "reason"}``. :meth:`CampaignSpec.to_json` gives back the
same shape for the store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.campaign.outcomes import RETRYABLE, Outcome

MAX_CPS = 100.0
MAX_CONCURRENT = 1000
MAX_RETRIES = 20
MAX_BACKOFF_S = 7 * 86400.0
MAX_VOICEMAIL_CHARS = 2000

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class SpecError(ValueError):
    """A bad campaign spec; ``field`` names it as written in the JSON (``window.tz``)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True)
class RetryRule:
    """Retry an outcome at most ``max`` times, ``backoff_s`` after the attempt ended."""

    max: int
    backoff_s: float


@dataclass(frozen=True, slots=True)
class Window:
    """Dial only from ``start`` to ``end`` local time on ``days`` (0 = Monday) in ``tz``.

    ``end`` before ``start`` is a window past midnight, belonging to the day it opens. Times are
    wall-clock times in ``tz``, so a window stays 09:00–20:00 local across a DST change.
    """

    start: time
    end: time
    days: frozenset[int]
    tz: ZoneInfo

    def is_open(self, now: float) -> bool:
        local = datetime.fromtimestamp(now, self.tz)
        t = local.time().replace(tzinfo=None)
        day = local.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= t < self.end
        return (day in self.days and t >= self.start) or (
            (day - 1) % 7 in self.days and t < self.end
        )

    def next_open(self, now: float) -> float:
        """``now`` if the window is open, else the (epoch) time it next opens."""
        if self.is_open(now):
            return now
        today = datetime.fromtimestamp(now, self.tz).date()
        for i in range(8):
            opening = self._local(today + timedelta(days=i), self.start).timestamp()
            if (today + timedelta(days=i)).weekday() in self.days and opening > now:
                return opening
        raise AssertionError("a window with days opens within a week")  # pragma: no cover

    def _local(self, day: date, at: time) -> datetime:
        # A start time inside a spring-forward gap (02:30 on the changeover day) resolves with
        # fold=0 (PEP 495), i.e. one hour later on the new offset: still the first dialable time.
        return datetime.combine(day, at, tzinfo=self.tz)

    def to_json(self) -> dict[str, str]:
        days = ",".join(_DAYS[d] for d in sorted(self.days))
        return {
            "start": self.start.strftime("%H:%M"),
            "end": self.end.strftime("%H:%M"),
            "days": days,
            "tz": self.tz.key,
        }


@dataclass(frozen=True, slots=True)
class CampaignSpec:
    agent: Mapping[str, Any]
    cps: float = 1.0
    max_concurrent: int = 10
    window: Window | None = None
    retries: Mapping[Outcome, RetryRule] = field(default_factory=dict)
    amd: bool = False
    voicemail: str | None = None
    ring_timeout_s: float = 30.0

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": dict(self.agent),
            "cps": self.cps,
            "max_concurrent": self.max_concurrent,
            "window": self.window.to_json() if self.window else None,
            "retries": {
                o.value: {"max": r.max, "backoff_s": r.backoff_s} for o, r in self.retries.items()
            },
            "amd": self.amd,
            "voicemail": self.voicemail,
            "ring_timeout_s": self.ring_timeout_s,
        }


_FIELDS = {
    "agent",
    "cps",
    "max_concurrent",
    "window",
    "retries",
    "amd",
    "voicemail",
    "ring_timeout_s",
}


def parse_spec(obj: Mapping[str, Any]) -> CampaignSpec:
    """Validate a campaign spec (without its contacts: the caller strips ``contacts``)."""
    if not isinstance(obj, Mapping):
        raise SpecError("(campaign)", "must be a JSON object")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise SpecError(unknown[0], "unknown field")
    agent = obj.get("agent")
    if not isinstance(agent, Mapping) or not agent:
        raise SpecError("agent", "must be a non-empty object (any agent kind)")
    cps = _number(obj, "cps", 1.0)
    if not 0 < cps <= MAX_CPS:
        raise SpecError("cps", f"must be > 0 and <= {MAX_CPS:g}")
    max_concurrent = obj.get("max_concurrent", 10)
    if (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or not 1 <= max_concurrent <= MAX_CONCURRENT
    ):
        raise SpecError("max_concurrent", f"must be an integer from 1 to {MAX_CONCURRENT}")
    ring = _number(obj, "ring_timeout_s", 30.0)
    if not 1 <= ring <= 300:
        raise SpecError("ring_timeout_s", "must be from 1 to 300 seconds")
    amd = obj.get("amd", False)
    if not isinstance(amd, bool):
        raise SpecError("amd", "must be true or false")
    voicemail = obj.get("voicemail")
    if voicemail is not None:
        if not isinstance(voicemail, str) or not voicemail.strip():
            raise SpecError("voicemail", "must be a non-empty text or null")
        if len(voicemail) > MAX_VOICEMAIL_CHARS:
            raise SpecError("voicemail", f"at most {MAX_VOICEMAIL_CHARS} characters")
        if not amd:
            raise SpecError("voicemail", "needs amd: true (the beep is found by AMD)")
    window = obj.get("window")
    return CampaignSpec(
        agent=dict(agent),
        cps=cps,
        max_concurrent=max_concurrent,
        window=None if window is None else parse_window(window),
        retries=parse_retries(obj.get("retries", {})),
        amd=amd,
        voicemail=voicemail,
        ring_timeout_s=ring,
    )


def parse_window(obj: object) -> Window:
    if not isinstance(obj, Mapping):
        raise SpecError("window", "must be an object with start, end, days, tz")
    unknown = sorted(set(obj) - {"start", "end", "days", "tz"})
    if unknown:
        raise SpecError(f"window.{unknown[0]}", "unknown field")
    start = _hhmm(obj, "start")
    end = _hhmm(obj, "end")
    if start == end:
        raise SpecError("window.end", "must differ from start")
    tz_name = obj.get("tz", "UTC")
    if not isinstance(tz_name, str):
        raise SpecError("window.tz", "must be an IANA time zone name")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SpecError("window.tz", f"unknown time zone {tz_name!r}") from None
    return Window(start, end, _days(obj.get("days", "mon-sun")), tz)


def parse_retries(obj: object) -> dict[Outcome, RetryRule]:
    if not isinstance(obj, Mapping):
        raise SpecError("retries", "must be an object of outcome: {max, backoff_s}")
    rules: dict[Outcome, RetryRule] = {}
    for key, rule in obj.items():
        where = f"retries.{key}"
        try:
            outcome = Outcome(key)
        except ValueError:
            outcome = None
        if outcome is None or outcome not in RETRYABLE:
            names = ", ".join(sorted(o.value for o in RETRYABLE))
            raise SpecError(where, f"not a retryable outcome ({names})")
        if not isinstance(rule, Mapping) or set(rule) - {"max", "backoff_s"}:
            raise SpecError(where, 'must be {"max": N, "backoff_s": S}')
        n = rule.get("max", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_RETRIES:
            raise SpecError(f"{where}.max", f"must be an integer from 0 to {MAX_RETRIES}")
        backoff = _number(rule, "backoff_s", 60.0, where=f"{where}.backoff_s")
        if not 0 <= backoff <= MAX_BACKOFF_S:
            raise SpecError(f"{where}.backoff_s", f"must be from 0 to {MAX_BACKOFF_S:g} seconds")
        rules[outcome] = RetryRule(n, backoff)
    return rules


def _number(obj: Mapping[str, Any], key: str, default: float, *, where: str | None = None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SpecError(where or key, "must be a number")
    return float(value)


def _hhmm(obj: Mapping[str, Any], key: str) -> time:
    value = obj.get(key)
    match = _HHMM.match(value) if isinstance(value, str) else None
    if match is None:
        raise SpecError(f"window.{key}", "must be HH:MM (24-hour)")
    return time(int(match[1]), int(match[2]))


def _days(value: object) -> frozenset[int]:
    """``"mon-fri"``, ``"mon,wed,sat-sun"`` or a list of day names."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, list | tuple) or not parts:
        raise SpecError("window.days", "must be like 'mon-fri' or a list of day names")
    days: set[int] = set()
    for part in parts:
        if not isinstance(part, str):
            raise SpecError("window.days", "day names are strings")
        first, dash, last = part.strip().lower().partition("-")
        if first not in _DAYS or (dash and last not in _DAYS):
            raise SpecError("window.days", f"bad day or range {part!r} (mon..sun)")
        a = _DAYS.index(first)
        b = _DAYS.index(last) if dash else a
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(days)


def utc(now: float) -> datetime:
    """``now`` (epoch seconds) as an aware UTC datetime, for messages and events."""
    return datetime.fromtimestamp(now, UTC)
