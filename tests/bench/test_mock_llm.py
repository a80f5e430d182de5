"""``voxgate mock-llm``: what an OpenAI-compatible streaming client sees (SSE chunks, tool
calls, usage, [DONE]), the scripted failures, and the record of requests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from voxgate.bench.mock_llm import MockLlm, Script

SCRIPT = {
    "turns": [
        {"match": "balance", "reply": "Your balance is forty dollars.", "chunk_words": 1},
        {"reply": "Goodbye then.", "tool_calls": [{"name": "hangup", "arguments": {}}]},
        {"status": 500},
        {"garbage": True},
        {"reply": "Bad tool.", "tool_calls": [{"name": "send_dtmf", "arguments": "{oops"}]},
    ],
    "default": {"reply": "Default."},
}


@pytest.fixture
async def server() -> AsyncIterator[tuple[TestServer, MockLlm]]:
    mock = MockLlm(Script(SCRIPT))
    srv = TestServer(mock.app(), host="127.0.0.1")
    await srv.start_server()
    yield srv, mock
    await srv.close()


async def chat(srv: TestServer, text: str, **extra: Any) -> tuple[int, list[Any]]:
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": text}], **extra}  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(str(srv.make_url("/v1/chat/completions")), json=body) as r,
    ):
        if r.status != 200:
            return r.status, [await r.json()]
        lines = [ln.decode().strip() async for ln in r.content]
    data = [ln[6:] for ln in lines if ln.startswith("data: ")]
    return 200, data


def content(chunks: list[Any]) -> str:
    out = []
    for c in chunks:
        for ch in json.loads(c).get("choices", []):
            out.append(ch["delta"].get("content") or "")
    return "".join(out)


async def test_streamed_reply_tools_usage_and_done(server: tuple[TestServer, MockLlm]) -> None:
    srv, mock = server
    status, data = await chat(srv, "What is my BALANCE?")
    assert status == 200 and data[-1] == "[DONE]"
    chunks = data[:-1]
    assert content(chunks) == "Your balance is forty dollars."
    assert len(chunks) >= 6  # one word per chunk: the client sees it arrive piece by piece
    assert json.loads(chunks[-1])["usage"]["completion_tokens"] == 5
    finish = [c["finish_reason"] for x in chunks for c in json.loads(x)["choices"]]
    assert finish[-1] == "stop"
    status, data = await chat(srv, "thanks")
    calls = [c["delta"]["tool_calls"][0] for x in data[:-1] for c in json.loads(x)["choices"]
             if c["delta"].get("tool_calls")]  # fmt: skip
    assert calls and calls[0]["function"]["name"] == "hangup"
    assert json.loads(calls[0]["function"]["arguments"]) == {}
    said = [m["messages"][-1]["content"] for m in mock.requests]
    assert said == ["What is my BALANCE?", "thanks"]
    assert mock.requests[0]["stream_options"] == {"include_usage": True}


async def test_scripted_failures(server: tuple[TestServer, MockLlm]) -> None:
    srv, _ = server
    await chat(srv, "skip the first unmatched turn")  # consumes the hang-up turn
    status, body = await chat(srv, "x")
    assert status == 500 and "scripted failure" in body[0]["error"]["message"]
    status, data = await chat(srv, "x")
    assert status == 200 and any("not json" in d for d in data)
    status, data = await chat(srv, "x")
    args = [c["delta"]["tool_calls"][0]["function"]["arguments"] for x in data[:-1]
            for c in json.loads(x)["choices"] if c["delta"].get("tool_calls")]  # fmt: skip
    assert args == ["{oops"]  # malformed on purpose
    status, data = await chat(srv, "x")
    assert content(data[:-1]) == "Default."  # the script ran out


async def test_without_stream_one_body(server: tuple[TestServer, MockLlm]) -> None:
    srv, _ = server
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            str(srv.make_url("/v1/chat/completions")),
            json={"model": "m", "messages": [{"role": "user", "content": "balance"}]},
        ) as r,
    ):
        doc = await r.json()
    assert doc["choices"][0]["message"]["content"] == "Your balance is forty dollars."
    async with aiohttp.ClientSession() as s, s.get(str(srv.make_url("/requests"))) as r:
        assert len(await r.json()) == 1


def test_bad_scripts_are_refused() -> None:
    with pytest.raises(ValueError):
        Script({"turns": "no"})
