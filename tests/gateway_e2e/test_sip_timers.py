"""``gateway.sip_t1_ms`` reaches the transaction layer: a UDP non-INVITE server transaction
(an OPTIONS here) is held for Timer J = 64×T1 after its final response (RFC 3261 §17.2.2) so
that a retransmitted request gets the same answer, and released then, not before."""

from __future__ import annotations

import asyncio
import time

from gateway.app import Gateway
from tests.gateway_e2e.test_readiness import gateway_without_worker, options, sip_addr


async def _held_for(gw: Gateway, limit_s: float) -> float:
    """Send one OPTIONS; seconds until the gateway holds no transaction (at most limit_s)."""
    assert gw.ua.layer.transaction_count == 0
    loop = asyncio.get_running_loop()
    reply = await loop.run_in_executor(None, options, sip_addr(gw))
    sent = time.monotonic()
    assert reply.status == 503  # no worker: still a final response, the transaction completes
    assert gw.ua.layer.transaction_count == 1
    while gw.ua.layer.transaction_count and time.monotonic() - sent < limit_s:
        await asyncio.sleep(0.05)
    return time.monotonic() - sent


async def test_timer_j_is_64_t1_of_the_configured_t1() -> None:
    async with gateway_without_worker(**{"gateway.sip_t1_ms": 50}) as (gw, _):
        assert gw.ua.layer.config.t1 == 0.05
        held = await _held_for(gw, 20.0)
    # 64 × 50 ms = 3.2 s; the wait began after the reply arrived, so a little under is right.
    assert 3.0 <= held < 10.0, held


async def test_the_default_t1_holds_it_32_s() -> None:
    async with gateway_without_worker() as (gw, _):
        assert gw.ua.layer.config.t1 == 0.5
        held = await _held_for(gw, 4.0)  # not 32 s of test time: past 64 × 50 ms is enough
    assert held >= 4.0
