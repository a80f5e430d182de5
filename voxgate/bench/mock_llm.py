"""``voxgate mock-llm``: a scripted OpenAI-compatible chat server for tests and demos (no network,
no model): ``POST /v1/chat/completions`` answers from a script, streamed as SSE
``chat.completion.chunk`` lines then ``data: [DONE]`` (or one JSON body without ``stream``), and
``GET /requests`` returns every request body it received, in order.

The script is JSON: ``{"turns": [TURN, ...], "default": TURN}``. A turn is used when its
``match`` (a substring, case-insensitive) occurs in the last user message, else the next turn
without ``match`` in order, else ``default``:

- ``reply``: text, streamed ``chunk_words`` words per chunk (default 2);
- ``tool_calls``: ``[{"name": "hangup", "arguments": {...}}]`` (OpenAI function calling; the
  arguments may be a string, to send malformed JSON on purpose);
- ``delay_ms`` before the first chunk, ``gap_ms`` between chunks (a slow model);
- ``status``: answer with this HTTP status and an OpenAI-shaped error instead;
- ``garbage``: stream lines that are not JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web


class Script:
    def __init__(self, doc: dict[str, Any]) -> None:
        turns = doc.get("turns", [])
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ValueError("script: 'turns' must be a list of objects")
        self.turns: list[dict[str, Any]] = turns
        self.default: dict[str, Any] = doc.get("default") or {"reply": "Sorry, I have no answer."}
        self._used: set[int] = set()

    @classmethod
    def load(cls, path: str | Path) -> Script:
        return cls(json.loads(Path(path).read_text()))

    def pick(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = next(
            (str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"),
            "",
        ).lower()
        for i, t in enumerate(self.turns):
            if i not in self._used and t.get("match") and str(t["match"]).lower() in last:
                self._used.add(i)
                return t
        for i, t in enumerate(self.turns):
            if i not in self._used and not t.get("match"):
                self._used.add(i)
                return t
        return self.default


def _chunk(cid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    body = {
        "id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


def _tool_calls(turn: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for i, tc in enumerate(turn.get("tool_calls") or []):
        args = tc.get("arguments", {})
        calls.append({
            "index": i, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": tc["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)},
        })  # fmt: skip
    return calls


class MockLlm:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1/chat/completions", self.completions),
            web.get("/requests", self.list_requests),
        ])  # fmt: skip
        return app

    async def list_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        self.requests.append(body)
        turn = self.script.pick(list(body.get("messages") or []))
        model = str(body.get("model") or "mock")
        if turn.get("status"):
            error = {"message": f"scripted failure {turn['status']}", "type": "server_error"}
            return web.json_response({"error": error}, status=int(turn["status"]))
        await asyncio.sleep(float(turn.get("delay_ms", 0)) / 1000)
        cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        text = str(turn.get("reply", ""))
        calls = _tool_calls(turn)
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "index"} for c in calls
                ]
            return web.json_response({
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            })  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        gap = float(turn.get("gap_ms", 0)) / 1000
        if turn.get("garbage"):
            await resp.write(b"data: {not json at all\n\ndata: ???\n\n")
            await resp.write_eof()
            return resp
        await resp.write(_chunk(cid, model, {"role": "assistant", "content": ""}).encode())
        words = text.split(" ") if text else []
        n = max(1, int(turn.get("chunk_words", 2)))
        for i in range(0, len(words), n):
            piece = " ".join(words[i : i + n]) + (" " if i + n < len(words) else "")
            await resp.write(_chunk(cid, model, {"content": piece}).encode())
            if gap:
                await asyncio.sleep(gap)
        for c in calls:
            await resp.write(_chunk(cid, model, {"tool_calls": [c]}).encode())
        await resp.write(_chunk(cid, model, {}, finish).encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            n_words = len(words)
            usage = {"prompt_tokens": 0, "completion_tokens": n_words, "total_tokens": n_words}
            end = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": model, "choices": [], "usage": usage}  # fmt: skip
            await resp.write(f"data: {json.dumps(end)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mock-llm", help="a scripted OpenAI-compatible chat server for tests and demos"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8089)
    p.add_argument("--script", metavar="FILE", help="JSON script (default: a friendly default)")
    p.set_defaults(func=cmd_mock_llm)


def cmd_mock_llm(args: argparse.Namespace) -> int:
    script = Script.load(args.script) if args.script else Script({})
    print(f"mock LLM on http://{args.host}:{args.port}/v1 (requests: /requests)", flush=True)
    web.run_app(MockLlm(script).app(), host=args.host, port=args.port, print=None)
    return 0
