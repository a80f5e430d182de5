"""The batched media tick on real UDP sockets (asyncio and uvloop): a dozen endpoints paced by
one :class:`MediaTicker`, an SRTP one among them, one whose source raises now and then, one
whose jitter-buffer consumer always raises, one that leaves and one that joins while the
others play.  Every packet that arrives must carry exactly the G.711 of the frame its call's
source gave for that media time, in sequence, and the calls that fail must not cost the
others a packet."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import uvloop

from dsp.g711 import ulaw_encode
from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.rtp.jitter import JitterFrame
from gateway.rtp.packet import RtpPacket
from gateway.sdp import MediaParams
from gateway.sdp_crypto import SrtpParams
from tests.secure.test_srtp import params as srtp_params
from tests.secure.test_srtp import peer_sessions

Int16Array = npt.NDArray[np.int16]
F = 160
CALLS = 12


def frame_at(seed: int, at: int) -> Int16Array:
    """Call ``seed``'s agent audio at media time ``at``: speech-like noise with pauses."""
    k = at // F
    if (k // 4 + seed) % 3 == 0:
        return np.zeros(F, np.int16)
    return np.random.default_rng(seed * 7919 + k).integers(-12000, 12000, F).astype(np.int16)


class Flaky:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.pulls = 0
        self.raised = 0

    def __call__(self, n: int, at: int) -> Int16Array:
        self.pulls += 1
        if self.pulls % 4 == 0:
            self.raised += 1
            raise RuntimeError("the agent broke")
        return frame_at(self.seed, at)


async def scenario(batched: bool) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ticker = MediaTicker(batched=batched)
    peers, eps = [], []
    srtp = srtp_params()
    _, rx = peer_sessions(srtp.suite, srtp)
    flaky = Flaky(3)
    for i in range(CALLS):
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        peer.setblocking(False)
        ep = await RtpEndpoint.open("127.0.0.1", (30000, 34000))
        keys: SrtpParams | None = srtp if i == 1 else None
        on_audio: Callable[[JitterFrame], None] | None = None
        if i == 4:

            def on_audio(frame: JitterFrame) -> None:
                raise ValueError("the recorder broke")

        session = ep.configure(
            MediaParams("127.0.0.1", peer.getsockname()[1], 0, "PCMU", dtmf_pt=None, srtp=keys),
            on_audio=on_audio,
        )
        session.pacer.source = flaky if i == 3 else (lambda n, at, s=i: frame_at(s, at))
        peers.append(peer)
        eps.append(ep)
    for i, ep in enumerate(eps):
        if i != 7:
            ticker.add(ep)
    got: list[list[bytes]] = [[] for _ in range(CALLS)]

    async def drain(until: float) -> None:
        while loop.time() < until:
            for i, peer in enumerate(peers):
                while True:
                    try:
                        got[i].append(peer.recv(2048))
                    except BlockingIOError:
                        break
            await asyncio.sleep(0.005)

    t0 = loop.time()
    await drain(t0 + 0.3)
    ticker.remove(eps[5])  # a call leaves
    left_at = eps[5].session.pacer.ticks if eps[5].session else 0
    ticker.add(eps[7])  # one joins
    await drain(t0 + 0.8)
    for ep in eps:
        ticker.remove(ep)
    await drain(loop.time() + 0.1)
    ticker.close()
    pacers = [ep.session.pacer for ep in eps if ep.session is not None]
    for ep in eps:
        ep.close()
    for peer in peers:
        peer.close()
    plain = [[rx.unprotect(w) or b"" for w in g] if i == 1 else g for i, g in enumerate(got)]
    return {
        "packets": plain,
        "wire": got,
        "pacers": pacers,
        "flaky": flaky,
        "left_at": left_at,
        "failures": ticker.failures,
        "error_count": ticker.error.count,
    }


def check(r: dict[str, Any]) -> None:
    pacers = r["pacers"]
    for i, wires in enumerate(r["packets"]):
        p = pacers[i]
        pkts = [RtpPacket.parse(w) for w in wires]
        assert len(pkts) == p.stats().sent > 5, i
        assert [x.sequence_number for x in pkts] == [
            (pkts[0].sequence_number + j) & 0xFFFF for j in range(len(pkts))
        ], i
        for x in pkts:
            at = (x.timestamp - p.ts0) & 0xFFFFFFFF
            assert x.payload == ulaw_encode(frame_at(3 if i == 3 else i, at)), (i, at)
        if i == 1:  # SRTP on the wire: ciphertext plus the 80-bit tag (RFC 3711 §3.1)
            assert all(len(w) == 12 + F + 10 for w in r["wire"][1])
    # The flaky call lost exactly its failed ticks; the others lost none to it.
    flaky = r["flaky"]
    # (A tick skipped by a stall of this busy box is not a packet either.)
    s3 = pacers[3].stats()
    assert flaky.raised > 0 and s3.sent == pacers[3].ticks - s3.skipped_ticks - flaky.raised
    for i in (0, 2, 4, 6, 8):
        s = pacers[i].stats()
        assert s.sent == pacers[i].ticks - s.skipped_ticks, i
    assert r["failures"] >= flaky.raised
    assert pacers[5].ticks == r["left_at"]  # nothing after it left
    assert 15 <= pacers[7].ticks <= 30  # joined for about half a second
    assert r["error_count"] >= sum(p.stats().sent for p in pacers)  # every send measured


def run_with(factory: Callable[[], asyncio.AbstractEventLoop], batched: bool) -> dict[str, Any]:
    coro: Coroutine[Any, Any, dict[str, Any]] = scenario(batched)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batched", [True, False])
def test_media_ticker_uvloop(batched: bool) -> None:
    check(run_with(uvloop.new_event_loop, batched))


@pytest.mark.timeout(30)
def test_media_ticker_asyncio_batched() -> None:
    check(run_with(asyncio.new_event_loop, True))
