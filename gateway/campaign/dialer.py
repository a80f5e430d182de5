"""The real dialler of a campaign attempt: originate the call through the gateway's SIP user
agent, classify how it ended, run answering-machine detection on the answered call's own audio
with the agent held, leave the voicemail after the beep.

Two layers, as elsewhere in the gateway:

- :class:`AttemptCore`, sans-I/O: fed what happened (answered, ended with a status, the ring
  timeout, AMD events, the voicemail finished), it answers with what to do
  (:class:`Hangup`, :class:`ReleaseAgent`, :class:`LeaveVoicemail`) and, once the call has
  ended, the :class:`DialResult`.
- :class:`CallDialer`, the asyncio side: places the call with the agent held
  (``CallManager.originate_call(hold_agent=True)``), starts AMD at the answer
  (:class:`gateway.amd.oncall.AmdOnCall`), times the ring, carries out the core's actions and
  returns when the call is over, so the runner's ``max_concurrent`` counts live calls.

What the core decides, and why:

- Not answered within ``ring_timeout_s``: CANCEL (RFC 3261 §9.1) → ``no_answer``. Ended
  unanswered: :func:`outcome_for_status` of the final status (486 → ``busy``, 503 →
  ``failed`` with the trunk's Retry-After, RFC 3261 §20.33).
- Answered without AMD: ``human`` (the agent was never held).
- ``amd.human`` → the agent starts (it greets), ``human``. ``amd.no_speech`` and
  ``amd.decision_timeout`` → also ``human`` with the AMD result in ``reason``: like Twilio's
  "unknown" and Asterisk's NOTSURE, an unsure call goes on to the agent rather than being
  dropped on a person.
- ``amd.machine`` → the agent never starts. With no voicemail text: hang up at once. With one:
  wait for ``amd.beep`` or ``amd.greeting_ended`` (the detector's jambonz-style timers), say the
  text, wait until it has played out (``utterance.finished`` done), hang up;
  ``voicemail_left`` only when it played in full. If neither comes before the detector gives up
  (``tone_timeout_ms`` after the answer: the "greeting" is still going after 20 s, so no
  recorder is listening yet), hang up without leaving it (reason says so).
- The callee hangs up while AMD decides: ``human`` (reason "hung up during amd": it answered,
  and a machine does not hang up in its first seconds; not retried as a machine); after
  ``machine``: ``machine`` without voicemail (before the beep, or during the message).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from gateway.agents.llm import fill
from gateway.amd.detector import (
    AmdBeep,
    AmdConfig,
    AmdDecisionTimeout,
    AmdEvent,
    AmdGreetingEnded,
    AmdHuman,
    AmdMachine,
    AmdNoSpeech,
)
from gateway.amd.oncall import AmdOnCall
from gateway.call.calls import end_status
from gateway.call.control import (
    CallStateChanged,
    ControlError,
    Event,
    Unavailable,
    UtteranceFinished,
)
from gateway.campaign.outcomes import Outcome, outcome_for_status
from gateway.campaign.runner import DialResult, Emit
from gateway.campaign.spec import CampaignSpec
from gateway.campaign.store import Claim

if TYPE_CHECKING:
    from gateway.call.calls import Call
    from gateway.call.manager import CallManager

log = logging.getLogger("voxgate.campaign")

# After the detector's own tone timeout, how long (wall clock) to wait before giving up on a
# detector that stopped getting frames (its clock is the media; a stalled feed must not hold a
# machine's line, and the campaign's concurrency slot, forever).
AMD_WALL_MARGIN_S = 5.0


# --- the sans-I/O core -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hangup:
    reason: str


@dataclass(frozen=True, slots=True)
class ReleaseAgent:
    """Start the held agent (``run``) or let it never start (a machine)."""

    run: bool


@dataclass(frozen=True, slots=True)
class LeaveVoicemail:
    text: str


Action = Hangup | ReleaseAgent | LeaveVoicemail


class Phase(Enum):
    RINGING = "ringing"
    DECIDING = "deciding"  # answered, AMD listening, agent held
    CONVERSATION = "conversation"  # a person (or unsure): the agent has the call
    AWAIT_BEEP = "await_beep"  # a machine: waiting for the beep or the greeting's end
    LEAVING = "leaving"  # the voicemail is playing
    HANGING_UP = "hanging_up"  # we sent BYE/CANCEL; waiting for the call to end
    OVER = "over"


class AttemptCore:
    """What to do next on one dial attempt (see the module docstring for the rules)."""

    def __init__(self, *, amd: bool, voicemail: str | None, ring_timeout_s: float) -> None:
        self.amd = amd
        self.voicemail = voicemail
        self.ring_timeout_s = ring_timeout_s
        self.phase = Phase.RINGING
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.voicemail_left = False
        self.voicemail_id: str | None = None
        self.ring_timed_out = False
        self.result: DialResult | None = None

    # inputs -------------------------------------------------------------------------------
    def ring_timeout(self) -> list[Action]:
        if self.phase is not Phase.RINGING:
            return []
        self.ring_timed_out = True
        self.phase = Phase.HANGING_UP
        self.outcome = Outcome.NO_ANSWER
        self.reason = f"no answer within {self.ring_timeout_s:g} s (CANCEL sent)"
        return [Hangup("no answer")]

    def answered(self) -> list[Action]:
        if self.phase is not Phase.RINGING:
            return []  # a re-INVITE's unhold says "answered" again
        self.outcome = Outcome.HUMAN
        if not self.amd:
            self.phase = Phase.CONVERSATION
            return []
        self.phase = Phase.DECIDING
        return []

    def amd_event(self, event: AmdEvent) -> list[Action]:
        if self.phase is Phase.DECIDING:
            if isinstance(event, AmdHuman):
                self.phase = Phase.CONVERSATION
                self.outcome = Outcome.HUMAN
                return [ReleaseAgent(True)]
            if isinstance(event, AmdNoSpeech | AmdDecisionTimeout):
                self.phase = Phase.CONVERSATION
                self.outcome = Outcome.HUMAN
                self.reason = f"amd: {event.name.removeprefix('amd.')}"
                return [ReleaseAgent(True)]
            if isinstance(event, AmdMachine):
                self.outcome = Outcome.MACHINE
                self.reason = f"amd: machine ({event.cause})" if event.cause else "amd: machine"
                if self.voicemail is None:
                    self.phase = Phase.HANGING_UP
                    return [ReleaseAgent(False), Hangup("answering machine")]
                self.phase = Phase.AWAIT_BEEP
                return [ReleaseAgent(False)]
            return []
        if self.phase is Phase.AWAIT_BEEP and isinstance(event, AmdBeep | AmdGreetingEnded):
            assert self.voicemail is not None
            self.phase = Phase.LEAVING
            after = "beep" if isinstance(event, AmdBeep) else "end of greeting"
            self.reason = f"{self.reason}; voicemail after the {after}"
            return [LeaveVoicemail(self.voicemail)]
        return []

    def amd_over(self) -> list[Action]:
        """The detector stopped (decided, and for a machine the beep came or its tone
        timeout ran out) — or, wall clock, it stopped getting audio."""
        if self.phase is Phase.AWAIT_BEEP:
            self.phase = Phase.HANGING_UP
            self.reason = f"{self.reason}; no beep or end of greeting: voicemail not left"
            return [Hangup("answering machine")]
        if self.phase is Phase.DECIDING:  # no decision at all (a stalled feed): go on
            self.phase = Phase.CONVERSATION
            self.reason = "amd: no decision"
            return [ReleaseAgent(True)]
        return []

    def voicemail_queued(self, utterance_id: str) -> None:
        self.voicemail_id = utterance_id

    def voicemail_failed(self, why: str) -> list[Action]:
        if self.phase is not Phase.LEAVING:
            return []
        self.phase = Phase.HANGING_UP
        self.reason = f"{self.reason}; voicemail failed: {why}"
        return [Hangup("answering machine")]

    def utterance_finished(
        self, utterance_id: str, outcome: str, error: str | None
    ) -> list[Action]:
        if self.phase is not Phase.LEAVING or utterance_id != self.voicemail_id:
            return []
        self.phase = Phase.HANGING_UP
        if outcome == "done":
            self.voicemail_left = True
        else:
            self.reason = f"{self.reason}; voicemail {outcome}" + (f": {error}" if error else "")
        return [Hangup("voicemail left" if self.voicemail_left else "answering machine")]

    def ended(self, end_reason: str | None, retry_after: float | None) -> DialResult:
        """The call is over: the attempt's result."""
        phase, self.phase = self.phase, Phase.OVER
        if self.result is not None:
            return self.result
        status, why = end_status(end_reason)
        if self.ring_timed_out:
            result = DialResult(Outcome.NO_ANSWER, reason=self.reason)
        elif phase is Phase.RINGING:
            if status is not None and status >= 300:
                outcome = outcome_for_status(status)
                result = DialResult(outcome, status, retry_after, reason=why)
            else:
                result = DialResult(Outcome.FAILED, status, retry_after, reason=why)
        elif phase is Phase.DECIDING:
            result = DialResult(Outcome.HUMAN, reason="hung up during amd")
        elif self.outcome is Outcome.MACHINE and not self.voicemail_left and self.voicemail:
            where = "before the beep" if phase is Phase.AWAIT_BEEP else None
            where = where or ("during the voicemail" if phase is Phase.LEAVING else None)
            reason = f"{self.reason}; hung up {where}" if where else self.reason
            result = DialResult(Outcome.MACHINE, reason=reason)
        else:
            outcome = self.outcome or Outcome.HUMAN
            result = DialResult(outcome, voicemail_left=self.voicemail_left, reason=self.reason)
        self.result = result
        return result


# --- the asyncio side ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Answered:
    pass


@dataclass(frozen=True, slots=True)
class _Ended:
    pass


@dataclass(frozen=True, slots=True)
class _AmdOver:
    pass


_Input = _Answered | _Ended | _AmdOver | AmdEvent | UtteranceFinished


def voicemail_for_contact(spec: CampaignSpec, contact_vars: Mapping[str, str]) -> str | None:
    """The voicemail text with ``{name}`` placeholders filled from the agent's vars and the
    contact's over them (the agent's own templating, :func:`gateway.agents.llm.fill`)."""
    if spec.voicemail is None:
        return None
    own = spec.agent.get("vars")
    variables = {str(k): str(v) for k, v in own.items()} if isinstance(own, Mapping) else {}
    return fill(spec.voicemail, {**variables, **contact_vars})


def agent_for_contact(
    agent: Mapping[str, object], contact_vars: Mapping[str, str]
) -> dict[str, object]:
    """The campaign's agent spec with the contact's vars laid over its own: ``vars`` for the
    kinds that take them (llm, flow), the ``start`` message's ``parameters`` for a stream bot;
    the IVR takes none."""
    spec = dict(agent)
    if not contact_vars:
        return spec
    kind = spec.get("kind")
    key = {"llm": "vars", "flow": "vars", "stream": "parameters"}.get(str(kind))
    if key is not None:
        own = spec.get(key)
        spec[key] = {**(dict(own) if isinstance(own, Mapping) else {}), **contact_vars}
    return spec


class CallDialer:
    """``Dial`` for :class:`gateway.campaign.runner.CampaignRunner`: one call per claim, held
    until the call ends (so ``max_concurrent`` counts live calls)."""

    def __init__(
        self,
        manager: CallManager,
        campaign_id: str,
        spec: CampaignSpec,
        *,
        amd: AmdConfig | None = None,
        emit: Emit | None = None,
    ) -> None:
        self.manager = manager
        self.campaign_id = campaign_id
        self.spec = spec
        self.amd = amd or AmdConfig()
        self.emit = emit  # the runner's campaign.* events say all; AMD's go on the call

    async def __call__(self, claim: Claim) -> DialResult:
        spec = self.spec
        agent = agent_for_contact(spec.agent, claim.contact.vars)
        try:
            call = await self.manager.originate_call(
                claim.contact.to, agent=agent, hold_agent=spec.amd
            )
        except Unavailable as exc:
            # At the call limit: a 503 of our own, so the runner backs off like for a trunk's.
            status = 503 if self.manager.full() else None
            return DialResult(Outcome.FAILED, status, reason=exc.message)
        except ControlError as exc:
            return DialResult(Outcome.FAILED, reason=exc.message)
        except OSError as exc:  # no RTP port, no route
            return DialResult(Outcome.FAILED, reason=f"could not dial: {exc}")
        return await _Attempt(self, call, claim).run()


class _Attempt:
    """One placed call, followed to its end (the asyncio adapter around :class:`AttemptCore`)."""

    def __init__(self, dialer: CallDialer, call: Call, claim: Claim) -> None:
        spec = dialer.spec
        self.call = call
        self.core = AttemptCore(
            amd=spec.amd,
            voicemail=voicemail_for_contact(spec, claim.contact.vars),
            ring_timeout_s=spec.ring_timeout_s,
        )
        self.inbox: asyncio.Queue[_Input] = asyncio.Queue()
        self.amd: AmdOnCall | None = None
        if spec.amd:
            self.amd = AmdOnCall(
                call, dialer.amd, on_event=self.inbox.put_nowait,
                on_done=lambda: self.inbox.put_nowait(_AmdOver()),
                campaign=dialer.campaign_id, contact=claim.index,
                # The jambonz word rule, where the gateway has a recogniser loaded.
                stt=getattr(dialer.manager.agents, "stt", None),
            )  # fmt: skip
        self.amd_wall_s = dialer.amd.tone_timeout_ms / 1000 + AMD_WALL_MARGIN_S
        self._answered = False

    def _listen(self, event: Event) -> None:
        # Synchronous, from the call's emit: the AMD tap is taken here, at the answer, before
        # the first frame after it.
        if isinstance(event, CallStateChanged):
            if event.state == "answered" and not self._answered:
                self._answered = True
                if self.amd is not None:
                    self.amd.start()
                self.inbox.put_nowait(_Answered())
            elif event.state == "ended":
                self.inbox.put_nowait(_Ended())
        elif isinstance(event, UtteranceFinished):
            self.inbox.put_nowait(event)

    async def run(self) -> DialResult:
        call = self.call
        call.listeners.append(self._listen)
        if call.info.state == "ended":  # failed before we listened (sent nowhere)
            self.inbox.put_nowait(_Ended())
        loop = asyncio.get_running_loop()
        ring_deadline = loop.time() + self.core.ring_timeout_s
        amd_deadline: float | None = None
        try:
            while True:
                if self.core.phase is Phase.RINGING:
                    timeout: float | None = max(ring_deadline - loop.time(), 0.0)
                elif amd_deadline is not None and self.core.phase in (
                    Phase.DECIDING, Phase.AWAIT_BEEP
                ):  # fmt: skip
                    timeout = max(amd_deadline - loop.time(), 0.0)
                else:
                    timeout = None
                try:
                    # Not wait_for: on 3.11 it can swallow a cancel that races the get.
                    async with asyncio.timeout(timeout):
                        item = await self.inbox.get()
                except TimeoutError:
                    if self.core.phase is Phase.RINGING:
                        await self._act(self.core.ring_timeout())
                    else:
                        await self._act(self.core.amd_over())
                    continue
                if isinstance(item, _Ended):
                    return self.core.ended(call.info.end_reason, call.retry_after)
                if isinstance(item, _Answered):
                    amd_deadline = loop.time() + self.amd_wall_s
                    actions = self.core.answered()
                elif isinstance(item, _AmdOver):
                    actions = self.core.amd_over()
                elif isinstance(item, UtteranceFinished):
                    actions = self.core.utterance_finished(
                        item.utterance_id, item.outcome, item.error
                    )
                else:
                    actions = self.core.amd_event(item)
                await self._act(actions)
        except asyncio.CancelledError:
            # The campaign stopped (or the gateway shuts down): do not leave a callee on a
            # held, silent line.
            with contextlib.suppress(Exception):
                await asyncio.shield(call.hangup("campaign stopped"))
            raise
        finally:
            with contextlib.suppress(ValueError):
                call.listeners.remove(self._listen)
            if self.amd is not None:
                await self.amd.stop()

    async def _act(self, actions: list[Action]) -> None:
        call = self.call
        for action in actions:
            if isinstance(action, ReleaseAgent):
                call.release_agent(action.run)
                if self.amd is not None and action.run:
                    await self.amd.stop()  # a person: the agent has the call from here
            elif isinstance(action, LeaveVoicemail):
                try:
                    utt = await call.say(action.text, barge_in=False, dtmf_interrupts=False)
                except ControlError as exc:
                    await self._act(self.core.voicemail_failed(exc.message))
                    continue
                self.core.voicemail_queued(utt)
                if self.amd is not None:
                    await self.amd.stop()
            elif isinstance(action, Hangup):
                log.info("call %s: hanging up (%s)", call.id, action.reason, extra=call.log_fields)
                await call.hangup(action.reason)
