"""Every ``voxgate bench ...`` command (synth, dsp, calls, bargein, webrtc, all), registered on
the ``bench`` subparsers by ``register_bench`` (called by :mod:`voxgate.cli`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable

from voxgate.bench.options import (
    add_agent_arguments,
    add_bargein_arguments,
    add_bridge_arguments,
    add_calls_arguments,
    add_soak_arguments,
    add_webrtc_arguments,
)
from voxgate.contract.config import SYNTH_KEYS, SubParsers, add_config_arguments, load_from_args
from voxgate.contract.logs import setup_logging


def register_bench(bench_sub: SubParsers) -> None:
    p = bench_sub.add_parser(
        "synth", help="TTFA streaming vs baseline, RTF, TTFA under concurrency"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--repeats", type=int, default=3, help="passes over the prompt set (default 3)")
    p.add_argument("--levels", default="1,2,4,8", help="concurrency levels (default 1,2,4,8)")
    p.add_argument("--profile", choices=("narrowband", "wideband"), default="narrowband")
    p.add_argument(
        "--streams", metavar="N,N,...", default="",
        help="instead: N calls talking continuously per level (e.g. 1,2,4,8): TTFA, underruns, "
        "RTF per stream, GPU memory/utilisation; streams sustained in real time",
    )  # fmt: skip
    p.add_argument(
        "--modes",
        default="batched,per-stream",
        help="with --streams: batched and/or per-stream (same run, interleaved)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=12.0,
        help="with --streams: seconds a level (default 12)",
    )
    p.add_argument("--plot", metavar="PNG", help="with --streams: the streams-vs-TTFA curve")
    p.add_argument("--out", metavar="JSON", help="with --streams: also write the JSON here")
    p.add_argument("--precision-check", action="store_true",
                   help="with --streams, torch: fp16/bf16 decoder SNR vs fp32")  # fmt: skip
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="with --streams: start no level that would end past this many seconds "
                   "from the command's start (levels left out are listed)")  # fmt: skip
    add_config_arguments(p, SYNTH_KEYS)
    p.set_defaults(func=cmd_bench_synth)

    p = bench_sub.add_parser("dsp", help="cost of the telephone chain per 20 ms block")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--iterations", type=int, default=5000, help="timed 20 ms blocks (default 5000)")
    p.add_argument("--in-rate", type=int, default=22050, help="engine rate (default 22050)")
    p.set_defaults(func=cmd_bench_dsp)

    p = bench_sub.add_parser(
        "calls",
        help="concurrent SIP calls (sipp) against a gateway process: pacing, underruns, CPU, "
        "greeting latency",
    )
    add_calls_arguments(p)
    p.set_defaults(func=cmd_bench_calls)

    b = bench_sub.add_parser(
        "bargein",
        help="barge-in over real SIP calls: decision/onset to silence, worker stop, misses, "
        "false barge-ins on echo",
    )
    add_bargein_arguments(b)
    b.set_defaults(func=cmd_bench_bargein)

    w = bench_sub.add_parser(
        "webrtc",
        help="browser legs over real WebRTC on loopback: connect to first audio, concurrent legs",
    )
    add_webrtc_arguments(w)
    w.set_defaults(func=cmd_bench_webrtc)

    ag = bench_sub.add_parser(
        "agent",
        help="the llm agent over real SIP calls: voice-to-voice latency as the caller hears it, "
        "where it goes, CPU per conversation, how many fit; pipecat side by side",
    )
    add_agent_arguments(ag)
    add_config_arguments(ag, ("turn", "llm.greeting", "llm.system_prompt"))
    ag.set_defaults(func=cmd_bench_agent)

    br = bench_sub.add_parser(
        "bridge",
        help="the pipecat bridge (stream agent): added latency both ways, clear → silence, "
        "bot-driven barge-in against pipecat's own Twilio path, echo, capacity",
    )
    add_bridge_arguments(br)
    br.set_defaults(func=cmd_bench_bridge)

    so = bench_sub.add_parser(
        "soak",
        help="calls renewed for many minutes against gateway + worker processes over Redis: "
        "RSS, fds, tasks, Redis keys per minute; flat after warm-up, nothing left behind",
    )
    add_soak_arguments(so)
    so.set_defaults(func=cmd_bench_soak)

    # Call-center numbers: each module parses its own options (--help there).
    for name, doc in (
        ("flow", "call flows over real SIP: key → next prompt's first audio, webhook round trip"),
        ("transfer", "blind transfer against sipp: REFER → call ended"),
        ("recording", "call recording's CPU per call (media side and writer), 8 and 48 kHz"),
        ("amd", "answering-machine detection on generated greetings: accuracy, decision time"),
        ("campaign", "an outbound campaign against a sipp UAS: dials/s, pacing, peak calls, CPU"),
        ("front", "the Kamailio front before gateways: spread, failover when one stops, cores"),
        (
            "fuzz",
            "coverage-guided fuzzing (atheris) of every parser of outside bytes: --target, "
            "--runs; inputs, exec/s, coverage, crashes",
        ),
    ):
        # Its own options pass through untouched ("+" is no option prefix of ours).
        cc = bench_sub.add_parser(name, help=doc, add_help=False, prefix_chars="+")
        cc.add_argument("args", nargs=argparse.REMAINDER, help=f"see voxgate.bench.{name}")
        cc.set_defaults(func=_module_bench(name))

    a = bench_sub.add_parser(
        "all",
        help="every benchmark (synth, calls, bargein, webrtc, agent) plus the telephone chain's "
        "measured response and a spectrogram: DIR/report.md with PNG plots",
    )
    a.add_argument("--report", metavar="DIR", required=True, help="write DIR/report.md + PNGs")
    a.add_argument("--quick", action="store_true", help="every stage short (a smoke run)")
    a.add_argument(
        "--skip", metavar="STAGE", action="append", default=[],
        help="leave stages out (repeat or comma-separate): synth, calls, bargein, webrtc, agent, "
        "response, spectrogram",
    )  # fmt: skip
    a.add_argument("--json", action="store_true", help="also write DIR/report.json (raw results)")
    add_config_arguments(a)
    a.set_defaults(func=cmd_bench_all)


def cmd_bench_calls(args: argparse.Namespace) -> int:
    from voxgate.bench.calls import cmd_bench_calls as run

    return run(args)


def cmd_bench_bargein(args: argparse.Namespace) -> int:
    from voxgate.bench.bargein import cmd_bench_bargein as run

    return run(args)


def cmd_bench_webrtc(args: argparse.Namespace) -> int:
    from voxgate.bench.webrtc import cmd_bench_webrtc as run

    return run(args)


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from voxgate.bench.soak import cmd_bench_soak as run

    return run(args)


def cmd_bench_agent(args: argparse.Namespace) -> int:
    from voxgate.bench.agent import cmd_bench_agent as run

    return run(args)


def _module_bench(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        module = importlib.import_module(f"voxgate.bench.{name}")
        return int(module.main(list(args.args)))

    return run


def cmd_bench_bridge(args: argparse.Namespace) -> int:
    from voxgate.bench.bridge import cmd_bench_bridge as run

    return run(args)


def cmd_bench_all(args: argparse.Namespace) -> int:
    from voxgate.bench.report import cmd_bench_all as run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """``python -m voxgate.bench.commands [options]``: the same as ``voxgate bench calls``."""
    parser = argparse.ArgumentParser(prog="voxgate bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    register_bench(sub)
    args = parser.parse_args(["calls", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def cmd_bench_synth(args: argparse.Namespace) -> int:
    import asyncio

    from synth.app import build_engine
    from voxgate.bench.synth import bench_synth, format_report, main_json

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    if args.streams:
        from voxgate.bench import synth_streams

        streams = synth_streams.run_command(cfg, args)
        print(main_json(streams) if args.json else synth_streams.format_report(streams))
        return 0
    levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    engine = build_engine(cfg)
    result = asyncio.run(
        bench_synth(engine, repeats=args.repeats, levels=levels, profile=args.profile)
    )
    print(main_json(result) if args.json else format_report(result))
    return 0


def cmd_bench_dsp(args: argparse.Namespace) -> int:
    from voxgate.bench import dsp as bench

    try:
        report = bench.run(iterations=args.iterations, in_rate=args.in_rate)
    except ValueError as exc:
        print(f"voxgate bench dsp: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(bench.format_report(report))
    return 0
