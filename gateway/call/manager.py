"""The registry of live calls: the call limit, outbound calls, the event feed for the control
API, and the barge-in detectors of all calls run as one batch.  ``CallManager`` implements
``CallControl`` (what the API drives)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from gateway.agents.base import Agent, AgentFactory
from gateway.call.calls import Call
from gateway.call.control import (
    BadRequest,
    CallInfo,
    CallStateChanged,
    Conflict,
    Event,
    TransferOutcome,
    Unavailable,
    UnknownCall,
    UnknownRecording,
)
from gateway.media.bargein import BargeInConfig, DetectorBank, run_batch
from gateway.media.recording import Recordings
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import BargeinSettings

log = logging.getLogger("voxgate.calls")

# Per-subscriber event queue bound: a stuck consumer loses events, never stalls calls.
EVENT_QUEUE = 1000
# Caller frames for the barge-in detectors are analysed in batches across calls, at most this
# long after the first of them was staged: one vectorised step for every call staged meanwhile
# (numpy's per-call overhead, ~0.4 ms a step on a 2-core EPYC, paid once per batch, not once
# per call and frame).  Barge-in timing does not hang on it: a call whose staged frames could
# confirm caller speech runs the batch before its next frame is pulled (Call.pull_audio,
# BargeInDetector.could_confirm), so the fade starts on the same packet as if every frame had
# been analysed at once.  The timer bounds the rest: the end of caller speech, and the events
# the agents' taps get.  A little under a media tick: each call's frames wait less than one
# packet time, and a batch rarely holds two frames of one call (a second round).
DETECT_BATCH_S = 0.016
# Records of ended calls kept for GET /api/calls/{id} (their transcripts), newest last.
ENDED_RECORDS = 500


class AgentChooser(Protocol):
    """Builds the agent a call asked for (``gateway.agents.registry.AgentRegistry``)."""

    def validate(self, spec: object) -> dict[str, object]:
        """A per-call agent request, checked (raises BadRequest with the reason)."""
        ...

    def build(self, info: CallInfo, spec: dict[str, object] | None) -> Agent: ...


class CallManager:
    """Registry of live calls; the ``CallControl`` the API talks to."""

    def __init__(
        self,
        bus: Bus,
        agent_factory: AgentFactory | None,
        *,
        max_calls: int = 200,
        max_text_chars: int = 5000,
        bargein: BargeinSettings | None = None,
        synth_timeout_s: float = 32.0,
    ) -> None:
        self.bus = bus
        # How long an utterance may wait for its first audio before it is given up (the
        # worker's default deadline plus a margin: the worker answers deadline_exceeded first
        # whenever one is alive).
        self.synth_timeout_s = synth_timeout_s
        self.bargein = bargein
        self.agent_factory = agent_factory
        # Agents by kind, for calls that name their own (POST /api/calls {"agent": ...}) and
        # for the configured default kind; None: only ``agent_factory``.
        self.agents: AgentChooser | None = None
        self.ended: OrderedDict[str, dict[str, object]] = OrderedDict()
        self.max_calls = max_calls
        self.max_text_chars = max_text_chars
        self.calls: dict[str, Call] = {}
        # Call recording (gateway.media.recording), set by the gateway; None: calls are not
        # recorded.
        self.recordings: Recordings | None = None
        self._subscribers: set[asyncio.Queue[Event]] = set()
        # Set by the SIP side: place an outbound call (to, caller) and return it ringing.
        self.originate_hook: Callable[[str, str | None], Awaitable[Call]] | None = None
        self.outcomes: dict[str, int] = {}
        # Observability hooks (gateway.metrics): a call leaving the registry (after its
        # ended state), and an utterance's first audio frame played, seconds after say().
        self.on_forget: list[Callable[[Call], None]] = []
        self.on_first_audio: list[Callable[[Call, float], None]] = []
        # Barge-in detectors: one bank per configuration (rate), calls with staged frames.
        self._banks: dict[BargeInConfig, DetectorBank] = {}
        self._staged: list[Call] = []
        self._flush: asyncio.TimerHandle | None = None
        self.detect_batch_s = DETECT_BATCH_S

    def detector_bank(self, config: BargeInConfig) -> DetectorBank:
        bank = self._banks.get(config)
        if bank is None:
            bank = self._banks[config] = DetectorBank(config, capacity=32)
        return bank

    def stage_detection(self, call: Call) -> None:
        """``call`` has caller frames staged on its detector: analyse them with the next batch
        (at most ``detect_batch_s`` from now)."""
        if not call._staged:
            call._staged = True
            self._staged.append(call)
        if self._flush is None:
            loop = asyncio.get_running_loop()
            self._flush = loop.call_later(self.detect_batch_s, self.flush_detection)

    def flush_detection(self) -> None:
        """Run every staged detector, one vectorised batch per bank, and hand each call its
        events.  One call's failure is logged and does not stop the others."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        staged, self._staged = self._staged, []
        by_bank: dict[DetectorBank, list[Call]] = {}
        for call in staged:
            call._staged = False
            det = call.detector
            if det is not None and not det.closed:
                by_bank.setdefault(det.bank, []).append(call)
        for calls in by_bank.values():
            try:
                results = run_batch([c.detector for c in calls if c.detector is not None])
            except Exception:
                log.exception("barge-in batch of %d calls failed", len(calls))
                continue
            for call, events in zip(calls, results, strict=True):
                if events:
                    try:
                        call.on_vad(events)
                    except Exception:
                        log.exception("barge-in events failed on call %s", call.id)

    def full(self) -> bool:
        return len(self.calls) >= self.max_calls

    def new_call(
        self,
        leg_kind: str,
        direction: str,
        remote: str,
        local: str,
        *,
        rate: int = 8000,
        profile: str = "narrowband",
        call_id: str | None = None,
    ) -> Call:
        if self.full():
            raise Unavailable(f"at the call limit ({self.max_calls})")
        info = CallInfo(
            id=call_id or uuid.uuid4().hex[:12], leg=leg_kind, direction=direction,  # type: ignore[arg-type]
            state="ringing", remote=remote, local=local, started_at=time.time(),
        )  # fmt: skip
        call = Call(self, info, rate=rate, profile=profile)
        self.calls[call.id] = call
        log.info("call %s: new %s %s call", call.id, direction, leg_kind, extra=call.log_fields)
        self.publish(CallStateChanged(call.id, state="ringing"))
        return call

    def forget(self, call: Call) -> None:
        self.calls.pop(call.id, None)
        self.ended[call.id] = call.record()
        while len(self.ended) > ENDED_RECORDS:
            self.ended.popitem(last=False)
        reason = call.info.end_reason or "unknown"
        self.outcomes[reason] = self.outcomes.get(reason, 0) + 1
        for hook in self.on_forget:
            hook(call)

    def agent_for(self, call: Call) -> Agent | None:
        if not call.wants_agent:
            return None  # a bridge's second leg: its audio is the other call's caller
        if call.agent_spec is not None and self.agents is not None:
            return self.agents.build(call.info, call.agent_spec)
        return self.agent_factory(call.info) if self.agent_factory is not None else None

    def publish(self, event: Event) -> None:
        for q in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(event)

    # --- CallControl ---------------------------------------------------------------------
    def list_calls(self) -> list[CallInfo]:
        return [c.info for c in self.calls.values()]

    def get_call(self, call_id: str) -> CallInfo:
        return self._call(call_id).info

    def _call(self, call_id: str) -> Call:
        call = self.calls.get(call_id)
        if call is None:
            raise UnknownCall(f"no call {call_id!r}")
        return call

    async def originate(
        self, to: str, *, caller: str | None = None, agent: dict[str, object] | None = None
    ) -> CallInfo:
        return (await self.originate_call(to, caller=caller, agent=agent)).info

    async def originate_call(
        self,
        to: str,
        *,
        caller: str | None = None,
        agent: dict[str, object] | None = None,
        hold_agent: bool = False,
    ) -> Call:
        """``originate``, returning the ringing :class:`Call` itself (a campaign's dialler
        follows it). ``hold_agent``: the agent waits for ``Call.release_agent`` once the call
        is answered (answering-machine detection decides first)."""
        spec = None
        if agent is not None:
            if self.agents is None:
                raise BadRequest("this gateway does not choose agents per call")
            spec = self.agents.validate(agent)  # before dialling anybody
        if self.originate_hook is None:
            raise Unavailable("outbound calls are not configured on this gateway")
        if self.full():
            raise Unavailable(f"at the call limit ({self.max_calls})")
        call = await self.originate_hook(to, caller)
        # Set before any answer can arrive: the hook returns as soon as the INVITE is out.
        call.agent_spec = spec
        if hold_agent:
            call.hold_agent()
        return call

    async def dial(self, to: str) -> Call:
        """The second leg of a bridge: an outbound call like ``originate`` but with no agent."""
        if self.originate_hook is None:
            raise Unavailable("outbound calls are not configured on this gateway")
        if self.full():
            raise Unavailable(f"at the call limit ({self.max_calls})")
        call = await self.originate_hook(to, None)
        # Set before any answer can arrive: the hook returns as soon as the INVITE is out.
        call.wants_agent = False
        return call

    def call_record(self, call_id: str) -> dict[str, object]:
        call = self.calls.get(call_id)
        if call is not None:
            return call.record()
        record = self.ended.get(call_id)
        if record is None:
            raise UnknownCall(f"no call {call_id!r}")
        return record

    async def say(self, call_id: str, text: str, *, interrupt: bool = False) -> str:
        return await self._call(call_id).say(text, interrupt=interrupt)

    async def say_stream(self, call_id: str, chunks: AsyncIterator[str]) -> str:
        return await self._call(call_id).say_stream(chunks)

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        await self._call(call_id).send_dtmf(digits)

    async def hangup(self, call_id: str) -> None:
        await self._call(call_id).hangup("api")

    async def transfer(
        self,
        call_id: str,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        return await self._call(call_id).transfer(
            target, mode=mode, fallback=fallback, timeout_s=timeout_s
        )

    def subscribe_events(self) -> EventSubscription:
        """Events from this call on (the subscriber is registered before this returns)."""
        return EventSubscription(self._subscribers)

    # --- RecordingControl ----------------------------------------------------------------
    def list_recordings(self, call_id: str) -> list[dict[str, object]]:
        self._known(call_id)
        if self.recordings is None:
            return []
        return [r.to_json() for r in self.recordings.of_call(call_id)]

    def recording_file(self, call_id: str, recording_id: str) -> str:
        self._known(call_id)
        rec = self.recordings.get(call_id, recording_id) if self.recordings else None
        if rec is None:
            raise UnknownRecording(f"call {call_id} has no recording {recording_id!r}")
        if rec.state == "starting" or (rec.state == "failed" and rec.bytes == 0):
            raise UnknownRecording(f"recording {recording_id} has no file ({rec.state})")
        return str(rec.path)

    def start_recording(self, call_id: str, channels: str = "both") -> dict[str, object]:
        call = self._call(call_id)
        call.start_recording(channels)
        assert call.recorder is not None
        return call.recorder.to_json()

    def stop_recording(self, call_id: str) -> None:
        call = self._call(call_id)
        if call.recorder is None or not call.recorder.active:
            raise Conflict(f"call {call_id} is not being recorded")
        call.stop_recording()

    def _known(self, call_id: str) -> None:
        """A call live or ended recently, else UnknownCall."""
        if call_id not in self.calls and call_id not in self.ended:
            raise UnknownCall(f"no call {call_id!r}")


class EventSubscription:
    """An async iterator of events; registered at creation, removed by ``aclose``."""

    def __init__(self, registry: set[asyncio.Queue[Event]]) -> None:
        self._registry = registry
        self._queue: asyncio.Queue[Event] = asyncio.Queue(EVENT_QUEUE)
        registry.add(self._queue)

    def __aiter__(self) -> EventSubscription:
        return self

    async def __anext__(self) -> Event:
        if self._queue not in self._registry:
            raise StopAsyncIteration
        return await self._queue.get()

    async def aclose(self) -> None:
        self._registry.discard(self._queue)
