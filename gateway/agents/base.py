"""The agent interface: what drives a call once it is up.

An agent sees one call through a ``CallHandle`` and reacts to its events, delivered in order
on the agent's own task (off the media path: a slow agent delays only itself):

- ``DtmfReceived`` (a key, with its source: rfc4733, info, datachannel);
- ``UtteranceFinished`` (done, interrupted with the words the caller ``heard``, cancelled,
  error); ``BargeIn`` and ``WorkerStopped`` when the caller cut the agent short;
- ``SpeechStarted`` / ``SpeechStopped`` (the echo-aware detector's view of the caller);
- ``CallStateChanged`` (``ended``, with its reason, is the last one);
- ``TransferEvent`` (the steps of a ``transfer``: started, progress, then completed, refused,
  failed or not_supported).

An agent reports its conversation with ``emit``: ``Transcript`` (caller and agent words),
``AgentTurn`` (an exchange's timings), ``AgentError`` (a fallback taken); these go to
``/api/events`` and the call's record (``GET /api/calls/{id}``), not back to the agent.

Not delivered: ``UtteranceStarted`` (the echo of the agent's own ``say``). An agent that needs
to hear the caller reads ``caller_audio()``. The embedded default is the IVR in
``gateway.agents.ivr``; a pipecat pipeline fits the same shape (events in as frames, ``say``
out as TTS text).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gateway.call.control import CallInfo, Event, TransferOutcome
from gateway.media.tap import CallerAudioTap


class CallHandle(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def info(self) -> CallInfo: ...

    async def say(
        self,
        text: str,
        *,
        interrupt: bool = False,
        dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:
        """Queue ``text``; returns its utterance id. ``interrupt`` stops what is playing first;
        ``dtmf_interrupts`` / ``barge_in`` let a key press / the caller's voice cut it short."""
        ...

    async def say_stream(
        self, chunks: AsyncIterator[str], *, utterances: list[str] | None = None
    ) -> str:
        """Speak text arriving in pieces (an LLM's tokens): cut by the chunker, the first
        clause is spoken while the rest still arrives. Returns the first utterance's id;
        ``utterances`` (when given) collects the id of every piece as it is queued."""
        ...

    def emit(self, event: Event) -> None:
        """Report an ``AgentEvent`` (transcripts, timings, errors) on the call."""
        ...

    def interrupt(self, *, clear_queue: bool = True) -> None:
        """Stop speaking now (10 ms fade), drop what is queued, cancel it on the worker."""
        ...

    async def send_dtmf(self, digits: str) -> None:
        """Send keys to the far end (an IVR the agent is calling into)."""
        ...

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        """The caller's audio as 20 ms int16 frames at 8 or 16 kHz (see
        ``gateway.media.tap``)."""
        ...

    async def hangup(self, reason: str = "agent") -> None: ...

    def start_recording(self, channels: str = "both") -> str:
        """Record the call to a WAV (``channels`` "both": stereo, caller left, agent right;
        "caller": mono); returns the recording's id. The file opens off the media path:
        ``RecordingEvent`` started, or failed (disk full, permissions), and the call goes on
        either way. Raises BadRequest, Conflict (already recording, ended), Unavailable."""
        ...

    def stop_recording(self) -> None:
        """Stop recording, if recording; the file is finalised in the background
        (``RecordingEvent`` stopped). Hang-up stops it too."""
        ...

    async def transfer(
        self,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        """Hand the caller to ``target`` (``sip:``/``sips:``): a blind transfer by REFER (RFC
        3515) on a SIP leg; when it completes the call ends ("transferred"). With
        ``fallback="bridge"`` a refused or failed REFER (or a browser leg) becomes a call the
        gateway places to ``target`` and bridges: this agent then stops, and either side
        hanging up ends both. ``mode="attended"`` is answered ``not_supported``. Returns
        the outcome (``TransferOutcome``: completed | refused | failed | not_supported, the
        SIP status, a reason)."""
        ...


@runtime_checkable
class AudioCallHandle(CallHandle, Protocol):
    """A call that also plays audio the agent brings itself (a bridged bot's voice, see
    ``gateway.agents.stream``) rather than text for the synthesis workers. ``Call`` is one."""

    def play_audio(
        self,
        utterance_id: str,
        pcm: npt.NDArray[np.int16],
        *,
        rate: int = 8000,
        barge_in: bool = False,
        dtmf_interrupts: bool = False,
        max_queued_s: float = 60.0,
    ) -> int:
        """Queue int16 ``pcm`` at ``rate`` as (more of) utterance ``utterance_id``: played on
        the call's media clock like synthesised speech (``interrupt`` fades it out), resampled
        to the call's rate. The first piece announces the utterance (``barge_in`` /
        ``dtmf_interrupts`` as for ``say``); audio for one already stopped is dropped.
        Returns the samples dropped (the oldest first) to keep at most ``max_queued_s`` of
        audio queued on the call."""
        ...

    def end_audio(self, utterance_id: str) -> None:
        """No more audio follows for ``utterance_id``: it finishes once what is queued has
        played (``UtteranceFinished`` done)."""
        ...


class Agent(Protocol):
    async def on_start(self, call: CallHandle) -> None:
        """The call is answered and media flows."""

    async def on_event(self, call: CallHandle, event: Event) -> None: ...

    async def on_end(self, call: CallHandle) -> None:
        """The call has ended (either side); release whatever the agent holds."""


AgentFactory = Callable[[CallInfo], Agent]
