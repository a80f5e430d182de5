"""Streamed say: text/plain (chunked) and ndjson bodies reach ``say_stream`` as they arrive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.call.control import BadRequest, Conflict, TextTooLong
from tests.api.conftest import ClientFactory, FakeControl, error

Client = TestClient[Any, Any]
PLAIN = {"Content-Type": "text/plain; charset=utf-8"}
NDJSON = {"Content-Type": "application/x-ndjson"}


async def test_pieces_arrive_while_the_body_is_still_sent(
    client: Client, control: FakeControl
) -> None:
    sent: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        for i, piece in enumerate(["Hello ", "there, ", "caller."]):
            sent.append(piece)
            yield piece.encode()
            # The next piece is only sent once the gateway has this one: if the API buffered
            # the body, this would wait forever (and time out).
            await control.wait_pieces(i + 1)

    resp = await client.post("/api/calls/c1/say", data=body(), headers=PLAIN)
    assert resp.status == 202
    assert await resp.json() == {"utterance_id": "u1"}
    assert control.pieces == ["Hello ", "there, ", "caller."]
    assert control.stream_ended is not None and control.stream_ended.result() is None


async def test_multibyte_characters_split_across_chunks(
    client: Client, control: FakeControl
) -> None:
    text = "héllo 😀 wörld"
    data = text.encode()
    # Cut inside "é" (2 bytes) and inside "😀" (4 bytes).
    cuts = [2, data.index("😀".encode()) + 2, len(data)]

    async def body() -> AsyncIterator[bytes]:
        start = 0
        for cut in cuts:
            yield data[start:cut]
            start = cut
            await control.wait_pieces(cuts.index(cut) + 1)

    resp = await client.post("/api/calls/c1/say", data=body(), headers=PLAIN)
    assert resp.status == 202
    assert "".join(control.pieces) == text
    # Each split character was held back whole into the next piece.
    assert control.pieces == ["h", "éllo ", "😀 wörld"]


async def test_plain_body_without_chunking(client: Client, control: FakeControl) -> None:
    resp = await client.post(
        "/api/calls/c1/say", data="Ça va?".encode(), headers={"Content-Type": "text/plain"}
    )
    assert resp.status == 202
    assert "".join(control.pieces) == "Ça va?"


async def test_too_long_mid_stream_is_413_at_once(
    make_client: ClientFactory, control: FakeControl
) -> None:
    client = await make_client(max_text_chars=10)

    async def body() -> AsyncIterator[bytes]:
        yield b"12345"
        await control.wait_pieces(1)
        yield b"678901"  # 11 characters in all
        # The gateway acts before the body ends: the speaker is told and stops.
        assert control.stream_ended is not None
        await control.stream_ended
        yield b"more"

    resp = await client.post("/api/calls/c1/say", data=body(), headers=PLAIN)
    assert resp.status == 413
    assert await resp.json() == error(
        "text_too_long", "streamed text passed 10 characters, the limit"
    )
    assert control.pieces == ["12345"]
    assert control.stream_ended is not None
    assert isinstance(control.stream_ended.result(), TextTooLong)


async def test_invalid_utf8(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/say", data=b"ok \xff no", headers=PLAIN)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", "request body is not valid UTF-8 (byte 3)")
    assert control.stream_ended is not None
    assert control.stream_ended.result() is not None  # never a clean end: nothing is spoken


async def test_truncated_utf8_at_end(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/say", data="ok é".encode()[:-1], headers=PLAIN)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", "request body is not valid UTF-8 (byte 3)")


async def test_empty_stream(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/say", data=b"", headers=PLAIN)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", "the request body has no text")


async def test_non_utf8_charset(client: Client) -> None:
    resp = await client.post(
        "/api/calls/c1/say", data=b"hi", headers={"Content-Type": "text/plain; charset=latin-1"}
    )
    assert resp.status == 415
    assert await resp.json() == error("unsupported_media_type", "text must be UTF-8, not latin-1")


async def test_stream_unknown_call_answers_before_the_body_ends(client: Client) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"hello"

    resp = await client.post("/api/calls/nope/say", data=body(), headers=PLAIN)
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_background_consumer_still_waits_for_the_whole_body(
    client: Client, control: FakeControl
) -> None:
    # A say_stream that returns its id at once and reads the pieces in a task.
    control.stream_in_background = True

    async def body() -> AsyncIterator[bytes]:
        yield b"one "
        await control.wait_pieces(1)
        yield b"two"

    resp = await client.post("/api/calls/c1/say", data=body(), headers=PLAIN)
    assert resp.status == 202
    assert control.stream_ended is not None
    assert await control.stream_ended is None
    assert control.pieces == ["one ", "two"]


async def test_ndjson(client: Client, control: FakeControl) -> None:
    chunks = [b'{"text": "Hel', b'lo "}\n\n{"text": "w\xc3', b'\xb6rld"}\n', b'{"text": "!"}']

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    resp = await client.post("/api/calls/c1/say", data=body(), headers=NDJSON)
    assert resp.status == 202
    assert await resp.json() == {"utterance_id": "u1"}
    assert control.pieces == ["Hello ", "wörld", "!"]


async def test_ndjson_lines_are_forwarded_as_they_complete(
    client: Client, control: FakeControl
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"text": "first"}\n'
        await control.wait_pieces(1)
        yield b'{"text": "second"}\n'

    resp = await client.post("/api/calls/c1/say", data=body(), headers=NDJSON)
    assert resp.status == 202
    assert control.pieces == ["first", "second"]


async def test_ndjson_bad_lines(client: Client, control: FakeControl) -> None:
    cases = [
        (
            b'{"text": "a"}\nnope\n',
            "ndjson line 2: not valid JSON: Expecting value: line 1 column 1 (char 0)",
        ),
        (b'["a"]\n', "ndjson line 1: expected an object, got array"),
        (b'{"text": 1}\n', "ndjson line 1: field 'text' must be a string, got number"),
        (b'{"txt": "a"}\n', "ndjson line 1: unknown field 'txt'"),
    ]
    for data, message in cases:
        resp = await client.post("/api/calls/c1/say", data=data, headers=NDJSON)
        assert resp.status == 422, message
        assert await resp.json() == error("bad_request", message)


async def test_ndjson_too_long(make_client: ClientFactory, control: FakeControl) -> None:
    client = await make_client(max_text_chars=8)
    resp = await client.post(
        "/api/calls/c1/say", data=b'{"text": "12345"}\n{"text": "6789"}\n', headers=NDJSON
    )
    assert resp.status == 413
    assert await resp.json() == error(
        "text_too_long", "streamed text passed 8 characters, the limit"
    )
    assert control.pieces == ["12345"]


async def test_ndjson_line_too_long(make_client: ClientFactory) -> None:
    client = await make_client(max_body_bytes=64)
    resp = await client.post("/api/calls/c1/say", data=b'{"text": "' + b"x" * 100, headers=NDJSON)
    assert resp.status == 413
    assert await resp.json() == error("body_too_large", "ndjson line 1 is over 64 bytes")


async def test_client_gone_mid_stream_is_not_a_clean_end(
    client: Client, control: FakeControl
) -> None:
    # A raw socket, so the body can stop half-way without the client library tidying up.
    _, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"POST /api/calls/c1/say HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHello\r\n"
    )
    await writer.drain()
    await control.wait_pieces(1)
    writer.close()
    await writer.wait_closed()
    assert control.stream_ended is not None
    ended = await asyncio.wait_for(control.stream_ended, 2)
    assert isinstance(ended, BadRequest)  # the speaker is told the text is incomplete
    assert control.pieces == ["Hello"]


async def test_refusal_answers_while_the_body_is_still_coming(
    client: Client, control: FakeControl
) -> None:
    control.stream_refusal = Conflict("call 'c1' is on hold")

    async def body() -> AsyncIterator[bytes]:
        yield b"hello"
        await asyncio.sleep(30)  # a slow producer: the answer must not wait for it
        yield b"never"

    resp = await asyncio.wait_for(
        client.post("/api/calls/c1/say", data=body(), headers=PLAIN), timeout=3
    )
    assert resp.status == 409
    assert await resp.json() == error("conflict", "call 'c1' is on hold")


async def test_unexpected_say_stream_failure_is_500(client: Client, control: FakeControl) -> None:
    control.stream_refusal = RuntimeError("boom")
    resp = await client.post("/api/calls/c1/say", data=b"hi", headers=PLAIN)
    assert resp.status == 500
    assert await resp.json() == error("internal_error", "internal error")
