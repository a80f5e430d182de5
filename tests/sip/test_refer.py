"""REFER (RFC 3515): the sipfrag, Subscription-State and Event fields, the REFER we build, the
referrer's subscription driven with a fake clock, and the referee's NOTIFYs — both sides' cores
against each other, through bytes."""

from __future__ import annotations

import pytest

from gateway.sip.dialog import Dialog, make_dialog_response
from gateway.sip.errors import SipParseError
from gateway.sip.fields import NameAddr
from gateway.sip.helpers import make_response
from gateway.sip.message import Request, Response, parse
from gateway.sip.refer import (
    EventHeader,
    ReferOutcome,
    ReferProgress,
    ReferSubscription,
    Sipfrag,
    SubscriptionState,
    build_notify,
    build_refer,
    decline_refer,
    refer_target,
)
from gateway.sip.uri import parse_uri

from .util import request

GW_CONTACT = NameAddr(parse_uri("sip:voxgate@192.0.2.20:5060"))
CAROL = parse_uri("sip:carol@pbx.example.com")


# --- fields ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"SIP/2.0 200 OK\r\n", 200, "OK"),
        (b"SIP/2.0 100 Trying", 100, "Trying"),
        (b"SIP/2.0 180 Ringing\r\nContact: <sip:carol@192.0.2.30>\r\n\r\n", 180, "Ringing"),
        (b"\r\nSIP/2.0 603 Declined by user\r\n", 603, "Declined by user"),
        (b"sip/2.0 486 \r\n", 486, ""),
    ],
)
def test_sipfrag_status_line(body: bytes, status: int, reason: str) -> None:
    frag = Sipfrag.parse(body)
    assert (frag.status, frag.reason) == (status, reason)
    assert frag.final == (status >= 200)
    assert Sipfrag.parse(bytes(frag)) == frag


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "does not start with a SIP/2.0 status line"),
        (b"INVITE sip:carol@example.com SIP/2.0\r\n", "does not start with a SIP/2.0"),
        (b"SIP/3.0 200 OK\r\n", "does not start with a SIP/2.0"),
        (b"SIP/2.0 20 OK\r\n", "bad status code"),
        (b"SIP/2.0 700 Nope\r\n", "bad status code"),
        (b"SIP/2.0 2x0 OK\r\n", "bad status code"),
    ],
)
def test_sipfrag_refuses_what_is_not_a_status_line(body: bytes, message: str) -> None:
    with pytest.raises(SipParseError, match=message):
        Sipfrag.parse(body)


def test_subscription_state() -> None:
    assert SubscriptionState.parse("active;expires=60") == SubscriptionState("active", expires=60)
    assert SubscriptionState.parse("Terminated ; Reason = NoResource") == SubscriptionState(
        "terminated", reason="noresource"
    )
    assert SubscriptionState.parse("terminated;reason=rejected;retry-after=30") == (
        SubscriptionState("terminated", reason="rejected", retry_after=30)
    )
    assert SubscriptionState.parse("pending").state == "pending"
    assert str(SubscriptionState("terminated", reason="noresource")) == (
        "terminated;reason=noresource"
    )
    for bad in ("", "active;expires=soon", "act ive"):
        with pytest.raises(SipParseError):
            SubscriptionState.parse(bad)


def test_event_header() -> None:
    assert EventHeader.parse("refer;id=93809824") == EventHeader("refer", "93809824")
    assert EventHeader.parse("Refer") == EventHeader("refer")
    assert str(EventHeader("refer", "7")) == "refer;id=7"
    with pytest.raises(SipParseError):
        EventHeader.parse("")


# --- two dialogs: the gateway (UAS of the call) and the far end (its UAC) -------------------------
def dialogs() -> tuple[Dialog, Dialog]:
    invite = request("INVITE")
    ok = make_dialog_response(invite, 200, to_tag="gwtag", contact=GW_CONTACT)
    answer = parse(bytes(ok))
    assert isinstance(answer, Response)
    return Dialog.from_uas_request(invite, "gwtag", GW_CONTACT), Dialog.from_uac_response(
        invite, answer
    )


def wire(message: Request) -> Request:
    parsed = parse(bytes(message))
    assert isinstance(parsed, Request)
    return parsed


def answer(req: Request, status: int) -> Response:
    parsed = parse(bytes(make_response(req, status)))
    assert isinstance(parsed, Response)
    return parsed


def drain(sub: ReferSubscription) -> list[ReferProgress | ReferOutcome]:
    out: list[ReferProgress | ReferOutcome] = []
    while (event := sub.next_event()) is not None:
        out.append(event)
    return out


def test_refer_is_an_in_dialog_request_with_refer_to_and_referred_by() -> None:
    gw, far = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="192.0.2.20:5060"))
    assert refer.method == "REFER" and refer.cseq.method == "REFER"
    assert str(refer.uri) == "sip:alice@192.0.2.10:5060"  # the far end's Contact
    assert (refer.from_addr.tag, refer.to_addr.tag) == ("gwtag", "fromtag1")
    assert refer.headers.get("Refer-To") == "<sip:carol@pbx.example.com>"
    # RFC 3892: who refers; our side of the dialog, without its tag.
    assert refer.headers.get("Referred-By") == "<sip:bob@example.com>"
    # REFER refreshes the target (RFC 3515 §2.4.1 via §12.2): it carries our Contact.
    assert refer.contacts == [GW_CONTACT]
    # The far end takes it as a request of this dialog, with one Refer-To.
    assert far.receive_request(refer) is None
    assert refer_target(refer).uri == CAROL
    later = build_refer(gw, CAROL, sent_by="192.0.2.20:5060")
    assert later.cseq.seq == refer.cseq.seq + 1


def test_blind_transfer_completes_on_a_2xx_sipfrag() -> None:
    gw, far = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="192.0.2.20:5060"))
    sub = ReferSubscription(refer, now=100.0, timeout=30.0)
    assert sub.get_timer() == 130.0
    sub.receive_response(answer(refer, 100), 100.01)
    sub.receive_response(answer(refer, 202), 100.02)
    assert drain(sub) == [ReferProgress(202, "Accepted", accepted=True)]

    def notify(status: int, reason: str) -> Request:
        n = wire(build_notify(far, refer.cseq.seq, Sipfrag(status, reason), sent_by="far:5060"))
        assert gw.receive_request(n) is None  # an in-order request of the dialog
        assert sub.matches(n)
        return n

    trying = notify(100, "Trying")
    assert trying.headers.get("Subscription-State") == "active;expires=60"
    assert trying.headers.get("Event") == f"refer;id={refer.cseq.seq}"
    assert sub.receive_notify(trying, 100.05).status == 200
    assert sub.get_timer() == 130.0  # the deadline, sooner than the 60 s the notifier offers
    ringing = notify(180, "Ringing")
    assert sub.receive_notify(ringing, 101.0).status == 200
    done = notify(200, "OK")
    assert done.headers.get("Subscription-State") == "terminated;reason=noresource"
    assert sub.receive_notify(done, 103.0).status == 200
    assert drain(sub) == [
        ReferProgress(100, "Trying"),
        ReferProgress(180, "Ringing"),
        ReferOutcome("completed", 200, "OK"),
    ]
    assert sub.outcome == ReferOutcome("completed", 200, "OK")
    assert sub.ended and sub.get_timer() is None
    # The subscription is over: a stray NOTIFY for it gets 481 (RFC 6665 §4.1.3).
    assert sub.receive_notify(notify(200, "OK"), 104.0).status == 481


def test_a_notify_overtaking_the_202_counts_as_acceptance() -> None:
    gw, far = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    final = wire(build_notify(far, refer.cseq.seq, Sipfrag(200, "OK"), sent_by="far"))
    assert sub.receive_notify(final, 0.1).status == 200
    sub.receive_response(answer(refer, 202), 0.2)  # late: changes nothing
    assert drain(sub) == [ReferOutcome("completed", 200, "OK")]


@pytest.mark.parametrize(
    ("status", "reason"),
    [(603, "Decline"), (405, "Method Not Allowed"), (501, "Not Implemented"), (403, "Forbidden")],
)
def test_refer_answered_4xx_to_6xx_is_refused(status: int, reason: str) -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    sub.receive_response(answer(refer, status), 0.1)
    assert drain(sub) == [ReferOutcome("refused", status, reason)]
    assert sub.ended and sub.get_timer() is None


def test_a_failing_referred_call_fails_the_transfer() -> None:
    gw, far = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    sub.receive_response(answer(refer, 202), 0.1)
    busy = wire(build_notify(far, refer.cseq.seq, Sipfrag(486, "Busy Here"), sent_by="far"))
    assert sub.receive_notify(busy, 2.0).status == 200
    assert sub.outcome == ReferOutcome("failed", 486, "Busy Here")


def test_no_final_notify_in_time_fails_and_drops_the_subscription() -> None:
    gw, far = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=10.0, timeout=5.0)
    sub.receive_response(answer(refer, 202), 10.1)
    trying = wire(build_notify(far, refer.cseq.seq, Sipfrag(100, "Trying"), sent_by="far"))
    sub.receive_notify(trying, 10.2)
    sub.handle_timer(14.9)  # early: nothing
    assert sub.outcome is None and sub.get_timer() == 15.0
    sub.handle_timer(15.0)
    assert sub.outcome == ReferOutcome("failed", None, "no final NOTIFY within 5 s of the REFER")
    assert sub.ended and sub.get_timer() is None
    late = wire(build_notify(far, refer.cseq.seq, Sipfrag(200, "OK"), sent_by="far"))
    assert sub.receive_notify(late, 16.0).status == 481
    assert sub.outcome is not None and sub.outcome.result == "failed"


def test_the_notifiers_expiry_ends_the_subscription_first() -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0, timeout=30.0)
    n = notify_request(refer, "SIP/2.0 100 Trying\r\n", "active;expires=3")
    assert sub.receive_notify(n, 1.0).status == 200
    assert sub.get_timer() == 4.0
    sub.handle_timer(4.0)
    assert sub.outcome == ReferOutcome(
        "failed", None, "the subscription expired without a final status"
    )


def test_terminated_without_a_final_status_fails() -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    n = notify_request(refer, "SIP/2.0 100 Trying\r\n", "terminated;reason=timeout")
    assert sub.receive_notify(n, 1.0).status == 200
    assert sub.outcome == ReferOutcome(
        "failed", None, "the subscription ended (timeout) without a final status"
    )


def test_notifies_that_are_not_ours_or_are_broken() -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    ours = notify_request(refer, "SIP/2.0 100 Trying\r\n", "active", event="refer")
    assert sub.matches(ours)  # no id: allowed for a dialog's first REFER (§2.4.6)
    assert not sub.matches(notify_request(refer, "", "active", event="refer;id=1"))
    assert not sub.matches(notify_request(refer, "", "active", event="presence"))
    assert not sub.matches(notify_request(refer, "", "active", event=None))
    # A body that is no sipfrag is still answered 200, and tells nothing.
    junk = notify_request(refer, "hello", "active")
    assert sub.receive_notify(junk, 0.5).status == 200
    assert drain(sub) == [] and sub.accepted
    assert sub.receive_notify(notify_request(refer, "", "active;expires=x"), 0.6).status == 400


def test_the_call_ending_closes_the_subscription() -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    sub.receive_response(answer(refer, 202), 0.1)
    sub.close("the call ended")
    assert drain(sub)[-1] == ReferOutcome("failed", None, "the call ended")
    assert sub.get_timer() is None
    done = ReferSubscription(refer, now=0.0)
    done.receive_response(answer(refer, 603), 0.1)
    done.close("the call ended")  # the outcome stands
    assert done.outcome == ReferOutcome("refused", 603, "Decline")


def test_a_refer_nobody_answers() -> None:
    gw, _ = dialogs()
    refer = wire(build_refer(gw, CAROL, sent_by="gw"))
    sub = ReferSubscription(refer, now=0.0)
    sub.transaction_failed(timeout=True)
    assert drain(sub) == [ReferOutcome("failed", 408, "no answer to the REFER")]
    other = ReferSubscription(refer, now=0.0)
    other.transaction_failed(timeout=False)
    assert other.outcome == ReferOutcome("failed", 503, "the REFER could not be sent")


def notify_request(
    refer: Request, body: str, state: str, *, event: str | None = "refer"
) -> Request:
    extra: list[tuple[str, str]] = [("Subscription-State", state)]
    if event is not None:
        extra.append(("Event", event))
    extra.append(("Content-Type", "message/sipfrag;version=2.0"))
    return request(
        "NOTIFY", to_tag="gwtag", call_id=refer.call_id, cseq=2, extra=tuple(extra),
        body=body.encode(),
    )  # fmt: skip


# --- the referee --------------------------------------------------------------------------------
def test_refer_target_needs_exactly_one_refer_to() -> None:
    none = request("REFER", to_tag="gwtag")
    with pytest.raises(SipParseError, match="exactly one Refer-To, found 0") as exc:
        refer_target(none)
    assert exc.value.status == 400
    two = request("REFER", to_tag="gwtag", extra=(("Refer-To", "<sip:a@x>"), ("r", "<sip:b@x>")))
    with pytest.raises(SipParseError, match="found 2"):
        refer_target(two)
    one = request("REFER", to_tag="gwtag", extra=(("Refer-To", "sip:carol@pbx.example.com"),))
    assert refer_target(one).uri == CAROL


def test_decline_refer_is_603_with_a_warning() -> None:
    refer = request("REFER", to_tag="gwtag", extra=(("Refer-To", "<sip:carol@x>"),))
    resp = parse(bytes(decline_refer(refer, "transfer by REFER is not accepted here")))
    assert isinstance(resp, Response)
    assert (resp.status, resp.reason) == (603, "Decline")
    assert resp.headers.get("Warning") == '399 voxgate "transfer by REFER is not accepted here"'
    assert resp.to_addr.tag == "gwtag" and resp.cseq.method == "REFER"


def test_notifies_of_an_accepted_refer_drive_the_referrers_core() -> None:
    """The referee's NOTIFYs (ours when gateway.accept_refer) read by the referrer's core."""
    gw, far = dialogs()
    refer = wire(build_refer(far, CAROL, sent_by="far"))  # this time the far end refers us
    assert gw.receive_request(refer) is None
    referrer = ReferSubscription(refer, now=0.0)
    for status, reason in ((100, "Trying"), (486, "Busy Here")):
        n = wire(build_notify(gw, refer.cseq.seq, Sipfrag(status, reason), sent_by="gw"))
        assert far.receive_request(n) is None
        assert n.content_type == "message/sipfrag"
        assert referrer.matches(n) and referrer.receive_notify(n, 1.0).status == 200
    assert drain(referrer) == [
        ReferProgress(100, "Trying"),
        ReferOutcome("failed", 486, "Busy Here"),
    ]
    assert referrer.ended
