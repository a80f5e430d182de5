"""The streaming chat client against real HTTP servers on 127.0.0.1: the scripted
``voxgate mock-llm`` (replies, tool calls, scripted failures, slow models) and tiny aiohttp apps
for what the mock does not show (headers, a disconnecting client, a JSON-only server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.llm.client import ChatClient, LlmError, tool_spec
from gateway.llm.sse import ChatEvent, Finished, TextDelta, ToolCall
from voxgate.bench.mock_llm import MockLlm, Script

TIMEOUT_S = 0.3
SLACK_S = 0.5

HANGUP = tool_spec(
    "hangup",
    "End the call.",
    {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
)


class Servers:
    """Servers started by one test, all closed after it."""

    def __init__(self) -> None:
        self._servers: list[TestServer] = []

    async def app(self, app: web.Application) -> str:
        srv = TestServer(app, host="127.0.0.1")
        await srv.start_server()
        self._servers.append(srv)
        return str(srv.make_url("/v1"))

    async def mock(self, *turns: dict[str, Any]) -> tuple[str, MockLlm]:
        mock = MockLlm(Script({"turns": list(turns), "default": {"reply": "Default."}}))
        return await self.app(mock.app()), mock

    async def close(self) -> None:
        for srv in self._servers:
            await srv.close()


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    yield s
    await s.close()


def client(base_url: str, **kw: Any) -> ChatClient:
    args: dict[str, Any] = {
        "api_key": None,
        "temperature": 0.3,
        "max_tokens": 64,
        "timeout_s": TIMEOUT_S,
    }
    return ChatClient(base_url, "test-model", **(args | kw))


USER: list[dict[str, object]] = [{"role": "user", "content": "hello"}]


async def collect(c: ChatClient, tools: list[dict[str, object]] | None = None) -> list[ChatEvent]:
    return [e async for e in c.stream(list(USER), tools)]


async def failure(c: ChatClient) -> tuple[LlmError, float]:
    t0 = time.monotonic()
    with pytest.raises(LlmError) as e:
        await collect(c)
    return e.value, time.monotonic() - t0


def text(events: list[ChatEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_streamed_reply(servers: Servers) -> None:
    reply = "Your balance is forty dollars and twelve cents."
    url, _ = await servers.mock({"reply": reply, "chunk_words": 1})
    async with client(url + "/") as c:  # a trailing slash is fine
        events = await collect(c)
    assert text(events) == reply
    assert sum(isinstance(e, TextDelta) for e in events) == 8  # streamed, word by word
    usage: dict[str, object] = {"prompt_tokens": 0, "completion_tokens": 8, "total_tokens": 8}
    assert events[-1] == Finished("stop", usage)


async def test_tool_calls(servers: Servers) -> None:
    url, _ = await servers.mock(
        {"reply": "Goodbye.", "tool_calls": [{"name": "hangup", "arguments": {"reason": "done"}}]},
        {"tool_calls": [{"name": "send_dtmf", "arguments": "{oops"}]},
    )
    async with client(url) as c:
        events = await collect(c, [HANGUP])
        assert text(events) == "Goodbye."
        (call,) = [e for e in events if isinstance(e, ToolCall)]
        assert call.name == "hangup" and call.arguments == {"reason": "done"}
        assert call.error is None and call.id.startswith("call_")
        assert isinstance(events[-1], Finished) and events[-1].reason == "tool_calls"
        # Malformed arguments are the model's mistake, reported on the call, not raised.
        events = await collect(c, [HANGUP])
    (bad,) = [e for e in events if isinstance(e, ToolCall)]
    assert bad.name == "send_dtmf" and bad.arguments is None and bad.raw_arguments == "{oops"
    assert bad.error is not None and bad.error.startswith("arguments of 'send_dtmf' are not valid")


async def test_request_body(servers: Servers) -> None:
    url, _ = await servers.mock({"reply": "a"}, {"reply": "b"})
    async with client(url, temperature=0.25, max_tokens=99) as c:
        await collect(c, [HANGUP])
        await collect(c)
        async with aiohttp.ClientSession() as s, s.get(url.removesuffix("/v1") + "/requests") as r:
            first, second = await r.json()
    assert first == {
        "model": "test-model",
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.25,
        "max_tokens": 99,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "hangup",
                    "description": "End the call.",
                    "parameters": HANGUP["function"]["parameters"],  # type: ignore[index]
                },
            }
        ],
    }
    assert "tools" not in second  # only when given


async def test_authorization_only_with_a_key_and_never_in_errors(servers: Servers) -> None:
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        seen.append(auth)
        # Like a server that echoes what it refused.
        msg = f"Incorrect API key provided: {auth}"
        return web.json_response({"error": {"message": msg}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    url = await servers.app(app)
    async with client(url, api_key="sk-secret-123") as c:
        err, _ = await failure(c)
    async with client(url, api_key=None) as c:
        await failure(c)
    assert seen == ["Bearer sk-secret-123", None]
    assert err.kind == "status" and err.status == 401
    assert "sk-secret-123" not in err.message and "sk-secret-123" not in str(err)
    assert err.message.endswith("Incorrect API key provided: Bearer [redacted]")
    assert "sk-secret" not in repr(client(url, api_key="sk-secret-123"))


async def test_status_error_carries_the_servers_message(servers: Servers) -> None:
    url, _ = await servers.mock({"status": 500})
    async with client(url) as c:
        err, _ = await failure(c)
    assert err.kind == "status" and err.status == 500
    assert err.message == f"HTTP 500 from {url}/chat/completions: scripted failure 500"


async def test_garbage_is_malformed(servers: Servers) -> None:
    url, _ = await servers.mock({"garbage": True})
    async with client(url) as c:
        err, _ = await failure(c)
    assert err.kind == "malformed" and err.status is None
    assert err.message == f"{url}/chat/completions: SSE data is not JSON: '{{not json at all'"


async def test_slow_first_event_times_out(servers: Servers) -> None:
    url, _ = await servers.mock({"reply": "late", "delay_ms": 5000})
    async with client(url) as c:
        err, took = await failure(c)
    assert err.kind == "timeout"
    assert err.message == f"no response from {url}/chat/completions within 0.3 s"
    assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S


async def test_gap_between_chunks_times_out(servers: Servers) -> None:
    url, _ = await servers.mock({"reply": "one two three", "chunk_words": 1, "gap_ms": 5000})
    got: list[ChatEvent] = []
    async with client(url) as c:
        with pytest.raises(LlmError) as e:
            async for event in c.stream(list(USER)):
                got.append(event)
                t0 = time.monotonic()
    assert got == [TextDelta("one ")]
    assert e.value.kind == "timeout"
    assert e.value.message == f"no data mid-stream from {url}/chat/completions within 0.3 s"
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + SLACK_S


async def test_connection_refused_is_unreachable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with client(f"http://127.0.0.1:{port}/v1") as c:
        err, took = await failure(c)
    assert err.kind == "unreachable" and err.status is None
    assert err.message.startswith(
        f"cannot reach http://127.0.0.1:{port}/v1/chat/completions: ClientConnectorError: "
    )
    assert took < TIMEOUT_S + SLACK_S


async def test_early_close_frees_the_connection(servers: Servers) -> None:
    # One connection in the pool: if barge-in left the first stream's connection busy, the
    # second request would wait for it (and time out) instead of starting at once.
    words = " ".join(f"w{i}" for i in range(50))
    url, _ = await servers.mock({"reply": words, "chunk_words": 1, "gap_ms": 100}, {"reply": "ok"})
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        c = client(url, session=session)
        async with contextlib.aclosing(c.stream(list(USER))) as events:
            async for event in events:
                assert event == TextDelta("w0 ")
                break
        t0 = time.monotonic()
        assert text(await collect(c)) == "ok"
        assert time.monotonic() - t0 < TIMEOUT_S
        await c.close()
        assert not session.closed  # the caller's session is the caller's to close


def endless_app(disconnected: asyncio.Event) -> web.Application:
    """A model that never stops talking until the client goes away."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                body = {"choices": [{"index": 0, "delta": {"content": "la "}}]}
                await resp.write(f"data: {json.dumps(body)}\n\n".encode())
                await asyncio.sleep(0.02)
        except (ConnectionError, asyncio.CancelledError):
            disconnected.set()
            raise

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


@pytest.mark.parametrize("how", ["aclose", "break"])
async def test_the_server_sees_the_client_go(servers: Servers, how: str) -> None:
    disconnected = asyncio.Event()
    url = await servers.app(endless_app(disconnected))
    async with client(url) as c:
        n = 0
        if how == "aclose":
            gen = c.stream(list(USER))
            async for _ in gen:
                n += 1
                if n == 3:
                    break
            await gen.aclose()
        else:  # the generator is dropped: CPython closes it through the loop's asyncgen hooks
            async for _ in c.stream(list(USER)):
                n += 1
                if n == 3:
                    break
        await asyncio.wait_for(disconnected.wait(), 1.0)


async def test_a_server_that_ignores_stream(servers: Servers) -> None:
    async def handler(request: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "café – 5 €"}
        doc = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        return web.json_response(doc)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with client(await servers.app(app)) as c:
        assert await collect(c) == [TextDelta("café – 5 €"), Finished("stop", None)]


async def test_a_stream_cut_off_is_malformed(servers: Servers) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        body = {"choices": [{"index": 0, "delta": {"content": "half a "}}]}
        await resp.write(f"data: {json.dumps(body)}\n\n".encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    url = await servers.app(app)
    got: list[ChatEvent] = []
    async with client(url) as c:
        with pytest.raises(LlmError) as e:
            async for event in c.stream(list(USER)):
                got.append(event)
    assert got == [TextDelta("half a ")]
    assert e.value.kind == "malformed"
    assert e.value.message == (
        f"{url}/chat/completions: stream ended before [DONE] and without a finish_reason (cut off?)"
    )


def test_tool_spec_and_arguments_checks() -> None:
    assert tool_spec("hangup", "End the call.") == {
        "type": "function",
        "function": {
            "name": "hangup",
            "description": "End the call.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    with pytest.raises(ValueError, match="tool name"):
        tool_spec("hang up", "no spaces")
    with pytest.raises(ValueError, match="base_url"):
        client("127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="timeout_s"):
        client("http://x/v1", timeout_s=0)


async def test_a_closed_client_refuses(servers: Servers) -> None:
    url, _ = await servers.mock({"reply": "a"})
    c = client(url)
    await collect(c)
    await c.close()
    with pytest.raises(RuntimeError, match="closed"):
        await collect(c)
