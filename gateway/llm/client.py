"""Streaming chat client for an OpenAI-compatible server (vLLM, llama.cpp, Ollama, OpenAI).

Why its own client rather than the ``openai`` package: a voice agent needs the first words as
soon as they exist, a deadline on every wait (a silent model is dead air on a phone line), the
connection dropped the moment the caller barges in, and failures sorted into a few kinds the
agent can act on (``LlmError.kind``). The byte-level work is the sans-I/O ``sse`` parser; this
module only moves bytes between aiohttp and it.

Request: ``POST {base_url}/chat/completions`` as in the OpenAI chat completions API, with
``stream: true`` and ``stream_options.include_usage`` (the last chunk then carries token counts).
A server that ignores ``stream`` and answers ``application/json`` is read with
``parse_completion``.

Deadlines: ``timeout_s`` bounds the connect plus the wait for the first event, and then every
wait for the next bytes; the time the consumer takes between events does not count.

Barge-in: stopping early is closing the generator (``aclose()``, ``contextlib.aclosing``, or
``break`` out of ``async for``, which CPython closes when the generator is dropped); the response
is then closed, not drained, so the server sees the disconnect and stops generating, and the
pooled connection slot is free at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncGenerator
from typing import Literal

import aiohttp

from gateway.llm.sse import (
    ChatEvent,
    ChatStreamParser,
    LlmProtocolError,
    parse_completion,
)

__all__ = ["ChatClient", "LlmError", "LlmErrorKind", "tool_spec"]

log = logging.getLogger(__name__)

LlmErrorKind = Literal["unreachable", "status", "malformed", "timeout"]

_MAX_ERROR_BODY = 64 * 1024  # bytes of a non-2xx body read for its message
_MAX_ERROR_CHARS = 300  # characters of the server's message kept in LlmError.message
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


class LlmError(Exception):
    """A chat request that failed, sorted for the agent:

    - ``unreachable``: no answer from the server (connection refused, DNS, reset before the
      response headers);
    - ``status``: a non-2xx answer; ``status`` holds it and ``message`` the server's reason;
    - ``malformed``: the answer is not an OpenAI chat completion, or the stream was cut off
      (ended without ``[DONE]`` and without a ``finish_reason``);
    - ``timeout``: no first event, or no next bytes, within ``timeout_s``.

    Messages never contain the API key.
    """

    def __init__(self, kind: LlmErrorKind, message: str, *, status: int | None = None) -> None:
        super().__init__(f"LLM {kind}: {message}")
        self.kind: LlmErrorKind = kind
        self.message = message
        self.status = status


def tool_spec(
    name: str, description: str, parameters: dict[str, object] | None = None
) -> dict[str, object]:
    """A tool in the OpenAI function-calling format; ``parameters`` is a JSON Schema object
    (none: a function without arguments)."""
    if not _TOOL_NAME.match(name):
        raise ValueError(f"tool name must match {_TOOL_NAME.pattern}: {name!r}")
    params = parameters if parameters is not None else {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


class ChatClient:
    """One model on one OpenAI-compatible server. ``stream`` may run concurrently (one HTTP
    request each). Pass ``session`` to share a connection pool; else the client makes its own
    (on first use) and ``close`` closes it."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None,
        temperature: float,
        max_tokens: int,
        timeout_s: float,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL: {base_url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0: {timeout_s}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1: {max_tokens}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self._api_key = api_key or None
        self._session = session
        self._owns_session = session is None
        self._closed = False

    def __repr__(self) -> str:  # no key here
        return f"ChatClient({self.url!r}, model={self.model!r})"

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session this client made (a session passed in is the caller's)."""
        self._closed = True
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def request_body(
        self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None
    ) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:  # OpenAI refuses "tools": [] (the array must not be empty)
            body["tools"] = tools
        return body

    def _headers(self) -> dict[str, str]:
        if self._api_key is None:
            return {}
        return {"Authorization": f"Bearer {self._api_key}"}

    def _redact(self, text: str) -> str:
        # A server may echo the key it refused (in a 401 message): never pass it on.
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    def _error(self, kind: LlmErrorKind, message: str, status: int | None = None) -> LlmError:
        return LlmError(kind, self._redact(message), status=status)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("ChatClient is closed")
        if self._session is None:
            # Our own deadlines (asyncio.timeout) rule; aiohttp's 5-minute total would cut a
            # long stream.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def stream(
        self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None
    ) -> AsyncGenerator[ChatEvent, None]:
        """The reply as it arrives: ``TextDelta``s, complete ``ToolCall``s, then ``Finished``.
        Raises ``LlmError``. Close the generator to stop early (barge-in): typed as a generator,
        not just an iterator, so that ``aclose()`` and ``contextlib.aclosing`` type-check."""
        session = self._get_session()
        body = self.request_body(messages, tools)
        loop = asyncio.get_running_loop()
        first_deadline = loop.time() + self.timeout_s
        log.debug(
            "POST %s model=%s messages=%d tools=%d",
            self.url,
            self.model,
            len(messages),
            len(tools or []),
        )
        resp: aiohttp.ClientResponse | None = None
        clean = False  # the response was read to its end: its connection may be reused
        try:
            try:
                async with asyncio.timeout_at(first_deadline):
                    resp = await session.post(
                        self.url,
                        json=body,
                        headers=self._headers(),
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s),
                    )
            except TimeoutError:
                raise self._error(
                    "timeout", f"no response from {self.url} within {self.timeout_s:g} s"
                ) from None
            except (aiohttp.ClientError, OSError) as e:
                raise self._error(
                    "unreachable", f"cannot reach {self.url}: {type(e).__name__}: {e}"
                ) from None

            if not 200 <= resp.status < 300:
                reason = await self._error_text(resp, max(first_deadline, loop.time() + 1.0))
                msg = f"HTTP {resp.status} from {self.url}" + (f": {reason}" if reason else "")
                raise self._error("status", msg, resp.status)

            if resp.content_type == "application/json":  # stream ignored: one body
                try:
                    async with asyncio.timeout_at(first_deadline):
                        raw = await resp.read()
                except TimeoutError:
                    raise self._error(
                        "timeout", f"no complete body from {self.url} within {self.timeout_s:g} s"
                    ) from None
                except aiohttp.ClientError as e:
                    raise self._error(
                        "malformed", f"body from {self.url} cut off: {type(e).__name__}: {e}"
                    ) from None
                try:
                    events = parse_completion(raw)
                except LlmProtocolError as e:
                    raise self._error("malformed", f"{self.url}: {e}") from None
                clean = True
                for event in events:
                    yield event
                return

            parser = ChatStreamParser()
            got_event = False
            while not parser.done:
                deadline = first_deadline if not got_event else loop.time() + self.timeout_s
                lost: aiohttp.ClientError | None = None
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    what = "no data mid-stream" if got_event else "no first event"
                    raise self._error(
                        "timeout", f"{what} from {self.url} within {self.timeout_s:g} s"
                    ) from None
                except aiohttp.ClientError as e:  # connection lost mid-stream: an end of bytes
                    chunk, lost = b"", e
                try:
                    events = parser.feed(chunk) if chunk else parser.close()
                except LlmProtocolError as e:
                    cause = f" ({type(lost).__name__}: {lost})" if lost else ""
                    raise self._error("malformed", f"{self.url}: {e}{cause}") from None
                for event in events:
                    got_event = True
                    yield event
                if not chunk:
                    break
            clean = True
        finally:
            if resp is not None:
                if clean:
                    resp.release()  # back to the pool (closed instead if bytes remain unread)
                else:
                    resp.close()  # early stop or failure: drop the connection now

    async def _error_text(self, resp: aiohttp.ClientResponse, deadline: float) -> str:
        """The server's reason for a non-2xx answer, from an OpenAI-shaped ``{"error":
        {"message": ...}}`` body if it is one, else the start of the body."""
        buf = bytearray()
        try:
            async with asyncio.timeout_at(deadline):
                while len(buf) < _MAX_ERROR_BODY:
                    piece = await resp.content.read(_MAX_ERROR_BODY - len(buf))
                    if not piece:
                        break
                    buf += piece
        except (TimeoutError, aiohttp.ClientError):
            pass  # the status alone must do
        text = buf.decode("utf-8", errors="replace").strip()
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            err = doc.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                text = err["message"]
            elif isinstance(err, str):
                text = err
            elif isinstance(doc.get("message"), str):
                text = doc["message"]
            elif isinstance(doc.get("detail"), str):  # FastAPI-style servers
                text = doc["detail"]
        text = " ".join(text.split())  # one line, whatever the server sent
        return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "…"
