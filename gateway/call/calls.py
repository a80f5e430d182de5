"""A call, whatever its leg: one agent, one playout, one bus subscription, one barge-in detector.

``Call`` is what agents and the control API act on (``CallHandle``). The signalling/media side
(a SIP dialog with its RTP session, or a WebRTC peer) is a ``Leg`` that the call drives for
hang-up and DTMF and that pulls the call's audio with ``pull_audio`` on each media tick; the
caller's audio comes back through ``on_caller_audio``, the one path from any leg into the call
(the place for anything else that listens to the caller, before the barge-in gate). Its
utterances are records in ``gateway.call.utterances``; the registry that holds the calls is
``gateway.call.manager``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from dsp.resample import Resampler
from gateway.agents.base import Agent
from gateway.call.bridge import Bridge
from gateway.call.control import (
    AgentEvent,
    BadRequest,
    BargeIn,
    BusUnavailable,
    CallInfo,
    CallState,
    CallStateChanged,
    Conflict,
    ControlError,
    DtmfReceived,
    Event,
    SpeechStarted,
    SpeechStopped,
    TextTooLong,
    Transcript,
    TransferEvent,
    TransferOutcome,
    Unavailable,
    UtteranceFinished,
    UtteranceStarted,
    WorkerStopped,
)
from gateway.call.utterances import Utterance, Utterances
from gateway.media.bargein import (
    BargeInConfig,
    BargeInDetector,
    DetectorBank,
    VadEvent,
    VoiceStarted,
)
from gateway.media.coupling import MediaCoupling
from gateway.media.playout import Playout, PlayoutEvent, PlayoutFinished, PlayoutStarted
from gateway.media.recording import CHANNELS, Recorder, Recordings
from gateway.media.tap import CallerAudioTap
from voxgate.contract.bus.base import Bus, BusDown, BusError, Subscription
from voxgate.contract.bus.schema import (
    AudioChunk,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)
from voxgate.contract.chunker import Chunker
from voxgate.contract.config import BargeinSettings
from voxgate.contract.dtmf import DTMF_KEYS
from voxgate.contract.logs import bind_log_context

log = logging.getLogger("voxgate.calls")

# Lines of conversation kept in a call's record (a long call keeps its latest).
TRANSCRIPT_LINES = 1000

# Error code of an utterance no worker answered in time (gateway side; workers never send it).
ERR_NO_WORKER = "no_worker"
# Error code of an utterance refused because the bus (Redis) could not take its request: a say
# during an outage fails at once with this (and the control API answers 503 bus_unavailable).
ERR_BUS_UNAVAILABLE = "bus_unavailable"

# A transfer waits this long for its outcome: the final NOTIFY of a REFER, or the answer of a
# bridged leg (the referred phone rings meanwhile; Timer B of an INVITE is 32 s).
TRANSFER_TIMEOUT_S = 32.0
# Why attended transfer is refused (mode="attended"): it needs a consultation call and REFER
# with Replaces (RFC 5589 §7, RFC 3891), which the gateway does not do.
ATTENDED_NOT_SUPPORTED = (
    "attended transfer (a consultation call, then REFER with Replaces, RFC 5589 §7 / RFC 3891) "
    "is not supported; use a blind transfer, with fallback bridge if needed"
)


class Leg(Protocol):
    """The signalling + media side of a call (``SipLeg``, ``WebRtcLeg``): everything a call,
    the control API and the metrics ask of it."""

    async def hangup(self, reason: str) -> None:
        """End the call on the wire (BYE/CANCEL/close); the leg then calls ``Call.ended``."""

    async def send_dtmf(self, digits: str) -> None:
        """Send keys to the far end (RFC 4733 events on SIP, the data channel on WebRTC)."""

    def media_stats(self) -> dict[str, float]:
        """Cumulative media counters for /metrics: packets_received, packets_lost,
        late_sends, jitter_buffer_ms (keys a leg cannot measure are left out)."""


@runtime_checkable
class ReferringLeg(Leg, Protocol):
    """A leg that can ask its far end to call someone else (``SipLeg``: REFER, RFC 3515)."""

    async def refer(
        self, target: str, *, timeout_s: float, on_progress: Callable[[int, str], None]
    ) -> TransferOutcome:
        """REFER the far end to ``target`` and wait for the outcome (completed, refused,
        failed); ``on_progress(status, reason)`` gets the 202 and each provisional sipfrag.
        Does not hang up: on completed the call does."""
        ...


@dataclass(slots=True)
class _RawAudio:
    """An utterance of audio the agent brings itself (``play_audio``): the next chunk's seq,
    and the resampler to the call's rate when its audio comes at another rate."""

    seq: int = 0
    resampler: Resampler | None = None
    ended: bool = False


class CallHost(Protocol):
    """What a call needs of the registry that holds it (``CallManager``)."""

    bus: Bus
    bargein: BargeinSettings | None
    max_text_chars: int
    synth_timeout_s: float
    # Where recordings go (None: this gateway does not record).
    recordings: Recordings | None
    on_first_audio: list[Callable[[Call, float], None]]

    def detector_bank(self, config: BargeInConfig) -> DetectorBank: ...

    def stage_detection(self, call: Call) -> None: ...

    def flush_detection(self) -> None: ...

    def publish(self, event: Event) -> None: ...

    def forget(self, call: Call) -> None: ...

    def agent_for(self, call: Call) -> Agent | None: ...

    async def dial(self, to: str) -> Call:
        """Place an outbound call to ``to`` (through the trunk) with no agent of its own: the
        second leg of a bridge. Returns it ringing; raises ControlError (Unavailable)."""
        ...


class Call:
    def __init__(
        self,
        manager: CallHost,
        info: CallInfo,
        *,
        rate: int = 8000,
        profile: str = "narrowband",
    ) -> None:
        self.manager = manager
        self._info = info
        self.rate = rate
        self.profile = profile
        settings = manager.bargein
        self.playout = Playout(rate, fade_ms=settings.fade_ms if settings else 10.0)
        # Barge-in: VAD on what the caller sends, compared against what we sent (echo).
        self.detector: BargeInDetector | None = None
        if settings is not None and settings.enabled:
            config = BargeInConfig.from_settings(settings, rate)
            self.detector = BargeInDetector(bank=manager.detector_bank(config))
        # Onsets before this media position (the call's first inbound samples) never barge in.
        self._guard_samples = settings.start_guard_ms * rate // 1000 if settings else 0
        self._staged = False  # frames staged on the detector, waiting for the batch
        # The leg hands the caller's audio over as it arrives (``on_caller_packet``), before
        # its jitter buffer: the detector and the agents' ears hear it then (see
        # ``feed_on_arrival``); otherwise everything comes once per tick (``on_caller_audio``).
        self._on_arrival = False
        # Media clock (samples): frames sent and frames received, one of each per tick.
        self.media = MediaCoupling(rate, keep_far=self.detector is not None)
        # Consumers of the caller's audio (caller_audio): agents' ears.
        self.taps: list[CallerAudioTap] = []
        self._speech_onset: int | None = None
        # One record per utterance (text, interruptibility, when it was said) and the cancels
        # waiting for the worker's acknowledgement.
        self.utterances = Utterances()
        self.bargeins: list[BargeIn] = []
        # The call's recent events (for inspection and tests; bounded).
        self.history: deque[Event] = deque(maxlen=500)
        # This call's events as they happen, for its leg (a browser page shows them); called
        # synchronously, so a listener must not block.
        self.listeners: list[Callable[[Event], None]] = []
        self.leg: Leg | None = None
        self.agent: Agent | None = None
        # The agent asked for this call (POST /api/calls {"agent": ...}, validated); None: the
        # gateway's default.
        self.agent_spec: dict[str, object] | None = None
        # The conversation for the call's record (GET /api/calls/{id}): final transcripts of
        # both sides, bounded.
        self.transcript: deque[dict[str, object]] = deque(maxlen=TRANSCRIPT_LINES)
        self._sub: Subscription | None = None
        # The recording being made, fed the frames of each tick (see gateway.media.recording).
        self.recorder: Recorder | None = None
        # The other call this one's media is crossed with (a bridged transfer), and whether
        # this call runs an agent at all (a bridge's second leg does not).
        self.bridge: Bridge[Call] | None = None
        self.wants_agent = True
        # ``hold_agent``: the agent starts only once this resolves (True: run it; False: it
        # never starts), so an outbound campaign call's answering-machine detection decides
        # before the agent's first word (gateway.campaign.dialer).
        self._agent_gate: asyncio.Future[bool] | None = None
        # Outbound: the Retry-After of the final response to our INVITE, in seconds (RFC 3261
        # §20.33; a 503 from an overloaded trunk says when to try again).
        self.retry_after: float | None = None
        # The outcome of each transfer (for the call's record), and one at a time.
        self.transfers: list[dict[str, object]] = []
        self._transferring = False
        self._agent_stopped = False
        # Utterances of raw agent audio (play_audio) until they finish playing.
        self._raw: dict[str, _RawAudio] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._agent_queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.trace_id = uuid.uuid4().hex[:16]
        # Logs of this call (and of its tasks, through the bound log context) carry these.
        self.log_fields = {"call_id": info.id, "trace_id": self.trace_id}
        self._log_ctx = contextvars.copy_context()
        self._log_ctx.run(bind_log_context, **self.log_fields)

    # --- CallHandle ----------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._info.id

    @property
    def info(self) -> CallInfo:
        return self._info

    async def say(
        self,
        text: str,
        *,
        interrupt: bool = False,
        dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:
        if self._info.state == "ended":
            raise Conflict(f"call {self.id} has ended")
        if self.bridge is not None:
            raise Conflict(f"call {self.id} is bridged to call {self.bridge.peer(self).id}")
        if len(text) > self.manager.max_text_chars:
            raise TextTooLong(
                f"text is {len(text)} characters; the limit is {self.manager.max_text_chars}"
            )
        if interrupt:
            self.interrupt()
        utt = uuid.uuid4().hex
        self.playout.enqueue(utt, text)
        self.utterances.add(Utterance(
            utt, text, time.monotonic(), dtmf_interrupts=dtmf_interrupts, barge_in=barge_in
        ))  # fmt: skip
        # No worker answering (all dead, or the bus lost) must not leave the call stuck behind
        # this utterance: past the worker's own deadline it is given up as an error.
        self._loop.call_later(self.manager.synth_timeout_s, self._give_up_if_silent, utt)
        try:
            await self.manager.bus.submit(
                SpeakRequest(
                    call_id=self.id, utterance_id=utt, text=text,
                    profile=self.profile, trace_id=self.trace_id,  # type: ignore[arg-type]
                    rate=self.rate if self.profile == "wideband" else 0,
                )
            )  # fmt: skip
        except BusError as exc:
            # Fail fast, never queue (README, "Redis outages"): the request reached no worker,
            # so the utterance ends now with its error event rather than holding the call's
            # queue for synth_timeout_s, and whoever said it gets a 503-class error at once.
            self._unsent(utt, text, exc)
            raise BusUnavailable(
                f"utterance {utt} was not queued: the bus is unavailable ({exc})"
            ) from exc
        return utt

    def _unsent(self, utterance_id: str, text: str, exc: BusError) -> None:
        """``utterance_id``'s request could not be put on the bus: drop it and say so."""
        self.playout.cancel(utterance_id)  # nothing was played: its playout events are moot
        self.utterances.finish(utterance_id)
        log.warning("call %s: utterance %s refused: %s", self.id, utterance_id, exc,
                    extra=self.log_fields)  # fmt: skip
        self.emit(UtteranceFinished(
            self.id, utterance_id=utterance_id, outcome="error", heard="",
            error=f"{ERR_BUS_UNAVAILABLE}: {exc}", text=text,
        ))  # fmt: skip

    async def say_stream(
        self, chunks: AsyncIterator[str], *, utterances: list[str] | None = None
    ) -> str:
        """Speak text arriving in pieces: each chunker piece becomes one queued utterance as
        soon as it is complete, so the first words play while the rest is still arriving.
        Returns the id of the first utterance; ``utterances`` collects every one, as queued."""
        chunker = Chunker()
        first: str | None = None
        total = 0
        async for piece in chunks:
            total += len(piece)
            if total > self.manager.max_text_chars:
                raise TextTooLong(
                    f"streamed text passed the limit of {self.manager.max_text_chars}"
                )
            for text in chunker.feed(piece):
                utt = await self.say(text)
                first = first or utt
                if utterances is not None:
                    utterances.append(utt)
        for text in chunker.flush():
            utt = await self.say(text)
            first = first or utt
            if utterances is not None:
                utterances.append(utt)
        if first is None:
            raise BadRequest("streamed text had nothing to speak")
        return first

    async def hangup(self, reason: str = "agent") -> None:
        if self.leg is not None and self._info.state != "ended":
            await self.leg.hangup(reason)

    async def send_dtmf(self, digits: str) -> None:
        """Send keys to the far end (RFC 4733 on SIP legs, the data channel to a browser)."""
        bad = sorted(set(digits) - set(DTMF_KEYS))
        if not digits or bad:
            raise BadRequest(f"digits must be 0-9 * # A-D; got {digits!r}")
        if self.leg is None or self._info.state == "ended":
            raise Conflict(f"call {self.id} has no media")
        await self.leg.send_dtmf(digits)

    async def transfer(
        self,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        """Hand the caller to ``target`` (a ``sip:``/``sips:`` URI) and return the outcome.

        ``mode="blind"``: a REFER on a SIP leg (RFC 3515); when its NOTIFY reports a 2xx the
        call ends with reason "transferred". ``fallback="bridge"``: when the REFER is refused
        or fails (or the leg cannot REFER, a browser), dial ``target`` through the trunk and
        bridge the two calls' audio through the gateway; the agent stops, and either side
        hanging up ends both. ``mode="attended"`` answers ``not_supported``. ``timeout_s``:
        how long to wait for a final NOTIFY, and then for the bridged leg's answer. Raises
        BadRequest (arguments), Conflict (ended, bridged, or a transfer under way)."""
        if mode not in ("blind", "attended"):
            raise BadRequest(f"mode must be blind or attended, got {mode!r}")
        if fallback not in (None, "bridge"):
            raise BadRequest(f"fallback must be bridge or none, got {fallback!r}")
        _check_target(target)
        if timeout_s is not None and not 0 < timeout_s <= 600:
            raise BadRequest(f"timeout_s must be in (0, 600], got {timeout_s!r}")
        if self._info.state in ("ended", "ringing"):
            raise Conflict(f"call {self.id} is {self._info.state}: nothing to transfer")
        if self.bridge is not None:
            raise Conflict(f"call {self.id} is already bridged")
        if self._transferring:
            raise Conflict(f"call {self.id} has a transfer under way")
        timeout = TRANSFER_TIMEOUT_S if timeout_s is None else timeout_s
        if mode == "attended":
            outcome = TransferOutcome("not_supported", None, ATTENDED_NOT_SUPPORTED)
            self._transfer_done(outcome, target, mode, "refer")
            return outcome
        self._transferring = True
        try:
            outcome = await self._refer(target, timeout)
            if outcome.result == "completed":
                await self.hangup("transferred")
            elif fallback == "bridge" and not self._has_ended():
                outcome = await self._bridge_to(target, timeout)
            return outcome
        finally:
            self._transferring = False

    def _has_ended(self) -> bool:
        # A method, not an inline test: the state changes across the awaits above.
        return self._info.state == "ended"

    async def _refer(self, target: str, timeout: float) -> TransferOutcome:
        leg = self.leg
        self.emit(TransferEvent(self.id, state="started", target=target, method="refer"))
        if not isinstance(leg, ReferringLeg):
            outcome = TransferOutcome(
                "not_supported", None, f"a {self._info.leg} leg cannot REFER (no SIP dialog)"
            )
        else:

            def progress(status: int, reason: str) -> None:
                self.emit(TransferEvent(
                    self.id, state="progress", target=target, method="refer", status=status,
                    reason=reason,
                ))  # fmt: skip

            outcome = await leg.refer(target, timeout_s=timeout, on_progress=progress)
        self._transfer_done(outcome, target, "blind", "refer")
        return outcome

    async def _bridge_to(self, target: str, timeout: float) -> TransferOutcome:
        """Dial ``target`` as a second leg and, once it answers, cross the two calls' audio."""
        self.emit(TransferEvent(self.id, state="started", target=target, method="bridge"))
        try:
            other = await self.manager.dial(target)
        except ControlError as exc:
            outcome = TransferOutcome("failed", 503, f"could not dial: {exc.message}")
        except OSError as exc:
            outcome = TransferOutcome("failed", 503, f"could not dial: {exc}")
        else:
            outcome = await self._join(other, timeout)
        self._transfer_done(outcome, target, "blind", "bridge")
        return outcome

    async def _join(self, other: Call, timeout: float) -> TransferOutcome:
        loop = self._loop
        settled: asyncio.Future[None] = loop.create_future()

        def watch(event: Event) -> None:
            # The target answers or fails; the caller only matters if it hangs up (an unhold
            # re-announces "answered").
            wanted = ("answered", "ended") if event.call_id == other.id else ("ended",)
            if isinstance(event, CallStateChanged) and event.state in wanted and not settled.done():
                settled.set_result(None)

        other.listeners.append(watch)
        self.listeners.append(watch)  # the caller may give up while the target rings
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(settled), timeout)
        finally:
            other.listeners.remove(watch)
            self.listeners.remove(watch)
        if self._has_ended():
            await other.hangup("caller gone")
            return TransferOutcome("failed", None, "the caller hung up before the target answered")
        if other.info.state == "ended":
            status, why = end_status(other.info.end_reason)
            return TransferOutcome("failed", status, f"the bridged call failed: {why}")
        if other.info.state == "ringing":
            await other.hangup("no answer")
            return TransferOutcome("failed", 408, f"the target did not answer within {timeout:g} s")
        self._bridge_with(other)
        return TransferOutcome("completed", 200, "bridged", bridged_call=other.id)

    def _bridge_with(self, other: Call) -> None:
        # The agent's voice fades out (10 ms) and it hears no more; from the next tick each
        # side's pacer sends what the other side says.
        self.interrupt()
        bridge = Bridge(self, other)
        self.bridge = other.bridge = bridge
        self._agent_stopped = True
        self._agent_queue.put_nowait(None)  # the agent's loop ends after what it is doing
        log.info("call %s bridged with call %s", self.id, other.id, extra=self.log_fields)

    def _transfer_done(self, outcome: TransferOutcome, target: str, mode: str, method: str) -> None:
        self.transfers.append({"target": target, "mode": mode, "method": method,
                               "ts": time.time(), **outcome.to_json()})  # fmt: skip
        self.emit(TransferEvent(
            self.id, state=outcome.result, target=target, mode=mode, method=method,
            status=outcome.status, reason=outcome.reason, bridged_call=outcome.bridged_call,
        ))  # fmt: skip

    def hold_agent(self) -> None:
        """Keep the call's agent from starting (no ``on_start``, so no greeting) until
        :meth:`release_agent`. Call it before the answer can arrive (right after originating:
        the INVITE is out, no 200 yet)."""
        if self._agent_gate is None:
            self._agent_gate = self._loop.create_future()

    def release_agent(self, run: bool = True) -> None:
        """Start a held agent (``run``), or let it never start (a machine answered: whoever
        holds the call speaks for it). Nothing if not held or already released."""
        gate = self._agent_gate
        if gate is not None and not gate.done():
            gate.set_result(run)

    @property
    def agent_held(self) -> bool:
        return self._agent_gate is not None and not self._agent_gate.done()

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        """The caller's audio from now on: 20 ms int16 frames at ``rate`` (8 or 16 kHz),
        ``async for``-able, ending when the call ends. ``echo_gate``: hold back what may be
        the agent's own voice coming back (see :mod:`gateway.media.tap`). A consumer that
        falls ``max_frames`` behind loses the oldest frames (counted in ``dropped``)."""
        tap = CallerAudioTap(self.rate, rate, echo_gate=echo_gate, max_frames=max_frames)
        if self._info.state == "ended":
            tap.close()
        else:
            self.taps.append(tap)
        return tap

    def start_recording(self, channels: str = "both") -> str:
        """Record the call from the next tick on, to a WAV under ``[recording] dir``:
        ``channels`` "both" (stereo, caller left, agent right) or "caller" (mono). Returns the
        recording's id; its file is opened off the media path (``RecordingEvent`` started,
        or failed: the call goes on). Raises BadRequest, Conflict (ended, already recording),
        Unavailable (recording not set up)."""
        if channels not in CHANNELS:
            raise BadRequest(f"channels must be one of {', '.join(CHANNELS)}; got {channels!r}")
        if self._info.state == "ended":
            raise Conflict(f"call {self.id} has ended")
        if self.recorder is not None and self.recorder.active:
            raise Conflict(f"call {self.id} is already being recorded ({self.recorder.id})")
        recordings = self.manager.recordings
        if recordings is None:
            raise Unavailable("this gateway does not record calls")
        self.recorder = recordings.record(self, channels)
        return self.recorder.id

    def stop_recording(self) -> None:
        """Stop recording (nothing if not recording): the file is finalised in the background
        (``RecordingEvent`` stopped)."""
        if self.recorder is not None:
            self.recorder.stop()
            self.recorder = None

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
        """Play audio the agent brings (a bridged bot's voice) through the same playout as
        synthesised speech: paced by the media tick, faded out by ``interrupt``, reported as
        an utterance (started/finished), resampled from ``rate`` to the call's rate (a
        browser leg at 48 kHz). Returns the samples dropped, oldest first, to keep at most
        ``max_queued_s`` queued (a source faster than real time is buffered up to there)."""
        if self._info.state == "ended":
            return 0
        raw = self._raw.get(utterance_id)
        if raw is None:
            try:
                self.playout.enqueue(utterance_id)
            except ValueError:
                return 0  # stopped already (interrupted): its late audio is dropped
            resampler = None
            if rate != self.rate:
                low = min(rate, self.rate)
                # Telephone audio has nothing above 3.4 kHz: a short filter (4 ms at 8 → 48
                # kHz) is enough, and it is latency the caller hears.
                resampler = Resampler.for_rates(rate, self.rate, pass_hz=0.425 * low,
                                                stop_hz=0.5 * low)  # fmt: skip
            raw = self._raw[utterance_id] = _RawAudio(resampler=resampler)
            # heard=True: kept out of the say() → first audio metric (nothing is synthesised).
            self.utterances.add(Utterance(
                utterance_id, "", time.monotonic(), dtmf_interrupts=dtmf_interrupts,
                barge_in=barge_in, heard=True,
            ))  # fmt: skip
        if raw.ended:
            return 0
        if raw.resampler is not None:
            pcm = _to_int16(raw.resampler.process_f64(pcm))
        self._raw_chunk(utterance_id, raw, pcm)
        excess = self.playout.queued_samples - int(max_queued_s * self.rate)
        return self.playout.drop_oldest(excess) if excess > 0 else 0

    def end_audio(self, utterance_id: str) -> None:
        """No more audio for ``utterance_id``: it finishes once its queued audio has played."""
        raw = self._raw.get(utterance_id)
        if raw is None or raw.ended or self._info.state == "ended":
            return
        raw.ended = True
        if raw.resampler is not None:  # the filter's held-back tail
            self._raw_chunk(utterance_id, raw, _to_int16(raw.resampler.process_f64([], True)))
        events = self.playout.on_message(UtteranceEnd(self.id, utterance_id, raw.seq))
        if events:
            self._on_playout(events)

    def _raw_chunk(self, utterance_id: str, raw: _RawAudio, pcm: npt.NDArray[np.int16]) -> None:
        if not len(pcm):
            return
        chunk = AudioChunk(
            self.id, utterance_id, raw.seq, self.rate, pcm.astype("<i2", copy=False).tobytes()
        )
        raw.seq += 1
        events = self.playout.on_message(chunk)
        if events:
            self._on_playout(events)

    # --- driven by the leg ---------------------------------------------------------------
    async def start(self, agent: Agent | None) -> None:
        """Media is up: subscribe to the call's audio and start the agent."""
        self._sub = await self.manager.bus.subscribe(self.id)
        self._spawn(self._read_audio())
        recordings = self.manager.recordings
        if recordings is not None and recordings.settings.record_all and self.recorder is None:
            # From the answer, before the agent's first words are queued; a recording that
            # cannot start never holds up the call.
            try:
                self.start_recording(recordings.settings.channels)
            except (ControlError, ValueError) as exc:
                log.warning("call %s: not recorded: %s", self.id, exc, extra=self.log_fields)
        self.agent = agent
        self._spawn(self._run_agent(), name="agent")

    def set_state(self, state: CallState, reason: str | None = None) -> None:
        now = time.time()
        changes: dict[str, object] = {"state": state}
        if state == "answered" and self._info.answered_at is None:
            changes["answered_at"] = now
        if state == "ended":
            changes.update(ended_at=now, end_reason=reason)
        if state in ("answered", "ended") and state != self._info.state:
            log.info("call %s %s%s", self.id, state, f" ({reason})" if reason else "",
                     extra=self.log_fields)  # fmt: skip
        self._info = replace_info(self._info, **changes)
        self.emit(CallStateChanged(self.id, state=state, reason=reason))

    def set_codec(self, codec: str) -> None:
        self._info = replace_info(self._info, codec=codec)

    def on_dtmf(self, digit: str, duration_ms: int = 0, source: str = "rfc4733") -> None:
        if self.bridge is not None:
            # Bridged: the key is for the other party (an IVR or a person behind it).
            peer = self.bridge.peer(self)
            self._spawn(_quietly(peer.send_dtmf(digit)))
            self.emit(DtmfReceived(self.id, digit=digit, duration_ms=duration_ms, source=source))
            return
        current = self.playout.current
        u = self.utterances.get(current)
        if current is not None and self.playout.speaking and (u is None or u.dtmf_interrupts):
            self.interrupt(clear_queue=False)
        self.emit(DtmfReceived(self.id, digit=digit, duration_ms=duration_ms, source=source))

    def pull_audio(self, n: int, at: int | None = None) -> npt.NDArray[np.int16]:
        """The next ``n`` samples to send (silence when the agent is quiet). Media-tick hot path.

        ``at``: the frame's media time in samples (the pacer's tick clock, stalls included);
        barge-in times are reported on that clock."""
        if self.bridge is not None:
            pcm = self.bridge.pull(self, n)  # the other call's caller, not our agent
            at = self.media.sent(pcm, at)
            if self.recorder is not None:  # the other party, in the agent's place
                self.recorder.agent(at, pcm)
            return pcm
        if self._staged and (det := self.detector) is not None and det.could_confirm:
            # Caller frames staged since the last batch that could confirm a barge-in are
            # decided before this frame goes (not up to the batch timer later): the fade
            # starts on this very frame.  The batch takes every call's staged frames along.
            self.manager.flush_detection()
        pcm, events = self.playout.pull(n)
        if events:
            self._on_playout(events)
        at = self.media.sent(pcm, at)
        if self.recorder is not None:
            self.recorder.agent(at, pcm)
        detector = self.detector
        # Fed on arrival, the caller's frames reach the detector as they come in; the agent's
        # frame goes to it now, before any caller frame that may echo it.  While the agent has
        # been silent longer than any echo path and no caller speech is pending, nothing is
        # staged (the gap then reads as silence).
        if (
            self._on_arrival
            and detector is not None
            and (not detector.idle or self.media.agent_audible(at))
        ):
            detector.stage_far(pcm, at, jump=True)
            self.manager.stage_detection(self)
        speaking = self.playout.speaking
        if speaking != self._info.speaking:
            self._info = replace_info(self._info, speaking=speaking)
        return pcm

    def feed_on_arrival(self) -> None:
        """The leg will hand the caller's audio to :meth:`on_caller_packet` as each packet
        arrives: the barge-in detector and the agents' ears take it from there, without the
        jitter buffer's playout delay (40-200 ms: barge-in as fast as the caller hears it,
        issue 17), and :meth:`on_caller_audio` (the jitter buffer's frames) then only feeds
        what plays the caller out in time: a bridged party and the recording."""
        self._on_arrival = True

    def plays_caller_out(self) -> bool:
        """Whether anything takes the caller's audio in playout time (:meth:`on_caller_audio`,
        the jitter buffer's frames): a recording, a bridged party, or, on a leg that does not
        feed on arrival, the detector and the agents' ears.  The SIP leg's jitter buffer
        rests while it is False (``RtpEndpoint.playout_wanted``)."""
        return not self._on_arrival or self.recorder is not None or self.bridge is not None

    def on_caller_packet(self, ts: int, pcm: npt.NDArray[np.int16]) -> None:
        """A caller packet's decoded audio the moment it arrives (``feed_on_arrival``), with
        its extended RTP timestamp; packets come in arrival order (a reordered late one is
        dropped, a gap reads as silence). Hot path: staged for the next detector batch."""
        placed = self.media.arrived(ts, len(pcm))
        if placed is None:
            return
        pos, skip = placed
        if skip:
            pcm = pcm[skip:]
        self._hear(pos, pcm)

    def on_caller_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        """One frame of decoded caller audio per media tick (after that tick's ``pull_audio``).
        Media-tick hot path: recorded, played to a bridged party, and (unless the leg feeds
        them on arrival) staged on the detector to be analysed with the other calls' frames in
        the next batch (:meth:`CallManager.flush_detection`) and given to the agents' ears."""
        pos, far = self.media.received(len(pcm))
        if self.recorder is not None:
            self.recorder.caller(pos, pcm)
        if self.bridge is not None and self._on_arrival:
            self.bridge.push(self, pcm)
            return
        if self._on_arrival:
            return
        det = self.detector
        if (
            far is not None
            and det is not None
            and self.bridge is None
            and not (det.idle and self.media.idle(pos, pcm))
        ):
            det.stage_far(far[1], far[0])
        self._hear(pos, pcm)

    def _hear(self, pos: int, pcm: npt.NDArray[np.int16]) -> None:
        """The caller's audio at media time ``pos``, for everything that listens to it."""
        # Everything that listens to the caller (agents' speech-to-text, a bot) taps here:
        # every leg's caller audio, before the barge-in gate.
        if self.taps:
            audible = self.media.agent_audible(pos)
            for tap in self.taps:
                tap.push(pcm, agent_audible=audible)
        if self.bridge is not None:
            # Bridged: the caller talks to the other party; no agent to barge in on.
            if not self._on_arrival:
                self.bridge.push(self, pcm)
            return
        detector = self.detector
        if detector is None:
            return
        # Idle gate: nothing to decide, so jump the detector's clock instead of analysing
        # frames of silence (it keeps what it learnt about the echo path).
        if detector.idle and self.media.idle(pos, pcm):
            detector.skip_to(pos + len(pcm))
            return
        detector.stage_near(pcm, pos)
        self.manager.stage_detection(self)

    def on_vad(self, events: list[VadEvent]) -> None:
        """The detector's events for this call's frames (from the batch, see
        :meth:`CallManager.flush_detection`)."""
        for ev in events:
            for tap in self.taps:
                if isinstance(ev, VoiceStarted):
                    tap.caller_started()
                else:
                    tap.caller_stopped()
            if isinstance(ev, VoiceStarted):
                self._speech_onset = ev.onset_sample
                self._barge_in(ev.onset_sample, ev.decision_sample)
                self.emit(SpeechStarted(self.id))
            else:
                onset = self._speech_onset if self._speech_onset is not None else ev.end_sample
                self._speech_onset = None
                duration = (ev.end_sample - onset) * 1000 // self.rate
                self.emit(SpeechStopped(self.id, duration_ms=int(duration)))

    def _barge_in(self, onset: int, decision: int) -> None:
        if self._on_arrival:
            # The detector's times are where the caller's audio sits on the media clock;
            # arrival placement puts it a little behind the agent's clock
            # (gateway.media.coupling), so the record is taken on the agent's clock: decided
            # now, the onset the detector's evidence before that.
            now = self.media.far_pos
            onset, decision = now - (decision - onset), now
        if onset < self._guard_samples:
            return  # a microphone opening, not a caller talking (bargein.start_guard_ms)
        current = self.playout.current
        u = self.utterances.get(current)
        if current is None or not self.playout.speaking or (u is not None and not u.barge_in):
            return
        start = self.media.far_pos  # the next sample to be sent: the fade starts there
        self.interrupt()
        faded = self.playout.fade_samples
        ms = 1000 / self.rate
        record = BargeIn(
            self.id, utterance_id=current, onset_ms=onset * ms, decision_ms=decision * ms,
            zero_ms=(start + faded) * ms, faded_samples=faded,
        )  # fmt: skip
        self.bargeins.append(record)
        log.info("call %s: barge-in on utterance %s", self.id, current, extra=self.log_fields)
        self.emit(record)

    def _give_up_if_silent(self, utterance_id: str) -> None:
        """The no-worker watchdog (``Utterances.watchdog``): an utterance nothing has come for
        in ``synth_timeout_s`` (from its say, or since its last chunk) ends with an error, so
        the call is never left mute behind it."""
        if self._info.state == "ended":
            return
        timeout = self.manager.synth_timeout_s
        verdict = self.utterances.watchdog(utterance_id, time.monotonic(), timeout)
        if verdict is None:
            return
        if isinstance(verdict, float):
            delay = max(0.0, verdict - time.monotonic())
            self._loop.call_later(delay, self._give_up_if_silent, utterance_id)
            return
        log.warning("call %s: utterance %s: %s; giving up", self.id, utterance_id, verdict,
                    extra=self.log_fields)  # fmt: skip
        error = UtteranceError(self.id, utterance_id, 0, ERR_NO_WORKER, verdict)
        self._on_playout(self.playout.on_message(error))
        # A worker that turns up later skips it.
        self._spawn(self._cancel(utterance_id), name="cancel")

    def interrupt(self, *, clear_queue: bool = True) -> None:
        """Stop the agent now: fade out (10 ms), drop queued audio, cancel it on the worker."""
        self._on_playout(self.playout.interrupt(clear_queue=clear_queue))

    async def ended(self, reason: str) -> None:
        """The leg is gone: stop everything of this call and tell the agent."""
        if self._info.state == "ended":
            return
        self._on_playout(self.playout.interrupt())
        self.set_state("ended", reason)
        self.stop_recording()  # flushed and finalised by the writer
        self.manager.forget(self)
        self.release_agent(False)  # a held agent's task ends without starting
        for tap in self.taps:
            tap.close()
        if self.detector is not None:
            self.detector.close()
        self._agent_queue.put_nowait(None)
        if self._sub is not None:
            await self._sub.close()
        with contextlib.suppress(BusError):
            await self.manager.bus.drop_call(self.id)
        for task in list(self._tasks):
            # The agent finishes on its own (on_end); the worker cancels of what this call
            # will never play must reach the bus: cancelled here, before a bus that does not
            # suspend (the embedded memory bus) ever ran them, the worker rendered a hung-up
            # caller's whole greeting and the next call's first chunk queued behind it.
            name = task.get_name()
            if task is not asyncio.current_task() and not name.startswith(("agent", "cancel")):
                task.cancel()
        if self.bridge is not None:
            # Either side hanging up ends both.
            peer = self.bridge.peer(self)
            try:
                await peer.hangup("bridged call ended")
            except Exception:
                log.exception("call %s: hanging up bridged call %s failed", self.id, peer.id)

    def record(self) -> dict[str, object]:
        """The call's facts and its conversation (``GET /api/calls/{id}``)."""
        spec = self.agent_spec or {}
        kind = spec.get("kind") or getattr(self.agent, "kind", None)
        record: dict[str, object] = {
            **self._info.to_json(),
            "agent": kind,
            "transcript": list(self.transcript),
        }
        if self.transfers:
            record["transfers"] = list(self.transfers)
        if self.bridge is not None:
            record["bridged_with"] = self.bridge.peer(self).id
        return record

    # --- internals -----------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        """Publish ``event`` (on /api/events, to the call's listeners and, unless it is the
        agent's own report or the echo of its say(), to the agent). Agents report their
        conversation here (``Transcript``, ``AgentTurn``, ``AgentError``)."""
        self.history.append(event)
        if isinstance(event, Transcript) and event.final:
            self.transcript.append({"role": event.role, "text": event.text, "ts": event.ts})
        self.manager.publish(event)
        for listener in self.listeners:
            listener(event)
        # Agents get what they act on (DTMF, speech, utterance ends, state changes: the
        # interface promises them), not the echo of their own say() or reports.
        if (
            self.agent is not None
            and not self._agent_stopped
            and not isinstance(event, UtteranceStarted | AgentEvent)
        ):
            self._agent_queue.put_nowait(event)

    def _on_playout(self, events: list[PlayoutEvent]) -> None:
        for ev in events:
            if isinstance(ev, PlayoutStarted):
                u = self.utterances.first_audio(ev.utterance_id)
                if u is not None:
                    for hook in self.manager.on_first_audio:
                        hook(self, time.monotonic() - u.said_at)
                known = self.utterances.get(ev.utterance_id)
                self.emit(
                    UtteranceStarted(
                        self.id,
                        utterance_id=ev.utterance_id,
                        text=known.text if known is not None else "",
                    )
                )
            elif isinstance(ev, PlayoutFinished):
                done = self.utterances.finish(ev.utterance_id)
                raw = self._raw.pop(ev.utterance_id, None)
                # Raw audio (play_audio) has no synthesis to cancel on a worker.
                if raw is None and ev.outcome in ("interrupted", "cancelled"):
                    self._spawn(self._cancel(ev.utterance_id), name="cancel")
                self.emit(UtteranceFinished(
                    self.id, utterance_id=ev.utterance_id, outcome=ev.outcome,
                    heard=" ".join(ev.heard), error=ev.error,
                    text=done.text if done is not None else "",
                ))  # fmt: skip

    async def _cancel(self, utterance_id: str) -> None:
        self.utterances.cancelled(utterance_id, time.monotonic())
        bus = self.manager.bus
        give_up = time.monotonic() + self.manager.synth_timeout_s
        while True:
            try:
                await bus.cancel(utterance_id)
                return
            except BusDown:
                # Through an outage (bounded): the worker holding the utterance resumes it when
                # Redis is back, and must find the cancel then.
                now = time.monotonic()
                if now >= give_up:
                    return
                await asyncio.sleep(bus.health.pause_s(now))
            except BusError:
                return  # an error reply is final

    async def _read_audio(self) -> None:
        assert self._sub is not None
        async for msg in self._sub:
            final = not isinstance(msg, AudioChunk)
            self.utterances.from_worker(msg.utterance_id, time.monotonic(), last=final)
            asked = (
                self.utterances.worker_ended(msg.utterance_id)
                if isinstance(msg, UtteranceEnd)
                else None
            )
            if asked is not None:
                stop_ms = (time.monotonic() - asked) * 1000
                self.emit(WorkerStopped(self.id, utterance_id=msg.utterance_id, stop_ms=stop_ms))
            events = self.playout.on_message(msg)
            if events:
                self._on_playout(events)

    async def _run_agent(self) -> None:
        agent = self.agent
        if agent is None:
            return
        if self._agent_gate is not None and not await self._hold_released():
            return
        try:
            await self._agent_turn(agent.on_start(self))
            while (event := await self._agent_queue.get()) is not None:
                await self._agent_turn(agent.on_event(self, event))
        except Conflict as exc:
            if self._info.state != "ended":
                log.exception("agent failed on call %s; hanging up", self.id)
                await self.hangup("agent error")
            else:
                # The caller hung up while the agent was acting (a say on a call that has
                # just ended): not an agent failure.
                log.info("call %s ended under its agent: %s", self.id, exc.message)
        except Exception:
            log.exception("agent failed on call %s; hanging up", self.id)
            await self.hangup("agent error")
        finally:
            with contextlib.suppress(Exception):
                await agent.on_end(self)

    async def _agent_turn(self, turn: Coroutine[Any, Any, None]) -> None:
        """One agent callback. A say refused because the bus is down cuts that turn short,
        never the call: the agent has the utterance's error event, the caller keeps the line."""
        try:
            await turn
        except BusUnavailable as exc:
            log.warning("call %s: agent's turn cut short: %s", self.id, exc.message,
                        extra=self.log_fields)  # fmt: skip

    async def _hold_released(self) -> bool:
        """Wait out ``hold_agent``; whether the agent is to start. What the call's events said
        while it was held (the answer, the caller's first words) happened before the agent
        existed for the caller: dropped, but for the end of the call."""
        assert self._agent_gate is not None
        run = await self._agent_gate
        ended = False
        while not self._agent_queue.empty():
            ended = ended or self._agent_queue.get_nowait() is None
        if ended or not run or self._info.state == "ended":
            self._agent_stopped = True
            return False
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str = "call") -> None:
        # The agent task is named so ``ended`` lets it finish (it runs on_end). Each task runs
        # in a copy of the call's log context, so its logs carry call_id and trace_id.
        task = self._loop.create_task(coro, name=f"{name}-{self.id}", context=self._log_ctx.copy())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _check_target(target: str) -> None:
    scheme, sep, rest = target.partition(":")
    if not sep or scheme.lower() not in ("sip", "sips") or not rest:
        raise BadRequest(f"target must be a sip: or sips: URI, got {target!r}")
    # It goes into a Refer-To or a Request-URI: whitespace or controls could inject headers.
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        raise BadRequest("target must not contain whitespace or control characters")


def end_status(reason: str | None) -> tuple[int | None, str]:
    """The SIP status behind an outbound call's end reason ("486 Busy Here", "timeout")."""
    text = reason or "unknown"
    code = text[:3]
    if code.isdigit() and (len(text) == 3 or text[3] == " "):
        return int(code), text
    return {"timeout": 408, "unreachable": 503}.get(text), text


async def _quietly(aw: Coroutine[Any, Any, None]) -> None:
    # A key the peer cannot send (no telephone-event negotiated, media gone) is dropped.
    with contextlib.suppress(ControlError, ValueError):
        await aw


def _to_int16(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)


def replace_info(info: CallInfo, **changes: object) -> CallInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)  # type: ignore[arg-type]
