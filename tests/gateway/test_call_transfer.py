"""``Call.transfer`` over stand-in legs (isolating the call layer from SIP): the outcomes and
their events, the call ended on a completed REFER, and the bridge fallback — the agent
stopped, audio and keys crossed, either side's hang-up ending both, a target that never
answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from gateway.agents.base import CallHandle
from gateway.call.calls import Call
from gateway.call.control import (
    BadRequest,
    CallStateChanged,
    Conflict,
    DtmfReceived,
    Event,
    TransferEvent,
    TransferOutcome,
)
from gateway.call.manager import CallManager
from voxgate.contract.bus.memory import MemoryBus


class PlainLeg:
    """A leg with no REFER (a browser)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.dtmf: list[str] = []
        self.hangups: list[str] = []

    async def hangup(self, reason: str) -> None:
        self.hangups.append(reason)
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        self.dtmf.append(digits)

    def media_stats(self) -> dict[str, float]:
        return {}


class ReferLeg(PlainLeg):
    """A SIP leg whose far end answers the REFER with ``outcome``."""

    def __init__(self, call: Call, outcome: TransferOutcome) -> None:
        super().__init__(call)
        self.outcome = outcome
        self.referred: list[str] = []

    async def refer(
        self, target: str, *, timeout_s: float, on_progress: Callable[[int, str], None]
    ) -> TransferOutcome:
        self.referred.append(target)
        on_progress(202, "Accepted")
        return self.outcome


class Agent:
    """Records what it is told."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ended = asyncio.Event()

    async def on_start(self, call: CallHandle) -> None:
        pass

    async def on_event(self, call: CallHandle, event: Event) -> None:
        self.events.append(event)

    async def on_end(self, call: CallHandle) -> None:
        self.ended.set()


@pytest.fixture
async def manager() -> AsyncIterator[CallManager]:
    bus = MemoryBus()
    await bus.start()
    agents: list[Agent] = []

    def factory(info: object) -> Agent:
        agents.append(Agent())
        return agents[-1]

    m = CallManager(bus, factory, max_calls=5)
    m.agents_made = agents  # type: ignore[attr-defined]
    yield m
    await bus.close()


async def answered(manager: CallManager, leg: Callable[[Call], PlainLeg]) -> Call:
    call = manager.new_call("sip", "inbound", "sip:caller@example.com", "sip:ivr@gw")
    call.leg = leg(call)
    call.set_state("answered")
    await call.start(manager.agent_for(call))
    return call


def transfer_steps(call: Call) -> list[tuple[str, str, int | None]]:
    return [(e.state, e.method, e.status) for e in call.history if isinstance(e, TransferEvent)]


async def test_a_completed_refer_ends_the_call_transferred(manager: CallManager) -> None:
    ok = TransferOutcome("completed", 200, "OK")
    call = await answered(manager, lambda c: ReferLeg(c, ok))
    outcome = await call.transfer("sip:agent@pbx.test")
    assert outcome == ok
    assert call.info.state == "ended" and call.info.end_reason == "transferred"
    assert transfer_steps(call) == [
        ("started", "refer", None), ("progress", "refer", 202), ("completed", "refer", 200),
    ]  # fmt: skip
    record = manager.call_record(call.id)
    assert record["end_reason"] == "transferred"
    assert [(t["result"], t["target"]) for t in record["transfers"]] == [  # type: ignore[attr-defined]
        ("completed", "sip:agent@pbx.test")
    ]


async def test_a_refused_refer_leaves_the_call_up(manager: CallManager) -> None:
    call = await answered(
        manager, lambda c: ReferLeg(c, TransferOutcome("refused", 603, "Decline"))
    )
    outcome = await call.transfer("sip:agent@pbx.test")
    assert outcome == TransferOutcome("refused", 603, "Decline")
    assert call.info.state == "answered"
    assert transfer_steps(call)[-1] == ("refused", "refer", 603)
    # The agent heard the transfer's events like any other (it may act on a refusal).
    await asyncio.sleep(0.01)
    agent: Agent = manager.agents_made[0]  # type: ignore[attr-defined]
    assert [e.state for e in agent.events if isinstance(e, TransferEvent)][-1] == "refused"


async def test_attended_and_browser_legs_are_not_supported(manager: CallManager) -> None:
    call = await answered(manager, PlainLeg)
    outcome = await call.transfer("sip:agent@pbx.test", mode="attended")
    assert outcome.result == "not_supported" and "Replaces" in outcome.reason
    outcome = await call.transfer("sip:agent@pbx.test")
    assert outcome == TransferOutcome(
        "not_supported", None, "a sip leg cannot REFER (no SIP dialog)"
    )
    assert call.info.state == "answered"


async def test_bad_requests_and_conflicts(manager: CallManager) -> None:
    call = await answered(manager, PlainLeg)
    for kwargs, message in (
        ({"target": "tel:+15551234"}, "sip: or sips: URI"),
        ({"target": "sip:a@b\r\nX: y"}, "whitespace or control"),
        ({"target": "sip:a@b", "mode": "warm"}, "mode must be"),
        ({"target": "sip:a@b", "fallback": "voicemail"}, "fallback must be"),
        ({"target": "sip:a@b", "timeout_s": 0.0}, "timeout_s must be"),
    ):
        with pytest.raises(BadRequest, match=message):
            await call.transfer(**kwargs)  # type: ignore[arg-type]
    ringing = manager.new_call("sip", "inbound", "a", "b")
    with pytest.raises(Conflict, match="ringing"):
        await ringing.transfer("sip:a@b")


async def bridged(manager: CallManager) -> tuple[Call, Call, list[Call]]:
    """A browser-like call (no REFER) transferred with fallback bridge to a dialled call that
    the test answers."""
    dialled: list[Call] = []

    async def originate(to: str, caller: str | None) -> Call:
        other = manager.new_call("sip", "outbound", to, "sip:gw")
        other.leg = PlainLeg(other)
        dialled.append(other)
        return other

    manager.originate_hook = originate
    call = await answered(manager, PlainLeg)
    task = asyncio.create_task(call.transfer("sip:agent@pbx.test", fallback="bridge"))
    while not dialled:
        await asyncio.sleep(0.005)
    other = dialled[0]
    assert not task.done()  # waiting for the answer
    other.set_state("answered")
    await other.start(manager.agent_for(other))
    outcome = await task
    assert outcome == TransferOutcome("completed", 200, "bridged", bridged_call=other.id)
    return call, other, dialled


async def test_bridge_fallback_crosses_audio_and_keys_and_stops_the_agent(
    manager: CallManager,
) -> None:
    call, other, _ = await bridged(manager)
    assert call.bridge is other.bridge is not None
    assert other.agent is None  # the second leg runs no agent
    agent: Agent = manager.agents_made[0]  # type: ignore[attr-defined]
    await asyncio.wait_for(agent.ended.wait(), 1)  # the first leg's agent stopped
    assert transfer_steps(call) == [
        ("started", "refer", None), ("not_supported", "refer", None),
        ("started", "bridge", None), ("completed", "bridge", 200),
    ]  # fmt: skip
    # Audio: what each caller says is what the other call sends.
    a = np.arange(160, dtype=np.int16)
    b = -np.arange(160, dtype=np.int16)
    call.on_caller_audio(a)
    other.on_caller_audio(b)
    assert np.array_equal(other.pull_audio(160), a)
    assert np.array_equal(call.pull_audio(160), b)
    # Keys pressed on one side are sent to the other; the agent no longer hears anything.
    before = len(agent.events)
    call.on_dtmf("5")
    await asyncio.sleep(0.01)
    assert other.leg is not None and other.leg.dtmf == ["5"]  # type: ignore[attr-defined]
    assert len(agent.events) == before
    assert any(isinstance(e, DtmfReceived) for e in call.history)
    with pytest.raises(Conflict, match="bridged"):
        await call.say("hello?")
    with pytest.raises(Conflict, match="already bridged"):
        await call.transfer("sip:x@y")
    assert manager.call_record(call.id)["bridged_with"] == other.id


@pytest.mark.parametrize("who", ["caller", "target"])
async def test_either_side_hanging_up_ends_both(manager: CallManager, who: str) -> None:
    call, other, _ = await bridged(manager)
    first, second = (call, other) if who == "caller" else (other, call)
    await first.hangup("remote hangup")
    assert first.info.state == second.info.state == "ended"
    assert second.info.end_reason == "bridged call ended"
    assert manager.list_calls() == []


async def test_a_target_that_never_answers_fails_the_bridge(manager: CallManager) -> None:
    dialled: list[Call] = []

    async def originate(to: str, caller: str | None) -> Call:
        other = manager.new_call("sip", "outbound", to, "sip:gw")
        other.leg = PlainLeg(other)
        dialled.append(other)
        return other

    manager.originate_hook = originate
    call = await answered(manager, PlainLeg)
    outcome = await call.transfer("sip:agent@pbx.test", fallback="bridge", timeout_s=0.2)
    assert outcome == TransferOutcome("failed", 408, "the target did not answer within 0.2 s")
    (other,) = dialled
    assert other.info.state == "ended" and other.info.end_reason == "no answer"
    assert call.info.state == "answered" and call.bridge is None
    # A target that fails (busy) is reported with its status.

    async def busy(to: str, caller: str | None) -> Call:
        other = manager.new_call("sip", "outbound", to, "sip:gw")
        other.leg = PlainLeg(other)
        asyncio.get_running_loop().call_later(0.01, lambda: asyncio.ensure_future(
            other.ended("486 Busy Here")))  # fmt: skip
        return other

    manager.originate_hook = busy
    outcome = await call.transfer("sip:agent@pbx.test", fallback="bridge", timeout_s=5)
    assert outcome == TransferOutcome("failed", 486, "the bridged call failed: 486 Busy Here")
    states = [e.state for e in call.history if isinstance(e, CallStateChanged)]
    assert states == ["answered"]
