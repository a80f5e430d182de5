"""The chat stream parser: the same events whatever the byte splits (inside CRLF, inside a UTF-8
character, inside a tool call's arguments), the OpenAI chunk shapes, and exact error messages."""

from __future__ import annotations

import json
import random

import pytest

from gateway.llm.sse import (
    ChatEvent,
    ChatStreamParser,
    Finished,
    LlmProtocolError,
    TextDelta,
    ToolCall,
    parse_completion,
    parse_stream,
)


def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> str:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return "data: " + json.dumps(body, ensure_ascii=False)


def tc(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> object:
    fn: dict[str, object] = {"arguments": args}
    if name is not None:
        fn["name"] = name
    call: dict[str, object] = {"index": index, "function": fn}
    if id is not None:
        call.update(id=id, type="function")
    return call


USAGE: dict[str, object] = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}

# A realistic stream with everything at once: a BOM, a comment, CRLF and LF line ends, non-ASCII
# text (2- and 3-byte UTF-8), Azure's empty-choices chunk, two tool calls whose arguments arrive
# in many pieces (one with non-ASCII, one malformed), finish_reason, the usage chunk and [DONE].
RICH_LINES = [
    ": keep-alive comment",
    "",
    'data: {"choices": [], "prompt_filter_results": []}',
    "",
    chunk({"role": "assistant", "content": ""}),
    "",
    chunk({"content": "café – 5 €"}),
    "",
    # One chunk over two data lines (joined with LF, which JSON takes as whitespace): a CRLF
    # split across feeds must not end this event early.
    *chunk({"content": " 😀 ok"}).replace(', "choices"', ',\ndata: "choices"').split("\n"),
    "",
    chunk({"tool_calls": [tc(0, id="call_a", name="transfer", args="")]}),
    "",
    chunk({"tool_calls": [tc(0, args='{"to": ')]}),
    "",
    chunk({"tool_calls": [tc(0, args='"Zoë", ')]}),
    "",
    chunk({"tool_calls": [tc(0, args='"amount": 5.5')]}),
    "",
    chunk({"tool_calls": [tc(0, args="}")]}),
    "",
    chunk({"tool_calls": [tc(1, id="call_b", name="hangup", args="{oops")]}),
    "",
    chunk({}, "tool_calls"),
    "",
    'data: {"id": "chatcmpl-1", "choices": [], "usage": ' + json.dumps(USAGE) + "}",
    "",
    "data: [DONE]",
    "",
]
RICH_EVENTS: list[ChatEvent] = [
    TextDelta("café – 5 €"),
    TextDelta(" 😀 ok"),
    ToolCall("call_a", "transfer", {"to": "Zoë", "amount": 5.5}, '{"to": "Zoë", "amount": 5.5}'),
    ToolCall(
        "call_b",
        "hangup",
        None,
        "{oops",
        "arguments of 'hangup' are not valid JSON "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): '{oops'",
    ),
    Finished("tool_calls", USAGE),
]


def rich_body(eol: str = "\n") -> bytes:
    # Mixed line ends: CRLF for the first half, the given one after.
    half = len(RICH_LINES) // 2
    text = "\r\n".join(RICH_LINES[:half]) + "\r\n" + eol.join(RICH_LINES[half:]) + eol
    return b"\xef\xbb\xbf" + text.encode()


def feed_in(body: bytes, cuts: list[int]) -> list[ChatEvent]:
    parser = ChatStreamParser()
    out: list[ChatEvent] = []
    prev = 0
    for cut in [*cuts, len(body)]:
        out += parser.feed(body[prev:cut])
        prev = cut
    return out + parser.close()


def fixed(body: bytes, size: int) -> list[int]:
    return list(range(size, len(body), size))


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_rich_stream_one_shot(eol: str) -> None:
    assert parse_stream(rich_body(eol)) == RICH_EVENTS


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 13, 64])
def test_any_fixed_split_gives_the_one_shot_events(eol: str, size: int) -> None:
    body = rich_body(eol)
    assert feed_in(body, fixed(body, size)) == parse_stream(body) == RICH_EVENTS


def test_random_splits_give_the_one_shot_events() -> None:
    rng = random.Random(20240611)
    for eol in ("\n", "\r\n", "\r"):
        body = rich_body(eol)
        for _ in range(60):
            cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 40)))
            assert feed_in(body, cuts) == RICH_EVENTS, cuts


def test_splits_inside_every_multibyte_character() -> None:
    body = rich_body()
    starts = [i for i, b in enumerate(body) if b >= 0xC0]  # UTF-8 lead bytes
    assert len(starts) == 6  # BOM, é, –, €, 😀, ë: 2, 3 and 4-byte sequences
    for i in starts:
        for k in (1, 2, 3):
            assert feed_in(body, [i + k]) == RICH_EVENTS


def test_events_come_as_soon_as_their_blank_line_does() -> None:
    parser = ChatStreamParser()
    assert parser.feed((chunk({"content": "Hel"}) + "\n").encode()) == []
    assert parser.feed(b"\n") == [TextDelta("Hel")]
    # A CR at the end of a feed may be half a CRLF: the LF that follows is not a blank line.
    assert parser.feed((chunk({"content": "lo"}) + "\r").encode()) == []
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r\n") == [TextDelta("lo")]
    assert parser.feed(b"data: [DONE]\n\n") == [Finished("stop", None)]
    assert parser.done
    assert parser.feed(b"data: anything after DONE is ignored\n\n") == []
    assert parser.close() == []
    assert parser.close() == []  # idempotent
    with pytest.raises(RuntimeError, match=r"feed\(\) after close\(\)"):
        parser.feed(b"x")


def test_sse_field_rules() -> None:
    # "data:" without a space, a multi-line data event (joined with LF: valid JSON whitespace),
    # unknown fields and id/retry ignored, an event name that is not "error".
    body = (
        b'data:{"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        b'id: 7\nretry: 100\nfoo: bar\nevent: message\ndata: {"choices":\n'
        b'data: [{"index": 0, "delta": {"content": "b"}}]}\n\n'
        b"data:\n\n"  # whitespace-only data: a keep-alive
        b'data: {"choices": [{"index": 1, "delta": {"content": "other choice"}}]}\n\n'
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert parse_stream(body) == [TextDelta("a"), TextDelta("b"), Finished("length", None)]


def test_end_without_final_newline_or_done() -> None:
    # Ends with "data: [DONE]" and no newline at all: still done.
    body = (chunk({"content": "hi"}, "stop") + "\n\ndata: [DONE]").encode()
    assert parse_stream(body) == [TextDelta("hi"), Finished("stop", None)]
    # No [DONE] at all, but a finish_reason (and a tool call completed at close).
    body = (chunk({"content": "hi"}) + "\n\n" + chunk({}, "stop") + "\n\n").encode()
    assert parse_stream(body) == [TextDelta("hi"), Finished("stop", None)]


def test_tool_calls_complete_at_finish_reason_and_at_done() -> None:
    parser = ChatStreamParser()
    first = chunk({"tool_calls": [tc(0, id="c1", name="send_dtmf", args='{"digits"')]})
    assert parser.feed((first + "\n\n").encode()) == []
    done = parser.feed((chunk({"tool_calls": [tc(0, args=': "12#"}')]}, "tool_calls")).encode())
    assert done == []  # the event has no blank line yet
    events = parser.feed(b"\n\n")
    assert events == [ToolCall("c1", "send_dtmf", {"digits": "12#"}, '{"digits": "12#"}')]
    # No finish_reason before [DONE]: the pending call completes there, before Finished.
    body = (chunk({"tool_calls": [tc(0, id="c2", name="hangup", args="")]}) + "\n\n").encode()
    assert parse_stream(body + b"data: [DONE]\n\n") == [
        ToolCall("c2", "hangup", {}, ""),  # no arguments at all: {} (some servers send "")
        Finished("stop", None),
    ]


def test_tool_calls_without_index_or_name() -> None:
    # Servers that omit "index": a new id is a new call; a fragment without id continues it.
    calls = [
        {"id": "x1", "function": {"name": "a", "arguments": '{"n": '}},
        {"function": {"arguments": "1}"}},
        {"id": "x2", "function": {"name": "b", "arguments": "[1]"}},
        {"id": "x3", "function": {"arguments": "{}"}},
    ]
    body = "".join(chunk({"tool_calls": [c]}) + "\n\n" for c in calls) + "data: [DONE]\n\n"
    assert parse_stream(body.encode()) == [
        ToolCall("x1", "a", {"n": 1}, '{"n": 1}'),
        ToolCall("x2", "b", None, "[1]", "arguments of 'b' are an array, not a JSON object: '[1]'"),
        ToolCall("x3", "", None, "{}", "tool call #2 has no function name"),
        Finished("stop", None),
    ]


def test_long_bad_arguments_are_cut_in_the_error() -> None:
    raw = '{"text": "' + "x" * 100
    body = chunk({"tool_calls": [tc(0, id="c", name="say", args=raw)]}, "tool_calls") + "\n\n"
    (call, finished) = parse_stream((body + "data: [DONE]\n\n").encode())
    assert isinstance(call, ToolCall) and call.arguments is None and call.raw_arguments == raw
    assert call.error == (
        "arguments of 'say' are not valid JSON "
        "(Unterminated string starting at: line 1 column 10 (char 9)): "
        "'" + raw[:60] + "…'"
    )
    assert finished == Finished("tool_calls", None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"data: {not json at all\n\n",
            "SSE data is not JSON: '{not json at all'",
        ),
        (
            b"data: " + b"y" * 100 + b"\n\n",
            "SSE data is not JSON: '" + "y" * 60 + "…'",
        ),
        (b"data: [1, 2]\n\n", "SSE data is not a JSON object: '[1, 2]'"),
        (
            b'data: {"id": "c", "object": "chat.completion.chunk"}\n\n',
            "chunk has no 'choices' and no 'usage': "
            '\'{"id": "c", "object": "chat.completion.chunk"}\'',
        ),
        (b'data: {"choices": 3}\n\n', "chunk 'choices' is not a list: '{\"choices\": 3}'"),
        (
            b'data: {"error": {"message": "CUDA out of memory", "code": 500}}\n\n',
            "server sent an error in the stream: 'CUDA out of memory'",
        ),
        (
            b'data: {"error": "overloaded"}\n\n',
            "server sent an error in the stream: 'overloaded'",
        ),
        (
            b'event: error\ndata: {"error": {"message": "rate limited"}}\n\n',
            "server sent an error event: 'rate limited'",
        ),
        (
            b'data: {"choices": [{"index": 0, "delta": {"content": 5}}]}\n\n',
            "delta 'content' is not a string: "
            '\'{"choices": [{"index": 0, "delta": {"content": 5}}]}\'',
        ),
        (
            (chunk({"content": "cut "}) + "\n\n" + chunk({"content": "off"})).encode(),
            "stream ended before [DONE] and without a finish_reason (cut off?)",
        ),
        (b"", "stream ended before [DONE] and without a finish_reason (cut off?)"),
        (b'data: {"choi', "SSE data is not JSON: '{\"choi'"),
    ],
)
def test_malformed_streams(body: bytes, message: str) -> None:
    with pytest.raises(LlmProtocolError) as e:
        parse_stream(body)
    assert str(e.value) == message
    # Fed byte by byte: the same error.
    parser = ChatStreamParser()
    with pytest.raises(LlmProtocolError) as e2:
        for i in range(len(body)):
            parser.feed(body[i : i + 1])
        parser.close()
    assert str(e2.value) == message
    # A failed parser stays failed.
    with pytest.raises(LlmProtocolError) as e3:
        parser.feed(b"\n")
    assert str(e3.value) == "parser already failed: " + message


def test_a_line_without_end_is_refused_past_the_limit() -> None:
    parser = ChatStreamParser(max_line_bytes=1000)
    parser.feed(b"data: " + b"a" * 900)
    with pytest.raises(LlmProtocolError, match=r"^SSE line longer than 1000 bytes$"):
        parser.feed(b"a" * 200)


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    body = b'data: {"choices": [{"index": 0, "delta": {"content": "a\xffb"}}]}\n\ndata: [DONE]\n\n'
    assert parse_stream(body) == [TextDelta("a\ufffdb"), Finished("stop", None)]


def completion(message: dict[str, object], **extra: object) -> bytes:
    doc = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        **extra,
    }
    return json.dumps(doc).encode()


def test_parse_completion() -> None:
    body = completion({"role": "assistant", "content": "café – 5 €"}, usage=USAGE)
    assert parse_completion(body) == [TextDelta("café – 5 €"), Finished("stop", USAGE)]
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "hangup", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": {"k": 1}}},
        {"id": "c3", "type": "function", "function": {"name": "g", "arguments": "nope"}},
    ]
    doc = json.loads(completion({"role": "assistant", "content": None, "tool_calls": calls}))
    doc["choices"][0]["finish_reason"] = "tool_calls"
    assert parse_completion(json.dumps(doc).encode()) == [
        ToolCall("c1", "hangup", {}, "{}"),
        ToolCall("c2", "f", {"k": 1}, '{"k": 1}'),
        ToolCall(
            "c3",
            "g",
            None,
            "nope",
            "arguments of 'g' are not valid JSON "
            "(Expecting value: line 1 column 1 (char 0)): 'nope'",
        ),
        Finished("tool_calls", None),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"<html>502 Bad Gateway</html>",
            "completion body is not JSON: '<html>502 Bad Gateway</html>'",
        ),
        (b"[]", "completion body is not a JSON object: '[]'"),
        (b'{"error": {"message": "no such model"}}', "server sent an error: 'no such model'"),
        (b'{"choices": []}', "completion has no choices: '{\"choices\": []}'"),
        (
            b'{"choices": [{"index": 0}]}',
            "completion choice has no 'message' object: '{\"choices\": [{\"index\": 0}]}'",
        ),
    ],
)
def test_parse_completion_errors(body: bytes, message: str) -> None:
    with pytest.raises(LlmProtocolError) as e:
        parse_completion(body)
    assert str(e.value) == message
