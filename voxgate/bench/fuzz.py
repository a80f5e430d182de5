"""Fuzz targets for everything that reads bytes from outside, and ``voxgate bench fuzz``.

Each target is one function ``check(data: bytes) -> None`` that feeds ``data`` to a parser the
way the network (or a client) would, and checks the parser's contract:

* it returns a value or raises its documented error type (``SipParseError``, ``SdpProblem``,
  ``RtpError``, ``TelephoneEventError``, ``SchemaError``, the control API's ``ControlError``/
  ``HttpError``, ``OfferError``) and never anything else (an ``IndexError``, a
  ``UnicodeDecodeError``, a ``RecursionError``... escaping a parser is a crash, since callers
  only catch the documented type);
* where the API has a serialiser, what it returns survives the round trip
  (``parse(bytes(x)) == x``) and the serialised form is stable;
* it does not hang: the runner gives each input a time limit (libFuzzer ``-timeout``,
  hypothesis ``deadline`` in tests/fuzz).

A broken contract raises :class:`FuzzFailure` (or lets the unexpected exception through): the
fuzzer reports it as a crash and saves the input. The same functions are used three ways:
``voxgate bench fuzz`` (coverage-guided, atheris/libFuzzer, millions of inputs), the
hypothesis property tests in ``tests/fuzz`` (a few hundred inputs each in ``make test``) and
the replay of every saved crash in ``sip-fixtures/fuzz-regressions/<target>/``.

Seeds (the starting corpus) come from ``sip-fixtures/``: the RFC 4475 torture messages, the
SIP and SDP of the sipp scenarios (their ``[keywords]`` filled in), the RTP/RFC 4733 packets of
sip-tester's bundled pcaps where installed, and ``sip-fixtures/fuzz-seeds/<target>/``.

Structured targets read their input in a small framing so the fuzzer can reach the code:
``sip-fields``/``api-body``/``bus-schema``/``webrtc-offer`` take a selector byte first,
``rtp``/``dtmf`` a sequence of ``[len:u8][packet]`` records, ``sip-stream`` split points.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "sip-fixtures"
REGRESSIONS = FIXTURES / "fuzz-regressions"
SEEDS = FIXTURES / "fuzz-seeds"
SIPP_PCAPS = Path("/usr/share/sip-tester")


class FuzzFailure(AssertionError):
    """A parser broke its contract on this input (the message says how)."""


def _require(cond: bool, what: str) -> None:
    if not cond:
        raise FuzzFailure(what)


# --- SIP ---------------------------------------------------------------------------------------
def check_sip_message(data: bytes) -> None:
    """``gateway.sip.message.parse``: a message or ``SipParseError`` (with a usable status and,
    for a request, a partial message a 400 can be built from); every typed accessor a value or
    ``SipParseError``; ``parse(bytes(m)) == m`` and ``bytes`` stable after one round."""
    from gateway.sip.errors import SipParseError
    from gateway.sip.helpers import error_response
    from gateway.sip.message import Request, Response, parse

    try:
        m = parse(data)
    except SipParseError as exc:
        _require(300 <= exc.status <= 699, f"SipParseError status {exc.status}")
        _require(exc.message is None or isinstance(exc.message, Request | Response),
                 f"SipParseError.message is {type(exc.message)}")  # fmt: skip
        reply = error_response(exc)  # what the layer sends back: must serialise
        if reply is not None:
            bytes(reply)
        return
    _accessors(m)
    wire = bytes(m)
    try:
        again = parse(wire)
    except SipParseError as exc:
        raise FuzzFailure(f"bytes(parse(x)) does not parse: {exc!r}\n{wire!r}") from None
    _require(again == m, f"parse(bytes(m)) != m:\n{m.start_line()!r}\n{again.start_line()!r}\n"
             f"{list(m.headers)!r}\n{list(again.headers)!r}")  # fmt: skip
    _require(bytes(again) == wire, f"serialisation not stable:\n{wire!r}\n{bytes(again)!r}")


def _accessors(m: Any) -> None:
    from gateway.sip.errors import SipParseError

    for name in ("via", "top_via", "from_addr", "to_addr", "call_id", "cseq", "max_forwards",
                 "contacts", "routes", "record_routes", "expires", "content_type"):  # fmt: skip
        try:
            value = getattr(m, name)
        except SipParseError:
            continue
        if isinstance(value, list):
            for item in value:
                str(item)
        elif value is not None:
            str(value)


def check_sip_stream(data: bytes) -> None:
    """``StreamFramer``: the same messages and errors whatever the chunking (its docstring's
    promise), and no other exception. The first byte picks up to 7 split points."""
    from gateway.sip.errors import SipParseError
    from gateway.sip.framing import StreamFramer

    if not data:
        return
    n_splits = data[0] % 8
    body = data[1 + n_splits :]
    cuts = sorted({b * len(body) // 256 for b in data[1 : 1 + n_splits]})

    def summary(items: list[Any]) -> list[Any]:
        return [
            ("error", e.reason, e.status, e.framing) if isinstance(e, SipParseError) else bytes(e)
            for e in items
        ]

    whole = StreamFramer(max_message_size=4096)
    one = summary(whole.feed(body))
    split = StreamFramer(max_message_size=4096)
    parts: list[Any] = []
    last = 0
    for cut in [*cuts, len(body)]:
        parts += split.feed(body[last:cut])
        last = cut
    _require(summary(parts) == one, f"framing depends on the chunking: {one!r} vs {parts!r}")
    _require(whole.pings == split.pings, "keep-alive count depends on the chunking")


def check_sip_layer(data: bytes) -> None:
    """``TransactionLayer.receive`` (the UDP entry point), twice (a retransmission) and then
    its timers: never raises (a malformed datagram is a ``MalformedMessage`` event and maybe a
    400); everything it transmits parses with our own parser. Run with a limit that sheds
    this source, too, so ``quick_refusal`` (503 from the raw header lines) sees the input."""
    from gateway.sip.errors import SipParseError
    from gateway.sip.events import Transmit
    from gateway.sip.layer import TransactionLayer
    from gateway.sip.limits import LimitSettings, Rate, SourceLimits
    from gateway.sip.message import Response, parse

    # A 400 to a malformed request copies its Via/From/To/Call-ID/CSeq (RFC 3261 §8.2.6.2),
    # so a field that broke the request may break the response's validation too: allowed
    # only then, and only as a response whose start line and header lines read. (Asked only
    # when something sent does not parse: the parse is a sixth of this target's time.)
    def malformed() -> bool:
        try:
            parse(data)
        except SipParseError:
            return True
        return False

    # One request a source, then shed: the second receive takes the quick-refusal path.
    slow = Rate(0.001, 1)
    limits = SourceLimits(LimitSettings(rates=(("INVITE", slow), ("OPTIONS", slow),
                                                ("REGISTER", slow))))  # fmt: skip
    for layer in (TransactionLayer(), TransactionLayer(limits=limits)):
        addr = ("192.0.2.7", 5062)
        layer.receive(data, addr, 100.0)
        layer.receive(data, addr, 100.1)
        for now in (100.6, 101.1, 132.5, 200.0):
            layer.handle_timer(now)
        while (ev := layer.next_event()) is not None:
            if isinstance(ev, Transmit):
                try:
                    parse(ev.data)
                except SipParseError as exc:
                    sent = exc.message
                    echoed = (not exc.framing and isinstance(sent, Response)
                              and 400 <= sent.status <= 699 and malformed())  # fmt: skip
                    _require(echoed, f"the layer sent what it cannot parse: {exc!r}\n"
                             f"{ev.data!r}")  # fmt: skip
                except Exception as exc:
                    raise FuzzFailure(f"the layer sent what it cannot parse: {exc!r}\n"
                                      f"{ev.data!r}") from None  # fmt: skip


def check_sip_fields(data: bytes) -> None:
    """The field grammars on their own (first byte picks one): ``parse_uri``,
    ``NameAddr.parse``, ``Via.parse``, ``CSeq.parse``; value or ``SipParseError``; ``str`` of a
    parsed value parses back to an equal one."""
    from gateway.sip.errors import SipParseError
    from gateway.sip.fields import CSeq, NameAddr, Via
    from gateway.sip.uri import parse_uri

    if not data:
        return
    text = data[1:].decode("utf-8", "surrogateescape")
    parsers: tuple[Callable[[str], Any], ...] = (parse_uri, NameAddr.parse, Via.parse,
                                                   CSeq.parse)  # fmt: skip
    parse_one = parsers[data[0] % len(parsers)]
    try:
        value = parse_one(text)
    except SipParseError:
        return
    wire = str(value)
    try:
        again = parse_one(wire)
    except SipParseError as exc:
        raise FuzzFailure(f"str(parse(x)) does not parse: {exc!r} {wire!r}") from None
    _require(str(again) == wire, f"not stable: {wire!r} -> {str(again)!r}")
    _require(again == value, f"parse(str(v)) != v: {value!r} vs {again!r}")


# --- digest ------------------------------------------------------------------------------------
def check_digest(data: bytes) -> None:
    """``parse_challenges`` (WWW-/Proxy-Authenticate): a list or ``SipParseError``; every
    parsed challenge can be answered (``build_authorization``) when supported, and the answer
    parses back with the realm, nonce and opaque it was built from."""
    from gateway.sip.digest import build_authorization, choose_challenge, parse_challenges
    from gateway.sip.errors import SipParseError

    text = data.decode("utf-8", "surrogateescape")
    try:
        challenges = parse_challenges(text)
    except SipParseError:
        return
    for c in challenges:
        _ = (c.realm, c.nonce, c.opaque, c.algorithm, c.qop_options, c.stale, c.userhash)
    chosen = choose_challenge(challenges)
    if chosen is None:
        return
    value = build_authorization(chosen, username="alice", password="secret", method="INVITE",
                                uri="sip:bob@example.com", cnonce="0a1b2c3d")  # fmt: skip
    try:
        back = parse_challenges(value)
    except SipParseError as exc:
        raise FuzzFailure(f"our Authorization does not parse: {exc!r} {value!r}") from None
    _require(len(back) == 1, f"our Authorization parses as {len(back)} values: {value!r}")
    _require(back[0].realm == chosen.realm and back[0].nonce == chosen.nonce
             and back[0].opaque == chosen.opaque,
             f"realm/nonce/opaque changed in {value!r}")  # fmt: skip


_AUTH_SECRET = b"voxgate-fuzz-nonce-secret"
_AUTH_NOW = 1000.0
_AUTH_METHODS = ("INVITE", "REGISTER", "OPTIONS", "BYE")


def _auth_server() -> Any:
    from gateway.sip.auth import Account, DigestServer

    accounts = [
        Account.with_password("alice", "voxgate", "secret"),
        Account.with_ha1("bob", "voxgate", md5="0" * 32, algorithms=("MD5",)),
        Account.with_password("carol", "pbx.example", "pw", algorithms=("SHA-256",)),
    ]
    return DigestServer(accounts, realm="voxgate", secret=_AUTH_SECRET)


def _auth_request(method: str, authorization: list[str]) -> bytes:
    lines = [
        f"{method} sip:ivr@192.0.2.1:5060 SIP/2.0",
        "Via: SIP/2.0/UDP 192.0.2.7:5062;branch=z9hG4bK-fuzz-1",
        "Max-Forwards: 70",
        "From: <sip:alice@192.0.2.1>;tag=f1",
        "To: <sip:alice@192.0.2.1>" if method == "REGISTER" else "To: <sip:ivr@192.0.2.1>",
        "Call-ID: fuzz-auth@192.0.2.7",
        f"CSeq: 1 {method}",
        *(f"Authorization: {v}" for v in authorization),
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def check_sip_auth(data: bytes) -> None:
    """The server side of digest (``gateway.sip.auth``). Byte 0 even: the rest is up to 3
    ``Authorization`` values (one a line) of a parsed request; ``DigestServer.verify`` returns
    a ``Verdict`` (never raises on what a peer sent), an ``ok`` one is not ok twice (replay
    protection), and the 400/401 it answers with serialises, parses, and its challenges parse
    back as one challenge each for one of our realms. Byte 0 odd: the rest is a users file:
    ``parse_users_file`` accounts or ``AccountError``, and a server built from them or
    ``AccountError``."""
    from gateway.sip.auth import AccountError, DigestServer, parse_users_file
    from gateway.sip.digest import parse_challenges
    from gateway.sip.errors import SipParseError
    from gateway.sip.message import Request, parse

    if not data:
        return
    text = data[1:].decode("utf-8", "surrogateescape")
    if data[0] % 2:
        try:
            accounts = parse_users_file(text, "voxgate")
        except AccountError as exc:
            _require(str(exc).startswith("line "), f"AccountError without its line: {exc}")
            return
        with contextlib.suppress(AccountError):
            DigestServer(accounts, realm="voxgate")
        return
    method = _AUTH_METHODS[(data[0] // 2) % len(_AUTH_METHODS)]
    values = [v.replace("\r", "") for v in text.split("\n")[:3]]
    try:
        request = parse(_auth_request(method, values))
    except SipParseError:
        return  # the layer answers 400 before any auth is asked
    assert isinstance(request, Request)
    server = _auth_server()
    verdict = server.verify(request, _AUTH_NOW + 0.5)
    _require(verdict.outcome in ("ok", "missing", "stale", "replayed", "failed", "malformed"),
             f"outcome {verdict.outcome!r}")  # fmt: skip
    if verdict.ok:
        again = server.verify(request, _AUTH_NOW + 0.6)
        _require(not again.ok, "the same credentials were accepted twice")
        return
    reply = server.response(request, verdict, _AUTH_NOW + 0.5)
    wire = bytes(reply)
    try:
        back = parse(wire)
    except SipParseError as exc:
        raise FuzzFailure(f"our {reply.status} does not parse: {exc!r}\n{wire!r}") from None
    for value in back.headers.get_all("WWW-Authenticate"):
        try:
            challenges = parse_challenges(value)
        except SipParseError as exc:
            raise FuzzFailure(f"our challenge does not parse: {exc!r} {value!r}") from None
        _require(len(challenges) == 1 and challenges[0].realm in server.realms,
                 f"our challenge reads as {challenges!r}")  # fmt: skip


# --- SDP ---------------------------------------------------------------------------------------
def check_sdp(data: bytes) -> None:
    """``gateway.sdp.parse``: a session or ``SdpError``; ``parse(str(s)) == s``; the offer/answer
    functions on it (``answer``, ``negotiated``, ``offer_changed``) a value or ``SdpProblem``
    (488 for a usable but unacceptable offer) and an answer that parses."""
    from gateway import sdp

    try:
        s = sdp.parse(data)
    except sdp.SdpError:
        return
    wire = str(s)
    try:
        again = sdp.parse(wire)
    except sdp.SdpError as exc:
        raise FuzzFailure(f"str(parse(x)) does not parse: {exc!r}\n{wire!r}") from None
    _require(again == s, f"parse(str(s)) != s:\n{wire!r}")
    _require(str(again) == wire, "serialisation not stable")
    for m in s.media:
        _ = (m.rtpmaps, m.fmtp, m.ptime, m.maxptime, m.direction, m.payload_types)
    with contextlib.suppress(sdp.SdpProblem):
        sdp.offer_changed(s, again)
    try:
        ans = sdp.answer(s, "192.0.2.1", 40000)
    except sdp.SdpProblem:
        return
    try:
        sdp.parse(str(ans))
    except sdp.SdpError as exc:
        raise FuzzFailure(f"our answer does not parse: {exc!r}\n{ans}") from None
    with contextlib.suppress(sdp.SdpProblem):
        sdp.negotiated(s, ans)


_CRYPTO_PROTOS = ("RTP/AVP", "RTP/SAVP", "RTP/SAVPF", "UDP/TLS/RTP/SAVPF")
_INLINE_KEY = re.compile(r"inline:([^|\s;]+)", re.IGNORECASE)


def check_sdp_crypto(data: bytes) -> None:
    """RFC 4568 ``a=crypto`` (``gateway.sdp_crypto``): up to 4 values, one a line.
    ``parse_crypto`` an attribute or ``CryptoError`` whose text never holds the key;
    ``parse_crypto(str(a)) == a``; ``answer_stream`` for every proto and mode a decision
    (never an exception) whose attribute parses back; ``pair`` of the offer with that answer
    ``SrtpParams`` with the offered key, or ``CryptoError``."""
    from gateway.sdp_crypto import SRTP_MODES, CryptoError, answer_stream, pair, parse_crypto

    text = data.decode("utf-8", "surrogateescape")
    values = [v.strip("\r") for v in text.split("\n")[:4]]
    for value in values:
        try:
            attr = parse_crypto(value)
        except CryptoError as exc:
            _require(not _leaks_key(value, str(exc)), f"the key is in {str(exc)!r}")
            continue
        wire = str(attr)
        try:
            again = parse_crypto(wire)
        except CryptoError as exc:
            raise FuzzFailure(f"str(parse(x)) does not parse: {exc} {wire!r}") from None
        _require(again == attr, f"parse(str(a)) != a: {attr!r} vs {again!r}")
        _require(str(again) == wire, f"not stable: {wire!r}")
    if data[:1] and data[0] % 2:
        return  # the parsers alone: more inputs a second
    for proto in _CRYPTO_PROTOS:
        for mode in SRTP_MODES:
            decision = answer_stream(proto, values, mode)
            if not decision.accept:
                _require(bool(decision.reason), "a refused stream without a reason")
                _require(not _leaks_key(text, decision.reason),
                         f"the key is in {decision.reason!r}")  # fmt: skip
                continue
            if decision.attribute is None:
                continue
            ours = str(decision.attribute)
            _require(parse_crypto(ours).tag == decision.attribute.tag, f"answer {ours!r}")
            try:
                params = pair(values, [ours])
            except CryptoError as exc:
                raise FuzzFailure(f"our answer does not pair with its offer: {exc}") from None
            offered: dict[int, Any] = {}
            for a in (_maybe_crypto(v) for v in values):
                if a is not None:
                    offered.setdefault(a.tag, a)  # a repeated tag: the first counts (§9.1)
            _require(params.recv_key == offered[decision.attribute.tag].key,
                     "paired with a key the offer did not give for that tag")  # fmt: skip


def _leaks_key(value: str, message: str) -> bool:
    """Whether ``message`` shows an ``inline:`` key of ``value`` (8+ characters) that could
    only have come from the key (the same text elsewhere, a suite name, may be shown)."""
    for key in _INLINE_KEY.findall(value):
        if len(key) >= 8 and key in message and value.count(key) == 1:
            return True
    return False


def _maybe_crypto(value: str) -> Any:
    from gateway.sdp_crypto import CryptoError, parse_crypto

    try:
        return parse_crypto(value)
    except CryptoError:
        return None


def check_webrtc_offer(data: bytes) -> None:
    """``check_offer``: a ``CheckedOffer`` or ``OfferError``. First byte even: the rest is the
    JSON body as posted (``json.loads`` of it, when a JSON object); odd: the rest is the SDP
    text of ``{"type": "offer", "sdp": ...}``, decoded as JSON strings may be (lone surrogates
    included)."""
    from gateway.legs.webrtc.offer import CheckedOffer, OfferError, check_offer

    if not data:
        return
    rest = data[1:]
    body: Any
    if data[0] % 2 == 0:
        try:
            body = json.loads(rest)
        except (ValueError, RecursionError):
            return  # the body reader's business (api-body)
        if not isinstance(body, dict):
            return
    else:
        body = {"type": "offer", "sdp": rest.decode("utf-8", "surrogatepass")
                if _utf8_surrogates_ok(rest) else rest.decode("utf-8", "replace")}  # fmt: skip
    try:
        checked = check_offer(body)
    except OfferError as exc:
        _require(bool(str(exc)), "OfferError without a reason")
        return
    _require(isinstance(checked, CheckedOffer), f"check_offer returned {type(checked)}")
    _require(checked.codec in ("opus", "pcmu", "pcma"), f"codec {checked.codec!r}")


def _utf8_surrogates_ok(data: bytes) -> bool:
    try:
        data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


# --- RTP, RTCP, RFC 4733 ------------------------------------------------------------------------
def _records(data: bytes) -> Iterator[bytes]:
    """``[len:u8][bytes]`` records (the last may be short)."""
    i = 0
    while i < len(data):
        n = data[i]
        yield data[i + 1 : i + 1 + n]
        i += 1 + n


def check_rtp(data: bytes) -> None:
    """``RtpPacket.parse``: a packet or ``RtpError``; ``parse(bytes(p)) == p``. Then the whole
    receive path of a call (``RtpSession.receive``: rtcp-mux classification, parse, latch,
    jitter buffer, RFC 4733 decoder) fed the records of ``data`` as datagrams from two
    sources, ticked between them: never raises, every tick yields a 20 ms frame."""
    from gateway.rtp.packet import RtpError, RtpPacket, is_rtcp
    from gateway.rtp.session import RtpSession
    from gateway.sdp import MediaParams

    try:
        p = RtpPacket.parse(data)
    except RtpError:
        pass
    else:
        wire = bytes(p)
        _require(RtpPacket.parse(wire) == p, f"parse(bytes(p)) != p: {p!r}")
    is_rtcp(data)
    params = MediaParams("192.0.2.9", 40000, 0, "PCMU", dtmf_pt=101, recv_dtmf_pt=101, cn_pt=13)
    session = RtpSession(params)
    session.start(0.0)
    now = 0.0
    for k, datagram in enumerate(_records(data)):
        src = ("192.0.2.9", 40000) if k % 3 else ("198.51.100.1", 40002)
        now += 0.02 if k % 2 else 0.0
        digits = session.receive(datagram, src, now)
        _check_digits(digits)
        if k % 2:
            result = session.tick(now)
            _require(len(result.frame.pcm) == 160, f"frame of {len(result.frame.pcm)} samples")
            _check_digits(result.digits)
    session.stats()
    session.media_stats()


def _check_digits(digits: list[Any]) -> None:
    from gateway.rtp.dtmf import DIGITS, FLASH

    for d in digits:
        _require(d.digit in DIGITS or d.digit == FLASH, f"digit {d.digit!r}")
        _require(d.duration_ms >= 0, f"duration {d.duration_ms}")


def check_dtmf(data: bytes) -> None:
    """RFC 4733: ``TelephoneEvent.parse`` an event or ``TelephoneEventError``, and
    ``parse(bytes(e)) == e``; ``DtmfDecoder`` fed the records as telephone-event packets
    (record = 2-byte seq/ts step + payload) reports only real keys with sane durations and
    never raises."""
    from gateway.rtp.dtmf import DtmfDecoder, TelephoneEvent, TelephoneEventError
    from gateway.rtp.packet import RtpPacket

    try:
        ev = TelephoneEvent.parse(data)
    except TelephoneEventError:
        pass
    else:
        _require(0 <= ev.volume <= 63, f"volume {ev.volume}")
        again = TelephoneEvent.parse(bytes(ev))
        _require(again == ev, f"parse(bytes(e)) != e: {ev!r} {again!r}")
    dec = DtmfDecoder()
    ts, seq, now = 1000, 0, 0.0
    for rec in _records(data):
        if len(rec) < 2:
            continue
        ts = (ts + rec[0] * 80) & 0xFFFFFFFF
        seq = (seq + 1 + rec[1] % 3) & 0xFFFF
        now += 0.02
        pkt = RtpPacket(payload_type=101, sequence_number=seq, timestamp=ts, payload=rec[2:])
        _check_digits(dec.feed(pkt, now))
        _check_digits(dec.poll(now + 0.01 * rec[1]))
    _check_digits(dec.poll(now + 10.0))


# --- the bus -----------------------------------------------------------------------------------
def _fields(data: bytes) -> dict[bytes, bytes]:
    """``key\\0value\\0key\\0value...`` as a Redis stream entry's field map (bytes, as redis-py
    returns them)."""
    parts = data.split(b"\x00")
    return {parts[i]: parts[i + 1] for i in range(0, len(parts) - 1, 2)}


def check_bus_schema(data: bytes) -> None:
    """``SpeakRequest.from_fields`` (worker side) and ``audio_from_fields`` (gateway side) on
    an arbitrary stream entry: a message or ``SchemaError``; what decodes re-encodes to fields
    that decode to the same message (``from_fields(to_fields(m)) == m``)."""
    from voxgate.contract.bus.schema import (
        SchemaError,
        SpeakRequest,
        audio_from_fields,
        audio_to_fields,
    )

    if not data:
        return
    fields = _fields(data[1:])
    if data[0] % 2 == 0:
        try:
            req = SpeakRequest.from_fields(fields)
        except SchemaError:
            return
        try:
            again = SpeakRequest.from_fields(req.to_fields())
        except SchemaError as exc:
            raise FuzzFailure(f"to_fields of a decoded request does not decode: {exc}") from None
        _require(again == req, f"request round trip: {req!r} vs {again!r}")
    else:
        try:
            msg = audio_from_fields(fields)
        except SchemaError:
            return
        try:
            back = audio_from_fields(audio_to_fields(msg))
        except SchemaError as exc:
            raise FuzzFailure(f"audio_to_fields of a decoded message fails: {exc}") from None
        _require(back == msg, f"audio round trip: {msg!r} vs {back!r}")


# --- the control API's body readers ------------------------------------------------------------
_API_CONTENT_TYPES = ("application/json", "application/x-ndjson", "text/plain",
                      "application/merge-patch+json", "application/xml", "")  # fmt: skip


def check_api_body(data: bytes) -> None:
    """The control API's request-body readers, on a real aiohttp request whose payload
    arrives in chunks: ``json_object`` (a dict or ``ControlError``/``HttpError``: 400/413/415/
    422, never a 500), ``_plain_text`` (the UTF-8 text, exactly, whatever the chunking, or a
    400 naming the byte) and ``_ndjson_text`` (each line's ``text`` or a 4xx). Byte 0: reader
    and Content-Type; byte 1: the chunk size."""
    if len(data) < 2:
        return
    _run(_api_body(data[0], max(1, data[1] % 64), data[2:]))


async def _api_body(selector: int, chunk: int, body: bytes) -> None:
    from aiohttp import web

    from gateway.api.routes import HttpError, _ndjson_text, _plain_text, json_object
    from gateway.call.control import ControlError

    reader = selector % 3
    ctype = _API_CONTENT_TYPES[(selector // 3) % len(_API_CONTENT_TYPES)]
    request = await _request(body, chunk, ctype)
    try:
        if reader == 0:
            value = await json_object(request)
            _require(isinstance(value, dict), f"json_object returned {type(value)}")
            return
        texts = [t async for t in (_plain_text(request) if reader == 1
                                   else _ndjson_text(request, 256))]  # fmt: skip
    except (ControlError, HttpError) as exc:
        status = getattr(exc, "status", 0)
        _require(400 <= status < 500, f"{type(exc).__name__} with status {status}")
        return
    except web.HTTPRequestEntityTooLarge:  # aiohttp's own 413 over client_max_size
        _require(len(body) > _API_MAX_BODY, f"413 for a body of {len(body)} bytes")
        return
    for t in texts:
        _require(isinstance(t, str), f"a text piece of type {type(t)}")
    if reader == 1:
        try:
            expected = body.decode("utf-8")
        except UnicodeDecodeError:
            raise FuzzFailure("invalid UTF-8 read as text without an error") from None
        _require("".join(texts) == expected, "text pieces do not join to the body")


# Bodies up to the target's 4096 bytes: over this the reader meets aiohttp's 413.
_API_MAX_BODY = 2048
_MOCKS: dict[str, Any] = {}


class _ReadingProtocol:
    """The connection side of a request (a ``RequestHandler``'s): what ``web.Request`` reads
    of it (addresses, TLS, header limits) and the flow control a ``StreamReader`` pauses and
    resumes. A plain object: ``Mock``s here were most of each input's time."""

    _reading_paused = False
    connected = True
    ssl_context = None
    peername = ("192.0.2.7", 40000)
    sockname = ("127.0.0.1", 8080)
    max_field_size = 8190
    max_line_length = 8190
    max_headers = 128
    transport = None

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self, resume_parser: bool = True) -> None:
        self._reading_paused = False


async def _request(body: bytes, chunk: int, ctype: str) -> Any:
    """An aiohttp ``web.Request`` (the real class, as the server builds it from a parsed
    request line and headers) whose body arrives ``chunk`` bytes at a time. The connection's
    stand-ins are made once (the writer and task from ``make_mocked_request``, unused by the
    readers): ``make_mocked_request`` per input (three ``Mock``s) cost five times the readers."""
    from aiohttp import streams, web
    from aiohttp.http import HttpVersion11, RawRequestMessage
    from aiohttp.test_utils import make_mocked_request
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    if not _MOCKS:
        probe = make_mocked_request("POST", "/")
        _MOCKS.update(protocol=_ReadingProtocol(), writer=probe.writer, task=probe.task,
                      reader=_ReadingProtocol(), url=URL("/api/calls/x/say"))  # fmt: skip
    loop = asyncio.get_running_loop()
    payload = streams.StreamReader(_MOCKS["reader"], 2**16, loop=loop)

    async def feed() -> None:
        for i in range(0, len(body), chunk):
            payload.feed_data(body[i : i + chunk])
            await asyncio.sleep(0)
        payload.feed_eof()

    _FEEDERS.add(loop.create_task(feed()))
    pairs = [("Content-Type", ctype)] if ctype else []
    headers = CIMultiDictProxy(CIMultiDict(pairs))
    raw = tuple((k.encode(), v.encode()) for k, v in pairs)
    message = RawRequestMessage("POST", "/api/calls/x/say", HttpVersion11, headers, raw, False,
                                None, False, False, _MOCKS["url"])  # fmt: skip
    return web.Request(message, payload, _MOCKS["protocol"], _MOCKS["writer"], _MOCKS["task"],
                       loop, client_max_size=_API_MAX_BODY)  # fmt: skip


_FEEDERS: set[asyncio.Task[None]] = set()
_LOOP: asyncio.AbstractEventLoop | None = None


def _run(coro: Any) -> None:
    """One loop for every input (a loop per input would cost more than the parse)."""
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    _LOOP.run_until_complete(coro)
    # The feeder of an input whose reader stopped early (an error) is done with it too.
    for task in list(_FEEDERS):
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                _LOOP.run_until_complete(task)
        _FEEDERS.discard(task)


# --- targets and seeds -------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    name: str
    check: Callable[[bytes], None]
    max_len: int
    seeds: Callable[[], list[bytes]]


def _sip_seeds() -> list[bytes]:
    out = [p.read_bytes() for p in sorted((FIXTURES / "rfc4475").glob("*.dat"))]
    out += _scenario_messages()
    return out


_SIPP_KEYWORDS = {
    "remote_ip": "192.0.2.10", "remote_port": "5060", "local_ip": "192.0.2.20",
    "local_port": "5062", "transport": "UDP", "branch": "z9hG4bK-524287-1", "pid": "4711",
    "call_number": "1", "call_id": "1-4711@192.0.2.20", "service": "ivr",
    "local_ip_type": "4", "media_ip_type": "4", "media_ip": "192.0.2.20", "media_port": "6000",
    "peer_tag_param": ";tag=abc123", "next_url": "sip:ivr@192.0.2.10:5060", "cseq": "2",
    "last_Via:": "Via: SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKlast",
    "last_From:": "From: <sip:a@192.0.2.10>;tag=1", "last_To:": "To: <sip:b@192.0.2.20>;tag=2",
    "last_Call-ID:": "Call-ID: 77@192.0.2.10", "last_CSeq:": "CSeq: 1 INVITE",
    "last_Record-Route:": "", "last_Contact:": "", "server_ip": "192.0.2.10",
}  # fmt: skip


def _scenario_messages() -> list[bytes]:
    """The SIP messages of the sipp scenarios in sip-fixtures, keywords filled in."""
    out: list[bytes] = []
    cdata = re.compile(r"<!\[CDATA\[(.*?)\]\]>", re.S)
    for path in sorted(FIXTURES.rglob("*.xml")):
        for block in cdata.findall(path.read_text(errors="replace")):
            lines = [ln.strip() for ln in block.strip("\n").splitlines()]
            text = "\r\n".join(lines).strip() + "\r\n"
            text = re.sub(r"\[([A-Za-z_:\-]+)\]", lambda m: _SIPP_KEYWORDS.get(m.group(1), "x"),
                          text)  # fmt: skip
            head, _, body = text.partition("\r\n\r\n")
            body_bytes = body.encode()
            text = re.sub(r"Content-Length: \S*", f"Content-Length: {len(body_bytes)}", head)
            out.append(text.encode() + b"\r\n\r\n" + body_bytes)
    return out


def _sdp_seeds() -> list[bytes]:
    from gateway.sdp import make_offer

    out = [
        bytes(make_offer("192.0.2.1", 40000)),
        bytes(make_offer("2001:db8::1", 40002, ("PCMA",), 30, comfort_noise=True)),
    ]
    for msg in _sip_seeds():
        _, sep, body = msg.partition(b"\r\n\r\n")
        if sep and body.startswith(b"v=0"):
            out.append(body)
    return out + _seed_files("sdp")


def _rtp_seeds() -> list[bytes]:
    from gateway.rtp.dtmf import dtmf_train
    from gateway.rtp.packet import pack_rtp

    packets = [pack_rtp(0, True, 1, 160, 0x1234, bytes(160)),
               pack_rtp(0, False, 2, 320, 0x1234, b"\xff" * 160)]  # fmt: skip
    for i, (marker, payload) in enumerate(dtmf_train("5")):
        packets.append(pack_rtp(101, marker, 3 + i, 480, 0x1234, payload))
    packets += _pcap_payloads()[:200]
    # Single packets, and records of several (the session's input).
    out = list(packets)
    run = b"".join(bytes([len(p)]) + p for p in packets[:12] if len(p) < 256)
    out.append(run)
    return out


def _dtmf_seeds() -> list[bytes]:
    from gateway.rtp.dtmf import dtmf_train

    out: list[bytes] = []
    for digit in "159#":
        train = dtmf_train(digit)
        out.append(train[0][1])
        out.append(b"".join(bytes([6, 0, i % 3]) + p for i, (_, p) in enumerate(train)))
    for payload in _pcap_payloads():
        if len(payload) == 16:  # 12-byte header + a 4-byte event
            out.append(payload[12:])
    return out


def _pcap_payloads() -> list[bytes]:
    """UDP payloads of sip-tester's bundled pcaps (classic pcap, Ethernet/IPv4)."""
    out: list[bytes] = []
    for path in sorted(SIPP_PCAPS.glob("*.pcap")) if SIPP_PCAPS.is_dir() else []:
        data = path.read_bytes()
        if len(data) < 24 or struct.unpack_from("<I", data)[0] != 0xA1B2C3D4:
            continue
        pos = 24
        while pos + 16 <= len(data):
            incl = struct.unpack_from("<IIII", data, pos)[2]
            frame = data[pos + 16 : pos + 16 + incl]
            pos += 16 + incl
            if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
                continue
            ihl = (frame[14] & 0x0F) * 4
            out.append(frame[14 + ihl + 8 :])
            if len(out) % 40 == 0:
                break  # a few from each file
    return out


def _digest_seeds() -> list[bytes]:
    out = []
    for msg in _sip_seeds():
        for line in msg.split(b"\r\n"):
            name, colon, value = line.partition(b":")
            if colon and name.strip().lower() in (
                b"www-authenticate",
                b"proxy-authenticate",
                b"authorization",
                b"proxy-authorization",
            ):
                out.append(value.strip())
    # What our server challenges with and what our client answers (stale, -sess, userhash,
    # several challenges in one value).
    from gateway.sip.digest import build_authorization, parse_challenges

    server = _auth_server()
    for challenge in server.challenges(_AUTH_NOW, stale=True):
        out.append(challenge.encode())
        answer = build_authorization(parse_challenges(challenge)[0], username="alice",
                                     password="secret", method="INVITE",
                                     uri="sip:ivr@192.0.2.1", cnonce="abc")  # fmt: skip
        out.append(answer.encode())
    out += [b'Digest realm="a", nonce="n", algorithm=MD5-sess, qop="auth,auth-int", '
            b'opaque="o", userhash=true, Digest realm="b", nonce="m", algorithm=SHA-512-256',
            b'Digest realm="v\\"q", nonce="n", stale=TRUE, domain="sip:a sip:b"']  # fmt: skip
    return out + _seed_files("digest")


def _auth_seeds() -> list[bytes]:
    """Credentials that verify (nonces of the target's server, the passwords of its
    accounts), a wrong password, a replayed count, a foreign realm, a Basic one; users files."""
    from gateway.sip.digest import build_authorization, parse_challenges

    server = _auth_server()
    out: list[bytes] = []
    for i, (user, password) in enumerate((("alice", "secret"), ("alice", "wrong"),
                                          ("carol", "pw"), ("dave", "x"))):  # fmt: skip
        for challenge in server.challenges(_AUTH_NOW, user=user):
            c = parse_challenges(challenge)[0]
            for method_index, method in enumerate(_AUTH_METHODS[:2]):
                value = build_authorization(c, username=user, password=password, method=method,
                                            uri="sip:ivr@192.0.2.1:5060",
                                            cnonce=f"c{i}{method_index}")  # fmt: skip
                out.append(bytes([2 * method_index]) + value.encode())
    out += [b"\x00Basic YWxpY2U6c2VjcmV0",
            b'\x00Digest username="alice", realm="elsewhere", nonce="x", uri="sip:a", '
            b'response="00"\nDigest username="alice", realm="voxgate", nonce="n", '
            b'uri="sip:ivr@192.0.2.1", response="' + b"0" * 64 + b'", algorithm=SHA-256',
            b"\x01alice:secret\nbob:voxgate:" + b"a" * 32 + b"\n# comment\n"
            b"carol::" + b"b" * 32 + b":" + b"c" * 64,
            b"\x01alice:\n"]  # fmt: skip
    return out + _seed_files("sip-auth")


def _crypto_seeds() -> list[bytes]:
    """RFC 4568's examples and ours (offers of both suites, lifetimes, WSH, MKI, KDR)."""
    from gateway.sdp_crypto import offer_attributes

    key = "WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz"  # RFC 4568 §9.1's key
    ours = "\n".join(str(a) for a in offer_attributes())
    out = [
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{key}|2^20|1:4".encode(),
        f"1 AES_CM_128_HMAC_SHA1_32 inline:{key}|2^20 KDR=0 WSH=64 -FOO".encode(),
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{key}|1048576\n1 AES_CM_128_HMAC_SHA1_32 "
        f"inline:{key}".encode(),
        f"1 F8_128_HMAC_SHA1_80 inline:{key};inline:{key} FEC_ORDER=FEC_SRTP".encode(),
        ours.encode(),
        b"\x01" + ours.encode(),
    ]
    return out + _seed_files("sdp-crypto")


def _field_seeds() -> list[bytes]:
    want = {b"to": 1, b"from": 1, b"contact": 1, b"route": 1, b"record-route": 1, b"via": 2,
            b"cseq": 3, b"v": 2, b"t": 1, b"f": 1, b"m": 1}  # fmt: skip
    out = []
    for msg in _sip_seeds():
        lines = msg.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) == 3 and not parts[0].startswith(b"SIP/"):
            out.append(b"\x00" + parts[1])
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            sel = want.get(name.strip().lower())
            if colon and sel is not None:
                out.append(bytes([sel]) + value.strip())
    return out


def _bus_seeds() -> list[bytes]:
    from voxgate.contract.bus.schema import (
        AudioChunk,
        SpeakRequest,
        UtteranceEnd,
        UtteranceError,
        Word,
        audio_to_fields,
    )

    def enc(selector: int, fields: dict[str, str] | dict[str, bytes]) -> bytes:
        parts: list[bytes] = []
        for k, v in fields.items():
            parts += [k.encode(), v if isinstance(v, bytes) else v.encode()]
        return bytes([selector]) + b"\x00".join(parts)

    req = SpeakRequest("c1", "u1", "Hello there.", profile="wideband", deadline=1.5e9, rate=48000)
    msgs: list[AudioChunk | UtteranceEnd | UtteranceError] = [
        AudioChunk("c1", "u1", 0, 8000, b"\x01\x00" * 8, words=(Word("hi", 0, 8),)),
        UtteranceEnd("c1", "u1", 3, "cancelled", 1600),
        UtteranceError("c1", "u1", 1, "engine_error", "boom"),
    ]
    return [enc(0, req.to_fields()), enc(0, SpeakRequest("c", "u", "x").to_fields()),
            *(enc(1, audio_to_fields(m)) for m in msgs)]  # fmt: skip


def _api_seeds() -> list[bytes]:
    bodies = [b'{"text": "Hello there", "interrupt": true}', b'{"to": "sip:bob@example.com"}',
              b'{"digits": "12#", "duration_ms": 100}', "Grüße, voilà 😀".encode(),
              b'{"text": "one"}\n{"text": "two"}\n\n{"text": "three"}']  # fmt: skip
    out = []
    for selector in (0, 1, 2, 3, 4, 5):
        for body in bodies:
            out.append(bytes([selector, 7]) + body)
    return out + _seed_files("api-body")


def _webrtc_seeds() -> list[bytes]:
    out = []
    for sdp in _seed_files("webrtc-offer") + _seed_files("sdp"):
        out.append(b"\x01" + sdp)
        out.append(b"\x00" + json.dumps({"type": "offer", "sdp": sdp.decode("utf-8", "replace")})
                   .encode())  # fmt: skip
    return out


def _seed_files(target: str) -> list[bytes]:
    d = SEEDS / target
    return [p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()] if d.is_dir() else []


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sip-message", check_sip_message, 8192, _sip_seeds),
        Target("sip-stream", check_sip_stream, 8192, lambda: [b"\x03\x40\x80\xc0" + s
                                                              for s in _sip_seeds()]),
        Target("sip-layer", check_sip_layer, 8192, _sip_seeds),
        Target("sip-fields", check_sip_fields, 1024, _field_seeds),
        Target("digest", check_digest, 2048, _digest_seeds),
        Target("sip-auth", check_sip_auth, 2048, _auth_seeds),
        Target("sdp", check_sdp, 8192, _sdp_seeds),
        Target("sdp-crypto", check_sdp_crypto, 1024, _crypto_seeds),
        Target("webrtc-offer", check_webrtc_offer, 16384, _webrtc_seeds),
        Target("rtp", check_rtp, 4096, _rtp_seeds),
        Target("dtmf", check_dtmf, 1024, _dtmf_seeds),
        Target("bus-schema", check_bus_schema, 2048, _bus_seeds),
        Target("api-body", check_api_body, 4096, _api_seeds),
    )
}  # fmt: skip


def _selftest_check(data: bytes) -> None:
    """Crashes on inputs starting ``FUZZ`` (the runner's own test: a crash is caught, saved
    and reported)."""
    if data.startswith(b"FUZZ"):
        raise FuzzFailure("selftest: an input starting FUZZ")


# Not a parser: only for tests of the runner (not in TARGETS, so not in --target all).
SELFTEST = Target("selftest-crash", _selftest_check, 64, lambda: [b"seed", b"FUZZ!"])


def _target(name: str) -> Target:
    return SELFTEST if name == SELFTEST.name else TARGETS[name]


def regression_inputs(target: str) -> list[Path]:
    d = REGRESSIONS / target
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


# --- the atheris driver (child process) ----------------------------------------------------------
def child_main(argv: list[str]) -> int:
    """``python -m voxgate.bench.fuzz child TARGET -- LIBFUZZER_ARGS...``."""
    import atheris  # type: ignore[import-untyped]

    # The layer's "refused" warnings and the like would be most of the run's time.
    logging.disable(logging.CRITICAL)
    target = _target(argv[0])
    rest = argv[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    # Import (and warm) everything the target touches with our packages instrumented as
    # they load: coverage feedback for the parser and whatever of ours it calls (not the
    # standard library's or aiohttp's: instrument_all takes 15 s for little more signal).
    with atheris.instrument_imports(include=["gateway", "voxgate"]):
        for seed in target.seeds()[:5]:
            with contextlib.suppress(Exception):
                target.check(seed)
    check = target.check

    def one(data: bytes) -> None:
        check(data)

    atheris.Setup([sys.argv[0], *rest], one)
    atheris.Fuzz()
    return 0


# --- the runner ---------------------------------------------------------------------------------
@dataclass
class FuzzResult:
    target: str
    runs: int
    seconds: float
    exec_per_s: float
    coverage: int | None
    features: int | None
    corpus: int | None
    crashes: list[str]
    seeds: int
    rss_mb: int | None
    exit_code: int
    log_tail: str


_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
_STATUS = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)")
_DONE = re.compile(r"^Done (\d+) runs in (\d+) second", re.M)


def run_target(
    name: str, runs: int, *, timeout_s: int = 10, work: Path, max_len: int | None = None,
    extra: list[str] | None = None,
) -> FuzzResult:  # fmt: skip
    """Fuzz one target for ``runs`` inputs in a child process (atheris + libFuzzer)."""
    target = _target(name)
    corpus = work / f"corpus-{name}"
    seeds = work / f"seeds-{name}"
    artifacts = work / f"crashes-{name}"
    for d in (corpus, seeds, artifacts):
        d.mkdir(parents=True, exist_ok=True)
    seed_list = target.seeds() + [p.read_bytes() for p in regression_inputs(name)]
    for i, seed in enumerate(seed_list):
        (seeds / f"seed-{i:04d}").write_bytes(seed[: target.max_len])
    log = work / f"fuzz-{name}.log"
    argv = [
        sys.executable, "-m", "voxgate.bench.fuzz", "child", name, "--",
        f"-runs={runs}", f"-timeout={timeout_s}", f"-max_len={max_len or target.max_len}",
        f"-artifact_prefix={artifacts}/", "-print_final_stats=1", "-rss_limit_mb=4096",
        *(extra or []), str(corpus), str(seeds),
    ]  # fmt: skip
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        rc = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.monotonic() - t0
    text = log.read_text(errors="replace")
    stats = {k: int(v) for k, v in _STAT.findall(text)}
    status = _STATUS.findall(text)
    cov, ft, corp = (int(x) for x in status[-1]) if status else (None, None, None)
    executed = stats.get("number_of_executed_units", 0)
    rate = float(stats.get("average_exec_per_sec", 0))
    done = _DONE.findall(text)
    if done and int(done[-1][1]) > 0:  # libFuzzer's own clock (whole seconds), not startup
        rate = int(done[-1][0]) / int(done[-1][1])
    elif not rate and seconds > 0:  # under a second of fuzzing: a lower bound, with startup
        rate = executed / seconds
    crashes = sorted(p.name for p in artifacts.iterdir())
    return FuzzResult(
        target=name, runs=executed, seconds=round(seconds, 1),
        exec_per_s=rate, coverage=cov, features=ft,
        corpus=corp, crashes=crashes, seeds=len(seed_list), rss_mb=stats.get("peak_rss_mb"),
        exit_code=rc, log_tail="\n".join(text.splitlines()[-30:]) if rc else "",
    )  # fmt: skip


def format_results(results: list[FuzzResult]) -> str:
    lines = [
        f"{'target':<14}{'inputs':>11}{'exec/s':>9}{'time s':>9}{'cov':>7}{'ft':>7}"
        f"{'corpus':>8}{'seeds':>7}  crashes",
    ]
    for r in results:
        lines.append(
            f"{r.target:<14}{r.runs:>11}{r.exec_per_s:>9.0f}{r.seconds:>9.1f}"
            f"{r.coverage if r.coverage is not None else '-':>7}"
            f"{r.features if r.features is not None else '-':>7}"
            f"{r.corpus if r.corpus is not None else '-':>8}{r.seeds:>7}  "
            f"{', '.join(r.crashes) or 'none'}"
        )
        if r.exit_code and r.log_tail:
            lines.append("  " + r.log_tail.replace("\n", "\n  "))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxgate bench fuzz", description=__doc__.split("\n")[0])
    add_fuzz_arguments(p)
    return cmd_bench_fuzz(p.parse_args(argv))


def add_fuzz_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help=f"target (repeat; 'all' for every one): {', '.join(TARGETS)}",
    )
    p.add_argument("--runs", type=int, default=1_000_000, help="inputs per target (1,000,000)")
    p.add_argument("--timeout", type=int, default=10, help="seconds allowed per input (10)")
    p.add_argument("--max-len", type=int, default=None, help="longest input (per-target default)")
    p.add_argument(
        "--max-time",
        type=int,
        default=None,
        metavar="S",
        help="stop each target after S seconds of fuzzing even short of --runs "
        "(libFuzzer -max_total_time); the inputs run are what is reported",
    )
    p.add_argument("--keep", metavar="DIR", default=None, help="keep corpus, crashes, logs here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--list", action="store_true", help="list the targets and exit")  # fmt: skip


def cmd_bench_fuzz(args: argparse.Namespace) -> int:
    if args.list:
        for name, t in TARGETS.items():
            print(f"{name:<14} {(t.check.__doc__ or '').strip().splitlines()[0]}")
        return 0
    try:
        import atheris  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        print("voxgate bench fuzz: atheris is not installed (pip install atheris; the dev "
              "extra has it)", file=sys.stderr)  # fmt: skip
        return 1
    names = list(TARGETS) if "all" in args.target or not args.target else args.target
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        print(f"voxgate bench fuzz: unknown target {unknown[0]!r}; one of {', '.join(TARGETS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(args.keep or tempfile.mkdtemp(prefix="vg-fuzz-"))
    results: list[FuzzResult] = []
    for name in names:  # one at a time: each has the CPU to itself
        extra = [f"-max_total_time={args.max_time}"] if args.max_time else None
        r = run_target(name, args.runs, timeout_s=args.timeout, work=work, max_len=args.max_len,
                       extra=extra)  # fmt: skip
        results.append(r)
        if not args.json:
            print(format_results([r]).splitlines()[-1] if not r.exit_code
                  else format_results([r]), flush=True)  # fmt: skip
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        print()
        print(format_results(results))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.crashes or r.exit_code for r in results) else 0


if __name__ == "__main__":  # pragma: no cover - the atheris child and a standalone entry
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
