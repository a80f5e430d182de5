"""Calls through a Redis outage, in one gateway process: a say fails fast, calls stay up.

A real Redis (a private server the test stops and restarts) under a real ``RedisBus``; the
call's leg is a stand-in (the SIP/RTP side is exercised end to end in test_outage_e2e.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.call.calls import ERR_BUS_UNAVAILABLE, Call
from gateway.call.control import BusUnavailable, DtmfReceived, Event, UtteranceFinished
from gateway.call.manager import CallManager
from tests.faults.redis_server import PrivateRedis
from tests.waiting import wait_for
from voxgate.contract.bus import AudioChunk, MemoryBus, RedisBus, UtteranceEnd

pytestmark = [pytest.mark.redis]


class FakeLeg:
    def __init__(self, call: Call) -> None:
        self.call = call

    async def hangup(self, reason: str) -> None:
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        pass

    def media_stats(self) -> dict[str, float]:
        return {}


class SayOnKeyAgent:
    """Says a prompt for every key, like the IVR; records the events it is given."""

    kind = "test"

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def on_start(self, call: Call) -> None:
        pass

    async def on_event(self, call: Call, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, DtmfReceived):
            await call.say(f"You pressed {event.digit}.")

    async def on_end(self, call: Call) -> None:
        pass


@pytest.fixture
async def bus(redis_server: PrivateRedis) -> AsyncIterator[RedisBus]:
    b = RedisBus(redis_server.url, prefix=f"vgfault-{uuid.uuid4().hex[:8]}", reader_block_ms=500)
    await b.start()
    yield b
    await b.close()


async def test_a_say_during_an_outage_fails_fast_and_the_call_stays_up(
    bus: RedisBus, redis_server: PrivateRedis
) -> None:
    agent = SayOnKeyAgent()
    manager = CallManager(bus, lambda info: agent)  # type: ignore[arg-type,return-value]
    call = manager.new_call("sip", "inbound", "sip:a@example.com", "sip:ivr@gw")
    call.leg = FakeLeg(call)
    call.set_state("answered")
    await call.start(manager.agent_for(call))
    before = await call.say("Said before the outage.")

    redis_server.stop()
    latencies = []
    for i in range(5):
        t0 = time.perf_counter()
        with pytest.raises(BusUnavailable) as refused:
            await manager.say(call.id, f"Said during the outage, {i}.")
        latencies.append(time.perf_counter() - t0)
    err = refused.value
    assert err.status == 503 and err.code == "bus_unavailable"
    assert "not queued" in err.message and str(redis_server.port) in err.message
    # The first finds Redis gone (connection refused, redis-py's two quick retries); the rest
    # are refused by the bus's bookkeeping without I/O.
    assert latencies[0] < 1.0 and max(latencies[1:]) < 0.01, latencies
    failed = [e for e in call.history if isinstance(e, UtteranceFinished) and e.outcome == "error"]
    assert len(failed) == 5
    assert all((e.error or "").startswith(f"{ERR_BUS_UNAVAILABLE}: ") for e in failed)
    assert failed[0].text == "Said during the outage, 0."
    # Refused utterances hold nothing up: only the one said before is still queued.
    assert call.playout.pending_ids() == [before]
    # The agent's say fails too: its turn is cut short, the call is not hung up.
    call.on_dtmf("1")
    await wait_for(lambda: any(isinstance(e, DtmfReceived) for e in agent.events), timeout=2)
    await wait_for(lambda: len([e for e in call.history if isinstance(e, UtteranceFinished)
                                and e.outcome == "error"]) == 6, timeout=2)  # fmt: skip
    await asyncio.sleep(0.1)
    assert call.info.state == "answered"
    # Media never waits on Redis: frames are pulled as usual (silence: nothing was rendered).
    frames = [call.pull_audio(160) for _ in range(50)]
    assert all(len(f) == 160 for f in frames)

    redis_server.start()
    assert await bus.ping()
    after = await manager.say(call.id, "Said after the outage.")
    assert call.playout.pending_ids() == [before, after]
    await call.hangup()


async def test_an_utterance_whose_worker_vanished_mid_way_is_given_up() -> None:
    # A Redis restart that lost the data also loses the requests in flight: audio stops half
    # way and never resumes. The call must not stay mute behind that utterance.
    bus = MemoryBus()
    await bus.start()
    manager = CallManager(bus, None, synth_timeout_s=0.3)
    call = manager.new_call("sip", "inbound", "a", "b")
    call.leg = FakeLeg(call)
    await call.start(None)
    cut = await call.say("Cut short.")
    nxt = await call.say("Next one.")
    tone = (np.sin(np.arange(800) / 3) * 8000).astype("<i2").tobytes()
    await bus.publish(AudioChunk(call.id, cut, 0, 8000, tone))  # one chunk, then nothing
    # The next one's worker is fine: it has all its audio, waiting its turn.
    await bus.publish(AudioChunk(call.id, nxt, 0, 8000, tone))
    await bus.publish(UtteranceEnd(call.id, nxt, 1, "done", 800))
    t0 = time.monotonic()
    for _ in range(300):
        call.pull_audio(160)
        done = [e for e in call.history if isinstance(e, UtteranceFinished)]
        if done:
            break
        await asyncio.sleep(0.005)
    assert [(e.utterance_id, e.outcome) for e in done] == [(cut, "error")]
    assert "after its last chunk" in (done[0].error or "")
    assert time.monotonic() - t0 >= 0.25  # not before synth_timeout_s of silence
    assert call.playout.current == nxt  # the next utterance is up, and plays
    heard = np.concatenate([call.pull_audio(160) for _ in range(5)])
    assert np.abs(heard).max() > 1000
    await call.hangup()
    await bus.close()
