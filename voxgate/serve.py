"""``voxgate serve``: a gateway and a synthesis worker in one process, over the in-memory bus.

The one place where both sides meet: the gateway (:mod:`gateway.app`) and the worker
(:mod:`synth.app`) each know only the contract (:mod:`voxgate.contract`).

Both sides are imported inside the functions, not at the top: :mod:`voxgate.cli` imports this
module to register ``serve``, and every other command (``voxgate worker`` above all, whose
spawn-to-ready is budgeted at 2 s) would otherwise pay ~0.4 s for the gateway's imports.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from voxgate.contract.config import Config, SubParsers, add_config_arguments, load_from_args

if TYPE_CHECKING:
    from gateway.app import Companion, Gateway
    from synth.worker import Worker


def register(sub: SubParsers) -> None:
    p = sub.add_parser("serve", help="run the gateway with an in-process worker (embedded bus)")
    add_config_arguments(p)
    p.set_defaults(func=cmd_serve)


def attach_worker(gw: Gateway, worker: Worker) -> None:
    """An in-process worker: its metrics go on the gateway's /metrics too."""
    from synth.metrics import WorkerMetrics

    gw.metrics.add_refresher(WorkerMetrics(worker, registry=gw.metrics.registry).refresh)


def embedded_worker(cfg: Config) -> Companion:
    """The companion that ``run_gateway`` starts beside the gateway: a worker on its bus."""

    async def start(gw: Gateway, stop: asyncio.Event) -> asyncio.Task[None]:
        from synth.app import build_engine, build_worker

        engine = await asyncio.to_thread(build_engine, cfg)
        worker = build_worker(cfg, gw.bus, engine)
        attach_worker(gw, worker)
        return asyncio.create_task(worker.run(stop))

    return start


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.app import run_gateway
    from voxgate.contract.logs import setup_logging
    from voxgate.contract.runtime import run

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    cfg.bus.kind = "memory"
    return run(run_gateway(cfg, companion=embedded_worker(cfg)))
