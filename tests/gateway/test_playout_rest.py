"""A SIP leg's jitter buffer rests while nothing takes the caller's audio in playout time
(issue 17: per-call CPU at 100 calls).  Fed on arrival, the barge-in detector and the agents'
ears hear each packet as it comes; the jitter buffer's frames only feed a recording or a
bridged party.  With neither, the batched tick neither fills nor pulls the buffer; once a
recording starts, the buffer primes afresh and the recording gets the caller's audio, exactly;
when it stops, the buffer rests again."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode
from gateway import sdp
from gateway.call.manager import CallManager
from gateway.legs.sip.ua import attach_source
from gateway.rtp.endpoint import RtpEndpoint
from gateway.rtp.jitter import JitterFrame
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import BargeinSettings

Int16Array = npt.NDArray[np.int16]
N = 160


class _Transport:
    def sendto(self, data: bytes, addr: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Recorder:
    """Stands in for the call's recorder: keeps the caller frames it is handed."""

    active = True

    def __init__(self) -> None:
        self.caller_frames: list[Int16Array] = []

    def caller(self, pos: int, pcm: Int16Array) -> None:
        self.caller_frames.append(pcm.copy())

    def agent(self, pos: int, pcm: Int16Array) -> None:
        pass


def _packet(i: int, pcm: Int16Array) -> bytes:
    # RFC 3550 §5.1 header: V=2, PT 0 (PCMU), seq, timestamp, SSRC.
    head = bytes([0x80, 0]) + (1000 + i).to_bytes(2, "big") + (160 * i).to_bytes(4, "big")
    return head + b"\x00\x00\x30\x39" + ulaw_encode(pcm)


async def test_the_buffer_rests_until_a_recording_takes_the_callers_audio() -> None:
    manager = CallManager(MemoryBus(), None, bargein=BargeinSettings())
    call = manager.new_call("sip", "inbound", "sip:c@test", "sip:ivr@gw")
    call.set_state("answered")
    call.feed_on_arrival()
    ep = RtpEndpoint(asyncio.get_running_loop())
    ep.transport = _Transport()  # type: ignore[assignment]
    offer = sdp.parse(str(sdp.make_offer("127.0.0.1", 40000, ("PCMU",), 20)))
    params = sdp.negotiated(offer, sdp.parse(str(sdp.answer(offer, "127.0.0.1", 30000))))
    heard: list[int] = []
    original = call.on_caller_packet

    def on_packet(ts: int, pcm: Int16Array) -> None:
        heard.append(ts)
        original(ts, pcm)

    played: list[Int16Array] = []

    def on_audio(frame: JitterFrame) -> None:
        played.append(frame.pcm)
        call.on_caller_audio(frame.pcm)

    session = ep.configure(
        params,
        on_audio=on_audio,
        on_arrival=on_packet,
        playout_wanted=call.plays_caller_out,
    )
    attach_source(ep, call)
    call.set_codec(params.codec)
    rng = np.random.default_rng(4)
    caller = rng.integers(-3000, 3000, 120 * N).astype(np.int16)
    jitter = session.jitter

    def step(i: int) -> None:
        ep._datagram(_packet(i, caller[i * N : (i + 1) * N]), ("127.0.0.1", 40000))
        ep.inbound_tick(i * 0.02)  # the batched tick's inbound half

    for i in range(40):
        step(i)
    assert len(heard) == 40  # the arrival path heard every packet
    assert not jitter.playing and jitter.depth_samples == 0 and not played
    assert jitter.stats().received == 40

    recorder = _Recorder()
    call.recorder = recorder  # type: ignore[assignment]
    for i in range(40, 80):
        step(i)
    assert jitter.playing
    got = np.concatenate(recorder.caller_frames)
    want = ulaw_decode(ulaw_encode(caller))
    first = int(np.flatnonzero(got)[0])
    assert first <= 4 * N  # primed within the target delay
    # The recording holds the caller's audio from the first packet after the recording began
    # (packet 40 arrived before the tick that saw the recorder), sample for sample.
    assert np.array_equal(got[first:], want[41 * N : 41 * N + got.size - first])
    assert got.size - first >= 30 * N

    call.recorder = None
    n_played = len(played)
    for i in range(80, 120):
        step(i)
    assert not jitter.playing and len(played) == n_played
    assert len(heard) == 120 and jitter.stats().received == 120
