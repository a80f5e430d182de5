"""A whole gateway on loopback in this process (memory bus, a real worker, free ports): what
the end-to-end tests and the in-process benchmarks run calls against."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from gateway.app import Gateway
from gateway.sip.message import Address
from synth.engines.base import Engine
from synth.worker import Worker
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import Config, load
from voxgate.serve import attach_worker


def free_port(kind: int = socket.SOCK_DGRAM, *, both: bool = False, even: bool = False) -> int:
    """A free loopback port; ``both``: free for UDP and TCP (SIP listens on both); ``even``:
    an even one (RTP)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if even and (port % 2 or port > 65000):
            continue
        if both:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port")


@dataclass
class LocalGateway:
    gw: Gateway
    cfg: Config
    sip: Address
    http: str
    worker: Worker
    bus: MemoryBus


@contextlib.asynccontextmanager
async def local_gateway(
    engine: Engine, *, name: str = "local", overrides: Mapping[str, object] | None = None
) -> AsyncIterator[LocalGateway]:
    """Gateway + worker on free loopback ports, wired as ``voxgate serve`` wires them (the
    worker's metrics on the gateway's /metrics), ready (the worker warmed up) when entered."""
    cfg = load(
        None,
        env={},
        overrides={
            "gateway.sip_listen": f"127.0.0.1:{free_port(both=True)}",
            "gateway.http_listen": f"127.0.0.1:{free_port(socket.SOCK_STREAM)}",
            "gateway.rtp_port_min": 30000,
            "gateway.rtp_port_max": 32000,
            "ivr.idle_timeout_s": 0,
            **(overrides or {}),
        },
    )
    bus = MemoryBus()
    await bus.start()
    stop = asyncio.Event()
    worker = Worker(bus, engine, name=name, concurrency=2)
    gw = Gateway(cfg, bus)
    attach_worker(gw, worker)
    worker_task = asyncio.create_task(worker.run(stop))
    try:
        await gw.start()
        # Ready as SIP sees it (the gateway's own view: OPTIONS and INVITE get 503 before).
        if not await gw.readiness.wait(60.0):
            raise RuntimeError("the worker did not get ready")
        host, _, port = cfg.gateway.sip_listen.rpartition(":")
        http = f"http://127.0.0.1:{gw.http_port}"
        yield LocalGateway(gw, cfg, (host, int(port)), http, worker, bus)
    finally:
        await gw.close()
        stop.set()
        await worker_task
        await bus.close()
