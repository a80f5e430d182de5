"""The ``voxgate`` console script: one entry point, subcommands registered by each package.

Each package exposes ``commands.register(sub)`` which adds its subcommands and sets
``func(args) -> int`` on them; ``voxgate serve`` (:mod:`voxgate.serve`) joins a gateway and a
worker; benchmarks come from :mod:`voxgate.bench.commands`. Imports stay lazy inside the handlers
so ``voxgate --help`` is fast and a gateway-only install never imports the engines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from voxgate.contract.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxgate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks: print p50/p95/p99 with the run conditions")
    bench_sub = bench.add_subparsers(dest="bench", metavar="WHAT")
    bench_sub.required = True

    import dsp.commands
    import gateway.amd.commands
    import gateway.campaign.commands
    import gateway.commands
    import synth.commands
    from voxgate import serve
    from voxgate.bench import mock_llm
    from voxgate.bench.commands import register_bench

    serve.register(sub)
    gateway.commands.register(sub)
    dsp.commands.register(sub)
    synth.commands.register(sub)
    register_bench(bench_sub)
    mock_llm.register(sub)
    gateway.amd.commands.register(sub)
    gateway.campaign.commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except ConfigError as exc:
        print(f"voxgate: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
