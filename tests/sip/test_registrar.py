"""The registrar's location service (gateway.sip.registrar, RFC 3261 §10.3) on a fake clock:
lifetimes, 423, removal with Expires 0 and ``*``, Call-ID/CSeq ordering, the bounds, and where
a call to a binding goes (NAT: the REGISTER's source)."""

from __future__ import annotations

import pytest

from gateway.sip.message import Address, Request, Response
from gateway.sip.registrar import LocationService, RegistrarSettings
from tests.sip.util import request

PHONE: Address = ("203.0.113.5", 40000)  # the NAT's public side


def register(
    *contacts: str,
    expires: int | None = None,
    cseq: int = 1,
    call_id: str = "reg-1",
    aor: str = "sip:alice@voxgate.example",
    extra: tuple[tuple[str, str], ...] = (),
) -> Request:
    req = request("REGISTER", uri="sip:voxgate.example", cseq=cseq, call_id=call_id, extra=extra)
    req.headers.set("To", f"<{aor}>")
    req.headers.set("From", f"<{aor}>;tag=reg")
    items = [(n, v) for n, v in req.headers if n != "Contact"]
    items += [("Contact", c) for c in contacts]
    if expires is not None:
        items.append(("Expires", str(expires)))
    req.headers = type(req.headers)(items)
    return req


def contacts_of(resp: Response) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for c in resp.contacts:
        out[str(c.uri)] = c.param("expires")
    return out


def service(**kw: object) -> LocationService:
    return LocationService(RegistrarSettings(**kw))  # type: ignore[arg-type]


def test_register_lists_the_binding_with_its_lifetime() -> None:
    loc = service()
    resp = loc.register(register("<sip:alice@192.168.1.20:5060>"), PHONE, 100.0,
                        date="Sat, 13 Nov 2010 23:29:00 GMT")  # fmt: skip
    assert resp.status == 200 and resp.to_addr.tag
    assert contacts_of(resp) == {"sip:alice@192.168.1.20:5060": "3600"}  # the default
    assert resp.headers.get("Date") == "Sat, 13 Nov 2010 23:29:00 GMT"
    binding = loc.lookup("alice", 101.0)
    assert binding is not None and binding.source == PHONE and str(binding.aor) == (
        "sip:alice@voxgate.example")  # fmt: skip
    # A query (no Contact) lists what is there, time having passed.
    query = loc.register(register(cseq=2), PHONE, 1100.0)
    assert contacts_of(query) == {"sip:alice@192.168.1.20:5060": "2600"}


def test_lifetimes_param_header_default_and_cap() -> None:
    loc = service(max_expires_s=7200)
    resp = loc.register(register("<sip:a@10.0.0.1>;expires=120", "<sip:a@10.0.0.2>",
                                 "<sip:a@10.0.0.3>;expires=99999", expires=600),
                        PHONE, 0.0)  # fmt: skip
    assert contacts_of(resp) == {"sip:a@10.0.0.1": "120", "sip:a@10.0.0.2": "600",
                                 "sip:a@10.0.0.3": "7200"}  # fmt: skip
    # §20.19: a malformed expires parameter counts as the default.
    odd = loc.register(register("<sip:b@10.0.0.9>;expires=soon", cseq=2), PHONE, 0.0)
    assert contacts_of(odd)["sip:b@10.0.0.9"] == "3600"


def test_too_brief_is_423_with_min_expires_and_changes_nothing() -> None:
    loc = service(min_expires_s=60)
    assert loc.register(register("<sip:a@10.0.0.1>"), PHONE, 0.0).status == 200
    resp = loc.register(register("<sip:a@10.0.0.2>", expires=30, cseq=2), PHONE, 1.0)
    assert (resp.status, resp.headers.get("Min-Expires")) == (423, "60")
    assert [str(b.uri) for b in loc.bindings("alice", 2.0)] == ["sip:a@10.0.0.1"]


def test_expires_zero_and_star_remove() -> None:
    loc = service()
    loc.register(register("<sip:a@10.0.0.1>", "<sip:a@10.0.0.2>"), PHONE, 0.0)
    resp = loc.register(register("<sip:a@10.0.0.1>;expires=0", cseq=2), PHONE, 1.0)
    assert contacts_of(resp) == {"sip:a@10.0.0.2": "3599"}
    for bad in (register("*", cseq=3), register("*", "<sip:a@10.0.0.3>", expires=0, cseq=3)):
        assert loc.register(bad, PHONE, 2.0).status == 400
    gone = loc.register(register("*", expires=0, cseq=3), PHONE, 2.0)
    assert gone.status == 200 and gone.contacts == []
    assert loc.lookup("alice", 2.0) is None and loc.total == 0


def test_star_keeps_bindings_of_a_later_registration() -> None:
    """§10.3 step 6: ``*`` removes a binding unless the same Call-ID already holds a higher
    CSeq (a late, reordered un-REGISTER)."""
    loc = service()
    loc.register(register("<sip:a@10.0.0.1>", cseq=5), PHONE, 0.0)
    resp = loc.register(register("*", expires=0, cseq=4), PHONE, 1.0)
    assert resp.status == 200 and loc.lookup("alice", 1.0) is not None


def test_cseq_must_grow_within_a_call_id() -> None:
    loc = service()
    loc.register(register("<sip:a@10.0.0.1>", cseq=7), PHONE, 0.0)
    assert loc.register(register("<sip:a@10.0.0.1>", cseq=7), PHONE, 1.0).status == 400
    assert loc.register(register("<sip:a@10.0.0.1>", cseq=6), PHONE, 1.0).status == 400
    assert loc.register(register("<sip:a@10.0.0.1>", cseq=8), PHONE, 1.0).status == 200
    # A new Call-ID (the phone rebooted) replaces the binding whatever its CSeq.
    again = loc.register(register("<sip:a@10.0.0.1>", cseq=1, call_id="reg-2"), PHONE, 2.0)
    assert again.status == 200 and loc.total == 1
    assert loc.lookup("alice", 2.0).call_id == "reg-2"  # type: ignore[union-attr]


def test_bindings_expire() -> None:
    loc = service(sweep_s=10.0)
    loc.register(register("<sip:a@10.0.0.1>", expires=60), PHONE, 0.0)
    loc.register(register("<sip:b@10.0.0.2>", expires=600, aor="sip:bob@voxgate.example"),
                 PHONE, 0.0)  # fmt: skip
    assert loc.lookup("alice", 59.0) is not None
    assert loc.lookup("alice", 60.0) is None
    assert loc.total == 1  # alice's went when her AOR was touched
    loc.register(register("<sip:c@10.0.0.3>", aor="sip:carol@voxgate.example"), PHONE, 700.0)
    assert loc.total == 1  # the sweep dropped bob's, unasked


def test_bounds_per_aor_and_in_all() -> None:
    loc = service(max_per_aor=2, max_total=3)
    assert loc.register(register("<sip:a@10.0.0.1>", "<sip:a@10.0.0.2>"), PHONE, 0.0).status == 200
    three = loc.register(register("<sip:a@10.0.0.3>", cseq=2), PHONE, 0.0)
    assert three.status == 403 and loc.total == 2
    loc.register(register("<sip:b@10.0.0.4>", aor="sip:bob@voxgate.example"), PHONE, 0.0)
    full = loc.register(register("<sip:c@10.0.0.5>", aor="sip:carol@voxgate.example"), PHONE, 0.0)
    assert (full.status, full.headers.get("Retry-After")) == (503, "30")
    # Refreshing an existing binding is no growth: allowed at the limit.
    assert loc.register(register("<sip:a@10.0.0.1>", cseq=3), PHONE, 1.0).status == 200


@pytest.mark.parametrize(
    ("req", "status"),
    [
        (register("<sip:a@10.0.0.1>", extra=(("Require", "path"),)), 420),
        (register("<sip:a@10.0.0.1>", aor="sip:voxgate.example"), 404),
        (register("<sip:a@10.0.0.1>", aor="sip:alice@elsewhere.example"), 404),
        (register("<tel:+15551234>"), 400),
        (register("<sip:a@10.0.0.1>;q=2"), 400),
        (register("<sip:a@10.0.0.1>", aor="sip:bob@voxgate.example"), 403),
    ],
)
def test_refusals(req: Request, status: int) -> None:
    loc = service(domain="voxgate.example")
    resp = loc.register(req, PHONE, 0.0, user="alice")
    assert resp.status == status, resp
    if status == 420:
        assert resp.headers.get("Unsupported") == "path"
    assert loc.total == 0


def test_best_binding_by_q_then_recency() -> None:
    loc = service()
    loc.register(register("<sip:a@10.0.0.1>;q=0.5"), PHONE, 0.0)
    loc.register(register("<sip:a@10.0.0.2>", call_id="reg-2"), PHONE, 1.0)
    loc.register(register("<sip:a@10.0.0.3>", call_id="reg-3"), PHONE, 2.0)
    assert [str(b.uri) for b in loc.bindings("alice", 3.0)] == [
        "sip:a@10.0.0.3", "sip:a@10.0.0.2", "sip:a@10.0.0.1"]  # fmt: skip


@pytest.mark.parametrize(
    ("contact", "source", "target"),
    [
        ("<sip:a@192.168.1.20:5060>", PHONE, PHONE),  # NATed: the flow
        ("<sip:a@100.64.3.4:5060>", PHONE, PHONE),  # carrier-grade NAT
        ("<sip:a@[fd00::1]:5060>", ("2001:db8::5", 5062), ("2001:db8::5", 5062)),  # ULA
        ("<sip:a@203.0.113.5:5060>", PHONE, PHONE),  # its public address, NAT-mapped port
        ("<sip:a@127.0.0.1:5080>", ("127.0.0.1", 5080), ("127.0.0.1", 5080)),
        ("<sip:a@8.8.8.8:5070>", PHONE, ("8.8.8.8", 5070)),  # public elsewhere: as it is
        ("<sip:a@phone.example.com>", PHONE, ("phone.example.com", 5060)),
        ("<sips:a@8.8.4.4>", PHONE, ("8.8.4.4", 5061)),
    ],
)
def test_where_a_call_to_the_binding_goes(contact: str, source: Address, target: Address) -> None:
    loc = service()
    assert loc.register(register(contact), source, 0.0).status == 200
    binding = loc.lookup("alice", 1.0)
    assert binding is not None and binding.target() == target
