"""§12 dialogs: ids, route sets, CSeq rules, in-dialog requests, 481."""

from __future__ import annotations

from gateway.sip.dialog import (
    Dialog,
    DialogId,
    DialogState,
    make_dialog_response,
    no_dialog_response,
    uac_dialog_id,
    uas_dialog_id,
)
from gateway.sip.fields import NameAddr
from gateway.sip.helpers import generate_branch, generate_call_id, generate_tag, make_response
from gateway.sip.message import Response, parse
from gateway.sip.uri import SipUri, parse_uri

from .util import request

RR = (("Record-Route", "<sip:p1.example.com;lr>"), ("Record-Route", "<sip:p2.example.com;lr>"))


def uac_pair() -> tuple[Dialog, object]:
    inv = request("INVITE", extra=RR)
    ok = make_dialog_response(
        inv, 200, to_tag="bobtag", contact=NameAddr(parse_uri("sip:bob@192.0.2.20:5062"))
    )
    parsed = parse(bytes(ok))
    assert isinstance(parsed, Response)
    return Dialog.from_uac_response(inv, parsed), inv


def test_ids_and_generators() -> None:
    assert generate_branch().startswith("z9hG4bK") and generate_branch() != generate_branch()
    assert len(generate_tag()) >= 8 and generate_tag() != generate_tag()
    assert generate_call_id("h").endswith("@h")
    req = request("BYE", to_tag="bobtag")
    assert uas_dialog_id(req) == DialogId(req.call_id, "bobtag", "fromtag1")
    assert uas_dialog_id(request("INVITE")) is None
    resp = make_response(req, 200)
    assert uac_dialog_id(resp) == DialogId(req.call_id, "fromtag1", "bobtag")


def test_uac_dialog_from_2xx() -> None:
    dialog, _ = uac_pair()
    assert dialog.id == DialogId("call-1@192.0.2.10", "fromtag1", "bobtag")
    assert dialog.state is DialogState.CONFIRMED
    assert str(dialog.remote_target) == "sip:bob@192.0.2.20:5062"
    # §12.1.2: the Record-Route of the response, reversed.
    assert [str(r.uri) for r in dialog.route_set] == [
        "sip:p2.example.com;lr",
        "sip:p1.example.com;lr",
    ]
    assert dialog.local_seq == 1 and dialog.remote_seq is None


def test_uas_dialog_and_response() -> None:
    inv = request("INVITE", extra=RR)
    contact = NameAddr(parse_uri("sip:gw@192.0.2.20"))
    ok = make_dialog_response(inv, 200, to_tag="b1", contact=contact)
    assert ok.headers.get_all("Record-Route") == [v for _, v in RR]
    assert ok.to_addr.tag == "b1" and ok.contacts == [contact]
    dialog = Dialog.from_uas_request(inv, "b1", contact)
    assert dialog.id == DialogId(inv.call_id, "b1", "fromtag1")
    assert [str(r.uri) for r in dialog.route_set] == [
        "sip:p1.example.com;lr",
        "sip:p2.example.com;lr",
    ]
    assert dialog.remote_seq == 1 and dialog.local_seq is None
    bye = dialog.create_request("BYE", sent_by="192.0.2.20:5060")
    assert 0 < bye.cseq.seq < 2**31 + 1
    assert bye.from_addr.tag == "b1" and bye.to_addr.tag == "fromtag1"
    assert str(bye.uri) == "sip:alice@192.0.2.10:5060"


def test_in_dialog_request_loose_routing() -> None:
    dialog, _ = uac_pair()
    bye = dialog.create_request("BYE", sent_by="192.0.2.10:5060")
    assert bye.method == "BYE" and bye.cseq.seq == 2
    assert str(bye.uri) == "sip:bob@192.0.2.20:5062"
    assert [str(r.uri) for r in bye.routes] == ["sip:p2.example.com;lr", "sip:p1.example.com;lr"]
    assert (bye.from_addr.tag, bye.to_addr.tag, bye.call_id) == (
        "fromtag1",
        "bobtag",
        dialog.call_id,
    )
    assert bye.headers.get("Contact") is None
    reinvite = dialog.create_request("INVITE", sent_by="192.0.2.10:5060")
    assert reinvite.cseq.seq == 3 and reinvite.headers.get("Contact") is not None
    assert str(dialog.next_hop()) == "sip:p2.example.com;lr"
    assert parse(bytes(reinvite)) == reinvite


def test_in_dialog_request_strict_routing() -> None:
    dialog, _ = uac_pair()
    dialog.route_set = [
        NameAddr(parse_uri("sip:strict.example.com;maddr=10.0.0.1")),
        *dialog.route_set,
    ]
    req = dialog.create_request("INFO", sent_by="h")
    assert str(req.uri) == "sip:strict.example.com"  # maddr stripped (§19.1.1)
    routes = [str(r.uri) for r in req.routes]
    assert routes[-1] == "sip:bob@192.0.2.20:5062" and len(routes) == 3


def test_ack_for_2xx_reuses_invite_cseq() -> None:
    dialog, inv = uac_pair()
    inv.headers.add("Proxy-Authorization", 'Digest username="a"')  # type: ignore[attr-defined]
    ack = dialog.create_ack(inv, sent_by="192.0.2.10:5060")  # type: ignore[arg-type]
    assert ack.method == "ACK" and ack.cseq.seq == 1 and ack.cseq.method == "ACK"
    assert ack.top_via.branch != inv.top_via.branch  # type: ignore[attr-defined]
    assert ack.headers.get("Proxy-Authorization") == 'Digest username="a"'
    assert dialog.local_seq == 1  # unchanged


def test_remote_cseq_rules_and_target_refresh() -> None:
    dialog, _ = uac_pair()
    first = request("INFO", cseq=10, to_tag="fromtag1", from_tag="bobtag")
    assert dialog.receive_request(first) is None and dialog.remote_seq == 10
    older = request("INFO", cseq=9, to_tag="fromtag1", from_tag="bobtag")
    error = dialog.receive_request(older)
    assert error is not None and (error.status, error.reason) == (500, "Server Internal Error")
    refresh = request(
        "INVITE",
        cseq=11,
        to_tag="fromtag1",
        from_tag="bobtag",
    )
    refresh.headers.set("Contact", "<sip:bob@198.51.100.7>")
    assert dialog.receive_request(refresh) is None
    assert str(dialog.remote_target) == "sip:bob@198.51.100.7"
    ack = request("ACK", cseq=11, to_tag="fromtag1", from_tag="bobtag")
    assert dialog.receive_request(ack) is None and dialog.remote_seq == 11


def test_early_dialog_confirmed_and_terminated() -> None:
    inv = request("INVITE")
    ringing = make_dialog_response(inv, 180, to_tag="t", contact=NameAddr(parse_uri("sip:b@early")))
    dialog = Dialog.from_uac_response(inv, ringing)
    assert dialog.state is DialogState.EARLY and dialog.route_set == []
    ok = make_dialog_response(
        request("INVITE", extra=(("Record-Route", "<sip:p;lr>"),)),
        200, to_tag="t", contact=NameAddr(parse_uri("sip:b@final")),
    )  # fmt: skip
    dialog.receive_response(inv, ok)
    assert dialog.state.value == "confirmed"
    assert [str(r.uri) for r in dialog.route_set] == ["sip:p;lr"]
    assert isinstance(dialog.remote_target, SipUri) and dialog.remote_target.host == "final"
    bye = dialog.create_request("BYE", sent_by="h")
    dialog.receive_response(bye, make_response(bye, 481))
    assert dialog.state.value == "terminated"


def test_481_for_unknown_dialog() -> None:
    resp = no_dialog_response(request("BYE", to_tag="gone"))
    assert (resp.status, resp.reason) == (481, "Call/Transaction Does Not Exist")
    assert resp.to_addr.tag == "gone"
