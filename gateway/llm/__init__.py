"""Talking to a language model for the ``llm`` voice agent: an OpenAI-compatible streaming chat
client (``client``) over a sans-I/O parser of the chat completion stream (``sse``)."""

from __future__ import annotations

from gateway.llm.client import ChatClient, LlmError, LlmErrorKind, tool_spec
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

__all__ = [
    "ChatClient",
    "ChatEvent",
    "ChatStreamParser",
    "Finished",
    "LlmError",
    "LlmErrorKind",
    "LlmProtocolError",
    "TextDelta",
    "ToolCall",
    "parse_completion",
    "parse_stream",
    "tool_spec",
]
