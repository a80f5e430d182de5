"""A registrar's location service (RFC 3261 §10.3), in memory (sans-I/O; time is passed in).

Softphones REGISTER to voxgate itself; ``LocationService.register`` applies one REGISTER that
the caller has already authenticated (§10.3 step 3, ``gateway.sip.auth``) and authorised (step
4: the authenticated user is the AOR's owner) and returns the response to send:

- step 2: a ``Require`` it does not support → 420 with ``Unsupported``;
- step 5: an AOR (To) that is not a ``sip:``/``sips:`` URI with a user, or not in the
  configured domain → 404;
- step 6: ``Contact: *`` only with ``Expires: 0`` and alone (else 400): removes every binding
  of the AOR (those whose Call-ID matches and CSeq is not lower are left, as step 6 says);
- step 7: each Contact's lifetime from its ``expires`` parameter, else the ``Expires`` header,
  else the default; a non-zero lifetime below ``min_expires`` fails the whole request with 423
  and ``Min-Expires`` (§10.3 step 7, §21.4.17), one above ``max_expires`` is shortened; an
  existing binding with the same Call-ID is only updated by a higher CSeq (else 400: out of
  order, nothing changes);
- step 8: 200 listing every current binding with its remaining ``expires`` (and a Date).

The request is applied all or nothing. Bounds: ``max_per_aor`` bindings an AOR (more: 403, a
phone cannot crowd out the others) and ``max_total`` in all (more: 503 + Retry-After); expired
bindings are dropped when their AOR is touched and in a sweep at most every ``sweep_s``.

Where a call to the AOR goes (RFC 5626-lite, no ``outbound``/``Path`` support): the Request-URI
is the registered Contact; packets go to the address the REGISTER came from (the phone's NAT
binding, over the same TCP connection while it is open) when the Contact's host is an address
that is not globally routable (RFC 1918, loopback, link-local, CGNAT, ULA) or is the source
address itself; a Contact naming a public address other than the source, or a host name, is
used as it is.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field, replace

from gateway.sip.errors import SipParseError
from gateway.sip.fields import NameAddr
from gateway.sip.helpers import generate_tag, make_response
from gateway.sip.message import Address, Request, Response
from gateway.sip.uri import SipUri, uri_equal

DEFAULT_EXPIRES_S = 3600  # §10.2.1.1's example default, capped at max_expires


@dataclass(frozen=True, slots=True)
class RegistrarSettings:
    min_expires_s: int = 60
    max_expires_s: int = 3600
    default_expires_s: int = DEFAULT_EXPIRES_S
    max_per_aor: int = 5
    max_total: int = 10000
    domain: str = ""  # empty: any host in the To URI (one domain: the user part is the AOR)
    retry_after_s: int = 30
    sweep_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Binding:
    """One registered contact of an AOR."""

    aor: SipUri  # the To URI of the REGISTER, without parameters
    contact: NameAddr  # as registered, without its expires parameter
    source: Address  # where the REGISTER came from
    reliable: bool  # it came over TCP (the connection is reused while it is open)
    call_id: str
    cseq: int
    expires_at: float
    registered_at: float
    q: float = 1.0

    @property
    def uri(self) -> SipUri:
        assert isinstance(self.contact.uri, SipUri)
        return self.contact.uri

    def remaining(self, now: float) -> int:
        return max(0, math.ceil(self.expires_at - now))

    def target(self) -> Address:
        """Where requests for this binding are sent (see the module docstring)."""
        uri = self.uri
        host = uri.host_for_connect
        try:
            ip = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return (host, uri.port or (5061 if uri.secure else 5060))
        if not ip.is_global or str(ip) == self.source[0]:
            return self.source
        return (str(ip), uri.port or (5061 if uri.secure else 5060))


@dataclass(slots=True)
class _Aor:
    bindings: list[Binding] = field(default_factory=list)


class LocationService:
    """AOR user -> bindings, bounded; one per gateway."""

    def __init__(self, settings: RegistrarSettings | None = None) -> None:
        self.settings = settings or RegistrarSettings()
        self._aors: dict[str, list[Binding]] = {}
        self._total = 0
        self._swept = -math.inf

    # --- REGISTER ------------------------------------------------------------------------------
    def register(
        self,
        request: Request,
        source: Address,
        now: float,
        *,
        reliable: bool = False,
        user: str | None = None,
        date: str | None = None,
    ) -> Response:
        """Apply an authenticated REGISTER; ``user``: who authenticated (the AOR must be
        theirs, §10.3 step 4; None: the caller has checked already)."""
        s = self.settings
        self._sweep(now)
        required = request.headers.values("Require")
        if required:  # §10.3 step 2 (no extension is supported for REGISTER)
            return self._reply(request, 420, headers=[("Unsupported", ", ".join(required))])
        try:
            to_uri = request.to_addr.uri
        except SipParseError:
            return self._reply(request, 400, "Bad To header field")
        if not isinstance(to_uri, SipUri) or not to_uri.user:
            return self._reply(request, 404, "Not a SIP AOR with a user part")
        if s.domain and to_uri.host.lower() != s.domain.lower():
            return self._reply(request, 404, f"Not a user of {s.domain}")
        aor_user = to_uri.user
        if user is not None and user != aor_user:
            return self._reply(request, 403, f"{user} may not register {aor_user}")
        aor = SipUri(host=to_uri.host, user=aor_user, scheme=to_uri.scheme)
        try:
            contacts = request.contacts
            header_expires = request.expires
            cseq = request.cseq.seq
            call_id = request.call_id
        except SipParseError as exc:
            return self._reply(request, 400, exc.reason[:80])
        current = self._live(aor_user, now)
        if not contacts:  # a query (§10.2.3)
            return self._ok(request, current, now, date)
        if any(c.wildcard for c in contacts):
            if len(contacts) != 1 or header_expires != 0:
                return self._reply(request, 400, "Contact: * needs Expires: 0 and no other")
            kept = [b for b in current if b.call_id == call_id and b.cseq >= cseq]
            self._store(aor_user, kept)
            return self._ok(request, kept, now, date)
        after = list(current)
        for contact in contacts:
            if not isinstance(contact.uri, SipUri):
                return self._reply(request, 400, "Only sip: and sips: contacts")
            expires = _expires(contact, header_expires, s.default_expires_s)
            if 0 < expires < s.min_expires_s:
                return self._reply(request, 423, headers=[("Min-Expires", str(s.min_expires_s))])
            expires = min(expires, s.max_expires_s)
            try:
                q = _q(contact)
            except ValueError:
                return self._reply(request, 400, "Bad q value in Contact")
            index = next((i for i, b in enumerate(after) if uri_equal(b.uri, contact.uri)), None)
            if index is not None:
                old = after[index]
                if old.call_id == call_id and old.cseq >= cseq:
                    return self._reply(request, 400, "CSeq not higher than the binding's")
                del after[index]
            if expires == 0:
                continue
            after.append(Binding(
                aor=aor, contact=_without_expires(contact),
                source=source, reliable=reliable, call_id=call_id, cseq=cseq,
                expires_at=now + expires, registered_at=now, q=q,
            ))  # fmt: skip
        if len(after) > s.max_per_aor:
            return self._reply(request, 403, f"More than {s.max_per_aor} contacts")
        if self._total - len(current) + len(after) > s.max_total:
            return self._reply(request, 503, "Registrar Full",
                               headers=[("Retry-After", str(s.retry_after_s))])  # fmt: skip
        self._store(aor_user, after)
        return self._ok(request, after, now, date)

    # --- lookups ------------------------------------------------------------------------------
    def bindings(self, user: str, now: float) -> list[Binding]:
        """The AOR's live bindings, best first (highest q, then the most recently
        registered: the phone the user touched last)."""
        live = self._live(user, now)
        return sorted(live, key=lambda b: (-b.q, -b.registered_at))

    def lookup(self, user: str, now: float) -> Binding | None:
        found = self.bindings(user, now)
        return found[0] if found else None

    @property
    def total(self) -> int:
        return self._total

    # --- internals ----------------------------------------------------------------------------
    def _live(self, user: str, now: float) -> list[Binding]:
        bindings = self._aors.get(user)
        if not bindings:
            return []
        live = [b for b in bindings if b.expires_at > now]
        if len(live) != len(bindings):
            self._store(user, live)
        return live

    def _store(self, user: str, bindings: list[Binding]) -> None:
        self._total += len(bindings) - len(self._aors.get(user, ()))
        if bindings:
            self._aors[user] = bindings
        else:
            self._aors.pop(user, None)

    def _sweep(self, now: float) -> None:
        if now - self._swept < self.settings.sweep_s:
            return
        self._swept = now
        for user in list(self._aors):
            self._live(user, now)

    def _ok(
        self, request: Request, bindings: list[Binding], now: float, date: str | None
    ) -> Response:
        headers = [("Contact", str(b.contact.with_param("expires", str(b.remaining(now)))))
                   for b in bindings]  # fmt: skip
        if date is not None:
            headers.append(("Date", date))
        return self._reply(request, 200, headers=headers)

    @staticmethod
    def _reply(
        request: Request,
        status: int,
        reason: str | None = None,
        *,
        headers: list[tuple[str, str]] | None = None,
    ) -> Response:
        return make_response(request, status, reason, to_tag=generate_tag(), headers=headers or [])


def _without_expires(contact: NameAddr) -> NameAddr:
    return replace(contact, params=tuple(p for p in contact.params if p[0].lower() != "expires"))


def _expires(contact: NameAddr, header: int | None, default: int) -> int:
    value = contact.param("expires")
    if value is not None:
        value = value.strip()
        # §20.19 / §10.2.1.1: a malformed value is treated as the default (3600).
        return min(int(value), 2**32 - 1) if value.isascii() and value.isdigit() else default
    return header if header is not None else default


def _q(contact: NameAddr) -> float:
    value = contact.param("q")
    if value is None:
        return 1.0
    q = float(value)  # ValueError for garbage
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        raise ValueError(value)
    return q
