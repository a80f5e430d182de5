"""Process-level assembly: build the engine and bus from a Config, run a worker or the embedded
gateway+worker, and stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from synth.engines import load_engine
from synth.engines.base import Engine
from synth.engines.graph_cache import GraphCache, default_cache_dir
from synth.worker import Worker
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import Config
from voxgate.contract.runtime import build_bus, install_stop_signals

log = logging.getLogger("voxgate")


GRAPH_CACHE_OFF = "off"


def graph_cache(cfg: Config) -> GraphCache | None:
    """The graph cache ``synth.graph_cache_dir`` names, or None for none.

    ``""``: the XDG default (:func:`default_cache_dir`); ``"off"``: none; ``~`` is expanded.
    A cache is an optimisation, so a directory that cannot be created (read-only filesystem,
    no permission, a file in the way) is a warning and the worker starts uncached (~3 s slower)
    rather than not at all. An existing directory we cannot write to is still used: its entries
    load (an image or an init container may have filled it) and a missing one is split and not
    saved (:func:`synth.engines.onnx_engine.load_backend` logs that).
    """
    value = cfg.synth.graph_cache_dir
    if value == GRAPH_CACHE_OFF:
        return None
    root = Path(value).expanduser() if value else default_cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "synth.graph_cache_dir: cannot create %s (%s); running without the graph cache",
            root,
            exc,
        )
        return None
    if not os.access(root, os.W_OK | os.X_OK):
        log.warning("synth.graph_cache_dir: %s is not writable; new graphs are not saved", root)
    return GraphCache(root)


def build_engine(cfg: Config) -> Engine:
    s = cfg.synth
    cache = graph_cache(cfg) if s.engine == "onnx" else None
    batching = {"on": True, "off": False}.get(s.batching)  # "auto": the engine's default
    return load_engine(
        s.engine,
        s.voice,
        s.device,
        s.threads,
        cache=cache,
        batching=batching,
        max_batch=s.batch_max,
        budget_ms=s.batch_budget_ms,
        precision=s.precision,
    )


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
        prerender=tuple(s.prerender),
        **{"background_warm": w.warm_background, **kwargs},  # type: ignore[arg-type]
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
