"""A SIP caller hanging up mid-greeting stops the worker's synthesis of it (issue 17).

``Call.ended`` spawned the worker cancels of what the call would never play and then cancelled
the call's tasks; on the embedded memory bus nothing in between suspends, so the cancels never
ran and the worker rendered the whole greeting of a caller who had gone, while the next
caller's first chunk waited behind it. The check is on the mechanism, not on a latency: once
the call has ended the greeting carries a cancel marker on the bus and the worker serves
nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.call.control import UtteranceStarted
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.interop.conftest import free_port, need, port_block
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SENTENCE = "Thank you for calling, every word of this greeting is rendered for the caller. "
LONG_GREETING = SENTENCE * 40


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


async def test_sip_hangup_mid_greeting_cancels_its_synthesis(engine: Engine) -> None:
    sipp = need("sipp")
    lo, hi = port_block(10)
    overrides = {
        "ivr.greeting": LONG_GREETING,
        "gateway.rtp_port_min": lo,
        "gateway.rtp_port_max": hi,
    }
    async with local_gateway(engine, name="sip-hangup", overrides=overrides) as lg:
        # sipp's own UAC: INVITE, ACK, 2.5 s of call, BYE.
        proc = await asyncio.create_subprocess_exec(
            sipp, "-sn", "uac", f"{lg.sip[0]}:{lg.sip[1]}", "-m", "1", "-d", "2500",
            "-i", "127.0.0.1", "-p", str(free_port()), "-mp", str(port_block(4)[0]),
            "-nostdin", "-timeout", "30s", "-timeout_error",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await wait_for(lambda: bool(lg.gw.manager.calls), timeout=15)
        call = next(iter(lg.gw.manager.calls.values()))
        await wait_for(
            lambda: any(isinstance(e, UtteranceStarted) for e in call.history), timeout=15
        )
        greeting = next(e for e in call.history if isinstance(e, UtteranceStarted)).utterance_id
        assert lg.worker.in_flight == 1  # still rendering the rest of the greeting
        assert not await lg.bus.is_cancelled(greeting)

        assert await asyncio.wait_for(proc.wait(), 30) == 0  # the BYE was answered
        await wait_for(lambda: call.id not in lg.gw.manager.calls, timeout=10)
        assert await lg.bus.is_cancelled(greeting)
        await wait_for(lambda: lg.worker.in_flight == 0, timeout=10)
