"""Sans-I/O parser for an OpenAI-compatible chat completion stream (``stream: true``).

Why sans-I/O (as h11 does for HTTP): the byte-level rules (Server-Sent Events framing, UTF-8
split at any byte, tool-call deltas accumulated across chunks) are where streaming clients go
wrong, and they are easiest to get right and to test exhaustively without sockets or an event
loop. ``ChatStreamParser`` takes bytes as they come (``feed``), returns the events they
complete, and is told when the bytes end (``close``); ``client.ChatClient`` is only the asyncio
adapter around it. Feeding a body in any split gives the same events as ``parse_stream`` on the
whole body: events are cut at SSE event boundaries, never at ``feed`` boundaries.

The framing follows WHATWG HTML §9.2.6 "Interpreting an event stream": lines end in CRLF, LF or
CR; a line starting with ``:`` is a comment; ``field: value`` (one leading space dropped); the
``data`` lines of one event are joined with LF; an empty line dispatches the event. Deliberate
deviations, each for a real server: at the end of the bytes the last line and the last event are
dispatched even without their line end / blank line (WHATWG discards them; a server that ends
with ``data: [DONE]`` and no newline did finish), and whitespace-only ``data`` is a keep-alive.

The payload follows the OpenAI chat completions streaming format: each event's data is a
``chat.completion.chunk`` object whose ``choices[0].delta`` carries ``content`` text and/or
``tool_calls`` fragments (the first fragment of a call has ``id`` and ``function.name``, later
ones append to ``function.arguments``, all keyed by ``index``), a chunk with ``finish_reason``
ends the choice, a last chunk with empty ``choices`` carries ``usage`` (with
``stream_options.include_usage``), and ``data: [DONE]`` ends the stream. Only choice 0 is read
(the client asks for ``n=1``).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = [
    "ChatEvent",
    "ChatStreamParser",
    "Finished",
    "LlmProtocolError",
    "TextDelta",
    "ToolCall",
    "parse_completion",
    "parse_stream",
]

# A line longer than this is not a chat chunk: refuse it rather than buffer without bound.
MAX_LINE_BYTES = 1 << 20
_EXCERPT_CHARS = 60
_BOM = b"\xef\xbb\xbf"  # WHATWG: one leading U+FEFF is dropped from the stream
_EOL = re.compile(rb"\r\n|\r|\n")


class LlmProtocolError(Exception):
    """The bytes are not an OpenAI-compatible chat completion (or the server said it failed)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the assistant's reply text, as the server streamed it."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete function call. ``arguments`` is None exactly when ``error`` says why (not
    JSON, not a JSON object, no function name); ``raw_arguments`` is the text as sent."""

    id: str  # "" when the server sent none
    name: str
    arguments: dict[str, object] | None
    raw_arguments: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of the reply: ``reason`` is the server's ``finish_reason`` ("stop", "length",
    "tool_calls", ...; "stop" when it sent none) and ``usage`` its token counts, if sent."""

    reason: str
    usage: dict[str, object] | None = None


ChatEvent: TypeAlias = TextDelta | ToolCall | Finished


def _excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """A short, quoted, control-character-escaped piece of ``text`` for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _error_message(err: object) -> str:
    """The human part of an OpenAI-shaped ``error`` value (``{"message": ...}`` or a string)."""
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            return msg
        return json.dumps(err)
    return str(err)


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


@dataclass(slots=True)
class _PendingCall:
    """One tool call being assembled from its deltas."""

    index: int
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)

    def add(self, call: dict[str, object], excerpt: str) -> None:
        cid = call.get("id")
        if isinstance(cid, str) and cid and not self.id:
            self.id = cid
        fn = call.get("function")
        if fn is None:
            return
        if not isinstance(fn, dict):
            raise LlmProtocolError(f"tool call 'function' is not an object: {excerpt}")
        name = fn.get("name")
        # OpenAI sends the name once, in the first delta; some servers repeat it in every one.
        if isinstance(name, str) and name and not self.name:
            self.name = name
        args = fn.get("arguments")
        if isinstance(args, str):
            self.parts.append(args)
        elif args is not None:  # an object instead of its JSON text (seen in non-stream bodies)
            self.parts.append(json.dumps(args))

    def finish(self) -> ToolCall:
        raw = "".join(self.parts)
        if not self.name:
            error = f"tool call #{self.index} has no function name"
            return ToolCall(self.id, "", None, raw, error)
        if not raw.strip():
            # A function without parameters: OpenAI sends "{}", some servers send nothing.
            return ToolCall(self.id, self.name, {}, raw)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            error = f"arguments of {self.name!r} are not valid JSON ({e}): {_excerpt(raw)}"
            return ToolCall(self.id, self.name, None, raw, error)
        if not isinstance(value, dict):
            error = (
                f"arguments of {self.name!r} are {_json_type(value)}, not a JSON object: "
                f"{_excerpt(raw)}"
            )
            return ToolCall(self.id, self.name, None, raw, error)
        return ToolCall(self.id, self.name, value, raw)


class _State(enum.Enum):
    STREAMING = "streaming"  # reading events
    DONE = "done"  # [DONE] seen (or the stream completed at close): later bytes are ignored
    CLOSED = "closed"  # close() returned
    FAILED = "failed"  # an LlmProtocolError was raised; the parser is unusable


class ChatStreamParser:
    """Bytes of a ``text/event-stream`` chat completion in, ``ChatEvent``s out.

    ``feed`` any number of times, then ``close`` once at the end of the bytes. Events come in
    stream order: ``TextDelta``s, then each ``ToolCall`` once complete (at ``finish_reason``, or
    at ``[DONE]``/``close``), then one ``Finished`` at ``[DONE]``. A stream that ends before
    ``[DONE]`` still finishes if a ``finish_reason`` came (some servers omit ``[DONE]``); one
    that ends before both raises (its pending tool calls are dropped: cut-off arguments cannot
    be trusted). Anything malformed raises ``LlmProtocolError``; the parser then stays failed.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max_line = max_line_bytes
        self._state = _State.STREAMING
        self._failure = ""
        # Framing state.
        self._buf = bytearray()  # bytes after the last complete line
        self._scanned = 0  # bytes of _buf already searched for a line end (none found)
        self._bom_checked = False
        self._skip_lf = False  # the last line ended in CR at the end of a feed: LF may follow
        self._data: list[str] = []  # data lines of the event being read
        self._event_type = ""
        # Chat state.
        self._calls: dict[int, _PendingCall] = {}
        self._finish: str | None = None
        self._usage: dict[str, object] | None = None

    @property
    def done(self) -> bool:
        """True once the stream is complete (``[DONE]`` seen, or completed at ``close``)."""
        return self._state in (_State.DONE, _State.CLOSED)

    def feed(self, data: bytes) -> list[ChatEvent]:
        """The events that ``data`` (the next bytes, split anywhere) completes."""
        self._check_open("feed")
        if self._state is _State.DONE:
            return []  # nothing is defined after [DONE]
        self._buf += data
        out: list[ChatEvent] = []
        try:
            self._read_lines(out)
        except LlmProtocolError as e:
            self._fail(e)
            raise
        return out

    def close(self) -> list[ChatEvent]:
        """The end of the bytes: the events still pending. Raises ``LlmProtocolError`` if the
        stream was cut off (neither ``[DONE]`` nor a ``finish_reason``). Idempotent."""
        if self._state is _State.CLOSED:
            return []
        self._check_open("close")
        out: list[ChatEvent] = []
        try:
            if self._state is _State.STREAMING:
                if self._buf:  # a last line without its line end
                    self._line(self._take(len(self._buf)), out)
                if self._state is _State.STREAMING:  # a last event without its blank line
                    self._dispatch(out)
            if self._state is _State.STREAMING:
                if self._finish is None:
                    raise LlmProtocolError(
                        "stream ended before [DONE] and without a finish_reason (cut off?)"
                    )
                self._complete(out)
        except LlmProtocolError as e:
            self._fail(e)
            raise
        self._state = _State.CLOSED
        return out

    # -- framing (WHATWG "Interpreting an event stream") -------------------------------------

    def _check_open(self, what: str) -> None:
        if self._state is _State.FAILED:
            raise LlmProtocolError(f"parser already failed: {self._failure}")
        if self._state is _State.CLOSED:
            raise RuntimeError(f"ChatStreamParser.{what}() after close()")

    def _fail(self, e: LlmProtocolError) -> None:
        self._state = _State.FAILED
        self._failure = str(e)

    def _take(self, n: int) -> str:
        """Remove ``n`` bytes from the buffer as a line of text. Lines are cut at CR/LF bytes,
        which never occur inside a UTF-8 sequence, so a character split across feeds is whole
        here. Invalid UTF-8 becomes U+FFFD, as the spec's "UTF-8 decode" does."""
        line = bytes(self._buf[:n]).decode("utf-8", errors="replace")
        del self._buf[:n]
        self._scanned = 0
        return line

    def _read_lines(self, out: list[ChatEvent]) -> None:
        if not self._bom_checked:
            if len(self._buf) < len(_BOM) and _BOM.startswith(self._buf):
                return  # could still be a BOM: wait for more bytes
            if self._buf.startswith(_BOM):
                del self._buf[: len(_BOM)]
            self._bom_checked = True
        while self._state is _State.STREAMING:
            if self._skip_lf and self._buf:
                if self._buf[0] == 0x0A:  # the LF of a CRLF split across feeds
                    del self._buf[0]
                self._skip_lf = False
            m = _EOL.search(self._buf, self._scanned)
            if m is None:
                self._scanned = len(self._buf)
                if self._scanned > self._max_line:
                    raise LlmProtocolError(f"SSE line longer than {self._max_line} bytes")
                return
            if m.end() == len(self._buf) and m.group() == b"\r":
                self._skip_lf = True
            end = m.end()
            line = self._take(m.start())
            del self._buf[: end - m.start()]
            self._line(line, out)

    def _line(self, line: str, out: list[ChatEvent]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line.startswith(":"):
            return  # a comment (servers send ": ping" keep-alives)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        # "id" and "retry" serve reconnection, which a POST stream does not do; others: ignored.

    def _dispatch(self, out: list[ChatEvent]) -> None:
        data, event_type = "\n".join(self._data), self._event_type
        had_data = bool(self._data)
        self._data, self._event_type = [], ""
        if had_data:
            self._event(data, event_type, out)

    # -- payload (OpenAI chat.completion.chunk) ------------------------------------------------

    def _event(self, data: str, event_type: str, out: list[ChatEvent]) -> None:
        if event_type == "error":
            raise LlmProtocolError(f"server sent an error event: {_excerpt(_event_error(data))}")
        if not data.strip():
            return  # keep-alive
        if data.strip() == "[DONE]":
            self._complete(out)
            self._state = _State.DONE
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise LlmProtocolError(f"SSE data is not JSON: {_excerpt(data)}") from None
        if not isinstance(chunk, dict):
            raise LlmProtocolError(f"SSE data is not a JSON object: {_excerpt(data)}")
        if chunk.get("error") is not None:  # vLLM, llama.cpp, OpenRouter: a failure mid-stream
            msg = _error_message(chunk["error"])
            raise LlmProtocolError(f"server sent an error in the stream: {_excerpt(msg, 200)}")
        usage = chunk.get("usage")  # null in every chunk but the last with include_usage
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        if choices is None:
            if isinstance(usage, dict):
                return
            raise LlmProtocolError(f"chunk has no 'choices' and no 'usage': {_excerpt(data)}")
        if not isinstance(choices, list):
            raise LlmProtocolError(f"chunk 'choices' is not a list: {_excerpt(data)}")
        # An empty list is fine: the usage chunk, and Azure's prompt_filter_results chunk.
        for choice in choices:
            if not isinstance(choice, dict):
                raise LlmProtocolError(f"a choice is not an object: {_excerpt(data)}")
            if choice.get("index", 0) == 0:
                self._choice(choice, data, out)

    def _choice(self, choice: dict[str, object], data: str, out: list[ChatEvent]) -> None:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise LlmProtocolError(f"choice 'delta' is not an object: {_excerpt(data)}")
        content = delta.get("content")
        if isinstance(content, str):
            if content:  # the first chunk usually carries the role and content ""
                out.append(TextDelta(content))
        elif content is not None:
            raise LlmProtocolError(f"delta 'content' is not a string: {_excerpt(data)}")
        # reasoning_content (thinking models) is deliberately not read: it is not the reply.
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise LlmProtocolError(f"delta 'tool_calls' is not a list: {_excerpt(data)}")
            for call in calls:
                if not isinstance(call, dict):
                    raise LlmProtocolError(f"a tool call delta is not an object: {_excerpt(data)}")
                self._pending(call).add(call, _excerpt(data))
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self._finish = finish
            self._emit_calls(out)

    def _pending(self, call: dict[str, object]) -> _PendingCall:
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # Servers that omit "index": a new id starts a call, anything else continues the last.
            cid = call.get("id")
            new = (
                isinstance(cid, str)
                and bool(cid)
                and cid not in {c.id for c in self._calls.values()}
            )
            index = max(self._calls, default=-1) + (1 if new or not self._calls else 0)
        if index not in self._calls:
            self._calls[index] = _PendingCall(index)
        return self._calls[index]

    def _emit_calls(self, out: list[ChatEvent]) -> None:
        out.extend(self._calls[i].finish() for i in sorted(self._calls))
        self._calls.clear()

    def _complete(self, out: list[ChatEvent]) -> None:
        self._emit_calls(out)
        out.append(Finished(self._finish or "stop", self._usage))


def _event_error(data: str) -> str:
    try:
        doc = json.loads(data)
    except json.JSONDecodeError:
        return data
    if isinstance(doc, dict) and "error" in doc:
        return _error_message(doc["error"])
    return _error_message(doc)


def parse_stream(body: bytes) -> list[ChatEvent]:
    """The events of a whole ``text/event-stream`` body (the one-shot twin of the parser)."""
    parser = ChatStreamParser()
    return parser.feed(body) + parser.close()


def parse_completion(body: bytes) -> list[ChatEvent]:
    """The events of a non-streamed ``chat.completion`` JSON body (a server that ignored
    ``stream: true``), in the order a stream would give them."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = body.decode("utf-8", errors="replace")
        raise LlmProtocolError(f"completion body is not JSON: {_excerpt(text)}") from None
    text = body.decode("utf-8", errors="replace")
    if not isinstance(doc, dict):
        raise LlmProtocolError(f"completion body is not a JSON object: {_excerpt(text)}")
    if doc.get("error") is not None:
        msg = _error_message(doc["error"])
        raise LlmProtocolError(f"server sent an error: {_excerpt(msg, 200)}")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LlmProtocolError(f"completion has no choices: {_excerpt(text)}")
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index") == 0), choices[0])
    message = choice.get("message")
    if not isinstance(message, dict):
        raise LlmProtocolError(f"completion choice has no 'message' object: {_excerpt(text)}")
    out: list[ChatEvent] = []
    content = message.get("content")
    if isinstance(content, str):
        if content:
            out.append(TextDelta(content))
    elif content is not None:
        raise LlmProtocolError(f"message 'content' is not a string: {_excerpt(text)}")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise LlmProtocolError(f"message 'tool_calls' is not a list: {_excerpt(text)}")
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise LlmProtocolError(f"a tool call is not an object: {_excerpt(text)}")
        pending = _PendingCall(i)
        pending.add(call, _excerpt(text))
        out.append(pending.finish())
    finish = choice.get("finish_reason")
    usage = doc.get("usage")
    out.append(
        Finished(
            finish if isinstance(finish, str) and finish else "stop",
            usage if isinstance(usage, dict) else None,
        )
    )
    return out
