"""The media ticker reads send-time error on a sub-millisecond clock: under uvloop,
``loop.time()`` is libuv's ``uv_now`` (CLOCK_MONOTONIC truncated to whole milliseconds), which
reported an error of 0.0-0.99 ms as 0 and 2.0-2.99 ms as 2; the ticker measures with
``time.monotonic`` (the same base) instead, and keeps a simulated loop's own clock."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import uvloop

from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.sdp import MediaParams


async def _pace(seconds: float, calls: int = 4) -> MediaTicker:
    ticker = MediaTicker()
    peers: list[socket.socket] = []
    eps: list[RtpEndpoint] = []
    for _ in range(calls):
        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        ep = await RtpEndpoint.open("127.0.0.1", (34000, 36000))
        session = ep.configure(
            MediaParams("127.0.0.1", peer.getsockname()[1], 0, "PCMU", dtmf_pt=None)
        )
        session.pacer.source = lambda n, at: np.full(n, 1000, np.int16)
        ticker.add(ep)
        peers.append(peer)
        eps.append(ep)
    await asyncio.sleep(seconds)
    for ep in eps:
        ticker.remove(ep)
        ep.close()
    for peer in peers:
        peer.close()
    ticker.close()
    return ticker


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_send_time_error_has_sub_millisecond_resolution(loop_kind: str) -> None:
    run: Callable[[Any], MediaTicker] = uvloop.run if loop_kind == "uvloop" else asyncio.run
    ticker = run(_pace(0.5))
    assert ticker.clock is time.monotonic
    bins = ticker.error._bins  # 0.1 ms bins
    assert ticker.error.count >= 4 * 20  # 4 calls x 25 packets, less the start
    # A whole-millisecond clock puts every error on a bin of 0.0 or 0.9 ms (mod 1 ms: k ms
    # minus a schedule on the 2 ms grid, with float noise); measured, the errors spread.
    frac = sum(int(bins[i]) for i in range(bins.size) if i % 10 not in (0, 9))
    assert frac > 0, np.flatnonzero(bins)[:20]


def test_a_simulated_loop_keeps_its_own_clock() -> None:
    class SimLoop:
        def __init__(self) -> None:
            self.now = 12345.0

        def time(self) -> float:
            return self.now

    sim = SimLoop()
    clock = MediaTicker()._precise_clock(cast(asyncio.AbstractEventLoop, sim))
    assert clock == sim.time
    real = asyncio.new_event_loop()
    try:
        assert MediaTicker()._precise_clock(real) is time.monotonic
    finally:
        real.close()
