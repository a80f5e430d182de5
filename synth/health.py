"""The worker's HTTP listener (``worker.http_listen``): health, readiness and metrics.

- ``GET /healthz``: 200 while the process runs (liveness);
- ``GET /readyz``: 200 once the worker has warmed up and the bus answers a ping, else 503; both
  with a JSON body saying which (an orchestrator's readiness probe);
- ``GET /metrics``: Prometheus text (``synth.metrics``).

It starts before the engine is loaded (``attach`` the worker once it exists), so a probe sees
the process alive and not ready for the whole warm-up.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from synth.metrics import WorkerMetrics
from synth.worker import Worker
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import parse_hostport
from voxgate.contract.metrics import CONTENT_TYPE

log = logging.getLogger("voxgate.worker.http")

PING_TIMEOUT_S = 2.0


class WorkerHttp:
    def __init__(self, bus: Bus, worker: Worker | None = None) -> None:
        self.bus = bus
        self.worker: Worker | None = None
        self.metrics: WorkerMetrics | None = None
        self.runner: web.AppRunner | None = None
        self.port = 0
        if worker is not None:
            self.attach(worker)

    def attach(self, worker: Worker) -> WorkerMetrics:
        self.worker = worker
        self.metrics = WorkerMetrics(worker)
        return self.metrics

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics_handler),
        ])  # fmt: skip
        return app

    async def start(self, listen: str) -> int:
        """Listen on ``HOST:PORT`` (port 0: a free one); returns the port."""
        host, port = parse_hostport("worker.http_listen", listen)
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        addresses = self.runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        log.info("worker health and metrics on http://%s:%d", host, self.port)
        return self.port

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # --- handlers ------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        worker = self.worker
        warm = worker is not None and worker.ready
        try:
            bus_ok = await asyncio.wait_for(self.bus.ping(), PING_TIMEOUT_S)
        except Exception:  # a bus that fails its ping is simply not ready
            bus_ok = False
        ready = warm and bus_ok
        body = {
            "ready": ready,
            "warm": warm,
            "bus": bus_ok,
            "worker": worker.name if worker is not None else None,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            body = b""
        else:
            body = await self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
