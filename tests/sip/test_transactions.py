"""The four §17 state machines driven with a fake clock, and the layer's matching rules."""

from __future__ import annotations

import pytest

from gateway.sip.events import (
    CancelReceived,
    MalformedMessage,
    RequestReceived,
    ResponseReceived,
    SipEvent,
    TransactionTerminated,
    TransactionTimeout,
    Transmit,
    TransportError,
)
from gateway.sip.helpers import make_cancel, make_response
from gateway.sip.layer import TransactionLayer
from gateway.sip.message import Request, Response, parse
from gateway.sip.transaction import SipStateError, State, TimerConfig

from .util import ALICE, BOB, drain, request, sent_messages, transmits


def run(layer: TransactionLayer, until: float) -> list[tuple[float, SipEvent]]:
    """Fire every timer up to ``until`` at its exact deadline; return (time, event) pairs."""
    out: list[tuple[float, SipEvent]] = []
    while (t := layer.get_timer()) is not None and t <= until:
        layer.handle_timer(t)
        out.extend((t, e) for e in drain(layer))
    return out


def times(events: list[tuple[float, SipEvent]], kind: type) -> list[float]:
    return [round(t, 6) for t, e in events if isinstance(e, kind)]


def response_to(req: Request, status: int, to_tag: str | None = "bobtag") -> bytes:
    return bytes(make_response(req, status, to_tag=to_tag))


# --- INVITE client transaction (§17.1.1) -------------------------------------------------


def test_ict_udp_retransmits_doubling_then_timer_b() -> None:
    layer = TransactionLayer()
    tid = layer.send_request(request("INVITE"), BOB, 0.0)
    assert len(transmits(drain(layer))) == 1
    events = run(layer, 100.0)
    # Timer A: T1, 2T1, 4T1... (not capped by T2 for INVITE), until Timer B = 64*T1.
    assert times(events, Transmit) == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    assert [e for _, e in events if isinstance(e, TransactionTimeout)] == [
        TransactionTimeout(tid, "B")
    ]
    assert times(events, TransactionTerminated) == [32.0]
    assert layer.get_timer() is None


def test_ict_tcp_does_not_retransmit() -> None:
    layer = TransactionLayer()
    layer.send_request(request("INVITE", transport="TCP"), BOB, 0.0, reliable=True)
    drain(layer)
    events = run(layer, 100.0)
    assert times(events, Transmit) == []
    assert times(events, TransactionTimeout) == [32.0]


def test_ict_provisional_stops_retransmission_then_non2xx_acked() -> None:
    layer = TransactionLayer()
    inv = request("INVITE")
    tid = layer.send_request(inv, BOB, 0.0)
    drain(layer)
    layer.receive(response_to(inv, 180), BOB, 0.2)
    (ringing,) = drain(layer)
    assert isinstance(ringing, ResponseReceived) and ringing.response.status == 180
    assert layer.transaction_state(tid) is State.PROCEEDING
    assert times(run(layer, 10.0), Transmit) == []  # no Timer A, no Timer B in Proceeding
    layer.receive(response_to(inv, 486), BOB, 10.0)
    events = drain(layer)
    (ack,) = sent_messages(events)
    assert isinstance(ack, Request) and ack.method == "ACK"
    assert ack.top_via.branch == inv.top_via.branch  # §17.1.1.3: same transaction
    assert ack.to_addr.tag == "bobtag" and ack.cseq.seq == 1 and ack.uri == inv.uri
    assert [e.response.status for e in events if isinstance(e, ResponseReceived)] == [486]
    assert layer.transaction_state(tid) is State.COMPLETED
    # A retransmitted 486 is ACKed again but not passed up.
    layer.receive(response_to(inv, 486), BOB, 11.0)
    again = drain(layer)
    assert len(transmits(again)) == 1 and not any(isinstance(e, ResponseReceived) for e in again)
    # Timer D (32 s on UDP) then Terminated.
    assert times(run(layer, 100.0), TransactionTerminated) == [42.0]


def test_ict_tcp_non2xx_terminates_at_once() -> None:
    layer = TransactionLayer()
    inv = request("INVITE", transport="TCP")
    tid = layer.send_request(inv, BOB, 0.0, reliable=True)
    drain(layer)
    layer.receive(response_to(inv, 603), BOB, 1.0)
    events = drain(layer)
    assert isinstance(events[-1], TransactionTerminated)
    assert layer.transaction_state(tid) is None


def test_ict_2xx_accepted_passes_retransmissions_until_timer_m() -> None:
    layer = TransactionLayer()
    inv = request("INVITE")
    tid = layer.send_request(inv, BOB, 0.0)
    drain(layer)
    layer.receive(response_to(inv, 200), BOB, 1.0)
    events = drain(layer)
    assert [type(e) for e in events] == [ResponseReceived]  # no ACK from the transaction
    assert layer.transaction_state(tid) is State.ACCEPTED
    layer.receive(response_to(inv, 200), BOB, 2.0)  # RFC 6026: delivered again
    assert [type(e) for e in drain(layer)] == [ResponseReceived]
    assert times(run(layer, 100.0), TransactionTerminated) == [33.0]  # Timer M = 64*T1
    layer.receive(response_to(inv, 200), BOB, 40.0)  # stray 2xx: to the TU, no transaction
    (stray,) = drain(layer)
    assert isinstance(stray, ResponseReceived) and stray.transaction_id is None


# --- non-INVITE client transaction (§17.1.2) ---------------------------------------------


def test_nict_udp_retransmits_capped_at_t2_then_timer_f() -> None:
    layer = TransactionLayer()
    tid = layer.send_request(request("OPTIONS"), BOB, 0.0)
    drain(layer)
    events = run(layer, 100.0)
    assert times(events, Transmit) == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert [e for _, e in events if isinstance(e, TransactionTimeout)] == [
        TransactionTimeout(tid, "F")
    ]


def test_nict_proceeding_retransmits_every_t2() -> None:
    layer = TransactionLayer()
    req = request("BYE", to_tag="bobtag")
    layer.send_request(req, BOB, 0.0)
    drain(layer)
    layer.receive(response_to(req, 100), BOB, 0.1)
    drain(layer)
    events = run(layer, 12.0)
    # E was already armed for 0.5 s; after that it is T2 in Proceeding.
    assert times(events, Transmit) == [0.5, 4.5, 8.5]


def test_nict_final_then_timer_k_absorbs_retransmissions() -> None:
    layer = TransactionLayer(TimerConfig(t1=0.1, t2=1.0, t4=2.0))
    req = request("OPTIONS")
    tid = layer.send_request(req, BOB, 0.0)
    drain(layer)
    layer.receive(response_to(req, 200), BOB, 0.05)
    assert [type(e) for e in drain(layer)] == [ResponseReceived]
    layer.receive(response_to(req, 200), BOB, 0.5)
    assert drain(layer) == []
    assert layer.transaction_state(tid) is State.COMPLETED
    assert times(run(layer, 10.0), TransactionTerminated) == [2.05]  # Timer K = T4


def test_nict_tcp_final_terminates_at_once() -> None:
    layer = TransactionLayer()
    req = request("OPTIONS", transport="TCP")
    tid = layer.send_request(req, BOB, 0.0, reliable=True)
    drain(layer)
    layer.receive(response_to(req, 404), BOB, 0.1)
    assert [type(e) for e in drain(layer)] == [ResponseReceived, TransactionTerminated]
    assert layer.transaction_state(tid) is None


def test_send_request_adds_branch_and_refuses_ack() -> None:
    layer = TransactionLayer()
    req = request("OPTIONS")
    req.headers.set("Via", "SIP/2.0/UDP 192.0.2.10:5060")
    tid = layer.send_request(req, BOB, 0.0)
    assert tid.startswith("z9hG4bK") and tid.endswith("/OPTIONS")
    with pytest.raises(ValueError, match="ACK"):
        layer.send_request(request("ACK"), BOB, 0.0)


# --- INVITE server transaction (§17.2.1) --------------------------------------------------


def receive_invite(layer: TransactionLayer, transport: str = "UDP") -> tuple[str, Request]:
    inv = request("INVITE", transport=transport)
    layer.receive(bytes(inv), ALICE, 0.0, reliable=transport != "UDP")
    events = drain(layer)
    received = [e for e in events if isinstance(e, RequestReceived)]
    assert len(received) == 1 and received[0].transaction_id is not None
    (trying,) = sent_messages(events)
    assert isinstance(trying, Response) and trying.status == 100  # §17.2.1 at once
    return received[0].transaction_id, received[0].request


def test_ist_retransmitted_invite_gets_last_provisional() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    layer.send_response(tid, make_response(inv, 180, to_tag="b1"), 0.1)
    drain(layer)
    layer.receive(bytes(request("INVITE")), ALICE, 0.6)
    events = drain(layer)
    (again,) = sent_messages(events)
    assert isinstance(again, Response) and again.status == 180
    assert not any(isinstance(e, RequestReceived) for e in events)


def test_ist_non2xx_retransmitted_by_timer_g_until_timer_h() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    layer.send_response(tid, make_response(inv, 486, to_tag="b1"), 1.0)
    drain(layer)
    events = run(layer, 100.0)
    assert times(events, Transmit) == [1.5, 2.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5, 32.5]
    assert [e for _, e in events if isinstance(e, TransactionTimeout)] == [
        TransactionTimeout(tid, "H")
    ]


def test_ist_ack_confirms_and_timer_i_terminates() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    final = make_response(inv, 486, to_tag="b1")
    layer.send_response(tid, final, 1.0)
    drain(layer)
    ack = request("ACK", to_tag="b1")
    layer.receive(bytes(ack), ALICE, 1.2)
    assert drain(layer) == []  # absorbed: the non-2xx ACK is not for the TU
    assert layer.transaction_state(tid) is State.CONFIRMED
    layer.receive(bytes(ack), ALICE, 1.3)
    layer.receive(bytes(request("INVITE")), ALICE, 1.4)
    assert drain(layer) == []  # retransmissions absorbed in Confirmed
    events = run(layer, 100.0)
    assert times(events, Transmit) == []
    assert times(events, TransactionTerminated) == [6.2]  # Timer I = T4


def test_ist_tcp_final_no_timer_g_and_ack_terminates() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer, "TCP")
    layer.send_response(tid, make_response(inv, 404, to_tag="b1"), 1.0)
    drain(layer)
    layer.receive(bytes(request("ACK", to_tag="b1", transport="TCP")), ALICE, 1.1, reliable=True)
    assert [type(e) for e in drain(layer)] == [TransactionTerminated]


def test_ist_2xx_retransmitted_until_ack() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    ok = make_response(inv, 200, to_tag="b1", headers=[("Contact", "<sip:bob@192.0.2.20>")])
    layer.send_response(tid, ok, 1.0)
    drain(layer)
    assert layer.transaction_state(tid) is State.ACCEPTED
    # §13.3.1.4: T1, 2T1, ... capped at T2.
    assert times(run(layer, 9.0), Transmit) == [1.5, 2.5, 4.5, 8.5]
    layer.receive(bytes(request("INVITE")), ALICE, 9.1)
    assert drain(layer) == []  # RFC 6026: retransmitted INVITE absorbed in Accepted
    ack = request("ACK", branch="z9hG4bKnewack", to_tag="b1")  # its own transaction
    layer.receive(bytes(ack), ALICE, 9.5)
    (got,) = drain(layer)
    assert isinstance(got, RequestReceived) and got.transaction_id == tid
    assert got.request.method == "ACK"
    events = run(layer, 100.0)
    assert times(events, Transmit) == []
    assert times(events, TransactionTimeout) == []
    assert times(events, TransactionTerminated) == [33.0]  # Timer L
    layer.receive(bytes(ack), ALICE, 40.0)  # late ACK retransmission: to the TU, no txn
    (late,) = drain(layer)
    assert isinstance(late, RequestReceived) and late.transaction_id is None


def test_ist_2xx_without_ack_reports_timer_l() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    layer.send_response(tid, make_response(inv, 200, to_tag="b1"), 0.0)
    drain(layer)
    events = run(layer, 100.0)
    assert [e for _, e in events if isinstance(e, TransactionTimeout)] == [
        TransactionTimeout(tid, "L")
    ]


def test_ist_2xx_over_tcp_not_retransmitted_by_default() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer, "TCP")
    layer.send_response(tid, make_response(inv, 200, to_tag="b1"), 0.0)
    drain(layer)
    assert times(run(layer, 100.0), Transmit) == []
    layer = TransactionLayer(TimerConfig(retransmit_2xx_reliable=True))
    tid, inv = receive_invite(layer, "TCP")
    layer.send_response(tid, make_response(inv, 200, to_tag="b1"), 0.0)
    drain(layer)
    assert times(run(layer, 3.0), Transmit) == [0.5, 1.5]


def test_second_final_response_is_a_state_error() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    layer.send_response(tid, make_response(inv, 486, to_tag="b1"), 0.0)
    with pytest.raises(SipStateError, match="cannot send 200 in state Completed"):
        layer.send_response(tid, make_response(inv, 200, to_tag="b1"), 0.1)


# --- non-INVITE server transaction (§17.2.2) ----------------------------------------------


def test_nist_absorbs_then_replays_final_until_timer_j() -> None:
    layer = TransactionLayer()
    opt = request("OPTIONS")
    layer.receive(bytes(opt), ALICE, 0.0)
    (ev,) = drain(layer)
    assert isinstance(ev, RequestReceived) and ev.transaction_id is not None
    tid = ev.transaction_id
    layer.receive(bytes(opt), ALICE, 0.5)
    assert drain(layer) == []  # Trying: absorbed
    layer.send_response(tid, make_response(opt, 200, to_tag="b1"), 1.0)
    assert len(transmits(drain(layer))) == 1
    layer.receive(bytes(opt), ALICE, 2.0)
    (replay,) = sent_messages(drain(layer))
    assert isinstance(replay, Response) and replay.status == 200
    assert times(run(layer, 100.0), TransactionTerminated) == [33.0]


def test_nist_provisional_replayed_in_proceeding() -> None:
    layer = TransactionLayer()
    opt = request("REGISTER")
    layer.receive(bytes(opt), ALICE, 0.0)
    (ev,) = drain(layer)
    assert ev.transaction_id is not None  # type: ignore[union-attr]
    layer.send_response(ev.transaction_id, make_response(opt, 100), 0.1)  # type: ignore[union-attr]
    drain(layer)
    layer.receive(bytes(opt), ALICE, 0.6)
    (replay,) = sent_messages(drain(layer))
    assert isinstance(replay, Response) and replay.status == 100


# --- matching rules -----------------------------------------------------------------------


def test_cancel_matches_pending_invite() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    cancel = make_cancel(request("INVITE"))
    layer.receive(bytes(cancel), ALICE, 1.0)
    events = drain(layer)
    (ok,) = sent_messages(events)
    assert isinstance(ok, Response) and (ok.status, ok.cseq.method) == (200, "CANCEL")
    (cancelled,) = [e for e in events if isinstance(e, CancelReceived)]
    assert cancelled.transaction_id == tid
    layer.send_response(tid, make_response(inv, 487, to_tag="b1"), 1.0)
    assert layer.transaction_state(tid) is State.COMPLETED


def test_cancel_without_invite_gets_481() -> None:
    layer = TransactionLayer()
    layer.receive(bytes(make_cancel(request("INVITE", branch="z9hG4bKnothere"))), ALICE, 0.0)
    (resp,) = sent_messages(drain(layer))
    assert isinstance(resp, Response) and resp.status == 481


def test_cancel_after_final_has_no_effect() -> None:
    layer = TransactionLayer()
    tid, inv = receive_invite(layer)
    layer.send_response(tid, make_response(inv, 200, to_tag="b1"), 0.5)
    drain(layer)
    layer.receive(bytes(make_cancel(request("INVITE"))), ALICE, 1.0)
    events = drain(layer)
    assert [r.status for r in sent_messages(events)] == [200]  # type: ignore[attr-defined]
    assert not any(isinstance(e, CancelReceived) for e in events)


def test_merged_request_gets_482() -> None:
    layer = TransactionLayer()
    receive_invite(layer)
    forked = request("INVITE", branch="z9hG4bKotherpath", sent_by="192.0.2.99:5060")
    layer.receive(bytes(forked), ("192.0.2.99", 5060), 0.1)
    events = drain(layer)
    assert not any(isinstance(e, RequestReceived) for e in events)
    (resp,) = sent_messages(events)
    assert isinstance(resp, Response) and resp.status == 482


def test_rfc2543_request_matching() -> None:
    layer = TransactionLayer()
    inv = request("INVITE")
    inv.headers.set("Via", "SIP/2.0/UDP 192.0.2.10:5060")  # no branch at all
    layer.receive(bytes(inv), ALICE, 0.0)
    events = drain(layer)
    (ev,) = [e for e in events if isinstance(e, RequestReceived)]
    assert ev.transaction_id is not None and ev.transaction_id.startswith("2543/")
    layer.receive(bytes(inv), ALICE, 0.3)
    assert [m.status for m in sent_messages(drain(layer))] == [100]  # type: ignore[attr-defined]
    layer.send_response(ev.transaction_id, make_response(ev.request, 404, to_tag="b1"), 0.4)
    drain(layer)
    ack = request("ACK", to_tag="b1")
    ack.headers.set("Via", "SIP/2.0/UDP 192.0.2.10:5060")
    layer.receive(bytes(ack), ALICE, 0.5)
    assert drain(layer) == []
    assert layer.transaction_state(ev.transaction_id) is State.CONFIRMED


def test_bare_magic_cookie_branch_uses_rfc2543_matching() -> None:
    layer = TransactionLayer()
    layer.receive(bytes(request("OPTIONS", branch="z9hG4bK")), ALICE, 0.0)
    (ev,) = drain(layer)
    assert isinstance(ev, RequestReceived) and ev.transaction_id is not None
    assert ev.transaction_id.startswith("2543/")


def test_via_received_and_rport_and_response_address() -> None:
    layer = TransactionLayer()
    opt = request("OPTIONS", sent_by="alice.example.com")
    opt.headers.set("Via", "SIP/2.0/UDP alice.example.com;branch=z9hG4bKr1;rport")
    layer.receive(bytes(opt), ("203.0.113.5", 40000), 0.0)
    (ev,) = drain(layer)
    assert isinstance(ev, RequestReceived) and ev.transaction_id is not None
    via = ev.request.top_via
    assert via.received == "203.0.113.5" and via.rport == 40000
    layer.send_response(ev.transaction_id, make_response(ev.request, 200), 0.1)
    (tx,) = transmits(drain(layer))
    assert tx.addr == ("203.0.113.5", 40000)  # RFC 3581 §4
    assert parse(tx.data).top_via.rport == 40000


def test_response_without_rport_goes_to_received_and_sent_by_port() -> None:
    layer = TransactionLayer()
    opt = request("OPTIONS", sent_by="alice.example.com:5070")
    layer.receive(bytes(opt), ("203.0.113.5", 40000), 0.0)
    (ev,) = drain(layer)
    assert isinstance(ev, RequestReceived) and ev.transaction_id is not None
    layer.send_response(ev.transaction_id, make_response(ev.request, 200), 0.1)
    (tx,) = transmits(drain(layer))
    assert tx.addr == ("203.0.113.5", 5070)  # §18.2.2


def test_malformed_request_is_answered_statelessly() -> None:
    layer = TransactionLayer()
    bad = bytes(request("OPTIONS")).replace(b"CSeq: 1 OPTIONS", b"CSeq: 1 INVITE")
    layer.receive(bad, ALICE, 0.0)
    events = drain(layer)
    (resp,) = sent_messages(events)
    assert isinstance(resp, Response) and resp.status == 400
    assert resp.reason == "CSeq method does not match Request-Line"
    assert isinstance(events[-1], MalformedMessage)
    layer.receive(b"\r\n\r\n", ALICE, 0.0)
    layer.receive(b"junk", ALICE, 0.0)
    assert [type(e) for e in drain(layer)] == [MalformedMessage]


def test_transport_error_terminates() -> None:
    layer = TransactionLayer()
    tid = layer.send_request(request("INVITE"), BOB, 0.0)
    drain(layer)
    layer.transport_error(BOB, 0.1)
    assert drain(layer) == [TransportError(tid, BOB), TransactionTerminated(tid)]
    assert layer.get_timer() is None


def test_responses_for_other_method_do_not_match() -> None:
    layer = TransactionLayer()
    inv = request("INVITE")
    layer.send_request(inv, BOB, 0.0)
    drain(layer)
    cancel_resp = make_response(make_cancel(inv), 200, to_tag="x")
    layer.receive(bytes(cancel_resp), BOB, 0.1)
    assert drain(layer) == []  # a CANCEL response is not the INVITE's (§17.1.3)


def test_event_types_validate() -> None:
    with pytest.raises(TypeError):
        Transmit(b"", ("h", "5060"))  # type: ignore[arg-type]
