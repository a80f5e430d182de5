"""Digest authentication for a SIP UAS or registrar (sans-I/O; time is passed in).

RFC 3261 §22.1/§22.4 with the algorithms of RFC 8760 (SHA-256; MD5 for old phones) and the
``qop=auth`` exchange of RFC 7616 §3.3-§3.4. The client side and the parsing and hashing are
``gateway.sip.digest``; this module only adds what a server needs:

- **Challenges.** One ``WWW-Authenticate`` per algorithm, most preferred first (RFC 8760 §2.4:
  SHA-256 before MD5), all carrying the same nonce. A UAS answers 401, not 407: 407 is the
  proxy's status (§22.3), and voxgate is the request's final destination (§22.1), for calls
  and for REGISTER (§10.3 step 3) alike.
- **Stateless nonces.** ``base64url(issued_ms | 8 random bytes | HMAC-SHA256(secret, both)
  [:16])``: nothing is stored per challenge, so a flood of unauthenticated requests costs a
  hash each, never memory. The timestamp makes a nonce expire (``nonce_ttl_s``); a nonce that
  is expired, or not ours at all (another gateway's, or ours from before a restart), with a
  *correct* digest gets a new challenge with ``stale=true`` (RFC 7616 §3.3), so the phone
  retries at once without asking its user for the password again.
- **Replay protection.** Each nonce's nonce counts (``nc``) are remembered in a bounded LRU
  table as the highest count seen plus a 64-wide window below it (out-of-order UDP requests
  are fine, a repeated count is not). When the table is full the least recently used nonce is
  forgotten and its issue time becomes a watermark: a nonce issued at or before the watermark
  that is not in the table any more is answered ``stale=true`` (fail closed: its counts are
  unknown). A qop-less answer (RFC 2069) has no count: its nonce is good for one request.
- **Verdicts.** ``verify`` never raises on what a peer sent: a broken Authorization header is
  ``malformed`` (400), a wrong password or unknown user ``failed`` (401 again, and the caller
  reports it to the failed-auth lockout, ``gateway.sip.limits``), a missing or foreign one
  (another realm, another scheme) ``missing`` (401, not a failure).

Accounts come from config (``[[gateway.accounts]]``: a password, or stored ``HA1`` values so
the password itself is never on the gateway) or from a users file (``parse_users_file``:
``htdigest``'s ``user:realm:HA1`` lines, plus a fourth SHA-256 HA1 field).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import string
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.sip.digest import (
    Challenge,
    hash_hex,
    parse_challenges,
    response_from_ha1,
    supported_algorithms,
)
from gateway.sip.errors import SipParseError
from gateway.sip.helpers import generate_tag, make_response
from gateway.sip.message import Request, Response
from gateway.sip.syntax import quote_string
from gateway.sip.uri import SipUri, Uri, parse_uri

# What is offered when the configuration does not say: RFC 8760 §2.4's order of preference.
DEFAULT_ALGORITHMS = ("SHA-256", "MD5")
NONCE_TTL_S = 300.0  # Kamailio's auth module default (nonce_expire)
MAX_NONCES = 20000
_WINDOW = 64  # nonce counts accepted below the highest one seen (UDP reordering)
_HEX = frozenset(string.hexdigits)
_DIGEST_LEN = {"MD5": 32, "SHA-256": 64, "SHA-512-256": 64}
_NONCE_BYTES = 32  # 8 timestamp + 8 random + 16 MAC
_NONCE_CHARS = 43  # base64url of 32 bytes, unpadded

Outcome = Literal["ok", "missing", "stale", "replayed", "failed", "malformed"]


class AccountError(ValueError):
    """An account or users-file line that cannot be used (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class Account:
    """One user who may authenticate: the secrets are HA1 values, ``H(user:realm:password)``
    per algorithm (RFC 7616 §3.4.2), so an account built from stored HA1s never holds the
    password. ``algorithms``: what this user is challenged with (empty: the server's list)."""

    username: str
    realm: str
    ha1: tuple[tuple[str, str], ...]
    algorithms: tuple[str, ...] = ()

    @classmethod
    def with_password(
        cls, username: str, realm: str, password: str, algorithms: Sequence[str] = ()
    ) -> Account:
        secrets_ = tuple(
            (alg, hash_hex(alg, f"{username}:{realm}:{password}")) for alg in supported_algorithms()
        )
        return cls(username, realm, secrets_, tuple(algorithms))

    @classmethod
    def with_ha1(
        cls,
        username: str,
        realm: str,
        *,
        md5: str = "",
        sha256: str = "",
        algorithms: Sequence[str] = (),
    ) -> Account:
        pairs: list[tuple[str, str]] = []
        for alg, value in (("MD5", md5), ("SHA-256", sha256)):
            if not value:
                continue
            value = value.lower()
            if len(value) != _DIGEST_LEN[alg] or not set(value) <= _HEX:
                raise AccountError(
                    f"account {username!r}: the {alg} HA1 must be {_DIGEST_LEN[alg]} hex digits"
                )
            pairs.append((alg, value))
        if not pairs:
            raise AccountError(f"account {username!r}: needs a password or an HA1")
        return cls(username, realm, tuple(pairs), tuple(algorithms))

    def secret(self, algorithm: str) -> str | None:
        for alg, value in self.ha1:
            if alg == algorithm:
                return value
        return None


def parse_users_file(text: str, default_realm: str) -> list[Account]:
    """The accounts of a users file. One account a line; ``#`` starts a comment line:

    - ``user:password`` — a password in clear (both algorithms work);
    - ``user:realm:md5-ha1`` — an ``htdigest`` line (MD5 only; an empty realm is the
      gateway's realm);
    - ``user:realm:md5-ha1:sha256-ha1`` — either HA1 may be empty, not both.

    A password cannot contain ``:`` here (put such an account in the config file).
    Raises :class:`AccountError` naming the line."""
    accounts: list[Account] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":")
        try:
            if len(fields) == 2:
                user, password = fields
                _check_username(user)
                if not password:
                    raise AccountError(f"account {user!r}: empty password")
                accounts.append(Account.with_password(user, default_realm, password))
            elif len(fields) in (3, 4):
                user, realm = fields[0], fields[1] or default_realm
                _check_username(user)
                sha = fields[3] if len(fields) == 4 else ""
                accounts.append(Account.with_ha1(user, realm, md5=fields[2], sha256=sha))
            else:
                raise AccountError("expected user:password or user:realm:ha1[:ha1_sha256]")
        except AccountError as exc:
            raise AccountError(f"line {number}: {exc}") from None
    return accounts


def _check_username(user: str) -> None:
    # The username goes into a quoted-string and is compared to the To user of a REGISTER.
    if not user or any(c in user for c in '"\\') or not user.isprintable() or user != user.strip():
        raise AccountError(f"bad username {user!r}")


# --- nonces -----------------------------------------------------------------------------------
class NonceIssuer:
    """Issues and checks HMAC-signed nonces that carry their issue time (milliseconds on the
    caller's clock: monotonic in the gateway, a fake one in tests)."""

    def __init__(self, secret: bytes | None = None, ttl_s: float = NONCE_TTL_S) -> None:
        self._secret = secret or secrets.token_bytes(32)
        self.ttl_ms = int(ttl_s * 1000)

    def issue(self, now: float) -> str:
        body = max(0, int(now * 1000)).to_bytes(8, "big") + secrets.token_bytes(8)
        raw = body + self._mac(body)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def issued_ms(self, nonce: str) -> int | None:
        """When ``nonce`` was issued, or None if it is not one of ours (bad MAC, garbage)."""
        if len(nonce) != _NONCE_CHARS or not nonce.isascii():
            return None
        try:
            raw = base64.b64decode(nonce + "=", altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _NONCE_BYTES or not hmac.compare_digest(raw[16:], self._mac(raw[:16])):
            return None
        return int.from_bytes(raw[:8], "big")

    def expired(self, issued_ms: int, now: float) -> bool:
        age = int(now * 1000) - issued_ms
        return age > self.ttl_ms or age < -1000  # from the future: not our clock's

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:16]


class _Counts:
    __slots__ = ("issued_ms", "seen", "top")

    def __init__(self, issued_ms: int) -> None:
        self.issued_ms = issued_ms
        self.top = 0
        self.seen = 0  # bit i: count (top - i) was used

    def use(self, nc: int) -> bool:
        if nc > self.top:
            shift = nc - self.top
            self.seen = ((self.seen << shift) | 1) & ((1 << _WINDOW) - 1) if shift < _WINDOW else 1
            self.top = nc
            return True
        offset = self.top - nc
        if offset >= _WINDOW or self.seen & (1 << offset):
            return False
        self.seen |= 1 << offset
        return True


class NonceCounts:
    """The nonce counts used so far, per nonce, in a table of at most ``size`` nonces."""

    def __init__(self, size: int = MAX_NONCES) -> None:
        if size < 1:
            raise ValueError("the nonce table needs room for one nonce")
        self.size = size
        self._table: OrderedDict[str, _Counts] = OrderedDict()
        self.watermark_ms = -1  # newest issue time among forgotten nonces
        self.evicted = 0

    def use(self, nonce: str, issued_ms: int, nc: int) -> bool:
        """Record ``nc`` for ``nonce``; False when it was used already (a replay) or cannot be
        told apart from one (the nonce's counts were forgotten)."""
        counts = self._table.get(nonce)
        if counts is None:
            if issued_ms <= self.watermark_ms:
                return False
            counts = _Counts(issued_ms)
            self._table[nonce] = counts
            while len(self._table) > self.size:
                _, old = self._table.popitem(last=False)
                self.watermark_ms = max(self.watermark_ms, old.issued_ms)
                self.evicted += 1
        else:
            self._table.move_to_end(nonce)
        return counts.use(nc)

    def forget_expired(self, oldest_ms: int) -> None:
        """Drop the least recently used nonces issued before ``oldest_ms``: they are expired,
        so ``verify`` answers them stale before it looks here (no watermark needed)."""
        while self._table:
            nonce, counts = next(iter(self._table.items()))
            if counts.issued_ms >= oldest_ms:
                break
            del self._table[nonce]

    def __len__(self) -> int:
        return len(self._table)


# --- verification -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``verify`` found. ``username``: who the credentials named (when they did)."""

    outcome: Outcome
    username: str | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def is_failure(self) -> bool:
        """Counts towards the source's failed-auth lockout: wrong credentials or garbage, not
        a first attempt without credentials or a stale nonce."""
        return self.outcome in ("failed", "malformed")


class DigestServer:
    """Challenges and verifies requests against a set of accounts."""

    def __init__(
        self,
        accounts: Iterable[Account],
        *,
        realm: str = "voxgate",
        algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
        nonce_ttl_s: float = NONCE_TTL_S,
        max_nonces: int = MAX_NONCES,
        secret: bytes | None = None,
    ) -> None:
        known = supported_algorithms()
        self.algorithms = tuple(a.upper() for a in algorithms)
        for alg in self.algorithms:
            if alg not in known:
                raise AccountError(f"unsupported digest algorithm {alg!r} (have {known})")
        if not self.algorithms:
            raise AccountError("no digest algorithm to offer")
        self.realm = realm
        self.nonces = NonceIssuer(secret, nonce_ttl_s)
        self.counts = NonceCounts(max_nonces)
        self._accounts: dict[tuple[str, str], Account] = {}
        self._by_user: dict[str, Account] = {}
        realms = [realm]
        for account in accounts:
            key = (account.username, account.realm)
            if key in self._accounts:
                raise AccountError(f"account {account.username!r} is defined twice")
            for alg in account.algorithms:
                if alg not in known:
                    raise AccountError(
                        f"account {account.username!r}: unsupported algorithm {alg!r}"
                    )
            if not self.offered_to(account):
                raise AccountError(
                    f"account {account.username!r}: no secret for any offered algorithm "
                    f"({', '.join(account.algorithms or self.algorithms)})"
                )
            self._accounts[key] = account
            self._by_user.setdefault(account.username, account)
            if account.realm not in realms:
                realms.append(account.realm)
        self.realms = tuple(realms)

    # --- accounts ----------------------------------------------------------------------------
    def __contains__(self, username: object) -> bool:
        return username in self._by_user

    def __len__(self) -> int:
        return len(self._accounts)

    def offered_to(self, account: Account) -> tuple[str, ...]:
        """The algorithms ``account`` is challenged with: its own list (or the server's), less
        those it has no secret for."""
        wanted = account.algorithms or self.algorithms
        return tuple(alg for alg in wanted if account.secret(alg) is not None)

    # --- challenges ---------------------------------------------------------------------------
    def challenges(self, now: float, *, stale: bool = False, user: str | None = None) -> list[str]:
        """WWW-Authenticate values, most preferred algorithm first. ``user``: the account the
        request names (its From, or the To of a REGISTER), when it is known and has its own
        algorithm list, narrows the offer to what that user can answer (RFC 8760 §2.4 lets
        the UAC pick, but many only read the first challenge: sipp, pjsip before 2.12, and
        libre, baresip's stack, refuses a 401 that holds an algorithm it lacks)."""
        account = self._by_user.get(user) if user else None
        if account is not None:
            pairs = [(account.realm, alg) for alg in self.offered_to(account)]
        else:
            pairs = [(realm, alg) for realm in self.realms for alg in self.algorithms]
        nonce = self.nonces.issue(now)
        tail = ", stale=true" if stale else ""
        return [
            f"Digest realm={quote_string(realm)}, nonce={quote_string(nonce)}, "
            f'algorithm={alg}, qop="auth"{tail}'
            for realm, alg in pairs
        ]

    def response(self, request: Request, verdict: Verdict, now: float) -> Response:
        """The answer to a request that did not authenticate: 400 for broken credentials
        (RFC 7616 §3.4.6 for a digest-uri that is not the Request-URI), else 401 with fresh
        challenges (``stale=true`` where the digest was right but the nonce was not)."""
        if verdict.outcome == "malformed":
            return make_response(request, 400, f"Bad Authorization: {verdict.reason}"[:100],
                                 to_tag=generate_tag())  # fmt: skip
        stale = verdict.outcome in ("stale", "replayed")
        user = verdict.username or challenge_hint(request)
        headers = [("WWW-Authenticate", v) for v in self.challenges(now, stale=stale, user=user)]
        return make_response(request, 401, to_tag=generate_tag(), headers=headers)

    # --- verification -------------------------------------------------------------------------
    def verify(self, request: Request, now: float) -> Verdict:
        """Check the request's Authorization header fields (the first one for one of our
        realms counts; others are for someone else, §22.4)."""
        for value in request.headers.get_all("Authorization"):
            scheme = value.strip().split(None, 1)
            if not scheme or scheme[0].lower() != "digest":
                continue  # Basic, Bearer...: not ours to judge (and token68 is no auth-param)
            try:
                parsed = parse_challenges(value)
            except (SipParseError, ValueError, IndexError):
                return Verdict("malformed", reason="unparseable credentials")
            if len(parsed) != 1:
                return Verdict("malformed", reason="not one set of credentials")
            creds = parsed[0]
            names = [name for name, _ in creds.params]
            if len(names) != len(set(names)):
                return Verdict("malformed", reason="a parameter given twice")
            if creds.get("realm") is None:
                return Verdict("malformed", reason="no realm")
            if creds.realm not in self.realms:
                continue  # for another realm: another hop's (§22.3)
            return self._check(creds, request, now)
        return Verdict("missing")

    def _check(self, creds: Challenge, request: Request, now: float) -> Verdict:
        username, nonce = creds.get("username"), creds.get("nonce")
        digest_uri, response = creds.get("uri"), creds.get("response")
        if not username or nonce is None or digest_uri is None or response is None:
            return Verdict("malformed", username, "username, nonce, uri and response needed")
        if creds.userhash:  # RFC 7616 §3.4.4: never offered
            return Verdict("malformed", username, "userhash was not offered")
        algorithm = creds.algorithm  # MD5 when absent (RFC 2617 §3.2.1)
        qop = creds.get("qop")
        nc = 1
        cnonce = ""
        if qop is not None:
            if qop.lower() != "auth":
                return Verdict("malformed", username, f"qop {qop!r} was not offered")
            qop = "auth"
            cnonce = creds.get("cnonce") or ""
            nc_text = creds.get("nc") or ""
            if not cnonce or len(nc_text) != 8 or not set(nc_text) <= _HEX:
                return Verdict("malformed", username, "qop=auth needs cnonce and an 8-hex nc")
            nc = int(nc_text, 16)
            if nc == 0:
                return Verdict("malformed", username, "nc must start at 1")
        if not _same_target(digest_uri, request.uri):
            return Verdict("malformed", username, "the digest uri is not the Request-URI")
        account = self._accounts.get((username, creds.realm))
        if account is None:
            hash_hex("SHA-256", nonce)  # about the work of a known user's check
            return Verdict("failed", username, "unknown user")
        ha1 = account.secret(algorithm) if algorithm in self.offered_to(account) else None
        if ha1 is None:
            # An algorithm this user is not challenged with (or -sess, never offered): a
            # new challenge with what the user can answer; not a failure of theirs.
            return Verdict("missing", username, f"algorithm {algorithm} not offered")
        if len(response) != _DIGEST_LEN[algorithm] or not set(response) <= _HEX:
            return Verdict("malformed", username, "the response is not a digest")
        expected = response_from_ha1(
            algorithm, ha1, nonce=nonce, method=request.method, uri=digest_uri, cnonce=cnonce,
            nc=nc, qop=qop, body=request.body,
        )  # fmt: skip
        if not hmac.compare_digest(expected, response.lower()):
            return Verdict("failed", username, "wrong credentials")
        # The client knows the password. Only now is the nonce judged: a stale one is told
        # stale=true (RFC 7616 §3.3) whatever the reason, so the client retries silently.
        issued = self.nonces.issued_ms(nonce)
        if issued is None:
            return Verdict("stale", username, "not a nonce of ours")
        if self.nonces.expired(issued, now):
            return Verdict("stale", username, "expired nonce")
        self.counts.forget_expired(int(now * 1000) - self.nonces.ttl_ms)
        if not self.counts.use(nonce, issued, nc):
            return Verdict("replayed", username, f"nonce count {nc} used already")
        return Verdict("ok", username)


def challenge_hint(request: Request) -> str | None:
    """The user a request is probably from, to pick the algorithms to offer before any
    credentials came: the To user of a REGISTER (the AOR), the From user otherwise."""
    try:
        addr = request.to_addr if request.method == "REGISTER" else request.from_addr
    except SipParseError:
        return None
    uri = addr.uri
    return uri.user if isinstance(uri, SipUri) else None


def _same_target(digest_uri: str, request_uri: Uri) -> bool:
    """RFC 7616 §3.4.6: the digest-uri names the request's resource. Some UACs write it
    without the user part (sipp: ``sip:host:port``), so the host is what must match."""
    if digest_uri == str(request_uri):
        return True
    try:
        uri = parse_uri(digest_uri)
    except SipParseError:
        return False
    if isinstance(uri, SipUri) and isinstance(request_uri, SipUri):
        return uri.host.lower() == request_uri.host.lower()
    return False
