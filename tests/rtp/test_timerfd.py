"""The media ticker's timerfd (gateway.rtp.timerfd): fires at its CLOCK_MONOTONIC deadline and
never before (the kernel's promise, so these checks cannot race), disarms, re-arms earlier;
and the ticker picks it on a real loop, keeps the loop's timer on a simulated one or when
told, and paces calls with it (the timing gain is measured by ``voxgate bench calls``, not
here)."""

from __future__ import annotations

import asyncio
import itertools
import select
import socket
import sys
import time
from typing import cast

import numpy as np
import pytest
import uvloop

from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.rtp.timerfd import TimerFd
from gateway.sdp import MediaParams
from voxgate.contract.config import ConfigError, GatewayConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd: Linux")


def _readable(fd: TimerFd, timeout: float) -> bool:
    return bool(select.select([fd.fileno()], [], [], timeout)[0])


def test_fires_at_the_deadline_never_before() -> None:
    fd = TimerFd.create()
    assert fd is not None
    try:
        assert not fd.clear()  # not armed: nothing to consume
        deadline = time.monotonic() + 0.05
        fd.arm_at(deadline)
        assert not _readable(fd, 0.0)
        assert _readable(fd, 2.0)
        assert time.monotonic() >= deadline
        assert fd.clear() and not fd.clear()  # one expiry, consumed once
        fd.arm_at(time.monotonic() - 1.0)  # a deadline already past fires at once
        assert _readable(fd, 1.0) and fd.clear()
    finally:
        fd.close()


def test_disarm_and_rearm_earlier() -> None:
    fd = TimerFd.create()
    assert fd is not None
    try:
        fd.arm_at(time.monotonic() + 0.03)
        fd.disarm()
        assert not _readable(fd, 0.1)  # well past the cancelled deadline
        fd.arm_at(time.monotonic() + 30.0)
        fd.arm_at(time.monotonic() + 0.01)  # the later deadline is replaced, not kept
        assert _readable(fd, 2.0) and fd.clear()
    finally:
        fd.close()


async def _pace(ticker: MediaTicker, seconds: float) -> tuple[int, list[int]]:
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    ep = await RtpEndpoint.open("127.0.0.1", (36000, 38000))
    session = ep.configure(MediaParams("127.0.0.1", peer.getsockname()[1], 0, "PCMU", dtmf_pt=None))
    session.pacer.source = lambda n, at: np.full(n, 1000, np.int16)
    ticker.add(ep)
    await asyncio.sleep(seconds)
    ticker.remove(ep)
    ep.close()
    got: list[int] = []
    while True:
        try:
            data = peer.recv(2048)
        except BlockingIOError:
            break
        got.append(int.from_bytes(data[2:4], "big"))
    peer.close()
    ticker.close()
    return ticker.error.count, got


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_the_ticker_paces_on_the_timerfd(loop_kind: str) -> None:
    ticker = MediaTicker()
    run = uvloop.run if loop_kind == "uvloop" else asyncio.run
    count, seqs = run(_pace(ticker, 0.5))
    assert ticker.wakeups > 0
    # ~25 packets in 0.5 s, consecutive: the timerfd woke the ticker for each tick.
    assert 20 <= len(seqs) <= 27, seqs
    assert [(b - a) % 65536 for a, b in itertools.pairwise(seqs)] == [1] * (len(seqs) - 1)
    assert count == len(seqs)
    assert ticker.timer_kind == ""  # closed: chosen again at the next add


def test_the_choice_of_timer() -> None:
    chosen: dict[str, str] = {}

    async def pick(timer: str) -> None:
        ticker = MediaTicker(timer=timer)
        ep = await RtpEndpoint.open("127.0.0.1", (36000, 38000))
        ep.configure(MediaParams("127.0.0.1", 9, 0, "PCMU", dtmf_pt=None))
        ticker.add(ep)
        chosen[timer] = ticker.timer_kind
        ticker.remove(ep)
        ep.close()
        ticker.close()

    for timer in ("auto", "timerfd", "loop"):
        uvloop.run(pick(timer))
    assert chosen == {"auto": "timerfd", "timerfd": "timerfd", "loop": "loop"}
    with pytest.raises(ValueError, match="timer must be one of"):
        MediaTicker(timer="hrtimer")
    with pytest.raises(ConfigError, match=r"gateway\.media_timer"):
        GatewayConfig(media_timer="hrtimer").validate()


def test_a_simulated_clock_keeps_the_loops_timer() -> None:
    class SimLoop:
        def time(self) -> float:
            return 12345.0

    ticker = MediaTicker()
    ticker.clock = ticker._precise_clock(cast(asyncio.AbstractEventLoop, SimLoop()))
    ticker._choose_timer(cast(asyncio.AbstractEventLoop, SimLoop()))
    assert ticker.timer_kind == "loop"
    with pytest.raises(RuntimeError, match="timerfd"):
        forced = MediaTicker(timer="timerfd")
        forced.clock = ticker.clock
        forced._choose_timer(cast(asyncio.AbstractEventLoop, SimLoop()))
