"""End to end: a SIP call from the Python test client to an in-process gateway with the real
onnx worker; what the caller hears is checked packet by packet and sample by sample."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import numpy.typing as npt
import pytest

from gateway import sdp
from gateway.call.calls import Call
from gateway.call.control import Event, UtteranceFinished, UtteranceStarted
from tests.gateway_e2e.conftest import LiveGateway
from voxgate.bench.sipclient import ClientCall, RtpPeer, SipClient, frame_rms, rms

pytestmark = pytest.mark.slow

SPEECH_RMS = 300.0  # a 20 ms frame of the greeting's speech
QUIET_RMS = 30.0  # silence (A-law's digital silence decodes to ±8)
FULL_SCALE = {"PCMU": 32124, "PCMA": 32256}  # the largest magnitude each law can code


async def api_calls(base: str) -> list[dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/api/calls") as r:
        assert r.status == 200
        body = await r.json()
    calls = body["calls"] if isinstance(body, dict) else body
    assert isinstance(calls, list)
    return calls


async def hang_up(call: ClientCall, base: str) -> None:
    assert await call.bye() == 200
    for _ in range(50):  # the gateway forgets the call as the BYE's 200 goes out
        if not await api_calls(base):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"calls left after BYE: {await api_calls(base)}")


def check_answer(call: ClientCall, codec: str) -> None:
    assert call.status == 200
    assert call.response is not None
    assert (call.response.content_type or "").startswith("application/sdp")
    answer = sdp.parse(call.response.body)
    assert answer.media and answer.media[0].port > 0
    assert call.params is not None
    assert call.params.codec == codec
    assert call.params.dtmf_pt == 101


async def assert_continuous(media: RtpPeer, gw_call: Call) -> None:
    """One packet per 20 ms, seq without gaps, timestamp steps of 160 — except where the
    gateway's pacer skipped ticks (a stall of its process: it never bursts to catch up but
    moves the timestamp on with the marker set); the receiver must see exactly the skips the
    pacer counted, and they must be rare. The pacer keeps running while we look, so its count
    is read before (every skip by then has reached the receiver 50 ms later) and after."""
    leg = gw_call.leg
    endpoint = getattr(leg, "endpoint", None)
    assert endpoint is not None and endpoint.session is not None
    skipped_before = endpoint.session.pacer.skipped_ticks
    await asyncio.sleep(0.05)
    chk = media.check()
    skipped_after = endpoint.session.pacer.skipped_ticks
    assert (chk.seq_gaps, chk.seq_disorder, chk.unmarked_jumps) == (0, 0, 0), chk
    assert skipped_before <= chk.skipped_frames <= skipped_after, (chk, skipped_before)
    assert chk.skipped_frames <= 0.02 * chk.packets, f"the gateway stalled: {chk}"


def peak(frames: list[npt.NDArray[np.int16]]) -> int:
    return max(int(np.abs(f.astype(np.int32)).max()) for f in frames)


async def test_greeting_pcmu(live_gateway: LiveGateway) -> None:
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(live_gateway.sip, codecs=("PCMU", "PCMA"))
        check_answer(call, "PCMU")
        (gw_call,) = live_gateway.gw.manager.calls.values()
        media = call.media
        first = await media.wait_for_audio(after=call.acked_at, threshold=SPEECH_RMS, timeout=3)
        assert first.arrival - call.acked_at < 1.0, "greeting later than 1 s after ACK"

        await media.wait_for_quiet(quiet_s=1.5, threshold=QUIET_RMS, timeout=25)
        pkts, frames = media.frames()
        assert len(pkts) > 400
        await assert_continuous(media, gw_call)
        # Every packet one frame of G.711, on a 20 ms grid (loose: this is no benchmark).
        assert {len(p.payload) for p in pkts} == {160}
        assert float(np.percentile(media.pacing_errors_ms(pkts), 99)) < 15.0

        levels = frame_rms(frames)
        speech = [i for i, r in enumerate(levels) if r > SPEECH_RMS]
        assert len(speech) > 150, "less than 3 s of speech"
        assert (speech[-1] - speech[0]) * 0.02 > 5.0, "the greeting lasted under 5 s"
        tail = levels[speech[-1] + 1 :]
        # The sentence's decaying tail, then silence for the last second.
        assert len(tail) >= 60 and max(tail[-50:]) < QUIET_RMS, "no silence after the greeting"
        # One utterance streamed without a single underrun (the gateway's own count: speech
        # has digitally silent frames of its own, so the receiver cannot tell them apart).
        assert gw_call.playout.stats.underruns == 0
        assert gw_call.playout.stats.speech_frames > 150
        assert peak(frames) < FULL_SCALE["PCMU"], "the greeting clips"

        await hang_up(call, live_gateway.http)
    finally:
        client.close()


async def test_pcma_call(live_gateway: LiveGateway) -> None:
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(live_gateway.sip, codecs=("PCMA",))
        check_answer(call, "PCMA")
        (gw_call,) = live_gateway.gw.manager.calls.values()
        media = call.media
        first = await media.wait_for_audio(after=call.acked_at, threshold=SPEECH_RMS, timeout=3)
        assert first.arrival - call.acked_at < 1.0
        await asyncio.sleep(3.0)
        pkts, frames = media.frames()
        await assert_continuous(media, gw_call)
        assert all(p.pt == 8 for p in pkts)
        levels = frame_rms(frames)
        assert sum(r > SPEECH_RMS for r in levels) > 75, "under 1.5 s of speech in 3 s"
        assert peak(frames) < FULL_SCALE["PCMA"]
        await hang_up(call, live_gateway.http)
    finally:
        client.close()


async def _press_when_loud(media: RtpPeer, digit: str, *, loud: float = 2500.0) -> float:
    """Press ``digit`` (a short press: its end packet follows 20 ms after the first) as soon
    as a loud frame arrives, so the gateway cuts the greeting mid-word; returns the time the
    press's first packet went out."""
    seen = len(media.received)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        for p in media.received[seen:]:
            if p.pt == media.payload_type and rms(media.codec.decode(p.payload)) > loud:
                return await media.send_dtmf(digit, duration_ms=40)
        seen = len(media.received)
        await asyncio.sleep(0.005)
    raise AssertionError("no loud frame to interrupt")


async def test_dtmf_interrupts_greeting_with_a_fade(live_gateway: LiveGateway) -> None:
    gw = live_gateway.gw
    sub = gw.manager.subscribe_events()
    events: list[Event] = []

    async def collect() -> None:
        async for ev in sub:
            events.append(ev)

    collector = asyncio.create_task(collect())
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(live_gateway.sip, codecs=("PCMU",))
        check_answer(call, "PCMU")
        (gw_call,) = gw.manager.calls.values()
        media = call.media
        await media.wait_for_audio(after=call.acked_at, threshold=SPEECH_RMS, timeout=3)
        await asyncio.sleep(1.0)
        pressed = await _press_when_loud(media, "1")
        hours = gw.cfg.ivr.menu["1"]
        for _ in range(100):
            if any(isinstance(e, UtteranceStarted) and e.text == hours for e in events):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the opening-hours prompt did not start")
        await asyncio.sleep(2.5)

        finished = [e for e in events if isinstance(e, UtteranceFinished)]
        assert finished and finished[0].outcome == "interrupted", finished

        pkts, all_frames = media.frames()
        first_after = next(i for i, p in enumerate(pkts) if p.arrival >= pressed)
        all_levels = frame_rms(all_frames)
        levels = all_levels[first_after:]
        # The reaction: the first quiet packet after the press, within 8 packets (press → its
        # end packet 20 ms later → the gateway's next tick, plus loopback). The gap lasts
        # until the prompt's first audio (~100 ms of synthesis).
        q = next(i for i, r in enumerate(levels) if r < QUIET_RMS)
        assert q <= 8, f"audio still playing {q} packets after the key press: {levels[:12]}"
        qa = first_after + q
        assert max(all_levels[qa - 2 : qa]) > SPEECH_RMS, (
            f"no speech just before the cut (pressed in a pause?): {all_levels[qa - 4 : qa + 2]}"
        )
        # The level falls to silence over at most 2 packets: packet q-2 is still speech, q-1
        # carries the fade, q is silent.
        x = np.concatenate(all_frames[qa - 3 : qa + 1]).astype(np.float64)
        quiet = np.abs(x) <= 8
        z = len(x)  # start of the final silent run
        while z > 0 and quiet[z - 1]:
            z -= 1
        assert len(x) - z >= 80, "the cut is not followed by silence"
        before = np.abs(x[max(0, z - 80 - 160) : z - 80])  # the 20 ms before the 10 ms fade
        prev_amp = float(before.max())
        # The press can land on a soft syllable (seen: 684): the checks below are relative to
        # this amplitude, so it only has to be well above the line's quiet level.
        assert prev_amp > 400, "too quiet before the cut to judge the fade"
        # No hard cut: the last 1.25 ms before silence is below a quarter of the amplitude
        # before the fade (a cosine fade ends near 0; a hard cut ends mid-waveform), and no
        # sample-to-sample step at the cut exceeds half of it.
        assert float(np.abs(x[z - 10 : z]).max()) <= 0.25 * prev_amp
        assert float(np.abs(np.diff(x[z - 20 : z + 1])).max()) <= 0.5 * prev_amp
        # The fade is at most 10 ms: it starts on the fade packet's first sample.
        assert z - (z - 1) // 160 * 160 <= 80

        # Then the opening-hours prompt is heard.
        after = levels[q:]
        resumed = next((i for i, r in enumerate(after) if r > SPEECH_RMS), None)
        assert resumed is not None and resumed * 0.02 < 1.5, "no prompt within 1.5 s of the cut"
        assert sum(r > SPEECH_RMS for r in after[resumed:]) > 50, "the prompt is too short"
        await assert_continuous(media, gw_call)
        await hang_up(call, live_gateway.http)
    finally:
        client.close()
        await sub.aclose()
        collector.cancel()
