"""Shared builders for the SIP tests."""

from __future__ import annotations

from gateway.sip.events import SipEvent, Transmit
from gateway.sip.headers import Headers
from gateway.sip.layer import TransactionLayer
from gateway.sip.message import Request, parse
from gateway.sip.uri import parse_uri

ALICE = ("192.0.2.10", 5060)
BOB = ("192.0.2.20", 5060)


def request(
    method: str = "INVITE",
    *,
    branch: str = "z9hG4bKabc123",
    sent_by: str = "192.0.2.10:5060",
    transport: str = "UDP",
    cseq: int = 1,
    to_tag: str | None = None,
    from_tag: str = "fromtag1",
    call_id: str = "call-1@192.0.2.10",
    uri: str = "sip:bob@192.0.2.20",
    extra: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
) -> Request:
    h = Headers()
    h.add("Via", f"SIP/2.0/{transport} {sent_by};branch={branch}")
    h.add("Max-Forwards", "70")
    h.add("From", f"Alice <sip:alice@example.com>;tag={from_tag}")
    h.add("To", "<sip:bob@example.com>" + (f";tag={to_tag}" if to_tag else ""))
    h.add("Call-ID", call_id)
    h.add("CSeq", f"{cseq} {method}")
    h.add("Contact", "<sip:alice@192.0.2.10:5060>")
    for name, value in extra:
        h.add(name, value)
    return Request(method, parse_uri(uri), h, body)


def drain(layer: TransactionLayer) -> list[SipEvent]:
    out: list[SipEvent] = []
    while (event := layer.next_event()) is not None:
        out.append(event)
    return out


def transmits(events: list[SipEvent]) -> list[Transmit]:
    return [e for e in events if isinstance(e, Transmit)]


def sent_messages(events: list[SipEvent]) -> list[object]:
    return [parse(t.data) for t in transmits(events)]
