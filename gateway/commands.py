"""Subcommands of the gateway side: serve (gateway + in-process worker) and gateway."""

from __future__ import annotations

import argparse
from typing import TypeAlias

from gateway.config import add_config_arguments, load_from_args

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register(sub: SubParsers, bench_sub: SubParsers) -> None:
    from gateway.bench_commands import register_bench

    register_bench(bench_sub)
    p = sub.add_parser("serve", help="run the gateway with an in-process worker (embedded bus)")
    add_config_arguments(p)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("gateway", help="run the gateway alone against workers on a Redis bus")
    add_config_arguments(p)
    p.set_defaults(func=cmd_gateway)


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.app import run_gateway
    from synth.app import run
    from synth.logs import setup_logging

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    cfg.bus.kind = "memory"
    return run(run_gateway(cfg, embedded_worker=True))


def cmd_gateway(args: argparse.Namespace) -> int:
    from gateway.app import run_gateway
    from synth.app import run
    from synth.logs import setup_logging

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    cfg.bus.kind = "redis"
    cfg.validate()
    return run(run_gateway(cfg, embedded_worker=False))
