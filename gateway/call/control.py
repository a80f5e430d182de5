"""What the control API (HTTP + WebSocket events) drives: the gateway's calls, as one protocol.

The HTTP layer (``gateway.api.routes``) only translates requests into these calls and errors into
status codes; the call logic lives behind ``CallControl`` (``gateway.call.calls``). Events are
frozen dataclasses serialised with ``event_json``; every event names its call.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

CallState = Literal["ringing", "answered", "held", "ended"]
Direction = Literal["inbound", "outbound"]
LegKind = Literal["sip", "webrtc"]


class ControlError(Exception):
    """A control request that cannot be done; ``status`` is the HTTP status to answer with."""

    status = 422
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownCall(ControlError):
    status = 404
    code = "unknown_call"


class TextTooLong(ControlError):
    status = 413
    code = "text_too_long"


class BadRequest(ControlError):
    status = 422
    code = "bad_request"


class Unavailable(ControlError):
    """Over the call limit, or no route/trunk to originate through."""

    status = 503
    code = "unavailable"


class Conflict(ControlError):
    """The call is not in a state that allows this (e.g. say on an ended call)."""

    status = 409
    code = "conflict"


@dataclass(frozen=True, slots=True)
class CallInfo:
    id: str
    leg: LegKind
    direction: Direction
    state: CallState
    remote: str  # From (inbound) or To (outbound) URI, or the browser's address
    local: str
    started_at: float  # epoch seconds
    answered_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    codec: str | None = None
    speaking: bool = False  # agent audio is playing now

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every event on ``/api/events``; ``type`` names the kind."""

    call_id: str
    ts: float = field(default_factory=time.time)
    type: str = "event"


@dataclass(frozen=True, slots=True)
class CallStateChanged(Event):
    state: CallState = "ringing"
    reason: str | None = None
    type: str = "call.state"


@dataclass(frozen=True, slots=True)
class DtmfReceived(Event):
    digit: str = ""
    duration_ms: int = 0
    source: str = "rfc4733"  # rfc4733 | info | datachannel
    type: str = "dtmf"


@dataclass(frozen=True, slots=True)
class UtteranceStarted(Event):
    utterance_id: str = ""
    text: str = ""
    type: str = "utterance.started"


@dataclass(frozen=True, slots=True)
class UtteranceFinished(Event):
    utterance_id: str = ""
    # done | interrupted | cancelled | error
    outcome: str = "done"
    # Words the caller heard before it stopped (all of them when done).
    heard: str = ""
    error: str | None = None
    type: str = "utterance.finished"


@dataclass(frozen=True, slots=True)
class SpeechStarted(Event):
    type: str = "speech.started"


@dataclass(frozen=True, slots=True)
class SpeechStopped(Event):
    duration_ms: int = 0
    type: str = "speech.stopped"


@dataclass(frozen=True, slots=True)
class BargeIn(Event):
    """The caller talked over the agent and the agent stopped. Media times in ms from the start
    of the call's media: ``onset_ms`` (estimated start of the caller's speech), ``decision_ms``
    (VAD decision), ``zero_ms`` (the agent's audio reached zero: decision + the rest of the
    frame in flight + the fade)."""

    utterance_id: str = ""
    onset_ms: float = 0.0
    decision_ms: float = 0.0
    zero_ms: float = 0.0
    faded_samples: int = 0
    type: str = "bargein"


@dataclass(frozen=True, slots=True)
class WorkerStopped(Event):
    """The worker acknowledged the cancel of an interrupted utterance (``stop_ms`` after the
    gateway asked, wall clock)."""

    utterance_id: str = ""
    stop_ms: float = 0.0
    type: str = "bargein.worker_stopped"


def event_json(event: Event) -> str:
    return json.dumps(dataclasses.asdict(event), separators=(",", ":"))


class CallControl(Protocol):
    """The gateway as the control API sees it. Methods raise ``ControlError`` subclasses."""

    def list_calls(self) -> list[CallInfo]: ...

    def get_call(self, call_id: str) -> CallInfo:
        """Raises UnknownCall."""
        ...

    async def originate(self, to: str, *, caller: str | None = None) -> CallInfo:
        """Place an outbound call to a ``sip:``/``sips:`` URI; returns at once (state ringing)."""
        ...

    async def say(self, call_id: str, text: str, *, interrupt: bool = False) -> str:
        """Queue ``text`` on the call; returns the utterance id. ``interrupt`` stops what is
        playing first. Raises UnknownCall, TextTooLong, Conflict."""
        ...

    async def say_stream(self, call_id: str, chunks: AsyncIterator[str]) -> str:
        """Speak text arriving in pieces (an LLM's tokens); returns the utterance id."""
        ...

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        """Send RFC 4733 digits (0-9 * # A-D) to the far end. Raises BadRequest on others."""
        ...

    async def hangup(self, call_id: str) -> None: ...

    def subscribe_events(self) -> AsyncIterator[Event]:
        """Every event from now on, for every call, until the consumer stops iterating."""
        ...
