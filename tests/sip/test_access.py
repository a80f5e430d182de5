"""Who may call (gateway.sip.access) on a fake clock: trunk allow-lists (IPv4, IPv6, mapped),
the auth modes, ACK/CANCEL never challenged, the failed-auth lockout fed and enforced by the
transaction layer with 403, REGISTER authorisation, and routing calls to registered AORs."""

from __future__ import annotations

import pytest

from gateway.sip.access import Gatekeeper, Mode, NotRegistered, Trunk
from gateway.sip.auth import Account, DigestServer
from gateway.sip.digest import DigestAuthenticator
from gateway.sip.layer import TransactionLayer
from gateway.sip.limits import LimitSettings, Rate, SourceLimits
from gateway.sip.message import Request, Response, parse
from gateway.sip.registrar import LocationService
from tests.sip.util import drain, request, transmits

CARRIER = Trunk.parse("carrier", ["192.0.2.0/28", "2001:db8:5::/48"])
PHONE = ("198.51.100.7", 5060)
SBC = ("192.0.2.3", 5060)


def gate(mode: Mode = "invite", *, trunks: tuple[Trunk, ...] = (CARRIER,),
         limits: SourceLimits | None = None, registrar: bool = True) -> Gatekeeper:  # fmt: skip
    digest = DigestServer([Account.with_password("alice", "voxgate", "secret"),
                           Account.with_password("bob", "voxgate", "hunter2")])  # fmt: skip
    location = LocationService() if registrar else None
    return Gatekeeper(mode=mode, trunks=trunks, digest=digest, location=location, limits=limits)


def lockout_limits(failures: int = 3) -> SourceLimits:
    return SourceLimits(LimitSettings(
        rates=(("INVITE", Rate(0, 0)), ("REGISTER", Rate(0, 0)), ("OPTIONS", Rate(0, 0))),
        auth_failures=failures, auth_window_s=60.0, lockout_s=300.0,
    ))  # fmt: skip


def status(g: Gatekeeper, req: Request, source: tuple[str, int] = PHONE, now: float = 0.0) -> int:
    resp = g.admit(req, source, now).response
    return 0 if resp is None else resp.status


def credentials(g: Gatekeeper, req: Request, password: str = "secret", user: str = "alice",
                now: float = 0.0) -> Request:  # fmt: skip
    challenge = g.admit(req, PHONE, now).response
    assert challenge is not None and challenge.status == 401
    retry = DigestAuthenticator(user, password).authorize(req, challenge)
    assert retry is not None
    return retry


def test_trunk_allow_lists() -> None:
    g = gate()
    for ip in ("192.0.2.0", "192.0.2.15", "::ffff:192.0.2.3", "2001:db8:5:1::9"):
        assert g.trunk_for(ip) is CARRIER, ip
    for ip in ("192.0.2.16", "2001:db8:6::1", "::ffff:192.0.2.99", "not-an-ip", "fe80::1%eth0"):
        assert g.trunk_for(ip) is None, ip
    with pytest.raises(ValueError, match=r"192\.0\.2\.300"):
        Trunk.parse("bad", ["192.0.2.300"])


def test_invite_mode() -> None:
    g = gate("invite")
    assert status(g, request("INVITE"), SBC) == 0  # the carrier needs no credentials
    challenge = g.admit(request("INVITE"), PHONE, 0.0).response
    assert challenge is not None and challenge.status == 401
    assert len(challenge.headers.get_all("WWW-Authenticate")) == 2
    assert status(g, request("OPTIONS"), PHONE) == 0  # keep-alives and probes stay open
    retry = credentials(g, request("INVITE"))
    admitted = g.admit(retry, PHONE, 0.1)
    assert (admitted.response, admitted.user, admitted.identity) == (None, "alice", "user alice")


def test_all_mode_challenges_everything_but_ack_and_cancel() -> None:
    g = gate("all")
    for method in ("OPTIONS", "MESSAGE", "INFO", "INVITE"):
        assert status(g, request(method)) == 401, method
    assert status(g, request("OPTIONS"), SBC) == 0
    # §22.1: a CANCEL cannot be resubmitted with credentials; an ACK gets no response.
    assert status(g, request("CANCEL")) == 0 and status(g, request("ACK")) == 0


def test_off_mode_refuses_unknown_sources_only_with_trunks() -> None:
    g = gate("off", registrar=False)
    assert status(g, request("INVITE"), SBC) == 0
    assert status(g, request("INVITE"), PHONE) == 403
    assert status(g, request("OPTIONS"), PHONE) == 0
    open_ = Gatekeeper(mode="off")
    assert open_.open and status(open_, request("INVITE"), PHONE) == 0
    assert not g.open


def test_failures_lock_the_source_out_and_the_layer_refuses_it() -> None:
    limits = lockout_limits(failures=3)
    g = gate("invite", limits=limits)
    assert status(g, request("INVITE")) == 401  # no credentials: not a failure
    codes = [status(g, credentials(g, request("INVITE", cseq=i), password="guess"), now=i)
             for i in range(1, 4)]  # fmt: skip
    assert codes == [401, 401, 403]
    assert limits.locked_out(PHONE[0], 4.0) and g.counts["locked_out"] == 1
    # The transaction layer now refuses the source before anything is parsed: 403 (no
    # Retry-After), and no transaction or event.
    layer = TransactionLayer(limits=limits)
    layer.receive(bytes(request("INVITE", branch="z9hG4bKlocked")), PHONE, 5.0)
    events = drain(layer)
    (reply,) = [parse(t.data) for t in transmits(events)]
    assert isinstance(reply, Response) and reply.status == 403
    assert reply.headers.get("Retry-After") is None
    assert layer.transaction_count == 0 and len(events) == 1
    # Others are not affected; the lockout ends.
    assert not limits.locked_out(SBC[0], 5.0)
    assert limits.locked_out(PHONE[0], 302.9) and not limits.locked_out(PHONE[0], 303.0)


def test_a_success_clears_earlier_failures() -> None:
    limits = lockout_limits(failures=2)
    g = gate("invite", limits=limits)
    assert status(g, credentials(g, request("INVITE"), password="guess")) == 401
    assert status(g, credentials(g, request("INVITE", cseq=2)), now=1.0) == 0
    assert status(g, credentials(g, request("INVITE", cseq=3), password="guess"), now=2.0) == 401
    assert not limits.locked_out(PHONE[0], 3.0)


def test_stale_and_malformed_are_counted_apart() -> None:
    limits = lockout_limits(failures=2)
    g = gate("invite", limits=limits)
    stale = credentials(g, request("INVITE"), now=0.0)
    assert status(g, stale, now=1000.0) == 401  # expired nonce, right password: no failure
    broken = request("INVITE", extra=(("Authorization", 'Digest username="x'),))
    assert status(g, broken, now=1001.0) == 400
    assert g.counts["stale"] == 1 and g.counts["malformed"] == 1
    assert not limits.locked_out(PHONE[0], 1002.0)
    assert status(g, broken, now=1003.0) == 403  # two garbage headers: locked out


def register(user: str, *, to_user: str | None = None, cseq: int = 1) -> Request:
    req = request("REGISTER", uri="sip:voxgate.example", cseq=cseq, call_id=f"reg-{user}")
    aor = f"sip:{to_user or user}@voxgate.example"
    req.headers.set("To", f"<{aor}>")
    req.headers.set("From", f"<{aor}>;tag=r1")
    req.headers.set("Contact", f"<sip:{user}@192.168.1.20:5062>")
    return req


def signed_register(g: Gatekeeper, user: str, password: str, *, to_user: str | None = None,
                    now: float = 0.0) -> Request:  # fmt: skip
    req = register(user, to_user=to_user)
    challenge = g.register(req, PHONE, now)
    assert challenge.status == 401
    retry = DigestAuthenticator(user, password).authorize(req, challenge)
    assert retry is not None
    return retry


def test_register_is_authenticated_even_from_a_trunk_and_when_auth_is_off() -> None:
    for mode in ("off", "invite"):
        g = gate(mode)  # type: ignore[arg-type]
        assert g.register(register("alice"), SBC, 0.0).status == 401
        ok = g.register(signed_register(g, "alice", "secret"), PHONE, 0.1)
        assert ok.status == 200 and ok.contacts


def test_an_account_registers_only_its_own_aor() -> None:
    g = gate()
    resp = g.register(signed_register(g, "bob", "hunter2", to_user="alice"), PHONE, 0.1)
    assert resp.status == 403
    assert g.location is not None and g.location.total == 0


def test_routes_to_registered_aors() -> None:
    g = gate()
    with pytest.raises(NotRegistered, match="alice is not registered"):
        g.route("alice", 0.0)
    with pytest.raises(NotRegistered, match="no account 'zed'"):
        g.route("zed", 0.0)
    assert g.register(signed_register(g, "alice", "secret"), PHONE, 0.0).status == 200
    for to in ("alice", "sip:alice@voxgate.example", "sip:alice@VOXGATE.example:5060"):
        route = g.route(to, 1.0)
        assert route is not None, to
        assert str(route.request_uri) == "sip:alice@192.168.1.20:5062"
        assert str(route.to) == "sip:alice@voxgate.example"
        assert route.addr == PHONE  # the private contact is reached through its NAT
    for to in (
        "sip:alice@elsewhere.example",
        "+14155550100",
        "sip:carol@voxgate.example",
        "sip:voxgate.example",
    ):
        assert g.route(to, 1.0) is None, to  # not a local user: dialled as before
    with pytest.raises(NotRegistered):
        g.route("alice", 3601.0)  # the binding expired
    # Without accounts nothing is local, but a bare name still cannot be dialled.
    with pytest.raises(NotRegistered):
        Gatekeeper().route("alice", 0.0)
    assert Gatekeeper().route("sip:alice@voxgate.example", 0.0) is None


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match="needs accounts"):
        Gatekeeper(mode="invite")
    with pytest.raises(ValueError, match="registrar"):
        Gatekeeper(location=LocationService())
