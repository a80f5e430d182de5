"""The ``flow`` agent: a small interpreter that runs a call flow's verbs in order.

The interpreter runs on a task of its own, started by ``on_start``; ``on_event`` (the call's
agent task) only notes what happened (a key, an utterance's end, the caller's speech, the
call's end) and wakes it. It talks to the call only through ``CallHandle`` (and, where the
call has them, ``play_audio``, ``transfer``, ``start_recording``: see
:mod:`gateway.flow.actions`), so it runs the same against a test's stand-in.

How the verbs behave (fields in :mod:`gateway.flow.verbs` and docs/flows.md):

- ``say`` and ``play`` are queued at once (consecutive prompts play back to back, without a
  gap for synthesis); every other verb first waits until what was queued has been heard.
- ``gather`` says its prompt, then collects keys and/or speech: it ends at ``num_digits``,
  at ``finish_on_key``, ``inter_digit_timeout`` after the last key, ``timeout`` after the
  prompt ended with nothing pressed or said, or with the caller's finished utterance (the
  speech-to-text and end-of-turn model the llm agent uses). Keys pressed while no gather runs
  are kept for the next one (a caller who knows the menu types ahead, and its prompt is then
  not said); keys left over when a gather ends (the ``#`` after a full ``num_digits``) are
  dropped. The result is in ``{digits}``, ``{speech}`` and ``{gather_reason}``.
- ``llm`` and ``stream`` hand the call to the conversational agent or a bot's WebSocket; the
  flow gets it back when that agent hangs up (the llm's ``hangup`` and ``end_call_after_reply``
  tools, the bot closing its socket or failing) or, for the llm, on its ``transfer`` and
  ``return_to_flow`` tools: the flow then goes on, with ``{llm_result}`` (hangup | transfer |
  return | error) and ``{llm_target}`` (a transfer's number), or ``{stream_result}`` (closed |
  error).
- The flow's end hangs up (after what was said has been heard).

Failures: a webhook that answers garbage, slowly or with an error, a loop of verbs that never
waits for the caller, a speech-only gather without speech-to-text, or a bug here, are reported
as an ``AgentError`` (kind ``flow_<what>``); the caller hears ``[flow] fallback`` and the call
is hung up. Verbs the call cannot do (play on a leg without raw audio, transfer or record
where the call has neither) are reported the same way and the flow goes on (with the verb's
``fallback`` when it has one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.agents.base import Agent, AudioCallHandle, CallHandle
from gateway.agents.hearing import CallerPartial, CallerTurn, Hearing
from gateway.agents.llm import TOOLS, Ears, LlmAgent, fill
from gateway.agents.twilio_media import phone_number
from gateway.call.control import (
    AgentError,
    CallInfo,
    CallStateChanged,
    Conflict,
    ControlError,
    DtmfReceived,
    Event,
    SpeechStarted,
    TextTooLong,
    Transcript,
    TransferOutcome,
    UtteranceFinished,
)
from gateway.flow import actions
from gateway.flow.source import Webhook, WebhookError
from gateway.flow.verbs import (
    CALL_FACTS,
    MAX_DIGITS,
    Clip,
    FlowBook,
    FlowError,
    Gather,
    Hangup,
    Limits,
    Llm,
    Pause,
    Play,
    Record,
    Redirect,
    Route,
    Say,
    SetVars,
    Step,
    Stream,
    Transfer,
    check_target,
    is_url,
    read_wav,
)
from gateway.media.tap import CallerAudioTap
from voxgate.contract.config import TurnConfig

log = logging.getLogger("voxgate.flow")

# Verbs run in a row without waiting for the caller (a redirect loop): past this it is a bug.
MAX_INSTANT_STEPS = 200
# How long the fallback line may take before the call is hung up anyway.
FALLBACK_WAIT_S = 30.0
# After a completed transfer the far end ends the call; past this the flow hangs up itself.
TRANSFER_END_WAIT_S = 10.0
# A caller who started speaking in a gather has this long to finish (beyond the turn's own
# limits: the longest utterance and the longest pause).
SPEECH_GRACE_S = 5.0
# The caller's audio buffered for a speech gather's ear (20 ms frames).
TAP_FRAMES = 250
# A sub-agent (llm, stream) gets this long to let go of the call.
HANDBACK_WAIT_S = 5.0
# WAV files fetched by play, kept per gateway (the same prompt is played on every call).
MAX_PLAY_BYTES = 20 * 1024 * 1024
CLIP_CACHE = 32

RETURN_TOOL: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "return_to_flow",
        "description": "Hand the caller back to the phone menu once you have helped them "
        "(after a short closing sentence).",
        "parameters": {
            "type": "object",
            "properties": {"reason": {"type": "string"}},
            "required": [],
        },
    },
}


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class FlowServices:
    """What every flow call on a gateway shares (``gateway.agents.registry`` builds it)."""

    webhook: Webhook
    book: FlowBook | None = None  # the flow file's flows
    url: str = ""  # [flow] url: calls start by asking it
    fallback: str = "Sorry, we cannot take your call right now. Please try again later."
    limits: Limits = field(default_factory=Limits)  # for webhook answers
    turn: TurnConfig = field(default_factory=TurnConfig)
    # The speech-to-text, loaded on first use; None: this gateway has none.
    ears: Callable[[], Awaitable[Ears]] | None = None
    # Builders of the agents the flow hands calls to (None: not available here).
    llm: Callable[[dict[str, object]], LlmAgent] | None = None
    stream: Callable[[dict[str, object]], Agent] | None = None
    clock: Callable[[], datetime] = _utc_now
    clips: dict[str, Clip] = field(default_factory=dict)


class _Failure(Exception):
    """The flow cannot go on: ``kind`` becomes the AgentError's, the fallback is said."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Ended(Exception):
    """The call ended under the flow."""


@dataclass(frozen=True, slots=True)
class _Jump:
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class _Insert:
    steps: tuple[Step, ...]


class _Stop:
    pass


_STOP = _Stop()
_Next = _Jump | _Insert | _Stop | None


class FlowAgent:
    """One call run by a flow: a named flow of the gateway's file (``flow``), or a webhook's
    verbs (``url``); ``vars`` start the call's variables (over the file's own)."""

    kind = "flow"

    def __init__(
        self,
        services: FlowServices,
        *,
        flow: str | None = None,
        url: str | None = None,
        variables: dict[str, str] | None = None,
    ) -> None:
        self.services = services
        self.flow = flow
        self.url = url
        book = services.book
        self.vars: dict[str, str] = {**(book.vars if book is not None else {}), **(variables or {})}
        self.task: asyncio.Task[None] | None = None
        self.steps_run = 0
        self.path: list[str] = []  # the verbs run, by path (tests, logs)
        self._call: CallHandle | None = None
        self._digits: deque[str] = deque(maxlen=MAX_DIGITS)
        self._pending: dict[str, str] = {}  # utterance id -> text, queued and not yet ended
        self._wake = asyncio.Event()
        self._ended = False
        self._waits = 0
        # Speech in a gather.
        self._speaking_since: float | None = None
        self._heard: CallerTurn | None = None
        self._ear_error: str | None = None
        # A sub-agent (llm, stream) holding the call.
        self._sub: tuple[Agent, _SubCall] | None = None
        self._llm_result: tuple[str, str] | None = None

    # --- Agent ---------------------------------------------------------------------------
    async def on_start(self, call: CallHandle) -> None:
        self._call = call
        self._set_facts(call.info)
        self.task = asyncio.get_running_loop().create_task(self._run(call), name=f"flow-{call.id}")

    async def on_event(self, call: CallHandle, event: Event) -> None:
        if isinstance(event, CallStateChanged) and event.state == "ended":
            self._ended = True
        sub = self._sub
        if sub is not None:
            agent, handle = sub
            if isinstance(event, UtteranceFinished):
                handle.finished.add(event.utterance_id)
            await agent.on_event(handle, event)
        elif isinstance(event, DtmfReceived):
            self._digits.append(event.digit)
        elif isinstance(event, SpeechStarted) and self._speaking_since is None:
            self._speaking_since = asyncio.get_running_loop().time()
        if isinstance(event, UtteranceFinished):
            text = self._pending.pop(event.utterance_id, None)
            if text is not None and event.outcome in ("done", "interrupted"):
                heard = (event.text or text) if event.outcome == "done" else event.heard
                if heard:
                    call.emit(Transcript(call.id, role="agent", text=heard))
        self._wake.set()

    async def on_end(self, call: CallHandle) -> None:
        self._ended = True
        self._wake.set()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=HANDBACK_WAIT_S + 1.0)

    # --- the interpreter -----------------------------------------------------------------
    async def _run(self, call: CallHandle) -> None:
        try:
            steps = await self._entry()
            if await self._execute(call, steps):
                # The flow ran out of verbs: the call ends once the last words are heard.
                await self._drain()
                if not self._ended:
                    await call.hangup("flow")
        except _Ended:
            pass
        except _Failure as exc:
            await self._fail(call, exc.kind, exc.message)
        except Conflict:
            pass  # the call ended while a verb was acting on it
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must still end the call cleanly
            log.exception("call %s: the flow failed", call.id)
            await self._fail(call, "flow_internal", f"{type(exc).__name__}: {exc}")

    async def _entry(self) -> tuple[Step, ...]:
        book = self.services.book
        url = self.url or (self.services.url if self.flow is None else "")
        if url:
            steps = await self._hook(url, "start")
            if not steps:
                raise _Failure("flow_webhook_invalid", f"{url}: the first answer has no verbs")
            return steps
        if book is None:
            raise _Failure("flow_internal", "no flow to run: no [flow] file or url")
        return book.flows[self.flow or book.start]

    async def _execute(self, call: CallHandle, steps: tuple[Step, ...]) -> bool:
        """Run ``steps`` (and where they lead); True when they ran out, False when a verb
        ended the flow (hangup, a transfer)."""
        i = 0
        instant = 0
        waits = self._waits
        while i < len(steps):
            if self._ended:
                raise _Ended
            step = steps[i]
            i += 1
            if step.when is not None and not step.when.holds(self.services.clock()):
                continue
            if self._waits != waits:
                instant, waits = 0, self._waits
            instant += 1
            if instant > MAX_INSTANT_STEPS:
                raise _Failure("flow_loop", f"{step.path}: {MAX_INSTANT_STEPS} verbs in a row "
                               "without waiting for the caller (a redirect loop?)")  # fmt: skip
            self.steps_run += 1
            self.path.append(step.path)
            nxt = await self._verb(call, step)
            if isinstance(nxt, _Jump):
                steps, i = nxt.steps, 0
            elif isinstance(nxt, _Insert):
                steps, i = nxt.steps + steps[i:], 0
            elif isinstance(nxt, _Stop):
                return False
        return True

    async def _verb(self, call: CallHandle, step: Step) -> _Next:
        v = step.verb
        if isinstance(v, Say):
            await self._say(call, step, v)
            return None
        if isinstance(v, Play):
            await self._play(call, step, v)
            return None
        if isinstance(v, SetVars):
            for k, value in v.values:
                self.vars[k] = fill(value, self.vars)
            return None
        if isinstance(v, Gather):
            return await self._gather(call, step, v)
        if isinstance(v, Redirect):
            if v.flow is not None:
                return _Jump(self._flow(v.flow))
            assert v.url is not None
            steps = await self._hook(v.url, "redirect", step)
            return _Jump(steps) if steps is not None else None
        await self._drain()
        if isinstance(v, Pause):
            await self._sleep(v.length)
            return None
        if isinstance(v, Hangup):
            await call.hangup(v.reason)
            return _STOP
        if isinstance(v, Transfer):
            return await self._transfer(call, step, v)
        if isinstance(v, Record):
            return await self._record(call, step, v)
        if isinstance(v, Llm):
            return await self._llm(call, step, v)
        if isinstance(v, Stream):
            return await self._stream(call, step, v)
        raise AssertionError(f"unhandled verb {v!r}")

    # --- waiting -------------------------------------------------------------------------
    async def _wait(self, until: Callable[[], bool], deadline: float | None) -> bool:
        """Wait until ``until()`` (True) or the loop time ``deadline`` (False); the call
        ending raises ``_Ended``."""
        loop = asyncio.get_running_loop()
        while not until():
            if self._ended:
                raise _Ended
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            self._wake.clear()
            self._waits += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
        return True

    async def _wait_once(self, deadline: float | None) -> bool:
        """Until anything happens (True) or the loop time ``deadline`` (False)."""
        if self._ended:
            raise _Ended
        left = None if deadline is None else deadline - asyncio.get_running_loop().time()
        if left is not None and left <= 0:
            return False
        self._wake.clear()
        self._waits += 1
        try:
            await asyncio.wait_for(self._wake.wait(), left)
        except TimeoutError:
            return False
        return True

    async def _drain(self) -> None:
        """Until everything queued has been heard (or cut short)."""
        await self._wait(lambda: not self._pending, None)

    async def _sleep(self, seconds: float) -> None:
        await self._wait(lambda: False, asyncio.get_running_loop().time() + seconds)

    # --- speaking ------------------------------------------------------------------------
    async def _say(self, call: CallHandle, step: Step, v: Say) -> list[str]:
        text = fill(v.text, self.vars)
        utts = []
        for _ in range(v.loop):
            try:
                utt = await call.say(
                    text, dtmf_interrupts="dtmf" in v.barge_in, barge_in="speech" in v.barge_in
                )
            except TextTooLong as exc:
                call.emit(
                    AgentError(call.id, kind="flow_say", message=f"{step.path}: {exc.message}")
                )
                break
            self._pending[utt] = text
            utts.append(utt)
        return utts

    async def _play(self, call: CallHandle, step: Step, v: Play) -> list[str]:
        if not isinstance(call, AudioCallHandle):
            self._report(call, "flow_play", f"{step.path}: this call cannot play audio files")
            return []
        clip = v.clip
        if clip is None and v.url is not None:
            clip = await self._fetch_clip(call, step, v.url)
        if clip is None:
            return []
        utts = []
        for _ in range(v.loop):
            utt = uuid.uuid4().hex
            seconds = len(clip.pcm) / clip.rate
            call.play_audio(
                utt, clip.pcm, rate=clip.rate, barge_in="speech" in v.barge_in,
                dtmf_interrupts="dtmf" in v.barge_in, max_queued_s=max(60.0, seconds + 5.0),
            )  # fmt: skip
            call.end_audio(utt)
            self._pending[utt] = ""
            utts.append(utt)
        return utts

    async def _fetch_clip(self, call: CallHandle, step: Step, url: str) -> Clip | None:
        clips = self.services.clips
        clip = clips.get(url)
        if clip is not None:
            return clip
        try:
            data = await self.services.webhook.request("GET", url, max_bytes=MAX_PLAY_BYTES)
            clip = read_wav(data)
        except WebhookError as exc:
            self._report(call, "flow_play", f"{step.path}: {exc.message}")
            return None
        except ValueError as exc:
            self._report(call, "flow_play", f"{step.path}: {url}: {exc}")
            return None
        if len(clips) >= CLIP_CACHE:
            clips.pop(next(iter(clips)))
        clips[url] = clip
        return clip

    async def _prompt(self, call: CallHandle, step: Step, v: Say | Play) -> list[str]:
        if isinstance(v, Say):
            return await self._say(call, step, v)
        return await self._play(call, step, v)

    # --- gather --------------------------------------------------------------------------
    async def _gather(self, call: CallHandle, step: Step, g: Gather) -> _Next:
        loop = asyncio.get_running_loop()
        dtmf, speech = "dtmf" in g.input, "speech" in g.input
        if speech and self.services.ears is None:
            message = f"{step.path}: speech input, but this gateway has no speech-to-text"
            if not dtmf:
                raise _Failure("flow_stt", message)
            self._report(call, "flow_stt", message + "; listening for keys only")
            speech = False
        if not dtmf:
            self._digits.clear()
        self._heard, self._ear_error, self._speaking_since = None, None, None
        ear = loop.create_task(self._listen(call)) if speech else None
        collected = ""
        reason = ""
        prompt: list[str] = []
        try:
            if g.prompt is not None and not (dtmf and self._digits):
                prompt = await self._prompt(call, step, g.prompt)
            prompt_done_at: float | None = None
            last_key = 0.0
            while not reason:
                while dtmf and self._digits and not reason:
                    key = self._digits.popleft()
                    if key == g.finish_on_key:
                        reason = "finish_key"
                        break
                    collected += key
                    last_key = loop.time()
                    if g.num_digits is not None and len(collected) >= g.num_digits:
                        reason = "num_digits"
                    elif len(collected) >= MAX_DIGITS:
                        reason = "max_digits"
                if reason:
                    break
                if self._heard is not None:
                    reason = "speech"
                    break
                if self._ear_error is not None and not dtmf:
                    raise _Failure("flow_stt", f"{step.path}: {self._ear_error}")
                if prompt_done_at is None and not any(u in self._pending for u in prompt):
                    prompt_done_at = loop.time()
                deadline: float | None
                if collected:
                    deadline = last_key + g.inter_digit_timeout
                elif self._speaking_since is not None and speech:
                    turn = self.services.turn
                    deadline = (
                        self._speaking_since
                        + turn.max_segment_s
                        + (turn.max_silence_ms / 1000 + SPEECH_GRACE_S)
                    )
                elif prompt_done_at is None:
                    deadline = None
                else:
                    deadline = prompt_done_at + g.timeout
                if not await self._wait_once(deadline):
                    reason = "inter_digit_timeout" if collected else "timeout"
        finally:
            if ear is not None:
                ear.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ear
        if any(u in self._pending for u in prompt):
            call.interrupt()  # the caller answered: the rest of the prompt is not said
        self._digits.clear()  # keys past the end (the "#" after num_digits) are not type-ahead
        heard = self._heard.text.strip() if self._heard is not None else ""
        self.vars.update(digits=collected, speech=heard, gather_reason=reason)
        outcome: str | None = None
        if heard:
            value = _words(heard)
        else:
            value = collected
            if reason == "timeout" and not collected:
                outcome = "timeout"
            elif not g.min_digits <= len(collected) <= g.max_digits:
                outcome = "invalid"
        result: dict[str, object] = {"reason": reason, "digits": collected, "speech": heard}
        return await self._follow(step, g.route, value, outcome, result, fold=bool(heard))

    async def _listen(self, call: CallHandle) -> None:
        """A speech gather's ear: the caller's next finished utterance into ``_heard``."""
        assert self.services.ears is not None
        try:
            ears = await self.services.ears()
        except Exception as exc:
            log.warning("call %s: speech-to-text unavailable: %s", call.id, exc)
            self._ear_error = f"speech-to-text unavailable: {exc}"
            self._report(call, "flow_stt", self._ear_error)
            self._wake.set()
            return
        tap = call.caller_audio(16000, echo_gate=True, max_frames=TAP_FRAMES)
        hearing = Hearing(tap, ears.stt, ears.model, self.services.turn)
        try:
            async for ev in hearing:
                if isinstance(ev, CallerPartial):
                    if self._speaking_since is None:
                        self._speaking_since = asyncio.get_running_loop().time()
                    call.emit(Transcript(call.id, role="caller", text=ev.text, final=False))
                elif ev.text.strip():
                    call.emit(Transcript(call.id, role="caller", text=ev.text))
                    self._heard = ev
                    self._wake.set()
                    return
                else:
                    self._speaking_since = None  # noise, not words: the timeout runs again
                self._wake.set()
        finally:
            tap.close()
            await hearing.aclose()

    # --- transfer, record ----------------------------------------------------------------
    async def _transfer(self, call: CallHandle, step: Step, v: Transfer) -> _Next:
        target = fill(v.target, self.vars)
        outcome = await self._try_transfer(call, step, v, target)
        self.vars.update(
            transfer_result=outcome.result,
            transfer_status=str(outcome.status or ""),
            transfer_reason=outcome.reason,
        )
        log.info("call %s: %s to %s: %s (%s %s)", call.id, v.name, target, outcome.result,
                 outcome.status, outcome.reason)  # fmt: skip
        result: dict[str, object] = {"result": outcome.result, "status": outcome.status,
                                     "reason": outcome.reason, "target": target}  # fmt: skip
        if outcome.result == "completed":
            # The far end has the caller: a REFER's call ends ("transferred"), a bridged one
            # goes on without this agent. Either way the flow is over; a webhook that asked is
            # told (its answer has nothing left to act on).
            if v.route.action is not None:
                with contextlib.suppress(_Failure):
                    await self._hook(v.route.action, "action", step, result)
            return _STOP
        if v.fallback:
            return _Insert(v.fallback)
        return await self._follow(step, v.route, "", outcome.result, result)

    async def _try_transfer(
        self, call: CallHandle, step: Step, v: Transfer, target: str
    ) -> TransferOutcome:
        if v.mode == "attended":
            reason = ("attended transfer (REFER with Replaces, RFC 3891) is not supported; "
                      "use mode 'blind'")  # fmt: skip
            self._report(call, "flow_transfer", f"{step.path}: {reason}")
            return TransferOutcome("not_supported", None, reason)
        try:
            check_target(f"{step.path}.target", target)
        except FlowError as exc:
            self._report(call, "flow_transfer", str(exc))
            return TransferOutcome("failed", None, exc.reason)
        uri = actions.sip_target(target, call.info)
        outcome = await actions.transfer(call, uri, bridge=v.bridge)
        if outcome.result == "not_supported":
            self._report(call, "flow_transfer", f"{step.path}: {outcome.reason}")
        return outcome

    async def _record(self, call: CallHandle, step: Step, v: Record) -> _Next:
        try:
            if v.action == "stop":
                await actions.stop_recording(call)
                return None
            if v.consent:
                await self._say(call, step, Say(v.consent, frozenset()))
                await self._drain()  # recording starts once the caller has been told
            rid = await actions.start_recording(call, v.channels)
        except (actions.Unsupported, ControlError, OSError) as exc:
            message = exc.message if isinstance(exc, ControlError) else str(exc)
            self._report(call, "flow_record", f"{step.path}: {message}")
            return _Insert(v.fallback) if v.fallback else None
        if rid is not None:
            self.vars["recording_id"] = rid
        return None

    # --- handing the call over -----------------------------------------------------------
    async def _llm(self, call: CallHandle, step: Step, v: Llm) -> _Next:
        build = self.services.llm
        self._llm_result = None
        if build is None:
            self._report(call, "flow_llm", f"{step.path}: this gateway has no [llm] base_url")
            result, target = "error", ""
        else:
            spec: dict[str, object] = {"vars": dict(self.vars)}
            for key in ("system_prompt", "greeting", "model", "temperature", "max_tokens"):
                value = getattr(v, key)
                if value is not None:
                    spec[key] = value
            agent = build(spec)
            agent.tools = [*TOOLS, RETURN_TOOL]
            agent.on_tool = self._llm_tool
            await self._hand_over(call, agent)
            result, target = self._llm_result or ("hangup", "")
        self.vars.update(llm_result=result, llm_target=target if result == "transfer" else "")
        self.vars["llm_reason"] = target if result == "return" else ""
        return await self._follow(step, v.route, "", result, {"result": result, "target": target})

    async def _llm_tool(self, name: str, args: dict[str, Any]) -> dict[str, object] | None:
        """The llm's tools that hand the call back to the flow (after the reply is said)."""
        if name == "transfer":
            self._llm_result = ("transfer", str(args.get("to", "")))
            return {"ok": True, "note": "the call flow transfers the caller now"}
        if name == "return_to_flow":
            self._llm_result = ("return", str(args.get("reason", "")))
            return {"ok": True, "note": "the caller is back in the phone menu"}
        return None

    async def _stream(self, call: CallHandle, step: Step, v: Stream) -> _Next:
        build = self.services.stream
        result = "error"
        if build is None:
            self._report(call, "flow_stream", f"{step.path}: no bot WebSocket on this gateway")
        elif not isinstance(call, AudioCallHandle):
            self._report(call, "flow_stream", f"{step.path}: this call cannot play a bot's audio")
        else:
            params = {k: fill(x, self.vars) for k, x in v.parameters}
            agent = build({"url": v.url, "parameters": params} if v.url else {"parameters": params})
            reason = await self._hand_over(call, agent)
            failed = getattr(agent, "error", None) is not None or reason == "stream error"
            result = "error" if failed else "closed"
        self.vars["stream_result"] = result
        return await self._follow(step, v.route, "", result, {"result": result})

    async def _hand_over(self, call: CallHandle, agent: Agent) -> str:
        """Let ``agent`` run the call until it hangs up (which hands the call back here);
        the hang-up's reason."""
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        handle = (_AudioSubCall if isinstance(call, AudioCallHandle) else _SubCall)(
            call, done, self._wake
        )
        self._sub = (agent, handle)
        try:
            await agent.on_start(handle)
            await self._wait(done.done, None)
        finally:
            self._sub = None
            for tap in handle.taps:
                tap.close()  # the agent's ear ends with its turn
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent.on_end(handle), HANDBACK_WAIT_S)
        # What the agent said and is still playing is waited for like the flow's own words.
        for utt in handle.utts - handle.finished:
            self._pending.setdefault(utt, "")
        return done.result()

    # --- where results lead --------------------------------------------------------------
    async def _follow(
        self,
        step: Step,
        route: Route,
        value: str,
        outcome: str | None,
        result: dict[str, object],
        *,
        fold: bool = False,
    ) -> _Next:
        if route.action is not None:
            steps = await self._hook(route.action, "action", step, result)
            return _Jump(steps) if steps is not None else None
        target = route.next if route.next is not None else route.choose(value, outcome, fold=fold)
        if target is None:
            return None
        if is_url(target):
            steps = await self._hook(target, "action", step, result)
            return _Jump(steps) if steps is not None else None
        return _Jump(self._flow(target))

    def _flow(self, name: str) -> tuple[Step, ...]:
        book = self.services.book
        if book is None or name not in book.flows:
            raise _Failure("flow_internal", f"no flow named {name!r}")
        return book.flows[name]

    async def _hook(
        self,
        url: str,
        event: str,
        step: Step | None = None,
        result: dict[str, object] | None = None,
    ) -> tuple[Step, ...] | None:
        payload: dict[str, object] = {
            "event": event,
            **{k: self.vars.get(k, "") for k in CALL_FACTS},
            "vars": {k: x for k, x in self.vars.items() if k not in CALL_FACTS},
        }
        if step is not None:
            payload["verb"] = step.path.rsplit(".", 1)[-1]
            payload["path"] = step.path
        if result is not None:
            payload["result"] = result
        try:
            return await self.services.webhook.verbs(url, payload, self.services.limits)
        except WebhookError as exc:
            raise _Failure(f"flow_webhook_{exc.kind}", exc.message) from None

    # --- reporting -----------------------------------------------------------------------
    def _report(self, call: CallHandle, kind: str, message: str) -> None:
        log.warning("call %s: %s: %s", call.id, kind, message)
        call.emit(AgentError(call.id, kind=kind, message=message))

    async def _fail(self, call: CallHandle, kind: str, message: str) -> None:
        """Report, say the fallback line, hang up."""
        if self._ended:
            return
        self._report(call, kind, message)
        with contextlib.suppress(ControlError, _Ended):
            if self._pending:
                call.interrupt()
            utt = await call.say(self.services.fallback, dtmf_interrupts=False, barge_in=False)
            self._pending[utt] = self.services.fallback
            await self._wait(lambda: utt not in self._pending,
                             asyncio.get_running_loop().time() + FALLBACK_WAIT_S)  # fmt: skip
        if not self._ended:
            with contextlib.suppress(ControlError):
                await call.hangup("flow error")

    def _set_facts(self, info: CallInfo) -> None:
        inbound = info.direction == "inbound"
        caller, callee = (info.remote, info.local) if inbound else (info.local, info.remote)
        self.vars.update(
            call_id=info.id, caller=phone_number(caller), callee=phone_number(callee),
            caller_uri=caller, callee_uri=callee, direction=info.direction, leg=info.leg,
        )  # fmt: skip


def _words(text: str) -> str:
    """Words heard, as branches match them: lower case, no punctuation."""
    return " ".join("".join(c for c in w if c.isalnum()) for w in text.lower().split()).strip()


class _SubCall:
    """The call as an agent the flow hands it to sees it: everything passes through, except
    ``hangup``, which hands the call back to the flow (the agent is done with it)."""

    def __init__(self, call: CallHandle, done: asyncio.Future[str], wake: asyncio.Event) -> None:
        self._call = call
        self._done = done
        self._wake = wake
        self.taps: list[CallerAudioTap] = []
        self.utts: set[str] = set()
        self.finished: set[str] = set()

    @property
    def id(self) -> str:
        return self._call.id

    @property
    def info(self) -> CallInfo:
        return self._call.info

    async def say(
        self, text: str, *, interrupt: bool = False, dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:  # fmt: skip
        utt = await self._call.say(
            text, interrupt=interrupt, dtmf_interrupts=dtmf_interrupts, barge_in=barge_in
        )
        self.utts.add(utt)
        return utt

    async def say_stream(
        self, chunks: AsyncIterator[str], *, utterances: list[str] | None = None
    ) -> str:
        noted = _Noted(utterances, self.utts)
        return await self._call.say_stream(chunks, utterances=noted)

    def emit(self, event: Event) -> None:
        self._call.emit(event)

    def interrupt(self, *, clear_queue: bool = True) -> None:
        self._call.interrupt(clear_queue=clear_queue)

    async def send_dtmf(self, digits: str) -> None:
        await self._call.send_dtmf(digits)

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        tap = self._call.caller_audio(rate, echo_gate=echo_gate, max_frames=max_frames)
        self.taps.append(tap)
        return tap

    def start_recording(self, channels: str = "both") -> str:
        return self._call.start_recording(channels)

    def stop_recording(self) -> None:
        self._call.stop_recording()

    async def transfer(
        self, target: str, *, mode: str = "blind", fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:  # fmt: skip
        return await self._call.transfer(target, mode=mode, fallback=fallback, timeout_s=timeout_s)

    async def hangup(self, reason: str = "agent") -> None:
        if not self._done.done():
            self._done.set_result(reason)
            self._wake.set()


class _AudioSubCall(_SubCall):
    """A ``_SubCall`` of a call that plays raw audio (a bot's voice)."""

    def play_audio(
        self, utterance_id: str, pcm: Any, *, rate: int = 8000, barge_in: bool = False,
        dtmf_interrupts: bool = False, max_queued_s: float = 60.0,
    ) -> int:  # fmt: skip
        call = self._call
        assert isinstance(call, AudioCallHandle)
        self.utts.add(utterance_id)
        return call.play_audio(
            utterance_id, pcm, rate=rate, barge_in=barge_in, dtmf_interrupts=dtmf_interrupts,
            max_queued_s=max_queued_s,
        )  # fmt: skip

    def end_audio(self, utterance_id: str) -> None:
        call = self._call
        assert isinstance(call, AudioCallHandle)
        call.end_audio(utterance_id)


class _Noted(list[str]):
    """The ids ``say_stream`` queues, noted for the flow and passed on to the agent's own
    list (the llm's enters them into its round as they come)."""

    def __init__(self, inner: list[str] | None, seen: set[str]) -> None:
        super().__init__()
        self._inner = inner
        self._seen = seen

    def append(self, utterance_id: str) -> None:
        self._seen.add(utterance_id)
        if self._inner is not None:
            self._inner.append(utterance_id)
        super().append(utterance_id)
