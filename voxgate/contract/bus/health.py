"""Outage bookkeeping of one bus connection: up or down, when to try again, what it cost.

Sans-I/O: every method takes ``now`` (``time.monotonic()`` seconds in the processes) and does
no I/O, so the policy is tested with a fake clock and a seeded random generator. The bus feeds
it the outcome of each operation that reached (or failed to reach) the server; its callers
read it to

- fail fast while the server is known to be down (``allow`` is False between attempts, so a
  ``say`` during an outage is refused in microseconds instead of waiting out connect timeouts);
- space the attempts that find out whether it is back: exponential backoff with "equal
  jitter" (half the delay fixed, half random), capped, so many processes reconnecting to one
  restarted Redis do not arrive in lock step
  (https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/);
- log once per outage (``failed`` and ``succeeded`` say when one begins and ends), never once
  per attempt;
- count outages, reconnects and outage seconds for the metrics.

Several coroutines share one bus: they all report into the same object, and any attempt that
succeeds ends the outage for everyone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# First retry delay and the cap, seconds. The cap bounds how long after the server's return a
# process that only probes on the backoff schedule (a worker) can take to notice it.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0


@dataclass
class BusHealth:
    base_s: float = BACKOFF_BASE_S
    cap_s: float = BACKOFF_CAP_S
    rng: random.Random = field(default_factory=random.Random, repr=False)
    up: bool = True
    # Start of the current outage (None while up) and the end of the last one.
    down_since: float | None = None
    up_since: float | None = None
    # Failed attempts in the current outage; the next attempt is allowed from ``next_try_at``.
    failures: int = 0
    next_try_at: float = 0.0
    last_error: str = ""
    outages: int = 0  # outages begun
    reconnects: int = 0  # outages ended by a successful operation
    outage_total_s: float = 0.0  # seconds of the outages that have ended

    def allow(self, now: float) -> bool:
        """Whether an operation should go to the server now: always while up; while down only
        once the backoff delay since the last failed attempt has passed (half-open)."""
        return self.up or now >= self.next_try_at

    def failed(self, now: float, error: str) -> bool:
        """An operation could not reach the server. True when this starts an outage (log it)."""
        self.last_error = error
        self.failures += 1
        self.next_try_at = now + self.delay()
        if not self.up:
            return False
        self.up = False
        self.down_since = now
        self.outages += 1
        return True

    def succeeded(self, now: float) -> float | None:
        """An operation got an answer from the server (any answer, errors included). Returns
        the outage's length in seconds when this ends one, else None."""
        if self.up:
            return None
        started = self.down_since if self.down_since is not None else now
        lasted = max(0.0, now - started)
        self.up = True
        self.down_since = None
        self.up_since = now
        self.failures = 0
        self.next_try_at = 0.0
        self.reconnects += 1
        self.outage_total_s += lasted
        return lasted

    def delay(self) -> float:
        """Backoff before the next attempt after ``failures`` failed ones: ``base * 2**(n-1)``
        capped at ``cap``, half of it random ("equal jitter": never 0, never in lock step)."""
        n = max(self.failures, 1)
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(n - 1, 30))
        return ceiling / 2 + self.rng.uniform(0.0, ceiling / 2)

    def retry_in(self, now: float) -> float:
        """Seconds until the next attempt is allowed (0 while up)."""
        return 0.0 if self.up else max(0.0, self.next_try_at - now)

    def pause_s(self, now: float, slice_s: float = 0.1) -> float:
        """How long a coroutine waiting for the bus sleeps before it looks again: until the
        next attempt is due, but in slices (another coroutine's attempt may end the outage
        first), and never less than 20 ms (no busy loop)."""
        return min(slice_s, max(0.02, self.retry_in(now)))

    def down_for(self, now: float) -> float:
        """How long the current outage has lasted (0 while up)."""
        return 0.0 if self.down_since is None else max(0.0, now - self.down_since)

    def outage_seconds(self, now: float) -> float:
        """Seconds of outage so far, the current one included (a counter for the metrics)."""
        return self.outage_total_s + self.down_for(now)

    def up_for(self, now: float) -> float | None:
        """Seconds since the last outage ended; None when there has been none (or it is down)."""
        if not self.up or self.up_since is None:
            return None
        return max(0.0, now - self.up_since)
