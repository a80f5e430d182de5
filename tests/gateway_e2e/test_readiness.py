"""Readiness on SIP: until a warmed-up worker serves, OPTIONS and INVITE get 503 with
Retry-After (a dispatcher probing with OPTIONS routes callers elsewhere); once one does, both
get 200. With ``gateway.unready_wait_ms`` an INVITE is held for a worker instead."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.app import Gateway
from gateway.sip import parse
from gateway.sip.message import Response
from synth.worker import Worker
from tests.fakes import ToneEngine
from voxgate.bench.localgw import free_port
from voxgate.bench.sipclient import SipClient
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import load
from voxgate.serve import attach_worker


def options(addr: tuple[str, int]) -> Response:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2.0)
        s.sendto(
            b"OPTIONS sip:ivr@127.0.0.1 SIP/2.0\r\n"
            b"Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKready"
            + str(free_port()).encode()
            + b";rport\r\nFrom: <sip:probe@127.0.0.1>;tag=1\r\nTo: <sip:ivr@127.0.0.1>\r\n"
            b"Call-ID: ready-" + str(free_port()).encode() + b"\r\nCSeq: 1 OPTIONS\r\n"
            b"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            addr,
        )
        reply = parse(s.recv(65535))
    assert isinstance(reply, Response)
    return reply


@asynccontextmanager
async def gateway_without_worker(**overrides: object) -> AsyncIterator[tuple[Gateway, MemoryBus]]:
    cfg = load(None, env={}, overrides={
        "gateway.sip_listen": f"127.0.0.1:{free_port(both=True)}",
        "gateway.http_listen": f"127.0.0.1:{free_port(socket.SOCK_STREAM)}",
        "gateway.rtp_port_min": 30000, "gateway.rtp_port_max": 32000,
        "ivr.idle_timeout_s": 0, **overrides,
    })  # fmt: skip
    bus = MemoryBus()
    await bus.start()
    gw = Gateway(cfg, bus)
    await gw.start()
    try:
        yield gw, bus
    finally:
        await gw.close()
        await bus.close()


def sip_addr(gw: Gateway) -> tuple[str, int]:
    host, _, port = gw.cfg.gateway.sip_listen.rpartition(":")
    return host, int(port)


async def test_options_and_invite_get_503_until_a_worker_is_warm() -> None:
    async with gateway_without_worker() as (gw, bus):
        addr = sip_addr(gw)
        loop = asyncio.get_running_loop()
        probe = await loop.run_in_executor(None, options, addr)
        assert probe.status == 503 and probe.headers.get("Retry-After") == "2", probe
        client = await SipClient.open("127.0.0.1")
        try:
            call = await client.invite(addr, codecs=("PCMU",))
            assert call.status == 503 and not gw.manager.calls
            # A worker warms up: within a moment SIP says so.
            stop = asyncio.Event()
            worker = Worker(bus, ToneEngine(warmup_s=0.2), name="late")
            attach_worker(gw, worker)
            task = asyncio.create_task(worker.run(stop))
            assert await gw.readiness.wait(10.0)
            probe = await loop.run_in_executor(None, options, addr)
            assert probe.status == 200, probe
            call = await client.invite(addr, codecs=("PCMU",))
            assert call.status == 200
            assert await call.bye() == 200
            stop.set()
            await task
            # The worker retired: not ready again (the view refreshes within a second).
            assert not await gw.readiness.refresh()
            assert (await loop.run_in_executor(None, options, addr)).status == 503
        finally:
            client.close()


async def test_with_unready_wait_an_invite_is_held_for_a_worker() -> None:
    async with gateway_without_worker(**{"gateway.unready_wait_ms": 8000}) as (gw, bus):
        addr = sip_addr(gw)
        client = await SipClient.open("127.0.0.1")
        stop = asyncio.Event()
        try:
            invite = asyncio.create_task(client.invite(addr, codecs=("PCMU",), timeout=15.0))
            await asyncio.sleep(0.5)
            assert not invite.done()  # held, not refused
            worker = Worker(bus, ToneEngine(warmup_s=0.2), name="late")
            task = asyncio.create_task(worker.run(stop))
            call = await invite
            assert call.status == 200
            assert await call.bye() == 200
            stop.set()
            await task
        finally:
            stop.set()
            client.close()


async def test_a_gateway_shutting_down_refuses_new_calls_while_it_hangs_up() -> None:
    # SIGTERM: while the calls up are being hung up, a dispatcher's OPTIONS probe and a new
    # INVITE get 503, not a 200 from a gateway about to vanish (the Kamailio front's case).
    async with gateway_without_worker() as (gw, bus):
        addr = sip_addr(gw)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        worker = Worker(bus, ToneEngine(warmup_s=0.0), name="w")
        attach_worker(gw, worker)
        task = asyncio.create_task(worker.run(stop))
        client = await SipClient.open("127.0.0.1")
        try:
            assert await gw.readiness.wait(10.0)
            up = await client.invite(addr, codecs=("PCMU",))
            assert up.status == 200 and len(gw.ua.legs) == 1
            seen: list[tuple[int, str, str | None]] = []
            leg = next(iter(gw.ua.legs))
            hang_up = leg.hangup

            async def probing_hangup(reason: str) -> None:
                # The transport is still open here: what does a newcomer get?
                probe = await loop.run_in_executor(None, options, addr)
                seen.append((probe.status, probe.reason, probe.headers.get("Retry-After")))
                late = await client.invite(addr, codecs=("PCMU",))
                seen.append((late.status, "", None))
                await hang_up(reason)

            leg.hangup = probing_hangup  # type: ignore[method-assign]
            await gw.ua.close()
            assert seen == [(503, "Shutting Down", "5"), (503, "", None)], seen
            assert not gw.ua.legs and not gw.manager.calls
        finally:
            stop.set()
            await task
            client.close()
