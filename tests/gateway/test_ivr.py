"""The IVR agent against a recording call handle (isolating the agent layer)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from gateway.agents.ivr import IvrAgent
from gateway.call.control import (
    CallInfo,
    DtmfReceived,
    Event,
    TransferOutcome,
    UtteranceFinished,
)
from gateway.media.tap import CallerAudioTap
from voxgate.contract.config import IvrConfig


class RecordingCall:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, bool]] = []
        self.hung_up: list[str] = []
        self.emitted: list[Event] = []
        self.dtmf: list[str] = []
        self.interrupted = 0
        self._ids = itertools.count(1)

    @property
    def id(self) -> str:
        return "call-1"

    @property
    def info(self) -> CallInfo:
        return CallInfo("call-1", "sip", "inbound", "answered", "sip:a@b", "sip:c@d", 0.0)

    async def say(
        self,
        text: str,
        *,
        interrupt: bool = False,
        dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:
        utt = f"u{next(self._ids)}"
        self.said.append((utt, text, interrupt))
        return utt

    async def say_stream(
        self, chunks: AsyncIterator[str], *, utterances: list[str] | None = None
    ) -> str:
        utt = await self.say("".join([c async for c in chunks]))
        if utterances is not None:
            utterances.append(utt)
        return utt

    def emit(self, event: Event) -> None:
        self.emitted.append(event)

    def interrupt(self, *, clear_queue: bool = True) -> None:
        self.interrupted += 1

    async def send_dtmf(self, digits: str) -> None:
        self.dtmf.append(digits)

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        return CallerAudioTap(8000, rate, echo_gate=echo_gate, max_frames=max_frames)

    async def hangup(self, reason: str = "agent") -> None:
        self.hung_up.append(reason)

    def start_recording(self, channels: str = "both") -> str:
        return "r1"

    def stop_recording(self) -> None:
        pass

    async def transfer(
        self,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        return TransferOutcome("not_supported", None, "the IVR tests transfer nobody")


def cfg(**kw: object) -> IvrConfig:
    c = IvrConfig(**kw)  # type: ignore[arg-type]
    c.validate()
    return c


async def test_greets_then_routes_digits() -> None:
    call, agent = RecordingCall(), IvrAgent(cfg())
    await agent.on_start(call)
    assert call.said[0][1].startswith("Thank you for calling voxgate")
    await agent.on_event(call, DtmfReceived("call-1", digit="1"))
    assert call.said[-1][1].startswith("We are open") and call.said[-1][2]  # interrupts
    await agent.on_event(call, DtmfReceived("call-1", digit="7"))
    assert call.said[-1][1] == IvrConfig().invalid
    await agent.on_event(call, DtmfReceived("call-1", digit="9"))
    assert call.said[-1][1] == call.said[0][1]  # repeat
    assert call.hung_up == []


async def test_hangup_digit_hangs_up_after_its_prompt() -> None:
    call, agent = RecordingCall(), IvrAgent(cfg())
    await agent.on_start(call)
    await agent.on_event(call, DtmfReceived("call-1", digit="0"))
    bye = call.said[-1][0]
    assert call.hung_up == []  # not before the goodbye was heard
    await agent.on_event(call, UtteranceFinished("call-1", utterance_id=bye, outcome="done"))
    assert call.hung_up == ["ivr"]


async def test_idle_timeout_says_goodbye_then_hangs_up() -> None:
    call, agent = RecordingCall(), IvrAgent(cfg(idle_timeout_s=0.05))
    await agent.on_start(call)
    greeting = call.said[0][0]
    await agent.on_event(call, UtteranceFinished("call-1", utterance_id=greeting, outcome="done"))
    await asyncio.sleep(0.2)
    assert call.said[-1][1] == IvrConfig().goodbye
    await agent.on_event(call, UtteranceFinished("call-1", utterance_id=call.said[-1][0]))
    assert call.hung_up == ["ivr"]


async def test_a_key_press_cancels_the_idle_timer() -> None:
    call, agent = RecordingCall(), IvrAgent(cfg(idle_timeout_s=0.1))
    await agent.on_start(call)
    await agent.on_event(call, UtteranceFinished("call-1", utterance_id="u1", outcome="done"))
    await asyncio.sleep(0.03)
    await agent.on_event(call, DtmfReceived("call-1", digit="1"))
    await asyncio.sleep(0.15)
    assert all(text != IvrConfig().goodbye for _, text, _ in call.said)
    await agent.on_end(call)
