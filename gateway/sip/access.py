"""Who may call: trunk allow-lists, inbound digest authentication and the registrar, as one
admission policy for new requests (sans-I/O; time is passed in).

The user agent hands every request outside a dialog to :meth:`Gatekeeper.admit` (and a
REGISTER to :meth:`Gatekeeper.register`) before acting on it, and sends the response it gets
back, if any. In-dialog requests never come here: the dialog was set up by an admitted INVITE
(or by our own call), and its Call-ID and tags are what a request must know to be in it.

Policy (``mode``; ``gateway.auth``):

- A source address on a trunk's allow-list (CIDR, IPv4 or IPv6; an IPv4-mapped IPv6 source
  is matched as IPv4) is admitted without credentials: a carrier's SBC does not answer
  challenges. This is Kamailio's ``permissions`` ``allow_source_address`` and Asterisk's
  ``identify`` ``match=``: trust by source IP, which a UDP sender can forge, so it fits
  addresses the network path already vouches for (a carrier interconnect, a VPN, TLS with
  client certificates).
- ``"invite"``: a new INVITE from anywhere else must carry valid digest credentials of an
  account; without them it gets 401 with one challenge per algorithm (``gateway.sip.auth``).
  Other requests outside a dialog (OPTIONS keep-alives and probes) are answered as before.
- ``"all"``: every request outside a dialog is challenged the same way, except ACK and
  CANCEL, which cannot be: RFC 3261 §22.1 (a CANCEL cannot be resubmitted, it must match its
  INVITE's transaction; an ACK gets no response at all).
- ``"off"``: no challenges; if trunks are configured, an INVITE from outside them is refused
  with 403 (§21.4.4: authorisation will not help), else anyone may call (the open default).
- REGISTER always authenticates (an unauthenticated binding would let anyone take over an
  AOR), whatever the mode and the source.

401, not 407: voxgate is the request's final destination, a UAS and registrar (§22.1,
§10.3 step 3); 407 is for a proxy relaying the request on (§22.3).

Every wrong password, unknown user or broken Authorization header is reported to the
per-source lockout (``gateway.sip.limits``); the request that crosses the threshold gets 403,
and the transaction layer refuses the source's new requests with 403 while it is locked out.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.sip.auth import DigestServer
from gateway.sip.errors import SipParseError
from gateway.sip.helpers import generate_tag, make_response
from gateway.sip.limits import SourceLimits
from gateway.sip.message import Address, Request, Response
from gateway.sip.registrar import Binding, LocationService
from gateway.sip.uri import SipUri, parse_uri

log = logging.getLogger("voxgate.sip")

Mode = Literal["off", "invite", "all"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Never challenged (§22.1); a locked-out source may still send them (gateway.sip.limits).
_EXEMPT = frozenset(("ACK", "CANCEL"))
# Every outcome Gatekeeper.counts keeps (the metric shows each, 0 until it happens).
OUTCOMES = (
    "admitted_trunk", "admitted_user", "challenged", "failed", "stale", "replayed", "malformed",
    "forbidden", "locked_out", "registered",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Trunk:
    name: str
    networks: tuple[Network, ...]

    @classmethod
    def parse(cls, name: str, allow: Iterable[str]) -> Trunk:
        """ValueError naming the entry that is not an address or a CIDR block."""
        nets: list[Network] = []
        for item in allow:
            try:
                nets.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                raise ValueError(f"trunk {name!r}: {item!r} is not an address or CIDR") from None
        return cls(name, tuple(nets))

    def allows(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)


@dataclass(frozen=True, slots=True)
class Admission:
    """``response`` None: go on with the request; else send it and stop. ``identity``: who the
    request was taken to be from, for the log (``trunk carrier``, ``user alice``, ``anyone``)."""

    response: Response | None
    identity: str
    user: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Where an outbound call to a registered AOR goes."""

    request_uri: SipUri  # the registered Contact
    to: SipUri  # the AOR
    addr: Address
    binding: Binding


class NotRegistered(LookupError):
    """An outbound call for a local user who has no live binding."""


def parse_source(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return addr


class Gatekeeper:
    def __init__(
        self,
        *,
        mode: Mode = "off",
        trunks: Sequence[Trunk] = (),
        digest: DigestServer | None = None,
        location: LocationService | None = None,
        limits: SourceLimits | None = None,
    ) -> None:
        if mode != "off" and digest is None:
            raise ValueError(f"auth mode {mode!r} needs accounts")
        if location is not None and digest is None:
            raise ValueError("a registrar needs accounts")
        self.mode = mode
        self.trunks = tuple(trunks)
        self.digest = digest
        self.location = location
        self.limits = limits
        # Outcomes (OUTCOMES), for /metrics (voxgate_sip_access) and tests.
        self.counts: Counter[str] = Counter()

    @property
    def open(self) -> bool:
        """Anyone may call: no challenges and no allow-lists (the default without config)."""
        return self.mode == "off" and not self.trunks

    def trunk_for(self, ip: str) -> Trunk | None:
        addr = parse_source(ip)
        if addr is None:
            return None
        return next((t for t in self.trunks if t.allows(addr)), None)

    # --- admission -----------------------------------------------------------------------------
    def admit(self, request: Request, source: Address, now: float) -> Admission:
        method = request.method
        if method in _EXEMPT:
            return Admission(None, "exempt")
        if method == "REGISTER":
            if self.location is None:
                return Admission(None, "no registrar")  # the UA answers 405
            return self._authenticate(request, source[0], now)
        if method != "INVITE" and self.mode != "all":
            return Admission(None, "anyone")
        trunk = self.trunk_for(source[0])
        if trunk is not None:
            self.counts["admitted_trunk"] += 1
            return Admission(None, f"trunk {trunk.name}")
        if self.mode == "off":
            if not self.trunks:
                return Admission(None, "anyone")
            self.counts["forbidden"] += 1
            log.info("SIP %s from %s refused: not on any trunk's allow-list", method, source[0])
            return Admission(
                make_response(request, 403, "Source Not Allowed", to_tag=generate_tag()),
                "unknown source",
            )
        return self._authenticate(request, source[0], now)

    def _authenticate(self, request: Request, ip: str, now: float) -> Admission:
        assert self.digest is not None
        verdict = self.digest.verify(request, now)
        if verdict.ok:
            self.counts["admitted_user"] += 1
            if self.limits is not None:
                self.limits.auth_succeeded(ip)
            return Admission(None, f"user {verdict.username}", verdict.username)
        self.counts["challenged" if verdict.outcome == "missing" else verdict.outcome] += 1
        if verdict.is_failure:
            log.info("SIP %s from %s: authentication failed (%s, user %r)",
                     request.method, ip, verdict.reason, verdict.username)  # fmt: skip
            if self.limits is not None and self.limits.auth_failed(ip, now):
                self.counts["locked_out"] += 1
                return Admission(
                    make_response(request, 403, "Too Many Failed Authentications",
                                  to_tag=generate_tag()),
                    "locked out",
                )  # fmt: skip
        elif verdict.outcome != "missing":
            log.debug("SIP %s from %s: %s (%s)", request.method, ip, verdict.outcome,
                      verdict.reason)  # fmt: skip
        return Admission(self.digest.response(request, verdict, now), "unauthenticated")

    # --- the registrar -------------------------------------------------------------------------
    def register(
        self,
        request: Request,
        source: Address,
        now: float,
        *,
        reliable: bool = False,
        date: str | None = None,
    ) -> Response:
        """Authenticate, authorise (the account registers its own AOR only: §10.3 step 4)
        and apply a REGISTER."""
        if self.location is None:
            return make_response(request, 405, to_tag=generate_tag())
        admission = self._authenticate(request, source[0], now)
        if admission.response is not None:
            return admission.response
        response = self.location.register(
            request, source, now, reliable=reliable, user=admission.user, date=date
        )
        if response.status == 200:
            self.counts["registered"] += 1
            log.debug("REGISTER %s from %s:%d: %d binding(s)", admission.user, source[0],
                      source[1], len(response.headers.get_all("Contact")))  # fmt: skip
        return response

    # --- outbound calls --------------------------------------------------------------------------
    def route(self, to: str, now: float) -> Route | None:
        """Where a call to ``to`` goes if it is for a local user: a bare account name
        (``alice``), or a ``sip:`` URI whose user is an account and whose host is the
        registrar's domain or the host the user registered under. None: not a local user
        (dialled as usual). NotRegistered: a local user without a live binding."""
        user, host = _user_and_host(to)
        if user is None:
            return None
        if self.location is None or self.digest is None or user not in self.digest:
            if host is None:  # a bare name can only mean one of our accounts
                raise NotRegistered(f"no account {user!r} on this gateway")
            return None
        bindings = self.location.bindings(user, now)
        if host is not None:
            domain = self.location.settings.domain.lower()
            ours = {b.aor.host.lower() for b in bindings}
            if domain:
                ours.add(domain)
            if host.lower() not in ours:
                return None
        if not bindings:
            raise NotRegistered(f"{user} is not registered")
        best = bindings[0]
        return Route(best.uri, best.aor, best.target(), best)


def _user_and_host(to: str) -> tuple[str | None, str | None]:
    """``alice`` -> (alice, None); ``sip:alice@host`` -> (alice, host); else (None, None)
    (an E.164 number goes to the trunk, ``gateway.legs.sip.ua.dial_uri``)."""
    if to.startswith("+"):
        return None, None
    if ":" not in to and "@" not in to:
        name = to.strip()
        return (name or None), None
    try:
        uri = parse_uri(to)
    except SipParseError:
        return None, None
    if not isinstance(uri, SipUri) or not uri.user:
        return None, None
    return uri.user, uri.host
