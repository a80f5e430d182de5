"""Subcommands of the gateway side: ``voxgate gateway`` (the gateway alone, workers on Redis).

``voxgate serve`` (gateway + in-process worker) is :mod:`voxgate.serve`."""

from __future__ import annotations

import argparse

from voxgate.contract.config import (
    GATEWAY_KEYS,
    SubParsers,
    add_config_arguments,
    load_from_args,
)


def register(sub: SubParsers) -> None:
    p = sub.add_parser("gateway", help="run the gateway alone against workers on a Redis bus")
    add_config_arguments(p, GATEWAY_KEYS)
    p.set_defaults(func=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    from gateway.app import run_gateway
    from voxgate.contract.logs import setup_logging
    from voxgate.contract.runtime import run

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    cfg.bus.kind = "redis"
    cfg.validate()
    return run(run_gateway(cfg))
