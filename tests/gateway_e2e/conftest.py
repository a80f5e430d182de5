"""An in-process gateway (memory bus, real onnx worker) on free loopback ports."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gateway.app import Gateway
from gateway.config import load
from gateway.sip.message import Address
from synth.bus.memory import MemoryBus
from synth.engines import load_engine
from synth.engines.base import Engine
from synth.worker import Worker


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_sip_port() -> int:
    """A port free for UDP and TCP both (the gateway listens on both)."""
    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free SIP port")


@dataclass
class LiveGateway:
    gw: Gateway
    sip: Address
    http: str


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture
async def live_gateway(engine: Engine) -> AsyncIterator[LiveGateway]:
    cfg = load(
        None,
        env={},
        overrides={
            "gateway.sip_listen": f"127.0.0.1:{free_sip_port()}",
            "gateway.http_listen": f"127.0.0.1:{free_port(socket.SOCK_STREAM)}",
            "gateway.rtp_port_min": 30000,
            "gateway.rtp_port_max": 32000,
            "ivr.idle_timeout_s": 0,
        },
    )
    bus = MemoryBus()
    await bus.start()
    stop = asyncio.Event()
    worker = Worker(bus, engine, name="e2e", concurrency=2)
    worker_task = asyncio.create_task(worker.run(stop))
    gw = Gateway(cfg, bus)
    await gw.start()
    for _ in range(600):
        if await bus.ready_workers():
            break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError("the worker did not get ready")
    host, _, port = cfg.gateway.sip_listen.rpartition(":")
    try:
        yield LiveGateway(gw, (host, int(port)), f"http://127.0.0.1:{gw.http_port}")
    finally:
        await gw.close()
        stop.set()
        await worker_task
        await bus.close()
