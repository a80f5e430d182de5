"""Calls over a real bus and worker (stand-in tone engine): agent, playout, DTMF, events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gateway.agents.base import CallHandle
from gateway.agents.ivr import IvrAgent
from gateway.call.calls import Call
from gateway.call.control import (
    BadRequest,
    CallStateChanged,
    Conflict,
    DtmfReceived,
    Event,
    TextTooLong,
    Unavailable,
    UnknownCall,
    UtteranceFinished,
    UtteranceStarted,
)
from gateway.call.manager import CallManager
from gateway.media.bargein import VoiceStarted
from synth.worker import Worker
from tests.fakes import ToneEngine
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import BargeinSettings, IvrConfig


class FakeLeg:
    def __init__(self, call: Call) -> None:
        self.call = call
        self.dtmf: list[str] = []

    async def hangup(self, reason: str) -> None:
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        self.dtmf.append(digits)

    def media_stats(self) -> dict[str, float]:
        return {}


@pytest.fixture
async def manager(bus: Bus) -> AsyncIterator[CallManager]:
    stop = asyncio.Event()
    worker = Worker(bus, ToneEngine(step_s=0.002), name="w", concurrency=4)
    task = asyncio.create_task(worker.run(stop))
    while not worker.ready:
        await asyncio.sleep(0.01)
    ivr = IvrConfig(idle_timeout_s=0)
    yield CallManager(bus, lambda info: IvrAgent(ivr), max_calls=2, max_text_chars=500)
    stop.set()
    await task


async def tick(call: Call, frames: int) -> np.ndarray:
    out = []
    for _ in range(frames):
        out.append(call.pull_audio(160))
        await asyncio.sleep(0.002)
    return np.concatenate(out)


async def collect(events: AsyncIterator[Event], into: list[Event]) -> None:
    async for e in events:
        into.append(e)


async def test_inbound_call_greets_routes_dtmf_and_hangs_up(manager: CallManager) -> None:
    seen: list[Event] = []
    watcher = asyncio.create_task(collect(manager.subscribe_events(), seen))
    await asyncio.sleep(0)
    call = manager.new_call("sip", "inbound", "sip:alice@example.com", "sip:ivr@gw")
    call.leg = leg = FakeLeg(call)
    call.set_state("answered")
    await call.start(manager.agent_for(call))
    audio = await tick(call, 60)
    assert np.abs(audio).max() > 1000  # the greeting is playing
    assert any(isinstance(e, UtteranceStarted) for e in seen)
    # A key while the greeting plays interrupts it (fade, not a cut) and routes the menu.
    call.on_dtmf("0")
    assert call.playout.speaking  # fading
    await tick(call, 400)
    finished = [e for e in seen if isinstance(e, UtteranceFinished)]
    assert finished[0].outcome == "interrupted" and finished[0].heard
    # "0" says goodbye, then the IVR hangs up.
    for _ in range(200):
        if call.info.state == "ended":
            break
        await tick(call, 10)
    assert call.info.state == "ended" and call.info.end_reason == "ivr"
    assert manager.list_calls() == []
    states = [e.state for e in seen if isinstance(e, CallStateChanged)]
    assert states == ["ringing", "answered", "ended"]
    assert any(isinstance(e, DtmfReceived) and e.digit == "0" for e in seen)
    assert leg.dtmf == []
    watcher.cancel()


async def test_control_errors(manager: CallManager) -> None:
    with pytest.raises(UnknownCall):
        await manager.say("nope", "hi")
    call = manager.new_call("sip", "inbound", "a", "b")
    call.leg = FakeLeg(call)
    await call.start(None)
    with pytest.raises(TextTooLong):
        await manager.say(call.id, "x" * 501)
    with pytest.raises(BadRequest):
        await manager.send_dtmf(call.id, "12x")
    await manager.send_dtmf(call.id, "12#")
    manager.new_call("sip", "inbound", "a", "b")
    with pytest.raises(Unavailable):
        manager.new_call("sip", "inbound", "a", "b")  # max_calls=2
    with pytest.raises(Unavailable):
        await manager.originate("sip:bob@example.com")  # no SIP side configured
    await manager.hangup(call.id)
    with pytest.raises(UnknownCall):
        manager.get_call(call.id)
    with pytest.raises(Conflict):
        await call.say("too late")


async def test_streamed_say_plays_pieces_as_they_complete(manager: CallManager) -> None:
    call = manager.new_call("sip", "inbound", "a", "b")
    call.leg = FakeLeg(call)
    await call.start(None)

    async def tokens() -> AsyncIterator[str]:
        for t in ["Sure, ", "let me ", "check that. ", "One ", "moment ", "please."]:
            yield t
            await asyncio.sleep(0.01)

    await call.say_stream(tokens())
    assert (
        len(call.playout.pending_ids()) == 3
    )  # "Sure," / "let me check that." / "One moment please."
    audio = await tick(call, 80)
    assert np.abs(audio).max() > 1000
    await call.hangup()


async def test_utterances_no_worker_answers_are_given_up(bus: Bus) -> None:
    # No worker at all (all killed): the call must not sit behind a prompt forever.
    manager = CallManager(bus, None, synth_timeout_s=0.3)
    call = manager.new_call("sip", "inbound", "a", "b")
    call.leg = FakeLeg(call)
    await call.start(None)
    first = await call.say("Hello there.")
    second = await call.say("Are you there?")
    for _ in range(100):
        done = [e for e in call.history if isinstance(e, UtteranceFinished)]
        if len(done) == 2:
            break
        await tick(call, 5)
    assert [(e.utterance_id, e.outcome) for e in done] == [(first, "error"), (second, "error")]
    assert all("no_worker" in (e.error or "") for e in done)
    assert await bus.is_cancelled(first)  # a worker that turns up later skips it
    assert call.info.state != "ended"  # the call itself goes on
    await call.hangup()


class RecordingAgent:
    """An agent that only records what it is told."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ended = asyncio.Event()

    async def on_start(self, call: CallHandle) -> None:
        await call.say("Hello.")

    async def on_event(self, call: CallHandle, event: Event) -> None:
        self.events.append(event)

    async def on_end(self, call: CallHandle) -> None:
        self.ended.set()


async def test_agents_hear_state_changes_but_not_their_own_utterance_starts(
    manager: CallManager,
) -> None:
    call = manager.new_call("sip", "inbound", "sip:alice@example.com", "sip:ivr@gw")
    call.leg = FakeLeg(call)
    call.set_state("answered")
    agent = RecordingAgent()
    await call.start(agent)
    await tick(call, 100)
    call.on_dtmf("5")
    await call.hangup("test")
    await asyncio.wait_for(agent.ended.wait(), 5)
    kinds = [type(e).__name__ for e in agent.events]
    assert "UtteranceFinished" in kinds and "DtmfReceived" in kinds, kinds
    assert "UtteranceStarted" not in kinds, kinds  # the echo of its own say()
    states = [e.state for e in agent.events if isinstance(e, CallStateChanged)]
    assert states == ["ended"], states  # answered came before the agent started
    assert len(call.utterances) == 0  # every record went with its utterance


async def test_a_caller_gone_before_the_agent_speaks_is_not_an_agent_failure(
    manager: CallManager, caplog: pytest.LogCaptureFixture
) -> None:
    # The caller hangs up within milliseconds of the answer: the agent's first say finds the
    # call ended. That is the caller's doing, not an agent error (no ERROR log, no "agent
    # error" hang-up over the remote one).
    started = asyncio.Event()

    class SlowStart:
        async def on_start(self, call: Any) -> None:
            await started.wait()
            await call.say("Hello and welcome.")

        async def on_event(self, call: Any, event: Event) -> None: ...

        async def on_end(self, call: Any) -> None: ...

    call = manager.new_call("sip", "inbound", "sip:alice@example.com", "sip:ivr@gw")
    call.leg = FakeLeg(call)
    call.set_state("answered")
    await call.start(SlowStart())
    await call.ended("remote hangup")
    started.set()
    await asyncio.sleep(0.05)
    assert call.info.end_reason == "remote hangup"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


@pytest.mark.parametrize(("onset_ms", "barges_in"), [(0, False), (240, False), (260, True)])
async def test_speech_in_the_calls_first_moments_does_not_barge_in(
    bus: Bus, onset_ms: int, barges_in: bool
) -> None:
    # A browser's microphone opening (Chromium's first ~220 ms carry bursts) or a click is not
    # a caller talking over the greeting: onsets inside bargein.start_guard_ms never stop it.
    stop = asyncio.Event()
    worker = Worker(bus, ToneEngine(step_s=0.002), name="w", concurrency=4)
    task = asyncio.create_task(worker.run(stop))
    while not worker.ready:
        await asyncio.sleep(0.01)
    manager = CallManager(
        bus, lambda info: IvrAgent(IvrConfig(idle_timeout_s=0)), max_calls=2,
        max_text_chars=500, bargein=BargeinSettings(start_guard_ms=250),
    )  # fmt: skip
    call = manager.new_call("sip", "inbound", "sip:alice@example.com", "sip:ivr@gw")
    call.leg = FakeLeg(call)
    call.set_state("answered")
    await call.start(manager.agent_for(call))
    await tick(call, 40)
    assert call.playout.speaking
    onset = onset_ms * 8
    call.on_vad([VoiceStarted(onset_sample=onset, decision_sample=onset + 480)])
    assert bool(call.bargeins) is barges_in
    await call.ended("test")
    stop.set()
    await task
