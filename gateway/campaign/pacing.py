"""When the next dial may start: a sans-I/O pacer; the caller passes the clock (epoch seconds).

Four gates, all of which must be open:

- **cps**, a token bucket with a burst of 1: two INVITEs are at least ``1/cps`` apart, first
  attempts and retries alike (they share the trunk);
- **max_concurrent** dials in flight (from INVITE to the end of the call);
- the **calling window** (:class:`~gateway.campaign.spec.Window`), in the campaign's time zone;
- a **trunk back-off**: a 503 from the trunk pauses all dialling until its Retry-After
  (RFC 3261 §21.5.4, §20.33) or, without one, for a default pause.

Retry timing is :func:`retry_at`: an outcome listed in ``retries`` is retried ``backoff_s``
after the attempt ended, at most ``max`` times *for that outcome*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.campaign.outcomes import Outcome
from gateway.campaign.spec import RetryRule, Window

DEFAULT_TRUNK_PAUSE_S = 30.0
# A Retry-After beyond this is treated as this: a trunk does not get to stop a campaign for days.
MAX_TRUNK_PAUSE_S = 3600.0


class Pacer:
    """Tracks in-flight dials and the last INVITE; says when the next may start."""

    def __init__(
        self,
        cps: float,
        max_concurrent: int,
        window: Window | None = None,
        *,
        default_trunk_pause_s: float = DEFAULT_TRUNK_PAUSE_S,
    ) -> None:
        if cps <= 0 or max_concurrent < 1:
            raise ValueError("cps > 0 and max_concurrent >= 1")
        self.interval = 1.0 / cps
        self.max_concurrent = max_concurrent
        self.window = window
        self.default_trunk_pause_s = default_trunk_pause_s
        self.in_flight = 0
        self._last_start: float | None = None
        self.trunk_paused_until = 0.0

    def next_dial_at(self, now: float) -> float | None:
        """The earliest time (>= ``now``) a dial may start, or None while at ``max_concurrent``
        (a finishing call, not the clock, opens that gate)."""
        if self.in_flight >= self.max_concurrent:
            return None
        at = now
        if self._last_start is not None:
            at = max(at, self._last_start + self.interval)
        at = max(at, self.trunk_paused_until)
        if self.window is not None:
            # The window may open after the other gates; re-checking is not needed since the
            # other gates only hold dials back, never forward.
            at = self.window.next_open(at)
        return at

    def may_dial(self, now: float) -> bool:
        return self.next_dial_at(now) == now

    def started(self, now: float) -> None:
        """An INVITE is being sent now. Raises if the gates were not open (a caller bug)."""
        if not self.may_dial(now):
            raise RuntimeError(f"dial at {now} not allowed (next at {self.next_dial_at(now)})")
        self._last_start = now
        self.in_flight += 1

    def finished(self) -> None:
        """A dial started with :meth:`started` ended (any outcome)."""
        if self.in_flight <= 0:
            raise RuntimeError("finished() without started()")
        self.in_flight -= 1

    def trunk_overloaded(self, now: float, retry_after: float | None) -> float:
        """A 503 from the trunk: pause all dialling; returns the time dialling may resume."""
        pause = self.default_trunk_pause_s if retry_after is None else max(0.0, retry_after)
        self.trunk_paused_until = max(self.trunk_paused_until, now + min(pause, MAX_TRUNK_PAUSE_S))
        return self.trunk_paused_until


def retry_at(
    outcome: Outcome,
    previous: Sequence[Outcome],
    ended_at: float,
    rules: Mapping[Outcome, RetryRule],
) -> float | None:
    """When to retry after an attempt ended with ``outcome``, or None: the contact is done.

    ``previous``: the outcomes of the contact's earlier attempts (not counting this one).
    """
    rule = rules.get(outcome)
    if rule is None:
        return None
    retries_so_far = sum(1 for o in previous if o == outcome)
    if retries_so_far >= rule.max:
        return None
    return ended_at + rule.backoff_s
