"""Targeted parser, URI, header and serialization cases, plus a fuzz test."""

from __future__ import annotations

import contextlib
import random

import pytest

from gateway.sip.errors import SipParseError
from gateway.sip.fields import CSeq, NameAddr, Via
from gateway.sip.headers import Headers, canonical_name
from gateway.sip.helpers import make_cancel, make_response
from gateway.sip.message import Request, Response, is_keepalive, parse, partial_request
from gateway.sip.reasons import reason_phrase
from gateway.sip.uri import AbsoluteUri, SipUri, parse_uri, uri_equal

from .util import request

BASE = (
    b"OPTIONS sip:bob@example.com SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKx1\r\n"
    b"Max-Forwards: 70\r\n"
    b"From: <sip:a@example.com>;tag=1\r\n"
    b"To: <sip:bob@example.com>\r\n"
    b"Call-ID: c1\r\n"
    b"CSeq: 1 OPTIONS\r\n"
)


def msg(extra: bytes = b"", body: bytes = b"", base: bytes = BASE) -> bytes:
    return base + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


def error_of(data: bytes) -> SipParseError:
    with pytest.raises(SipParseError) as info:
        parse(data)
    return info.value


# --- URIs ------------------------------------------------------------------------------


def test_sip_uri_components() -> None:
    uri = parse_uri("sips:alice:secret@[2001:db8::1]:5061;transport=tcp;lr?Subject=hi%20there&X=1")
    assert isinstance(uri, SipUri)
    assert (uri.scheme, uri.user, uri.password, uri.host, uri.port) == (
        "sips", "alice", "secret", "[2001:db8::1]", 5061,
    )  # fmt: skip
    assert uri.transport == "tcp" and uri.lr and uri.secure
    assert uri.headers == (("Subject", "hi there"), ("X", "1"))
    assert uri.host_for_connect == "2001:db8::1"
    assert parse_uri(str(uri)) == uri
    assert (
        str(uri) == "sips:alice:secret@[2001:db8::1]:5061;transport=tcp;lr?Subject=hi%20there&X=1"
    )


def test_uri_escaping_round_trip() -> None:
    uri = SipUri(host="example.com", user="a b@c", params=(("x", "1 2"),))
    assert str(uri) == "sip:a%20b%40c@example.com;x=1%202"
    assert parse_uri(str(uri)) == uri


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("sip:alice@", "Bad host in URI 'sip:alice@'"),
        ("sip:alice@host:99999", "Bad port in URI 'sip:alice@host:99999'"),
        ("sip:[::1", "Bad IPv6 reference in URI 'sip:[::1'"),
        ("sip:[zz]", "Bad IPv6 reference in URI 'sip:[zz]'"),
        ("sip:a b@host", "Whitespace in URI 'sip:a b@host'"),
        ("sip:a%zz@host", "Bad escape in URI user part"),
        ("nocolon", "Bad URI 'nocolon'"),
        ("sip:@host", "Empty user part in URI 'sip:@host'"),
        ("sip:host;;lr", "Empty URI parameter in 'sip:host;;lr'"),
        ("sip:a<b@host", "Bad character '<' in URI user part of 'sip:a<b@host'"),
    ],
)
def test_bad_uris(text: str, reason: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse_uri(text)
    assert info.value.reason == reason


def test_other_schemes_are_opaque() -> None:
    assert parse_uri("tel:+15551234567;phone-context=x") == AbsoluteUri(
        "tel", "+15551234567;phone-context=x"
    )


def test_uri_equality_rules() -> None:
    assert uri_equal(
        parse_uri("sip:alice@AtLanTa.CoM;Transport=UDP"),
        parse_uri("sip:alice@atlanta.com;transport=udp"),
    )
    assert not uri_equal(parse_uri("sip:alice@atlanta.com"), parse_uri("sip:ALICE@atlanta.com"))
    assert not uri_equal(
        parse_uri("sip:bob@biloxi.com"), parse_uri("sip:bob@biloxi.com;transport=tcp")
    )
    assert not uri_equal(parse_uri("sip:bob@biloxi.com"), parse_uri("sip:bob@biloxi.com:5060"))


# --- header fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compact", "long"),
    [("i", "Call-ID"), ("m", "Contact"), ("e", "Content-Encoding"), ("l", "Content-Length"),
     ("c", "Content-Type"), ("f", "From"), ("s", "Subject"), ("k", "Supported"), ("t", "To"),
     ("v", "Via"), ("o", "Event"), ("u", "Allow-Events"), ("r", "Refer-To"),
     ("b", "Referred-By"), ("x", "Session-Expires"), ("y", "Identity"),
     ("a", "Accept-Contact"), ("CALL-id", "Call-ID"), ("www-authenticate", "WWW-Authenticate"),
     ("X-Custom", "X-Custom")],
)  # fmt: skip
def test_compact_and_canonical_names(compact: str, long: str) -> None:
    assert canonical_name(compact) == long


def test_headers_multimap() -> None:
    h = Headers([("v", "SIP/2.0/UDP a"), ("Via", "SIP/2.0/UDP b, SIP/2.0/UDP c"), ("X-A", "1")])
    assert h.get_all("VIA") == ["SIP/2.0/UDP a", "SIP/2.0/UDP b, SIP/2.0/UDP c"]
    assert h.values("via") == ["SIP/2.0/UDP a", "SIP/2.0/UDP b", "SIP/2.0/UDP c"]
    h.set("via", "SIP/2.0/UDP z")
    assert list(h) == [("Via", "SIP/2.0/UDP z"), ("X-A", "1")]
    h.remove("x-a")
    assert "X-A" not in h and "v" in h


def test_comma_split_respects_quotes_and_brackets() -> None:
    h = Headers([("Contact", '"Doe, John" <sip:j@h;x="a,b">;q=0.5, <sip:k@h?a=1,2>')])
    assert h.values("Contact") == ['"Doe, John" <sip:j@h;x="a,b">;q=0.5', "<sip:k@h?a=1,2>"]
    h2 = Headers([("WWW-Authenticate", 'Digest realm="a", nonce="b"')])
    assert h2.values("WWW-Authenticate") == ['Digest realm="a", nonce="b"']


def test_folded_lines_and_duplicates_kept_in_order() -> None:
    m = parse(msg(b"Route: <sip:p1;lr>,\r\n <sip:p2;lr>\r\nRoute:\t<sip:p3;lr>\r\n"))
    assert [str(r.uri) for r in m.routes] == ["sip:p1;lr", "sip:p2;lr", "sip:p3;lr"]
    assert m.headers.get_all("Route") == ["<sip:p1;lr>, <sip:p2;lr>", "<sip:p3;lr>"]


def test_via_fields() -> None:
    via = Via.parse("SIP/2.0/udp 192.0.2.1:5062;branch=z9hG4bK1;rport;received=10.0.0.1")
    assert (via.transport, via.host, via.port, via.branch) == ("UDP", "192.0.2.1", 5062, "z9hG4bK1")
    assert via.wants_rport and via.rport is None and via.received == "10.0.0.1"
    assert via.sent_by == "192.0.2.1:5062"
    assert Via.parse(str(via)) == via
    v6 = Via.parse("SIP/2.0/TLS [2001:db8::9];rport=5070")
    assert v6.host == "[2001:db8::9]" and v6.rport == 5070 and v6.sent_by == "[2001:db8::9]:5061"


def test_name_addr_forms() -> None:
    a = NameAddr.parse('"A \\"B\\"" <sip:a@h>;tag=x;expires=60')
    assert a.display_name == 'A "B"' and a.tag == "x" and a.param("EXPIRES") == "60"
    assert NameAddr.parse(str(a)) == a
    assert str(NameAddr.parse("Bob Smith <sip:b@h>")) == "Bob Smith <sip:b@h>"
    assert NameAddr.parse("sip:b@h;tag=9").tag == "9"
    assert NameAddr.parse("*").wildcard
    assert str(a.with_tag("y")) == '"A \\"B\\"" <sip:a@h>;expires=60;tag=y'


def test_cseq() -> None:
    assert CSeq.parse(" 0042   INVITE ") == CSeq(42, "INVITE")
    with pytest.raises(SipParseError, match="Bad CSeq number"):
        CSeq.parse("-1 INVITE")


# --- messages -------------------------------------------------------------------------------


def test_parse_and_serialize_request() -> None:
    m = parse(msg(b"Content-Type: text/plain\r\n", "héllo".encode()))
    assert isinstance(m, Request)
    assert m.method == "OPTIONS" and m.body == "héllo".encode()
    assert m.content_type == "text/plain"
    data = bytes(m)
    assert data.startswith(b"OPTIONS sip:bob@example.com SIP/2.0\r\nVia: ")
    assert b"\r\nContent-Length: 6\r\n\r\nh\xc3\xa9llo" in data
    assert parse(data) == m


def test_serialization_fixes_content_length() -> None:
    m = parse(msg(body=b"abc"))
    m.body = b"abcdef"
    assert b"Content-Length: 6\r\n" in bytes(m)
    assert parse(bytes(m)).body == b"abcdef"


def test_bare_lf_and_leading_crlf_tolerated() -> None:
    data = b"\r\n\r\n" + msg().replace(b"\r\n", b"\n")
    assert parse(data).call_id == "c1"


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"", 400, "Empty message"),
        (b"\r\n\r\n", 400, "Empty message"),
        (b"GARBAGE\r\n\r\n", 400, "Bad Request-Line"),
        (b"OPTIONS sip:a@b HTTP/1.1\r\n\r\n", 400, "Bad SIP-Version in Request-Line"),
        (b"OPT(IONS sip:a@b SIP/2.0\r\n\r\n", 400, "Bad method in Request-Line"),
        (b"SIP/2.0 99 Low\r\n\r\n", 400, "Bad status code in Status-Line"),
        (b"SIP/2.0 2000 OK\r\n\r\n", 400, "Bad status code in Status-Line"),
        (b"SIP/X 200 OK\r\n\r\n", 400, "Bad Status-Line"),
    ],
)
def test_start_line_errors(data: bytes, status: int, reason: str) -> None:
    err = error_of(data)
    assert (err.status, err.reason) == (status, reason)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (b"Bad Header\r\n", "Malformed header line"),
        (b"Max-Forwards: 256\r\n", "Multiple Max-Forwards header fields"),
        (b"Contact: <sip:a@b\r\n", "Bad Contact header field: Missing '>' in Contact"),
        (b"Contact: *, <sip:a@b>\r\n", "Bad Contact header field: '*' must be alone"),
        (b"Route: sip:p1;lr\r\n", "Bad Route header field: Route URI must be enclosed in <>"),
        (b"Via: SIP/2.0/UDP\r\n", "Bad Via header field: Missing Via sent-by"),
        (b"Via: SIP2.0 host\r\n", "Bad Via header field: Bad Via sent-protocol"),
        (b"Via: SIP/2.0/UDP host;=x\r\n", "Bad Via header field: Bad parameter name '' in Via"),
        (b"Via: SIP/3.0/UDP host\r\n", "Bad Via header field: Unsupported Via protocol SIP/3.0"),
    ],
)
def test_header_errors_have_exact_messages(extra: bytes, reason: str) -> None:
    err = error_of(msg(extra))
    assert err.reason == reason
    request = partial_request(err)
    assert request is not None and request.call_id == "c1"


def test_max_forwards_range() -> None:
    base = BASE.replace(b"Max-Forwards: 70", b"Max-Forwards: 256")
    assert error_of(msg(base=base)).reason == "Bad Max-Forwards header field"


def test_continuation_before_any_header() -> None:
    assert error_of(b"OPTIONS sip:a@b SIP/2.0\r\n folded\r\n\r\n").reason == (
        "Header continuation line without a header field"
    )


def test_response_parse_and_make_response() -> None:
    req = request("INVITE", extra=(("Timestamp", "54"),))
    trying = make_response(req, 100, to_tag="ignored")
    assert trying.reason == "Trying" and trying.to_addr.tag is None
    assert trying.headers.get("Timestamp") == "54"
    ok = make_response(req, 200, to_tag="t1", headers=[("Contact", "<sip:b@h>")])
    assert ok.to_addr.tag == "t1" and ok.headers.get("Timestamp") is None
    assert ok.headers.get_all("Via") == req.headers.get_all("Via")
    assert (ok.call_id, ok.cseq, ok.from_addr) == (req.call_id, req.cseq, req.from_addr)
    back = parse(bytes(ok))
    assert isinstance(back, Response) and back == ok
    tagged = request("BYE", to_tag="keep")
    assert make_response(tagged, 200, to_tag="other").to_addr.tag == "keep"


def test_make_cancel() -> None:
    inv = request("INVITE", extra=(("Route", "<sip:proxy;lr>"),))
    cancel = make_cancel(inv)
    assert cancel.method == "CANCEL" and cancel.uri == inv.uri
    assert cancel.cseq == CSeq(1, "CANCEL")
    assert cancel.top_via == inv.top_via and cancel.routes == inv.routes
    assert parse(bytes(cancel)) == cancel


def test_reason_phrases() -> None:
    assert reason_phrase(481) == "Call/Transaction Does Not Exist"
    assert reason_phrase(499) == "Client Error"
    assert Response(486).reason == "Busy Here"


def test_keepalive() -> None:
    assert is_keepalive(b"\r\n\r\n") and is_keepalive(b"\r\n") and not is_keepalive(BASE)


def test_fuzz_only_sip_parse_error() -> None:
    rng = random.Random(4475)
    corpus = [msg(body=b"v=0\r\n"), msg(b'Contact: "x" <sip:a@[::1]:5;lr>;q=1\r\n')]
    alphabet = b'\r\n :;,<>"@=%\\/\x00\xff' + b"SIPVviaCSeq0123456789"
    for _ in range(3000):
        data = bytearray(rng.choice(corpus))
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            pos = rng.randrange(len(data) + 1)
            if op < 0.4 and data:
                data[min(pos, len(data) - 1)] = rng.choice(alphabet)
            elif op < 0.7:
                data[pos:pos] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            else:
                del data[pos : pos + rng.randint(1, 6)]
        try:
            m = parse(bytes(data))
        except SipParseError:
            continue
        # Whatever parses must serialize and parse back to the same thing.
        assert parse(bytes(m)) == m
    for _ in range(2000):
        with contextlib.suppress(SipParseError):
            parse(bytes(rng.randrange(256) for _ in range(rng.randint(0, 60))))
