"""Barge-in decided on arrival (issue 17): a SIP leg hands each caller packet to the call as it
arrives, so the detector no longer waits for the jitter buffer's playout delay.

The same agent audio, echo and caller speech go to two calls on one simulated media clock (one
tick per 20 ms, the caller's packet arriving right after the tick): one fed on arrival, one
through a real :class:`JitterBuffer` into ``on_caller_audio`` as the SIP leg did before.  The
detector's batch is flushed after every packet, as the manager's 8 ms timer does in the
gateway.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from gateway.call.calls import Call
from gateway.call.manager import CallManager
from gateway.rtp.codecs import get_codec
from gateway.rtp.jitter import JitterBuffer
from gateway.rtp.packet import RtpPacket
from tests.bargein.audio import (
    agent_speech,
    caller_utterances,
    echo_of,
    noise,
    phone_leg,
    to_s16,
)
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import BargeinSettings

Int16Array = npt.NDArray[np.int16]
N = 160
RATE = 8000
TS0 = 987_654_321  # the caller's first RTP timestamp (random in real life, off the grid)
NET_FRAMES = 1  # the caller's packet j arrives after tick j + 1 (20 ms one way)


class _Leg:
    def __init__(self, call: Call) -> None:
        self.call = call

    async def hangup(self, reason: str) -> None:
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        return None

    def media_stats(self) -> dict[str, float]:
        return {}


def _near(
    far: Int16Array, *, echo_db: float | None, caller_at_s: float | None, delay_ms: float = 120.0
) -> Int16Array:
    """What the caller's phone sends: the agent's echo (``delay_ms``, ``echo_db``), the
    caller's speech from ``caller_at_s``, line noise; through G.711 like a phone leg."""
    x = noise(far.size, -60.0, seed=3)
    if echo_db is not None:
        x = x + echo_of(far.astype(np.float64) / 32768.0, delay_ms, -echo_db)
    if caller_at_s is not None:
        speech = caller_utterances()[2]
        at = int(caller_at_s * RATE)
        end = min(far.size, at + speech.size)
        x[at:end] += speech[: end - at]
    return phone_leg(x)


async def _run(far: Int16Array, near: Int16Array, *, on_arrival: bool) -> tuple[Call, list[int]]:
    """Play ``far`` as the agent's (interruptible) audio and send ``near`` as the caller's;
    returns the call and the tick at which each barge-in was decided."""
    bus = MemoryBus()
    manager = CallManager(bus, None, bargein=BargeinSettings())
    call = manager.new_call("sip", "inbound", "sip:c@example.com", "sip:ivr@gw")
    call.leg = _Leg(call)
    call.set_state("answered")
    if on_arrival:
        call.feed_on_arrival()
    call.play_audio("greeting", far, barge_in=True)
    jitter = JitterBuffer({0: "PCMU"}, target_ms=60, min_ms=40)
    ulaw = get_codec("PCMU")
    decided: list[int] = []
    for k in range(far.size // N):
        sent = call.pull_audio(N, at=k * N)
        if not call.bargeins:
            # Until the barge-in, the agent's frames are the greeting, sample for sample.
            assert np.array_equal(sent, far[k * N : (k + 1) * N])
        j = k - NET_FRAMES
        if j >= 0:
            pcm = near[j * N : (j + 1) * N]
            ts = TS0 + j * N
            if on_arrival:
                call.on_caller_packet(ts, pcm)
            else:
                pkt = RtpPacket(0, j == 0, j & 0xFFFF, ts & 0xFFFFFFFF, 1, ulaw.encode(pcm))
                jitter.push(pkt, k * 0.02)
        if not on_arrival:
            call.on_caller_audio(jitter.pull().pcm)
        n = len(call.bargeins)
        manager.flush_detection()
        if len(call.bargeins) > n:
            decided.append(k)
    await call.ended("test")
    await bus.close()
    return call, decided


async def test_barge_in_is_decided_sooner_on_arrival_than_through_the_jitter_buffer() -> None:
    far = to_s16(agent_speech()[: 6 * RATE])
    for echo_db in (None, -15.0):
        near = _near(far, echo_db=echo_db, caller_at_s=3.1)
        _, on_arrival = await _run(far, near, on_arrival=True)
        _, buffered = await _run(far, near, on_arrival=False)
        assert len(on_arrival) == 1 and len(buffered) == 1, (echo_db, on_arrival, buffered)
        onset_tick = int(3.1 * RATE) // N + NET_FRAMES  # the onset's packet arrives here
        # The jitter buffer held the caller 40-60 ms (2-3 ticks) before the detector heard it.
        assert on_arrival[0] <= buffered[0] - 2, (echo_db, on_arrival, buffered)
        # On arrival the decision comes within the detector's own evidence (60 ms) + a tick.
        assert on_arrival[0] - onset_tick <= 4, (echo_db, on_arrival, onset_tick)


@pytest.mark.parametrize("delay_ms", [20.0, 120.0, 220.0])
async def test_no_false_barge_in_on_echo_alone_on_arrival(delay_ms: float) -> None:
    # The echo path as the caller's phone makes it, plus the 20 ms the packet takes: the
    # issue's 40-240 ms grid, at -15 dB and at a loud -10 dB.
    far = to_s16(agent_speech()[: 10 * RATE])
    for echo_db in (-10.0, -15.0):
        near = _near(far, echo_db=echo_db, caller_at_s=None, delay_ms=delay_ms)
        call, decided = await _run(far, near, on_arrival=True)
        assert decided == [], (echo_db, [(b.onset_ms, b.decision_ms) for b in call.bargeins])


async def test_the_barge_in_record_is_on_the_agents_clock() -> None:
    # The detector sees the caller placed a little behind the agent's clock; the record says
    # when it was decided on the clock the caller hears (decision → zero = the fade).
    far = to_s16(agent_speech()[: 6 * RATE])
    call, decided = await _run(far, _near(far, echo_db=None, caller_at_s=3.1), on_arrival=True)
    (b,) = call.bargeins
    assert b.decision_ms == (decided[0] + 1) * N * 1000 / RATE  # the end of tick k's frame
    assert b.zero_ms - b.decision_ms == b.faded_samples * 1000 / RATE
    assert 0 < b.decision_ms - b.onset_ms <= 100
