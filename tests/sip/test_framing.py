"""Stream framing: any split of the stream gives the same messages as feeding it whole."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from gateway.sip.errors import SipParseError
from gateway.sip.framing import StreamFramer
from gateway.sip.message import Request

FIXTURES = Path(__file__).resolve().parents[2] / "sip-fixtures" / "rfc4475"
STREAM = b"".join(
    [
        b"\r\n\r\n",  # RFC 5626 ping before the first message
        (FIXTURES / "wsinv.dat").read_bytes(),
        (FIXTURES / "unreason.dat").read_bytes(),
        b"\r\n",
        (FIXTURES / "mismatch01.dat").read_bytes(),  # bad, but framed: reported, stream goes on
        (FIXTURES / "esc01.dat").read_bytes(),
        (FIXTURES / "longreq.dat").read_bytes(),
    ]
)


def summary(items: Sequence[object]) -> list[str]:
    return [f"error:{i.reason}" if isinstance(i, SipParseError) else repr(i) for i in items]


def test_byte_by_byte_equals_whole() -> None:
    whole = StreamFramer().feed(STREAM)
    framer = StreamFramer()
    pieces: list[object] = []
    for i in range(len(STREAM)):
        pieces.extend(framer.feed(STREAM[i : i + 1]))
    assert summary(pieces) == summary(whole)
    assert [p for p in pieces if not isinstance(p, SipParseError)] == [
        w for w in whole if not isinstance(w, SipParseError)
    ]
    assert len(whole) == 5 and isinstance(whole[2], SipParseError) and not whole[2].framing


def test_random_splits_equal_whole() -> None:
    whole = summary(StreamFramer().feed(STREAM))
    rng = random.Random(7)
    for _ in range(50):
        framer = StreamFramer()
        out: list[object] = []
        pos = 0
        while pos < len(STREAM):
            step = rng.randint(1, 300)
            out.extend(framer.feed(STREAM[pos : pos + step]))
            pos += step
        assert summary(out) == whole


def test_content_length_across_reads() -> None:
    body = b"x" * 1000
    head = (
        b"MESSAGE sip:a@b SIP/2.0\r\nVia: SIP/2.0/TCP h;branch=z9hG4bK1\r\n"
        b"From: <sip:x@y>;tag=1\r\n"
        b"To: <sip:a@b>\r\nCall-ID: m1\r\nCSeq: 1 MESSAGE\r\nContent-Length: 1000\r\n\r\n"
    )
    framer = StreamFramer()
    assert framer.feed(head + body[:10]) == []
    assert framer.feed(body[10:999]) == []
    (message,) = framer.feed(body[999:] + b"\r\n")
    assert isinstance(message, Request) and message.body == body


def test_pings_are_counted() -> None:
    framer = StreamFramer()
    assert framer.feed(b"\r\n\r\n\r\n\r\n") == []
    assert framer.pings == 2


def test_size_limit_on_headers_and_body() -> None:
    framer = StreamFramer(max_message_size=200)
    (err,) = framer.feed(b"INVITE sip:a@b SIP/2.0\r\n" + b"X-Pad: " + b"p" * 300)
    assert isinstance(err, SipParseError) and err.framing and err.status == 513
    framer = StreamFramer(max_message_size=200)
    (err,) = framer.feed(b"INVITE sip:a@b SIP/2.0\r\nContent-Length: 5000\r\n\r\n")
    assert isinstance(err, SipParseError) and err.framing


def test_conflicting_content_lengths_break_the_stream() -> None:
    framer = StreamFramer()
    (err,) = framer.feed(b"OPTIONS sip:a@b SIP/2.0\r\nl: 3\r\nContent-Length: 4\r\n\r\nabcd")
    assert isinstance(err, SipParseError) and err.framing and framer.broken
