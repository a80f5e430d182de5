"""RFC 4475 torture messages (sip-fixtures/rfc4475/*.dat, expanded from the RFC's shorthand).

Valid messages parse, keep their meaning through ``bytes()`` and back, and read as the RFC
says; invalid ones raise SipParseError with the status the RFC recommends, or are read the
way the RFC says a liberal parser may read them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sip.errors import SipParseError
from gateway.sip.framing import StreamFramer
from gateway.sip.helpers import error_response
from gateway.sip.message import Request, Response, parse
from gateway.sip.uri import AbsoluteUri, SipUri

FIXTURES = Path(__file__).resolve().parents[2] / "sip-fixtures" / "rfc4475"

VALID = [
    # §3.1.1 valid messages
    "wsinv", "intmeth", "esc01", "escnull", "esc02", "lwsdisp", "longreq", "dblreq", "semiuri",
    "transports", "unreason", "noreason",
    # §3.1.2 invalid, but the RFC allows a liberal reading (and this parser takes it)
    "lwsstart", "trws", "baddate", "badaspec",
    # §3.2 / §3.3: syntactically fine; the transaction layer / application decides
    "badbranch", "bext01", "invut", "regaut01", "bcast", "zeromf", "cparam01", "cparam02",
    "regescrt", "sdp01", "inv2543", "unksm2",
]  # fmt: skip

INVALID = {
    "badinv01": (400, "Bad Via header field: Empty parameter in Via"),
    "clerr": (400, "Content-Length larger than the message body"),
    "ncl": (400, "Bad Content-Length header field"),
    "scalar02": (400, "CSeq number out of range"),
    "scalarlg": (400, "CSeq number out of range"),
    "quotbal": (400, "Bad To header field: Unterminated quoted display name in To"),
    "ltgtruri": (400, "Request-URI must not be enclosed in <>"),
    "lwsruri": (400, "Whitespace in Request-URI"),
    "escruri": (400, "Request-URI must not contain headers"),
    "regbadct": (
        400,
        "Bad Contact header field: URI with '?' or ',' must be enclosed in <> in Contact",
    ),
    "baddn": (400, "Bad From header field: Bad display name in From"),
    "badvers": (505, "Version Not Supported"),
    "mismatch01": (400, "CSeq method does not match Request-Line"),
    "mismatch02": (501, "CSeq method does not match Request-Line"),
    "bigcode": (400, "Bad status code in Status-Line"),
    "insuf": (400, "Missing To, From, Call-ID header fields"),
    "unkscm": (416, "Unsupported URI Scheme"),
    "novelsc": (416, "Unsupported URI Scheme"),
    "multi01": (400, "Multiple To header fields"),
    "mcl01": (400, "Multiple Content-Length header fields"),
}


def load(name: str) -> bytes:
    return (FIXTURES / f"{name}.dat").read_bytes()


def test_every_fixture_is_classified() -> None:
    names = {p.stem for p in FIXTURES.glob("*.dat")}
    assert names == set(VALID) | set(INVALID)


@pytest.mark.parametrize("name", VALID)
def test_valid_message_parses_and_round_trips(name: str) -> None:
    message = parse(load(name))
    again = parse(bytes(message))
    assert again == message
    assert again.body == message.body
    # typed views survive the round trip too
    assert again.via == message.via
    assert again.from_addr == message.from_addr
    assert again.to_addr == message.to_addr
    assert again.cseq == message.cseq
    assert again.contacts == message.contacts
    if isinstance(message, Request):
        assert isinstance(again, Request)
        assert again.uri == message.uri


@pytest.mark.parametrize("name", VALID)
def test_valid_message_framed_on_a_stream(name: str) -> None:
    data = load(name)
    if name in ("dblreq", "inv2543"):
        pytest.skip("UDP-only: trailing octets / no Content-Length")
    framer = StreamFramer()
    assert framer.feed(data) == [parse(data)]


@pytest.mark.parametrize(("name", "expected"), sorted(INVALID.items()))
def test_invalid_message_raises_with_status(name: str, expected: tuple[int, str]) -> None:
    with pytest.raises(SipParseError) as info:
        parse(load(name))
    assert (info.value.status, info.value.reason) == expected


@pytest.mark.parametrize(
    "name",
    [n for n in INVALID if n not in ("bigcode", "scalarlg", "insuf")],
)
def test_invalid_request_can_still_be_answered(name: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse(load(name))
    response = error_response(info.value)
    assert response is not None
    assert response.status == info.value.status
    assert response.reason == info.value.reason
    assert response.call_id == parse_header(load(name), "Call-ID")


def test_insufficient_request_cannot_be_answered() -> None:
    # RFC 4475 insuf: no To/From/Call-ID, so no response can be matched by the client.
    with pytest.raises(SipParseError) as info:
        parse(load("insuf"))
    assert error_response(info.value) is None


def parse_header(data: bytes, name: str) -> str:
    for line in data.split(b"\r\n"):
        if line.lower().startswith(name.lower().encode() + b":"):
            return line.split(b":", 1)[1].strip().decode()
    raise AssertionError(name)


def test_wsinv_reads_as_rfc_describes() -> None:
    m = parse(load("wsinv"))
    assert isinstance(m, Request) and m.method == "INVITE"
    assert isinstance(m.uri, SipUri) and m.uri.param("unknownparam") == ""
    assert m.to_addr.tag == "1918181833n"
    assert m.from_addr.display_name == 'J Rosenberg \\"'
    assert m.from_addr.tag == "98asjd8"
    assert m.max_forwards == 68
    assert m.cseq.seq == 9 and m.cseq.method == "INVITE"
    vias = m.via
    assert [(v.transport, v.host, v.branch) for v in vias] == [
        ("UDP", "192.0.2.2", "390skdjuw"),
        ("TCP", "spindle.example.com", "z9hG4bK9ikj8"),
        ("UDP", "192.168.255.111", "z9hG4bK30239"),
    ]
    assert m.headers.get("Subject") == ""
    assert m.headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    assert m.headers.values("UnknownHeaderWithUnusualValue") == [";;,,;;,;"]
    (contact,) = m.contacts
    assert contact.display_name == 'Quoted string ""'
    assert contact.param("newparam") == "newvalue"
    assert contact.param("secondparam") == ""
    assert contact.param("q") == "0.33"
    (route,) = m.routes
    assert isinstance(route.uri, SipUri) and route.uri.lr
    assert len(m.body) == 150


def test_intmeth_reads_as_rfc_describes() -> None:
    m = parse(load("intmeth"))
    assert isinstance(m, Request)
    assert m.method == "!interesting-Method0123456789_*+`.%indeed'~"
    assert isinstance(m.uri, SipUri)
    assert m.uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert m.uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    assert m.top_via.branch == "z9hG4bK-.!%66*_+`'~"
    assert m.to_addr.display_name == "BEL:\x07 NUL:\x00 DEL:\x7f"
    assert m.from_addr.display_name == "token1~` token2'+_ token3*%!.-"
    assert m.from_addr.param("fromParam''~+*_!.-%") == "работающий"
    assert m.from_addr.tag == "_token~1'+`*%!-."
    assert m.call_id == "intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{"
    assert m.headers.get("extensionHeader-!.%*+_`'~") == "\ufeff大停電"


def test_escapes_are_expanded_once() -> None:
    m = parse(load("esc01"))
    assert isinstance(m, Request) and isinstance(m.uri, SipUri)
    assert m.uri.user == "sips:user@example.com" and m.uri.host == "example.net"
    assert isinstance(m.to_addr.uri, SipUri) and m.to_addr.uri.user == "user"
    assert isinstance(m.from_addr.uri, SipUri) and m.from_addr.uri.user == "I have spaces"
    contact = m.contacts[0].uri
    assert isinstance(contact, SipUri)
    assert contact.user == "caller"
    assert contact.param("lr") == ""
    assert contact.param("name") == "value%41"  # never recursively (RFC 3986)


def test_escaped_nulls_do_not_shorten_user() -> None:
    m = parse(load("escnull"))
    users = [c.uri.user for c in m.contacts if isinstance(c.uri, SipUri)]
    assert users == ["\x00", "\x00\x00"]
    assert isinstance(m.to_addr.uri, SipUri) and m.to_addr.uri.user == "null-\x00-null"


def test_percent_is_not_an_escape_outside_uris() -> None:
    m = parse(load("esc02"))
    assert isinstance(m, Request) and m.method == "RE%47IST%45R"
    assert m.to_addr.display_name == "%Z%45"
    assert len(m.contacts) == 2  # C%6Fntact is another header
    assert m.headers.get("C%6Fntact") == "<sip:alias2@host2.example.com>"
    assert m.top_via.branch == "z9hG4bK209%fzsnel234"


def test_lwsdisp_longreq_semiuri_transports() -> None:
    assert parse(load("lwsdisp")).from_addr.display_name == "caller"
    long = parse(load("longreq"))
    assert len(long.via) == 34 and long.via[0].host == "sip33.example.com"
    assert long.via[-1].received == "192.0.2.5"
    semi = parse(load("semiuri"))
    assert isinstance(semi, Request) and isinstance(semi.uri, SipUri)
    assert semi.uri.user == "user;par=u@example.net" and semi.uri.params == ()
    assert len(semi.headers.values("Accept")) == 6
    transports = [v.transport for v in parse(load("transports")).via]
    assert transports == ["UDP", "SCTP", "TLS", "UNKNOWN", "TCP"]


def test_dblreq_ignores_the_trailing_invite() -> None:
    m = parse(load("dblreq"))
    assert isinstance(m, Request) and m.method == "REGISTER" and m.body == b""


def test_reason_phrases() -> None:
    un = parse(load("unreason"))
    assert isinstance(un, Response) and un.status == 200
    assert un.reason == "= 2**3 * 5**2 но сто девяносто девять - простое"
    no = parse(load("noreason"))
    assert isinstance(no, Response) and (no.status, no.reason) == (100, "")


def test_liberal_readings() -> None:
    start = parse(load("lwsstart"))
    assert (
        isinstance(start, Request) and start.start_line() == "INVITE sip:user@example.com SIP/2.0"
    )
    assert parse(load("trws")).start_line() == "OPTIONS sip:remote-target@example.com SIP/2.0"
    aspec = parse(load("badaspec"))
    assert str(aspec.to_addr.uri) == "sip:t.watson@example.org"
    assert aspec.from_addr.display_name == "Bell, Alexander"


def test_contact_params_versus_uri_params() -> None:
    c1 = parse(load("cparam01")).contacts[0]
    assert c1.param("unknownparam") == "" and isinstance(c1.uri, SipUri) and c1.uri.params == ()
    c2 = parse(load("cparam02")).contacts[0]
    assert c2.params == () and isinstance(c2.uri, SipUri) and c2.uri.param("unknownparam") == ""


def test_unknown_schemes_in_header_fields_are_opaque() -> None:
    m = parse(load("unksm2"))
    assert m.to_addr.uri == AbsoluteUri("isbn", "2983792873")
    assert m.from_addr.uri == AbsoluteUri("http", "//www.example.com")
    assert m.contacts[0].uri == AbsoluteUri("name", "John_Smith")


def test_regescrt_uri_headers() -> None:
    uri = parse(load("regescrt")).contacts[0].uri
    assert isinstance(uri, SipUri) and uri.headers == (("Route", "<sip:sip.example.com>"),)


def test_inv2543_without_content_length_takes_the_rest() -> None:
    m = parse(load("inv2543"))
    assert m.body.endswith(b"m=audio 49217 RTP/AVP 0\r\n")
    assert m.top_via.branch is None
    assert m.max_forwards is None


def test_ncl_breaks_a_stream() -> None:
    framer = StreamFramer()
    (error,) = framer.feed(load("ncl") + load("wsinv"))
    assert isinstance(error, SipParseError) and error.framing
    assert framer.broken and framer.feed(load("wsinv")) == []


def test_clerr_on_a_stream_waits_for_more() -> None:
    framer = StreamFramer()
    assert framer.feed(load("clerr")) == []
    assert not framer.broken
