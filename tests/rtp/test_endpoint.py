"""Real UDP sockets on 127.0.0.1: two endpoints paced by one MediaTicker.

Checks content, not timing: the box may be noisy, so no assertion depends on when a packet
left, only on what arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest
import uvloop

from dsp.g711 import ulaw_decode, ulaw_encode
from gateway.rtp.dtmf import DtmfDigit
from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.rtp.jitter import JitterFrame
from gateway.rtp.packet import RtpPacket
from gateway.sdp import answer, make_offer, negotiated, parse

F = 160
PORTS = (30000, 40000)


def speech_like(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 8000)) / 8000
    x = 7000 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    x += rng.normal(0, 300, t.size)
    return np.clip(x, -32768, 32767).astype(np.int16)


async def exchange() -> dict[str, Any]:
    a = await RtpEndpoint.open("127.0.0.1", PORTS)
    b = await RtpEndpoint.open("127.0.0.1", PORTS)
    assert a.local_port % 2 == 0 and b.local_port % 2 == 0 and a.local_port != b.local_port
    offer = parse(str(make_offer("127.0.0.1", a.local_port, ("PCMU",), 20)))
    ans = parse(str(answer(offer, "127.0.0.1", b.local_port)))
    a_frames: list[JitterFrame] = []
    b_frames: list[JitterFrame] = []
    b_digits: list[DtmfDigit] = []
    b_raw: list[bytes] = []
    a.configure(negotiated(ans, offer), on_audio=a_frames.append)
    b.configure(negotiated(offer, ans), on_audio=b_frames.append, on_dtmf=b_digits.append)
    assert a.session is not None and b.session is not None
    orig = b._datagram

    def tap(data: bytes, addr: tuple[str, int]) -> None:
        b_raw.append(data)
        orig(data, addr)

    b._datagram = tap  # type: ignore[method-assign]

    a_pcm = speech_like(1.0, 1)
    b_pcm = speech_like(1.0, 2)
    a.session.pacer.enqueue(a_pcm)
    a.session.pacer.end_utterance()
    b.session.pacer.enqueue(b_pcm)
    b.session.pacer.end_utterance()

    ticker = MediaTicker()
    ticker.add(a)
    ticker.add(b)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    await asyncio.sleep(1.2)  # the utterance is out; DTMF pre-empts audio, so send it after
    a.session.pacer.send_dtmf("1#", duration_ms=100)
    await asyncio.sleep(0.2)
    while len(b_digits) < 2 and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    ticker.remove(a)
    ticker.remove(b)
    ticker.close()
    result = {
        "a_pcm": a_pcm,
        "b_pcm": b_pcm,
        "a_frames": a_frames,
        "b_frames": b_frames,
        "b_digits": b_digits,
        "b_raw": b_raw,
        "a_ts0": a.session.pacer.ts0,
        "b_ts0": b.session.pacer.ts0,
        "a_stats": a.session.stats(),
        "b_stats": b.session.stats(),
        "ticker_error": ticker.error.summary(),
        "wakeups": ticker.wakeups,
    }
    a.close()
    b.close()
    return result


def frames_matching(frames: list[JitterFrame], pcm: np.ndarray, ts0: int) -> tuple[int, int]:
    ref = ulaw_decode(ulaw_encode(pcm))
    good = bad = 0
    for f in frames:
        if f.kind != "audio" or f.timestamp is None:
            continue
        off = (f.timestamp - ts0) & 0xFFFFFFFF
        if off + F <= ref.size:
            if np.array_equal(f.pcm, ref[off : off + F]):
                good += 1
            else:
                bad += 1
    return good, bad


def check(r: dict[str, Any]) -> None:
    # What went over the wire is exactly the μ-law of what was queued.
    pkts = sorted(
        (RtpPacket.parse(d) for d in r["b_raw"]),
        key=lambda p: (p.timestamp - r["a_ts0"]) & 0xFFFFFFFF,
    )
    audio = b"".join(p.payload for p in pkts if p.payload_type == 0)
    assert ulaw_encode(r["a_pcm"]) in audio
    # What the jitter buffers played is that audio, frame for frame, both directions.
    for frames, pcm, ts0 in (
        (r["b_frames"], r["a_pcm"], r["a_ts0"]),
        (r["a_frames"], r["b_pcm"], r["b_ts0"]),
    ):
        good, bad = frames_matching(frames, pcm, ts0)
        assert bad == 0
        assert good >= 45  # 50 frames sent; allow a couple concealed on a very busy box
    assert [(d.digit, d.duration_ms) for d in r["b_digits"]] == [("1", 100), ("#", 100)]
    assert r["b_stats"]["latch"]["latched"] and r["b_stats"]["inbound"]["lost"] == 0
    assert r["ticker_error"]["count"] > 100


def run_with(factory: Callable[[], asyncio.AbstractEventLoop]) -> dict[str, Any]:
    coro: Coroutine[Any, Any, dict[str, Any]] = exchange()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@pytest.mark.timeout(30)
def test_two_endpoints_uvloop() -> None:
    check(run_with(uvloop.new_event_loop))


@pytest.mark.timeout(30)
def test_two_endpoints_asyncio() -> None:
    check(run_with(asyncio.new_event_loop))


async def test_port_range_exhaustion_and_ipv6() -> None:
    a = await RtpEndpoint.open("127.0.0.1", (41000, 41002))
    try:
        with pytest.raises(OSError, match="no free RTP port"):
            await RtpEndpoint.open("127.0.0.1", (41000, 41002))
    finally:
        a.close()
    with pytest.raises(ValueError, match="no even port"):
        await RtpEndpoint.open("127.0.0.1", (41001, 41002))
    try:
        v6 = await RtpEndpoint.open("::1", (41000, 41100))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert v6.local_port % 2 == 0
    v6.close()
