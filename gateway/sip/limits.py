"""Per-source admission limits for SIP requests: floods and abuse (sans-I/O; time is passed in).

The transaction layer (``TransactionLayer(limits=...)``) asks twice: ``shed`` before it parses
a datagram (from its source IP and first token: a source over its rate costs ~10 µs a
request), then ``check`` before it creates a server transaction for a new request. A refused
request costs at most one stateless response (RFC 3261 §8.2.6: a UAS may answer outside a
transaction), sent to the packet's source; nothing per request is kept beyond the bounded
tables here.

- Token buckets per (source IP, method) for INVITE, REGISTER and OPTIONS: ``rate`` tokens a
  second up to ``burst``. Re-INVITEs count too (they cost a transaction and an SDP answer).
- A cap on the calls one source has up at once (``call_started`` / ``call_ended``).
- Failed-auth lockout: ``auth_failures`` failures within ``auth_window_s`` lock the source out
  for ``lockout_s`` (every new request but ACK, CANCEL and BYE is refused with 403, so its
  calls up can still end). The inbound digest check (``gateway.sip.access``) reports each
  wrong password, unknown user or broken Authorization header to ``auth_failed`` and each
  success to ``auth_succeeded``; a first request without credentials is not a failure.
- A bound on the transaction table (``max_transactions``), whoever sends.

What a refusal looks like is ``action``: ``"reject"`` answers 503 with Retry-After (RFC 3261
§21.5.4: a well-behaved peer backs off, a proxy fails over) or, for a locked-out source, 403
(§21.4.4: it is refused, and retrying will not help until the lockout ends); ``"drop"`` sends
nothing (no reflection towards a spoofed source, and the flooder learns nothing).

Every table is an LRU of at most ``max_sources`` entries, so a flood from spoofed or rotating
sources cannot grow them without limit. What eviction forgets is the state of the least
recently seen source: a bucket comes back full (fail open, which is the only safe way to
forget) and a lockout is lifted early. The per-source call counts are bounded by the calls up.
Loopback is not exempt: a local sipp or PBX is limited like any peer.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from voxgate.contract.config import GatewayConfig

log = logging.getLogger("voxgate.sip")

Action = Literal["reject", "drop"]
# Why a request was refused: the label of ``voxgate_sip_requests_refused``.
REASONS = ("rate", "calls", "lockout", "table")
LIMITED_METHODS = ("INVITE", "REGISTER", "OPTIONS")
# Requests a locked-out source may still send: they end or acknowledge what is already up.
_ALWAYS = frozenset(("ACK", "CANCEL", "BYE"))

K = TypeVar("K")
V = TypeVar("V")


class LruTable(Generic[K, V]):
    """A dict of at most ``size`` entries; a lookup makes an entry the most recent, an insert
    into a full table forgets the least recent one."""

    __slots__ = ("_data", "evicted", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("an LRU table needs room for one entry")
        self._data: OrderedDict[K, V] = OrderedDict()
        self.size = size
        self.evicted = 0

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)
            self.evicted += 1

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; starts full."""

    __slots__ = ("refused", "stamp", "tokens")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.stamp = now
        self.refused = 0  # refusals since this source's bucket was created (for the log)

    def refill(self, rate: float, burst: float, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
            self.stamp = now

    def take(self, rate: float, burst: float, now: float) -> bool:
        self.refill(rate, burst, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float  # 0 disables the limit
    burst: int


@dataclass(frozen=True, slots=True)
class LimitSettings:
    action: Action = "reject"
    retry_after_s: int = 5
    rates: tuple[tuple[str, Rate], ...] = (
        ("INVITE", Rate(100.0, 200)),
        ("REGISTER", Rate(20.0, 40)),
        ("OPTIONS", Rate(20.0, 40)),
    )
    calls_per_source: int = 0  # 0: only the gateway's max_calls
    auth_failures: int = 10  # 0: no lockout
    auth_window_s: float = 60.0
    lockout_s: float = 300.0
    max_sources: int = 10000
    max_transactions: int = 8192

    @classmethod
    def from_config(cls, cfg: GatewayConfig) -> LimitSettings:
        action: Action = "drop" if cfg.limit_action == "drop" else "reject"
        return cls(
            action=action,
            retry_after_s=cfg.limit_retry_after_s,
            rates=(
                ("INVITE", Rate(cfg.limit_invite_rate, cfg.limit_invite_burst)),
                ("REGISTER", Rate(cfg.limit_register_rate, cfg.limit_register_burst)),
                ("OPTIONS", Rate(cfg.limit_options_rate, cfg.limit_options_burst)),
            ),
            calls_per_source=cfg.limit_calls_per_source,
            auth_failures=cfg.limit_auth_failures,
            auth_window_s=cfg.limit_auth_window_s,
            lockout_s=cfg.limit_lockout_s,
            max_sources=cfg.limit_sources,
            max_transactions=cfg.max_transactions,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request that is not admitted: answer ``status`` (503 + Retry-After, or 403 for a
    locked-out source) unless ``drop``."""

    reason: str  # one of REASONS
    drop: bool
    retry_after_s: int
    status: int = 503


@dataclass(slots=True)
class _AuthRecord:
    failures: int
    window_start: float
    locked_until: float = 0.0


class SourceLimits:
    """The admission policy and its bounded state; one per user agent."""

    def __init__(self, settings: LimitSettings | None = None) -> None:
        self.settings = s = settings or LimitSettings()
        self._rates = {method: rate for method, rate in s.rates if rate.per_s > 0}
        self._buckets: LruTable[tuple[str, str], TokenBucket] = LruTable(s.max_sources)
        self._auth: LruTable[str, _AuthRecord] = LruTable(s.max_sources)
        self._calls: dict[str, int] = {}
        self.refused: Counter[str] = Counter({reason: 0 for reason in REASONS})

    # --- admission ---------------------------------------------------------------------------
    def shed(self, ip: str, method: str, now: float) -> Refusal | None:
        """The cheap check before a datagram is even parsed (``method`` from its first token):
        a refusal when ``ip`` is locked out or its bucket for ``method`` is empty now, so a
        flooding source costs a few microseconds a request, not a parse. Takes no token (the
        request, if it gets through, meets ``check``). A retransmission of a request admitted
        earlier is shed too while its source is over the limit: its source is flooding."""
        if method not in _ALWAYS and self.locked_out(ip, now):
            return self._refuse("lockout", ip)
        rate = self._rates.get(method)
        if rate is None:
            return None
        bucket = self._buckets.get((ip, method))
        if bucket is None:
            return None
        bucket.refill(rate.per_s, rate.burst, now)
        if bucket.tokens >= 1.0:
            return None
        return self._over_rate(bucket, ip, method, rate)

    def check(
        self, ip: str, method: str, *, new_dialog: bool, now: float, transactions: int = 0
    ) -> Refusal | None:
        """Admit (None) or refuse a request that would start a server transaction.

        ``new_dialog``: the request has no To tag (an INVITE that would start a call);
        ``transactions``: the transaction table's size now.
        """
        s = self.settings
        if method not in _ALWAYS and self.locked_out(ip, now):
            return self._refuse("lockout", ip)
        rate = self._rates.get(method)
        if rate is not None:
            key = (ip, method)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = TokenBucket(rate.burst, now)
                self._buckets.put(key, bucket)
            if not bucket.take(rate.per_s, rate.burst, now):
                return self._over_rate(bucket, ip, method, rate)
        if method == "INVITE" and new_dialog and not self.call_admitted(ip):
            return self._refuse("calls", ip)
        if transactions >= s.max_transactions:
            return self._refuse("table", ip)
        return None

    def _over_rate(self, bucket: TokenBucket, ip: str, method: str, rate: Rate) -> Refusal:
        bucket.refused += 1
        if _is_power_of_ten(bucket.refused):  # a flood logs a handful of lines, not a line each
            log.warning("SIP %s from %s over %g/s (burst %d): %d refused",
                        method, ip, rate.per_s, rate.burst, bucket.refused)  # fmt: skip
        return self._refuse("rate", ip)

    def _refuse(self, reason: str, ip: str) -> Refusal:
        self.refused[reason] += 1
        s = self.settings
        return Refusal(reason, s.action == "drop", s.retry_after_s,
                       403 if reason == "lockout" else 503)  # fmt: skip

    def refuse_call(self, ip: str) -> Refusal:
        """The call cap was found reached when the call was about to be set up (a burst of
        INVITEs admitted before any of them became a call): count it like ``check`` would."""
        return self._refuse("calls", ip)

    # --- calls per source --------------------------------------------------------------------
    def call_admitted(self, ip: str) -> bool:
        cap = self.settings.calls_per_source
        return cap <= 0 or self._calls.get(ip, 0) < cap

    def call_started(self, ip: str) -> None:
        self._calls[ip] = self._calls.get(ip, 0) + 1

    def call_ended(self, ip: str) -> None:
        n = self._calls.get(ip, 0) - 1
        if n > 0:
            self._calls[ip] = n
        else:
            self._calls.pop(ip, None)

    def calls(self, ip: str) -> int:
        return self._calls.get(ip, 0)

    # --- failed-auth lockout -----------------------------------------------------------------
    def auth_failed(self, ip: str, now: float) -> bool:
        """A request from ``ip`` failed authentication (wrong credentials, not the first
        challenge-less attempt); True when this locks the source out."""
        s = self.settings
        if s.auth_failures <= 0:
            return False
        rec = self._auth.get(ip)
        if rec is None or now - rec.window_start > s.auth_window_s:
            locked = rec.locked_until if rec is not None else 0.0
            rec = _AuthRecord(0, now, locked)
            self._auth.put(ip, rec)
        rec.failures += 1
        if rec.failures >= s.auth_failures and rec.locked_until <= now:
            rec.locked_until = now + s.lockout_s
            log.warning("SIP source %s locked out for %g s after %d failed authentications",
                        ip, s.lockout_s, rec.failures)  # fmt: skip
            return True
        return False

    def auth_succeeded(self, ip: str) -> None:
        rec = self._auth.get(ip)
        if rec is not None and rec.locked_until == 0.0:
            self._auth.pop(ip)

    def locked_out(self, ip: str, now: float) -> bool:
        rec = self._auth.get(ip)
        if rec is None or rec.locked_until == 0.0:
            return False
        if rec.locked_until <= now:
            self._auth.pop(ip)  # served its time: a clean slate
            return False
        return True

    # --- sizes (metrics, tests) --------------------------------------------------------------
    @property
    def tracked(self) -> int:
        """Entries held in the bounded tables now."""
        return len(self._buckets) + len(self._auth)

    def refused_counts(self) -> dict[str, int]:
        return dict(self.refused)


def peek_method(data: bytes) -> str | None:
    """The method of a request datagram from its first token, unparsed; None for a response
    or something that does not look like a request line (the parser deals with it)."""
    head = data[:32].lstrip(b"\r\n")  # §7.5: CRLFs before the start line are ignored
    sp = head.find(b" ")
    if sp <= 0 or head.startswith(b"SIP/"):
        return None
    return head[:sp].decode("ascii", "replace")


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1
