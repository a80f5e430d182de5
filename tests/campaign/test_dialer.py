"""The dialler's decisions (:class:`AttemptCore`, sans-I/O), the call's agent hold, and
:class:`CallDialer` on real calls of a real :class:`CallManager` (memory bus, a stand-in tone
worker) whose SIP side is a fake leg: the test answers, feeds the caller's audio and hangs up.
The sipp tests (``test_dial_sipp.py``) do the same over real SIP and RTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gateway.agents.base import CallHandle
from gateway.amd.detector import (
    AmdBeep,
    AmdDecisionTimeout,
    AmdGreetingEnded,
    AmdHuman,
    AmdMachine,
    AmdNoSpeech,
)
from gateway.call.calls import Call
from gateway.call.control import AmdResult, BadRequest, Event, UtteranceStarted
from gateway.call.manager import CallManager
from gateway.campaign.contacts import Contact
from gateway.campaign.dialer import (
    AttemptCore,
    CallDialer,
    Hangup,
    LeaveVoicemail,
    Phase,
    ReleaseAgent,
    agent_for_contact,
    voicemail_for_contact,
)
from gateway.campaign.outcomes import Outcome
from gateway.campaign.runner import DialResult
from gateway.campaign.spec import CampaignSpec
from gateway.campaign.store import Claim
from gateway.legs.sip.ua import dial_uri, retry_after_s
from gateway.stt.base import FloatArray, Transcript
from synth.worker import Worker
from tests.agents.audio import frames_of, silence, voiced
from tests.fakes import ToneEngine
from voxgate.contract.bus.base import Bus


def core(amd: bool = True, voicemail: str | None = "Please call back.") -> AttemptCore:
    return AttemptCore(amd=amd, voicemail=voicemail, ring_timeout_s=30.0)


# --- AttemptCore ------------------------------------------------------------------------------
def test_ring_timeout_cancels_and_is_no_answer() -> None:
    c = core()
    assert c.ring_timeout() == [Hangup("no answer")]
    assert c.ring_timeout() == []  # once
    # The leg ends at once on our CANCEL; the callee's 487 comes later and changes nothing.
    result = c.ended("no answer", None)
    assert result.outcome is Outcome.NO_ANSWER and result.sip_status is None
    assert result.reason is not None and "30 s" in result.reason


@pytest.mark.parametrize(
    ("reason", "retry", "expected"),
    [
        ("486 Busy Here", None, DialResult(Outcome.BUSY, 486, reason="486 Busy Here")),
        ("503 Service Unavailable", 2.0,
         DialResult(Outcome.FAILED, 503, 2.0, reason="503 Service Unavailable")),
        ("404 Not Found", None, DialResult(Outcome.INVALID_NUMBER, 404, reason="404 Not Found")),
        ("603 Decline", None, DialResult(Outcome.REJECTED, 603, reason="603 Decline")),
        # Someone else's CANCEL (not our ring timeout): cancelled, not no_answer.
        ("487 Request Terminated", None,
         DialResult(Outcome.CANCELLED, 487, reason="487 Request Terminated")),
        ("timeout", None, DialResult(Outcome.NO_ANSWER, 408, reason="timeout")),  # Timer B
        ("shutdown", None, DialResult(Outcome.FAILED, None, reason="shutdown")),
    ],
)  # fmt: skip
def test_unanswered_calls_are_classified_by_their_final_status(
    reason: str, retry: float | None, expected: DialResult
) -> None:
    assert core().ended(reason, retry) == expected


def test_answered_without_amd_is_human() -> None:
    c = core(amd=False, voicemail=None)
    assert c.answered() == []
    assert c.phase is Phase.CONVERSATION
    assert c.ended("remote hangup", None) == DialResult(Outcome.HUMAN)


def test_amd_human_releases_the_agent() -> None:
    c = core()
    c.answered()
    assert c.phase is Phase.DECIDING
    assert c.amd_event(AmdHuman(1640)) == [ReleaseAgent(True)]
    assert c.amd_over() == []  # the detector stopping afterwards changes nothing
    assert c.ended("remote hangup", None) == DialResult(Outcome.HUMAN)


@pytest.mark.parametrize("event", [AmdNoSpeech(2500), AmdDecisionTimeout(15000)])
def test_unsure_amd_goes_on_as_human(event: AmdNoSpeech | AmdDecisionTimeout) -> None:
    c = core()
    c.answered()
    assert c.amd_event(event) == [ReleaseAgent(True)]
    name = event.name.removeprefix("amd.")
    assert c.ended("agent", None) == DialResult(Outcome.HUMAN, reason=f"amd: {name}")


def test_machine_without_voicemail_hangs_up_at_once() -> None:
    c = core(voicemail=None)
    c.answered()
    assert c.amd_event(AmdMachine(1600, "LONGGREETING")) == [
        ReleaseAgent(False),
        Hangup("answering machine"),
    ]
    assert c.amd_event(AmdBeep(7000, 1000.0, 6500, 7000)) == []
    result = c.ended("answering machine", None)
    assert result == DialResult(Outcome.MACHINE, reason="amd: machine (LONGGREETING)")


def test_machine_voicemail_after_the_beep_then_hang_up() -> None:
    c = core()
    c.answered()
    assert c.amd_event(AmdMachine(1600, "LONGGREETING")) == [ReleaseAgent(False)]
    assert c.amd_event(AmdHuman(1700)) == []  # decided already
    assert c.amd_event(AmdBeep(7780, 1000.0, 7240, 7740)) == [LeaveVoicemail("Please call back.")]
    c.voicemail_queued("u1")
    assert c.utterance_finished("other", "done", None) == []
    assert c.utterance_finished("u1", "done", None) == [Hangup("voicemail left")]
    result = c.ended("voicemail left", None)
    assert result.outcome is Outcome.MACHINE and result.voicemail_left
    assert result.reason == "amd: machine (LONGGREETING); voicemail after the beep"


def test_machine_voicemail_after_the_greeting_ended_without_a_beep() -> None:
    c = core()
    c.answered()
    c.amd_event(AmdMachine(1600, "MAXWORDS"))
    assert c.amd_event(AmdGreetingEnded(9000, 7000)) == [LeaveVoicemail("Please call back.")]
    assert c.amd_event(AmdBeep(9500, 1000.0, 9000, 9400)) == []  # one message only
    c.voicemail_queued("u1")
    c.utterance_finished("u1", "done", None)
    result = c.ended("voicemail left", None)
    assert result.voicemail_left and result.reason is not None
    assert result.reason.endswith("after the end of greeting")


def test_no_beep_nor_greeting_end_by_the_tone_timeout_leaves_nothing() -> None:
    c = core()
    c.answered()
    c.amd_event(AmdMachine(1600, "LONGGREETING"))
    assert c.amd_over() == [Hangup("answering machine")]
    result = c.ended("answering machine", None)
    assert result.outcome is Outcome.MACHINE and not result.voicemail_left
    assert result.reason is not None and "voicemail not left" in result.reason


def test_a_voicemail_that_did_not_play_in_full_is_not_left() -> None:
    c = core()
    c.answered()
    c.amd_event(AmdMachine(1600, "LONGGREETING"))
    c.amd_event(AmdBeep(7780, 1000.0, 7240, 7740))
    c.voicemail_queued("u1")
    assert c.utterance_finished("u1", "error", "no_worker: gone") == [Hangup("answering machine")]
    result = c.ended("answering machine", None)
    assert result.outcome is Outcome.MACHINE and not result.voicemail_left
    assert result.reason is not None and "voicemail error: no_worker" in result.reason


def test_hanging_up_during_amd_is_human_and_after_machine_is_machine() -> None:
    c = core()
    c.answered()
    assert c.ended("remote hangup", None) == DialResult(Outcome.HUMAN, reason="hung up during amd")
    c = core()
    c.answered()
    c.amd_event(AmdMachine(1600, "LONGGREETING"))
    result = c.ended("remote hangup", None)
    assert result.outcome is Outcome.MACHINE and not result.voicemail_left
    assert result.reason is not None and result.reason.endswith("hung up before the beep")
    c = core()
    c.answered()
    c.amd_event(AmdMachine(1600, "LONGGREETING"))
    c.amd_event(AmdBeep(7780, 1000.0, 7240, 7740))
    c.voicemail_queued("u1")
    result = c.ended("remote hangup", None)
    assert result.outcome is Outcome.MACHINE and not result.voicemail_left
    assert result.reason is not None and result.reason.endswith("hung up during the voicemail")


def test_a_second_answered_changes_nothing() -> None:
    c = core()
    c.answered()
    c.amd_event(AmdHuman(1500))
    assert c.answered() == [] and c.phase is Phase.CONVERSATION


# --- helpers ------------------------------------------------------------------------------------
def test_contact_vars_reach_the_agents_that_take_them() -> None:
    vars_ = {"name": "Dana"}
    assert agent_for_contact({"kind": "ivr"}, vars_) == {"kind": "ivr"}
    llm = agent_for_contact({"kind": "llm", "vars": {"name": "x", "shop": "Acme"}}, vars_)
    assert llm == {"kind": "llm", "vars": {"name": "Dana", "shop": "Acme"}}
    assert agent_for_contact({"kind": "flow", "flow": "f"}, vars_)["vars"] == vars_
    stream = agent_for_contact({"kind": "stream", "parameters": {"a": "1"}}, vars_)
    assert stream["parameters"] == {"a": "1", "name": "Dana"}
    assert agent_for_contact({"kind": "llm"}, {}) == {"kind": "llm"}


def test_voicemail_text_is_filled_from_the_vars() -> None:
    spec = CampaignSpec(
        agent={"kind": "llm", "vars": {"shop": "Acme", "name": "customer"}},
        amd=True,
        voicemail="Hi {name}, {shop} calling. {unknown} stays; so does {a.b}.",
    )
    assert voicemail_for_contact(spec, {"name": "Dana"}) == (
        "Hi Dana, Acme calling. {unknown} stays; so does {a.b}."
    )
    assert voicemail_for_contact(CampaignSpec(agent={"kind": "ivr"}), {"name": "x"}) is None


def test_e164_numbers_go_to_the_trunk() -> None:
    assert (
        dial_uri("+14155550100", "sip:127.0.0.1:5070")
        == "sip:+14155550100@127.0.0.1:5070;user=phone"
    )
    assert dial_uri("+4930123456", "sips:trunk.example.com") == (
        "sips:+4930123456@trunk.example.com;user=phone"
    )
    assert dial_uri("sip:alice@example.com", "") == "sip:alice@example.com"
    with pytest.raises(BadRequest, match="no trunk"):
        dial_uri("+14155550100", "")
    with pytest.raises(BadRequest, match=r"E\.164"):
        dial_uri("+1-415", "sip:trunk")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("2", 2.0), ("120 (in a meeting)", 120.0), ("18000;duration=3600", 18000.0),
     (" 5 ", 5.0), (None, None), ("soon", None), ("", None), ("-1", None)],
)  # fmt: skip
def test_retry_after(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds


# --- on calls -----------------------------------------------------------------------------------
class FakeLeg:
    """The SIP side: hanging up ends the call (as BYE/CANCEL do), and records why."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.hangups: list[str] = []

    async def hangup(self, reason: str) -> None:
        self.hangups.append(reason)
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None: ...

    def media_stats(self) -> dict[str, float]:
        return {}


class Greeter:
    """An agent that greets on start; records when it started and whether it ended."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.ended = False

    async def on_start(self, call: CallHandle) -> None:
        self.started_at = time.time()
        await call.say("Hi, this is Acme.")

    async def on_event(self, call: CallHandle, event: Event) -> None: ...

    async def on_end(self, call: CallHandle) -> None:
        self.ended = True


class Rig:
    def __init__(self, manager: CallManager) -> None:
        self.manager = manager
        self.agents: list[Greeter] = []
        self.dialled: list[str] = []
        manager.originate_hook = self.originate
        manager.agents = self  # per-call agents, as the gateway's AgentRegistry

    def validate(self, spec: object) -> dict[str, object]:
        assert isinstance(spec, dict)
        return dict(spec)

    def build(self, info: Any, spec: dict[str, object] | None) -> Greeter:
        self.agents.append(Greeter())
        return self.agents[-1]

    async def originate(self, to: str, caller: str | None) -> Call:
        to = dial_uri(to, "")
        call = self.manager.new_call("sip", "outbound", to, "sip:gw@127.0.0.1")
        call.leg = FakeLeg(call)
        self.dialled.append(to)
        return call

    async def call(self, timeout: float = 5.0) -> Call:
        deadline = time.monotonic() + timeout
        while not self.manager.calls:
            assert time.monotonic() < deadline, "no call placed"
            await asyncio.sleep(0.005)
        return next(iter(self.manager.calls.values()))

    async def answer(self, call: Call) -> None:
        call.set_state("answered")  # the leg's 2xx: AMD taps the audio here
        await call.start(self.manager.agent_for(call))

    @staticmethod
    async def speak(call: Call, pcm: np.ndarray) -> None:
        """The callee's audio, one 20 ms frame per loop turn (faster than real time)."""
        for frame in frames_of(pcm):
            if call.info.state == "ended":
                return
            call.on_caller_audio(frame)
            await asyncio.sleep(0.001)


@pytest.fixture
async def rig(bus: Bus) -> AsyncIterator[Rig]:
    stop = asyncio.Event()
    worker = Worker(bus, ToneEngine(step_s=0.002), name="w", concurrency=4)
    task = asyncio.create_task(worker.run(stop))
    while not worker.ready:
        await asyncio.sleep(0.01)
    yield Rig(CallManager(bus, None, max_calls=2, max_text_chars=500))
    stop.set()
    await task


def claim(to: str = "sip:dana@192.0.2.7", **vars_: str) -> Claim:
    return Claim("c1", 3, Contact(to, vars_), "gw-test", time.time() + 600)


def spec(**kw: Any) -> CampaignSpec:
    return CampaignSpec(agent={"kind": "ivr"}, **kw)


async def test_a_person_gets_the_agent_after_amd_decides(rig: Rig) -> None:
    dialer = CallDialer(rig.manager, "c1", spec(amd=True, voicemail="Call us back."))
    task = asyncio.create_task(dialer(claim()))
    call = await rig.call()
    assert call.agent_held  # held from the INVITE on, before any answer
    await rig.answer(call)
    agent = rig.agents[0]
    await rig.speak(call, np.concatenate([silence(0.3), voiced(0.5), silence(1.5)]))
    await asyncio.sleep(0.05)
    amd = [e for e in call.history if isinstance(e, AmdResult)]
    assert [(e.type, e.campaign, e.contact) for e in amd] == [("amd.human", "c1", 3)]
    assert agent.started_at is not None and agent.started_at >= amd[0].ts
    await call.leg.hangup("remote hangup")  # type: ignore[union-attr]
    assert await asyncio.wait_for(task, 5) == DialResult(Outcome.HUMAN)
    assert agent.ended


class PhraseStt:
    """A recogniser that hears a voicemail phrase in whatever it is given."""

    name = "phrase"

    def __init__(self) -> None:
        self.jobs = 0

    def transcribe(self, audio: FloatArray) -> Transcript:
        self.jobs += 1
        return Transcript("please leave a message after the tone", len(audio) / 16000, 0.0)


@pytest.mark.parametrize("with_stt", [False, True])
async def test_amd_on_a_campaign_call_uses_the_gateways_recogniser(
    rig: Rig, with_stt: bool
) -> None:
    # A short greeting and silence: a person to the heuristic at 2.4 s; with a recogniser
    # loaded (the registry's ``stt``), the words of that greeting (final at 1.6 s) decide a
    # machine first.
    stt = PhraseStt()
    if with_stt:
        rig.stt = stt  # type: ignore[attr-defined]
    dialer = CallDialer(rig.manager, "c1", spec(amd=True))
    task = asyncio.create_task(dialer(claim()))
    call = await rig.call()
    await rig.answer(call)
    for frame in frames_of(np.concatenate([voiced(0.8), silence(2.0)])):
        if call.info.state == "ended":
            break
        call.on_caller_audio(frame)
        await asyncio.sleep(0.02)  # real time, as the recogniser's results would come
    decided = [e for e in call.history if isinstance(e, AmdResult)]
    if with_stt:
        assert stt.jobs >= 1
        assert (decided[0].type, decided[0].cause) == ("amd.machine", "HINT"), decided
        result = await asyncio.wait_for(task, 5)
        assert result.outcome is Outcome.MACHINE, result
    else:
        assert [e.type for e in decided] == ["amd.human"], decided
        await call.leg.hangup("remote hangup")  # type: ignore[union-attr]
        assert (await asyncio.wait_for(task, 5)).outcome is Outcome.HUMAN


async def test_a_machine_never_gets_the_agent(rig: Rig) -> None:
    dialer = CallDialer(rig.manager, "c1", spec(amd=True))
    task = asyncio.create_task(dialer(claim()))
    call = await rig.call()
    await rig.answer(call)
    speaking = asyncio.create_task(rig.speak(call, voiced(4.0)))
    result = await asyncio.wait_for(task, 10)
    speaking.cancel()
    assert result.outcome is Outcome.MACHINE and not result.voicemail_left, result
    assert call.leg.hangups == ["answering machine"]  # type: ignore[union-attr]
    agent = rig.agents[0]
    await asyncio.sleep(0.05)
    assert agent.started_at is None and not agent.ended  # never started, so never ended
    assert not [e for e in call.history if isinstance(e, UtteranceStarted)]  # nothing said


async def test_the_agent_runs_at_once_without_amd(rig: Rig) -> None:
    dialer = CallDialer(rig.manager, "c1", spec(amd=False))
    task = asyncio.create_task(dialer(claim()))
    call = await rig.call()
    assert not call.agent_held
    await rig.answer(call)
    await asyncio.sleep(0.05)
    assert rig.agents[0].started_at is not None
    assert not [e for e in call.history if isinstance(e, AmdResult)]
    await call.leg.hangup("remote hangup")  # type: ignore[union-attr]
    assert await asyncio.wait_for(task, 5) == DialResult(Outcome.HUMAN)


async def test_ring_timeout_hangs_up_the_ringing_call(rig: Rig) -> None:
    dialer = CallDialer(rig.manager, "c1", spec(ring_timeout_s=0.2))
    result = await asyncio.wait_for(dialer(claim()), 5)
    assert result.outcome is Outcome.NO_ANSWER, result
    assert not rig.manager.calls


async def test_at_the_call_limit_is_a_503_of_our_own(rig: Rig) -> None:
    rig.manager.max_calls = 0
    result = await CallDialer(rig.manager, "c1", spec())(claim())
    assert (result.outcome, result.sip_status) == (Outcome.FAILED, 503)
    assert result.reason is not None and "call limit" in result.reason


async def test_a_number_without_a_trunk_fails_with_the_reason(rig: Rig) -> None:
    result = await CallDialer(rig.manager, "c1", spec())(claim("+14155550100"))
    assert (result.outcome, result.sip_status) == (Outcome.FAILED, None)
    assert result.reason is not None and "no trunk" in result.reason
    assert rig.dialled == []


async def test_a_stopped_campaign_hangs_up_its_live_call(rig: Rig) -> None:
    dialer = CallDialer(rig.manager, "c1", spec(amd=True))
    task = asyncio.create_task(dialer(claim()))
    call = await rig.call()
    await rig.answer(call)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.info.state == "ended" and call.info.end_reason == "campaign stopped"
    await asyncio.sleep(0.05)
    assert rig.agents[0].started_at is None  # the held agent never started


async def test_a_held_agent_starts_on_release_without_what_happened_before(rig: Rig) -> None:
    events: list[Event] = []

    class Listener(Greeter):
        async def on_event(self, call: CallHandle, event: Event) -> None:
            events.append(event)

    call = rig.manager.new_call("sip", "outbound", "sip:x@y", "sip:gw@z")
    call.leg = FakeLeg(call)
    call.hold_agent()
    call.set_state("answered")
    agent = Listener()
    await call.start(agent)
    call.on_dtmf("5")  # before the agent exists for the callee: not delivered
    await asyncio.sleep(0.05)
    assert agent.started_at is None and call.agent_held
    call.release_agent(True)
    call.release_agent(False)  # once released, stays released
    await asyncio.sleep(0.05)
    assert agent.started_at is not None and not call.agent_held
    call.on_dtmf("7")
    await asyncio.sleep(0.05)
    assert [getattr(e, "digit", None) for e in events] == ["7"]
    await call.hangup("test")
    await asyncio.sleep(0.05)
    assert agent.ended
