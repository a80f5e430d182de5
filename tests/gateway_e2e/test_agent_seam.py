"""The agent seam on a real SIP call: an agent hears the caller (caller_audio at 16 kHz) and
is told what happens, on its own task: an agent stuck in its event handler delays neither the
call's media nor barge-in."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from gateway.agents.base import CallHandle
from gateway.call.control import BargeIn, Event, SpeechStarted, UtteranceFinished
from gateway.media.tap import CallerAudioTap
from synth.engines.base import Engine
from tests.gateway_e2e.conftest import LiveGateway
from tests.gateway_e2e.test_bargein import caller_speech
from voxgate.bench.sipclient import SipClient, rms

pytestmark = pytest.mark.slow

LONG = (
    "Thank you for calling. Your account shows three payments this month, the first on the "
    "second, the next on the ninth, and the last one on the twentieth, each of forty dollars."
)


class SlowListeningAgent:
    """Speaks a long prompt, reads the caller's audio, and takes two seconds per event."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.heard: list[np.ndarray] = []
        self.tap: CallerAudioTap | None = None
        self._reader: asyncio.Task[None] | None = None
        self.in_handler = asyncio.Event()

    async def on_start(self, call: CallHandle) -> None:
        self.tap = call.caller_audio(16000)
        self._reader = asyncio.create_task(self._read(self.tap))
        await call.say(LONG, dtmf_interrupts=False)  # the key below must not cut it

    async def _read(self, tap: CallerAudioTap) -> None:
        async for frame in tap:
            self.heard.append(frame)

    async def on_event(self, call: CallHandle, event: Event) -> None:
        self.events.append(event)
        self.in_handler.set()
        await asyncio.sleep(2.0)  # a slow LLM, a stuck webhook

    async def on_end(self, call: CallHandle) -> None:
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 2.0)  # the tap ends with the call


async def test_a_stuck_agent_delays_neither_media_nor_barge_in(
    live_gateway: LiveGateway, engine: Engine
) -> None:
    gw = live_gateway.gw
    agent = SlowListeningAgent()
    gw.manager.agent_factory = lambda info: agent
    # Synthesised before the call: the test shares the gateway's event loop, and a blocking
    # synthesis here would itself stall the media this test watches.
    speech = caller_speech(engine, "Hello? Sorry, I need to talk to somebody about my bill.")
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(live_gateway.sip, codecs=("PCMU",))
        assert call.status == 200 and call.media is not None
        media = call.media
        (gw_call,) = gw.manager.calls.values()
        await media.wait_for_audio(timeout=10)
        # A key press: the agent gets it and sits in its handler for 2 s from here on.
        await media.send_dtmf("5", duration_ms=40)
        await asyncio.wait_for(agent.in_handler.wait(), 5)
        media.send_audio(speech)
        for _ in range(100):
            if gw_call.bargeins:
                break
            await asyncio.sleep(0.02)
        assert gw_call.bargeins, "barge-in waited for the agent"
        cut = gw_call.bargeins[0]
        assert cut.decision_ms - cut.onset_ms <= 200 and cut.zero_ms - cut.decision_ms <= 31, cut
        await asyncio.sleep(0.5)
        # The media never stalled: every 20 ms packet arrived, the stream continuous.
        pkts, _ = media.frames()
        seqs = [p.seq for p in pkts]
        assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(seqs)), "seq gaps"
        gaps = np.diff([p.arrival for p in pkts])
        assert float(np.percentile(gaps, 99)) < 0.06, "the pacing stalled"
        # The agent heard the caller: 16 kHz frames, the sentence at speech level.
        heard = np.concatenate(agent.heard)
        assert all(f.size == 320 for f in agent.heard)
        assert rms(heard[-3 * 16000 :].astype(np.int32)) > 300
        assert agent.tap is not None and agent.tap.dropped == 0
        # And it is told, late but in order, what happened meanwhile.
        for _ in range(200):
            kinds = {type(e) for e in agent.events}
            if {SpeechStarted, BargeIn, UtteranceFinished} <= kinds:
                break
            await asyncio.sleep(0.05)
        assert {SpeechStarted, BargeIn, UtteranceFinished} <= kinds, kinds
        interrupted = [e for e in agent.events if isinstance(e, UtteranceFinished)]
        assert interrupted[0].outcome == "interrupted" and interrupted[0].heard
        assert await call.bye() == 200
    finally:
        client.close()
