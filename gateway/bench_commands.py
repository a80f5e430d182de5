"""``voxgate bench calls``, ``bench bargein`` and ``bench all``: registered on the ``bench``
subparsers by ``register_bench``."""

from __future__ import annotations

import argparse
import sys
from typing import TypeAlias

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register_bench(bench_sub: SubParsers) -> None:
    p = bench_sub.add_parser(
        "calls",
        help="concurrent SIP calls (sipp) against a gateway process: pacing, underruns, CPU, "
        "greeting latency",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--calls", type=int, default=100, help="concurrent calls (default 100)")
    p.add_argument("--rate", type=float, default=20.0, help="calls per second (default 20)")
    p.add_argument(
        "--duration", type=float, default=30.0, help="seconds each call is held (default 30)"
    )
    p.add_argument(
        "--sample-calls", type=int, default=5,
        help="of the calls, how many the Python client places and records (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--latency-calls", type=int, default=20,
        help="sequential calls for the greeting latency with a warm worker (default 20)",
    )  # fmt: skip
    p.add_argument("--idle", type=float, default=5.0, help="idle CPU baseline, s (default 5)")
    p.add_argument(
        "--redis", metavar="URL", default=None,
        help="run voxgate gateway + one voxgate worker over this Redis instead of voxgate serve",
    )  # fmt: skip
    p.add_argument("--concurrency", type=int, default=None, help="worker synth.concurrency")
    p.add_argument("--engine", default="onnx", choices=("onnx", "torch"))
    p.add_argument(
        "--greeting", default=None,
        help="IVR greeting text (e.g. 'Hello.' to measure pacing without synthesis load)",
    )  # fmt: skip
    p.add_argument(
        "--worker-nice", type=int, default=0,
        help="with --redis: run the worker process at this nice level (default 0)",
    )  # fmt: skip
    p.add_argument("--sipp", default="sipp", help="the sipp binary (default: sipp on PATH)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep logs and stats in DIR")
    p.add_argument(
        "--quick", action="store_true",
        help="a short smoke run: 6 calls at 10/s held 6 s, 3 latency calls",
    )  # fmt: skip
    p.set_defaults(func=cmd_bench_calls)

    b = bench_sub.add_parser(
        "bargein",
        help="barge-in over real SIP calls: decision/onset to silence, worker stop, misses, "
        "false barge-ins on echo",
    )
    b.add_argument("--json", action="store_true", help="print JSON instead of a table")
    b.add_argument("--trials", type=int, default=20, help="calls with caller speech (default 20)")
    b.add_argument(
        "--echo-seconds", type=float, default=60.0,
        help="echo-only greeting audio to collect, s (default 60)",
    )  # fmt: skip
    b.add_argument("--seed", type=int, default=1, help="offsets into the greeting (default 1)")
    b.add_argument(
        "--quick", action="store_true", help="a short smoke run: 4 trials, 15 s of echo"
    )  # fmt: skip
    b.set_defaults(func=cmd_bench_bargein)

    w = bench_sub.add_parser(
        "webrtc",
        help="browser legs over real WebRTC on loopback: connect to first audio, concurrent legs",
    )
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w.add_argument(
        "--calls", type=int, default=20, help="sequential calls for connect → first audio (20)"
    )
    w.add_argument(
        "--steps", default=None, metavar="N,N,...",
        help="concurrent legs to hold, in steps (default 5,10,20,30,40)",
    )  # fmt: skip
    w.add_argument("--window", type=float, default=5.0, help="seconds measured per step (5)")
    w.add_argument("--quick", action="store_true", help="a short smoke run: 3 calls, 2 and 4 legs")
    w.set_defaults(func=cmd_bench_webrtc)

    from gateway.config import add_config_arguments

    a = bench_sub.add_parser(
        "all",
        help="every benchmark (synth, calls, bargein, webrtc) plus the telephone chain's "
        "measured response and a spectrogram: DIR/report.md with PNG plots",
    )
    a.add_argument("--report", metavar="DIR", required=True, help="write DIR/report.md + PNGs")
    a.add_argument("--quick", action="store_true", help="every stage short (a smoke run)")
    a.add_argument(
        "--skip", metavar="STAGE", action="append", default=[],
        help="leave stages out (repeat or comma-separate): synth, calls, bargein, webrtc, "
        "response, spectrogram",
    )  # fmt: skip
    a.add_argument("--json", action="store_true", help="also write DIR/report.json (raw results)")
    add_config_arguments(a)
    a.set_defaults(func=cmd_bench_all)


def cmd_bench_calls(args: argparse.Namespace) -> int:
    from gateway.bench_calls import cmd_bench_calls as run

    return run(args)


def cmd_bench_bargein(args: argparse.Namespace) -> int:
    from gateway.bench_bargein import cmd_bench_bargein as run

    return run(args)


def cmd_bench_webrtc(args: argparse.Namespace) -> int:
    from gateway.bench_webrtc import cmd_bench_webrtc as run

    return run(args)


def cmd_bench_all(args: argparse.Namespace) -> int:
    from gateway.bench_report import cmd_bench_all as run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.bench_commands [options]``: the same as ``voxgate bench calls``."""
    parser = argparse.ArgumentParser(prog="voxgate bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    register_bench(sub)
    args = parser.parse_args(["calls", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
