"""Two transaction layers wired through an in-memory, lossy UDP network with a fake clock:
a whole call (INVITE/180/200/ACK, BYE) survives dropped packets."""

from __future__ import annotations

from collections.abc import Callable

from gateway.sip.dialog import Dialog, make_dialog_response
from gateway.sip.events import (
    RequestReceived,
    ResponseReceived,
    SipEvent,
    TransactionTimeout,
    Transmit,
)
from gateway.sip.fields import NameAddr
from gateway.sip.layer import TransactionLayer
from gateway.sip.message import Address, Request, Response, parse
from gateway.sip.uri import parse_uri

from .util import ALICE, BOB, request

LATENCY = 0.02


class Network:
    def __init__(self, drop: Callable[[int, bytes], bool]) -> None:
        self.nodes: dict[Address, TransactionLayer] = {}
        self.handlers: dict[Address, Callable[[SipEvent, float], None]] = {}
        self.in_flight: list[tuple[float, int, bytes, Address, Address]] = []
        self.sent = 0
        self.drop = drop
        self.now = 0.0
        self.log: list[tuple[float, str]] = []

    def add(
        self, addr: Address, layer: TransactionLayer, handler: Callable[[SipEvent, float], None]
    ) -> None:
        self.nodes[addr] = layer
        self.handlers[addr] = handler

    def flush(self, addr: Address) -> None:
        layer = self.nodes[addr]
        while (event := layer.next_event()) is not None:
            if isinstance(event, Transmit):
                self.sent += 1
                first = event.data.split(b"\r\n", 1)[0].decode()
                if self.drop(self.sent, event.data):
                    self.log.append((self.now, f"DROP {first}"))
                    continue
                self.log.append((self.now, f"{addr[0]} -> {first}"))
                self.in_flight.append((self.now + LATENCY, self.sent, event.data, addr, event.addr))
            else:
                self.handlers[addr](event, self.now)
                self.flush(addr)

    def run(self, until: float) -> None:
        for addr in self.nodes:
            self.flush(addr)
        while True:
            candidates: list[tuple[float, int, object]] = []
            if self.in_flight:
                t, seq, *_ = min(self.in_flight)
                candidates.append((t, 0, seq))
            for i, layer in enumerate(self.nodes.values()):
                timer = layer.get_timer()
                if timer is not None:
                    candidates.append((timer, 1, i))
            if not candidates:
                return
            t, kind, ref = min(candidates, key=lambda c: (c[0], c[1]))
            if t > until:
                return
            self.now = max(self.now, t)
            if kind == 0:
                item = min(self.in_flight)
                self.in_flight.remove(item)
                _, _, data, src, dst = item
                self.nodes[dst].receive(data, src, self.now)
                self.flush(dst)
            else:
                addr = list(self.nodes)[int(str(ref))]
                self.nodes[addr].handle_timer(self.now)
                self.flush(addr)


def call(drop: Callable[[int, bytes], bool]) -> tuple[Network, dict[str, object]]:
    state: dict[str, object] = {"alice_events": [], "bob_events": []}
    alice, bob = TransactionLayer(), TransactionLayer()
    net = Network(drop)
    invite = request("INVITE", branch="z9hG4bKcall1")
    bob_contact = NameAddr(parse_uri("sip:bob@192.0.2.20:5060"))

    def alice_tu(event: SipEvent, now: float) -> None:
        state["alice_events"].append(event)  # type: ignore[attr-defined]
        if isinstance(event, ResponseReceived) and event.response.status == 200:
            if event.response.cseq.method == "INVITE":
                dialog = Dialog.from_uac_response(invite, event.response)
                state["alice_dialog"] = dialog
                ack = dialog.create_ack(invite, sent_by="192.0.2.10:5060")
                alice.send_stateless(ack, BOB)  # §13.2.2.4: for every 2xx received
                if "bye_sent" not in state:
                    state["bye_sent"] = True
                    bye = dialog.create_request("BYE", sent_by="192.0.2.10:5060")
                    alice.send_request(bye, BOB, now)
            else:
                state["bye_done"] = now

    def bob_tu(event: SipEvent, now: float) -> None:
        state["bob_events"].append(event)  # type: ignore[attr-defined]
        if not isinstance(event, RequestReceived):
            return
        req = event.request
        assert event.transaction_id is not None or req.method == "ACK"
        if req.method == "INVITE":
            assert event.transaction_id is not None
            bob.send_response(
                event.transaction_id,
                make_dialog_response(req, 180, to_tag="bt", contact=bob_contact),
                now,
            )
            bob.send_response(
                event.transaction_id,
                make_dialog_response(req, 200, to_tag="bt", contact=bob_contact),
                now,
            )
            state["bob_dialog"] = Dialog.from_uas_request(req, "bt", bob_contact)
        elif req.method == "ACK":
            state["acked"] = now
        elif req.method == "BYE":
            assert event.transaction_id is not None
            dialog = state["bob_dialog"]
            assert isinstance(dialog, Dialog)
            error = dialog.receive_request(req)
            assert error is None
            from gateway.sip.helpers import make_response

            bob.send_response(event.transaction_id, make_response(req, 200), now)

    net.add(ALICE, alice, alice_tu)
    net.add(BOB, bob, bob_tu)
    alice.send_request(invite, BOB, 0.0)
    net.run(100.0)
    return net, state


def first_lines(net: Network) -> list[str]:
    return [line for _, line in net.log]


def test_clean_call() -> None:
    net, state = call(lambda n, data: False)
    assert "acked" in state and "bye_done" in state
    lines = first_lines(net)
    assert lines[:3] == [
        "192.0.2.10 -> INVITE sip:bob@192.0.2.20 SIP/2.0",
        "192.0.2.20 -> SIP/2.0 100 Trying",
        "192.0.2.20 -> SIP/2.0 180 Ringing",
    ]
    assert not any("DROP" in line for line in lines)


def test_call_survives_loss_of_invite_200_ack_and_bye() -> None:
    dropped: set[str] = set()

    def drop(n: int, data: bytes) -> bool:
        # Drop the first copy of each of: INVITE, 200 to INVITE, ACK, BYE, 200 to BYE.
        m = parse(data)
        key = (
            m.method if isinstance(m, Request) else f"{m.status} {m.cseq.method}"  # type: ignore[union-attr]
        )
        if key in ("INVITE", "200 INVITE", "ACK", "BYE", "200 BYE") and key not in dropped:
            dropped.add(key)
            return True
        return False

    net, state = call(drop)
    assert dropped == {"INVITE", "200 INVITE", "ACK", "BYE", "200 BYE"}
    assert "acked" in state, first_lines(net)
    assert "bye_done" in state, first_lines(net)
    bob_events = state["bob_events"]
    assert isinstance(bob_events, list)
    # The INVITE reached Bob's TU exactly once despite retransmissions.
    invites = [
        e for e in bob_events if isinstance(e, RequestReceived) and e.request.method == "INVITE"
    ]
    assert len(invites) == 1
    assert not any(isinstance(e, TransactionTimeout) for e in bob_events)
    alice_events = state["alice_events"]
    assert isinstance(alice_events, list)
    oks = [
        e for e in alice_events
        if isinstance(e, ResponseReceived) and isinstance(e.response, Response)
        and e.response.status == 200 and e.response.cseq.method == "INVITE"
    ]  # fmt: skip
    assert len(oks) >= 2  # the retransmitted 2xx reached Alice's TU and was ACKed again


def test_total_loss_times_out() -> None:
    net, state = call(lambda n, data: data.startswith(b"INVITE"))
    alice_events = state["alice_events"]
    assert isinstance(alice_events, list)
    assert [e.timer for e in alice_events if isinstance(e, TransactionTimeout)] == ["B"]
    assert sum(1 for line in first_lines(net) if line.startswith("DROP INVITE")) == 7
