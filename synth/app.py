"""Process-level assembly: build the engine and bus from a Config, run a worker or the embedded
gateway+worker, and stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from synth.engines import load_engine
from synth.engines.base import Engine
from synth.worker import Worker
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import Config
from voxgate.contract.runtime import build_bus, install_stop_signals

log = logging.getLogger("voxgate")


def build_engine(cfg: Config) -> Engine:
    return load_engine(cfg.synth.engine, cfg.synth.voice, cfg.synth.device, cfg.synth.threads)


def build_worker(cfg: Config, bus: Bus, engine: Engine, **kwargs: object) -> Worker:
    s, w = cfg.synth, cfg.worker
    return Worker(
        bus,
        engine,
        name=w.name,
        concurrency=s.concurrency,
        max_text_chars=s.max_text_chars,
        eq_gain_db=s.eq_gain_db,
        wideband_rate=s.wideband_rate,
        claim_idle_ms=w.claim_idle_ms,
        default_deadline_s=w.default_deadline_s,
        cache_bytes=s.cache_mb * 1024 * 1024,
        **kwargs,  # type: ignore[arg-type]
    )


async def run_worker(cfg: Config) -> int:
    """Run one worker on the configured bus until SIGINT/SIGTERM.

    ``voxgate worker`` runs it against a shared Redis (``voxgate serve`` runs a worker inside
    the gateway process instead: :mod:`voxgate.serve`).
    """
    stop = asyncio.Event()
    install_stop_signals(stop)
    from synth.health import WorkerHttp

    bus = build_bus(cfg)
    await bus.start()
    # Health/readiness/metrics from before the engine loads: alive, not ready until warm.
    http = WorkerHttp(bus)
    try:
        if cfg.worker.http_listen:
            await http.start(cfg.worker.http_listen)
        engine = await asyncio.to_thread(build_engine, cfg)
        worker = build_worker(cfg, bus, engine)
        http.attach(worker)
        await worker.run(stop)
    finally:
        await http.close()
        await bus.close()
    return 0
