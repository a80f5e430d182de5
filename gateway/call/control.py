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
from typing import Literal, Protocol, runtime_checkable

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


class BusUnavailable(Unavailable):
    """The bus (Redis) cannot be reached: nothing can be synthesized until it answers again.
    A say refused with it was never queued anywhere (it is not retried later)."""

    code = "bus_unavailable"


class Conflict(ControlError):
    """The call is not in a state that allows this (e.g. say on an ended call)."""

    status = 409
    code = "conflict"


class UnknownRecording(ControlError):
    """No such recording on that call, or its file is gone (retention)."""

    status = 404
    code = "unknown_recording"


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
    # Words the caller heard before it stopped (all of them when done), as spoken words.
    heard: str = ""
    error: str | None = None
    # The utterance's whole text, as it was given to say().
    text: str = ""
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


@dataclass(frozen=True, slots=True)
class AgentEvent(Event):
    """Base of what an agent reports about its conversation (``CallHandle.emit``): published
    on ``/api/events`` and kept in the call's record, never delivered back to the agent."""

    type: str = "agent"


@dataclass(frozen=True, slots=True)
class Transcript(AgentEvent):
    """Words of the conversation. ``role`` "caller": what the speech-to-text heard (``final``
    False for live partials while the caller speaks); "agent": what the caller heard of the
    agent (a whole reply, or up to where the caller cut it short)."""

    role: str = "caller"
    text: str = ""
    final: bool = True
    type: str = "transcript"


@dataclass(frozen=True, slots=True)
class AgentTurn(AgentEvent):
    """One exchange's timings (wall clock, epoch seconds, and compute in ms), published when
    the agent's first words of the reply are queued: the caller's turn ended
    (``decided_at``; ``reason``: model | silence | cut), the recogniser and end-of-turn model
    took ``stt_ms``/``eot_ms``, the model's first token came at ``first_token_at`` and the
    first piece was queued as ``utterance_id`` at ``first_say_at`` (its first audio is that
    utterance's ``utterance.started``)."""

    text: str = ""
    reason: str = ""
    probability: float | None = None
    speech_end_ms: float = 0.0  # media time of the caller's last speech frame
    decided_at: float = 0.0
    stt_ms: float = 0.0
    eot_ms: float = 0.0
    first_token_at: float | None = None
    first_say_at: float | None = None
    utterance_id: str = ""
    type: str = "agent.turn"


@dataclass(frozen=True, slots=True)
class AgentError(AgentEvent):
    """Something the agent depends on failed and it fell back (the call goes on): ``kind``
    llm_timeout | llm_unreachable | llm_status | llm_malformed | tool | stt."""

    kind: str = ""
    message: str = ""
    type: str = "agent.error"


TransferResult = Literal["completed", "refused", "failed", "not_supported"]
TransferMode = Literal["blind", "attended"]


@dataclass(frozen=True, slots=True)
class TransferOutcome:
    """How ``transfer`` ended. ``completed``: the far end took the call (blind transfer: a 2xx
    in the REFER's NOTIFY, and this call then ends "transferred"; bridge: the target answered
    and both legs' audio is crossed, ``bridged_call`` names the second leg); ``refused``: the
    far end answered the REFER 4xx-6xx; ``failed``: it accepted but the referred call failed,
    or nothing final came in time, or the bridged leg was not answered; ``not_supported``:
    this call cannot do it (attended transfer; REFER on a WebRTC leg). ``status``: the SIP
    status behind the result, when there is one."""

    result: TransferResult
    status: int | None = None
    reason: str = ""
    bridged_call: str | None = None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class TransferEvent(Event):
    """A transfer's steps: ``state`` started (``target``, ``mode``, ``method`` refer or
    bridge) → progress (a sipfrag status such as 180 from the REFER's NOTIFYs, or the 202) →
    completed | refused | failed | not_supported, with ``status`` and ``reason``; a refused or
    failed REFER followed by a bridge attempt starts again with method bridge."""

    state: str = "started"
    target: str = ""
    mode: str = "blind"
    method: str = "refer"
    status: int | None = None
    reason: str = ""
    bridged_call: str | None = None
    type: str = "transfer"


@dataclass(frozen=True, slots=True)
class RecordingEvent(Event):
    """A recording of the call (``gateway.media.recording``) ``started`` (its file is open),
    ``stopped`` (hang-up or stop: the file is complete, ``duration_s`` and ``bytes`` final) or
    ``failed`` (``code`` disk_full | permission | io, ``reason`` the error; what was written
    before stays a valid WAV). The call goes on either way."""

    recording_id: str = ""
    state: str = "started"
    path: str = ""
    channels: str = "both"
    reason: str | None = None
    code: str | None = None
    duration_s: float = 0.0
    bytes: int = 0
    type: str = "recording"


@dataclass(frozen=True, slots=True)
class AmdResult(Event):
    """Answering-machine detection on an answered outbound call (``gateway.amd``): ``type`` is
    the detector's event name (amd.human | amd.machine | amd.beep | amd.no_speech |
    amd.decision_timeout | amd.greeting_ended); ``at_ms`` the media time of the decision after
    the answer; ``cause`` the heuristic's or word rule's reason (machine/human); for a beep its
    ``frequency_hz``. ``campaign``/``contact`` name the campaign attempt it belongs to."""

    at_ms: int = 0
    cause: str = ""
    frequency_hz: float | None = None
    campaign: str | None = None
    contact: int | None = None
    type: str = "amd"


@dataclass(frozen=True, slots=True)
class CampaignEvent(Event):
    """A campaign's steps (``gateway.campaign``), ``type``: campaign.created | campaign.state
    (``state`` paused/running/cancelled) | campaign.dial (``contact``, ``to``, ``attempt``) |
    campaign.attempt (the attempt ended: ``outcome``, ``sip_status``, ``reason``,
    ``voicemail_left``, ``retry_at``) | campaign.trunk_backoff (``until``, ``retry_after``) |
    campaign.finished (``state`` done/cancelled). ``call_id`` is the attempt's call, or ""."""

    campaign: str = ""
    contact: int | None = None
    to: str | None = None
    attempt: int | None = None
    state: str | None = None
    outcome: str | None = None
    sip_status: int | None = None
    reason: str | None = None
    voicemail_left: bool | None = None
    retry_at: float | None = None
    until: float | None = None
    retry_after: float | None = None
    type: str = "campaign"


def event_json(event: Event) -> str:
    return json.dumps(dataclasses.asdict(event), separators=(",", ":"))


class CallControl(Protocol):
    """The gateway as the control API sees it. Methods raise ``ControlError`` subclasses."""

    def list_calls(self) -> list[CallInfo]: ...

    def get_call(self, call_id: str) -> CallInfo:
        """Raises UnknownCall."""
        ...

    async def originate(
        self, to: str, *, caller: str | None = None, agent: dict[str, object] | None = None
    ) -> CallInfo:
        """Place an outbound call to a ``sip:``/``sips:`` URI; returns at once (state ringing).
        ``agent``: the agent for this call (``{"kind": "llm", "system_prompt", "vars", ...}``;
        None: the gateway's own). Raises BadRequest for a bad agent before dialling."""
        ...

    def call_record(self, call_id: str) -> dict[str, object]:
        """The call's facts and its conversation so far (``transcript``), live or ended
        recently. Raises UnknownCall."""
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

    async def transfer(
        self,
        call_id: str,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        """Hand the call to ``target`` (a ``sip:``/``sips:`` URI): SIP REFER (RFC 3515) on a
        SIP leg; ``fallback="bridge"`` dials the target through the trunk and bridges both
        legs when REFER is refused or fails. Returns once the outcome is known (see
        ``TransferOutcome``). Raises UnknownCall, BadRequest, Conflict."""
        ...

    def subscribe_events(self) -> AsyncIterator[Event]:
        """Every event from now on, for every call, until the consumer stops iterating."""
        ...


@runtime_checkable
class RecordingControl(Protocol):
    """Recordings as the control API sees them (``CallManager`` is one). Methods raise
    ``ControlError`` subclasses."""

    def list_recordings(self, call_id: str) -> list[dict[str, object]]:
        """The call's recordings (live or ended call), oldest first. Raises UnknownCall."""
        ...

    def recording_file(self, call_id: str, recording_id: str) -> str:
        """Path of the recording's WAV. Raises UnknownCall, UnknownRecording."""
        ...

    def start_recording(self, call_id: str, channels: str = "both") -> dict[str, object]:
        """Start recording the call; returns the recording as listed. Raises UnknownCall,
        BadRequest (channels), Conflict (ended, already recording), Unavailable."""
        ...

    def stop_recording(self, call_id: str) -> None:
        """Stop the call's recording (its file is finalised in the background). Raises
        UnknownCall, Conflict (nothing is being recorded)."""
        ...
