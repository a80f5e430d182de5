"""Subcommands of the synthesis side: normalize, synth, worker, serve, bench synth."""

from __future__ import annotations

import argparse
import sys
import wave
from typing import TypeAlias

from gateway.config import Config, add_config_arguments, load_from_args

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register(sub: SubParsers, bench_sub: SubParsers) -> None:
    from synth.text.cli import register as register_text

    register_text(sub)

    p = sub.add_parser(
        "synth", help="synthesize TEXT to a WAV file through the worker's render path"
    )
    p.add_argument("text", help="text to speak ('-' reads stdin)")
    p.add_argument("-o", "--output", required=True, help="output WAV path")
    p.add_argument("--profile", choices=("narrowband", "wideband"), default="narrowband")
    p.add_argument("--raw", action="store_true", help="skip the text normalizer")
    add_config_arguments(p)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("worker", help="run a synthesis worker against a shared Redis bus")
    add_config_arguments(p)
    p.set_defaults(func=cmd_worker)

    p = bench_sub.add_parser(
        "synth", help="TTFA streaming vs baseline, RTF, TTFA under concurrency"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--repeats", type=int, default=3, help="passes over the prompt set (default 3)")
    p.add_argument("--levels", default="1,2,4,8", help="concurrency levels (default 1,2,4,8)")
    p.add_argument("--profile", choices=("narrowband", "wideband"), default="narrowband")
    add_config_arguments(p)
    p.set_defaults(func=cmd_bench_synth)


def _setup(args: argparse.Namespace) -> Config:
    from synth.logs import setup_logging

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    return cfg


def cmd_synth(args: argparse.Namespace) -> int:
    from synth.app import build_engine
    from synth.render import Renderer, RenderError, prepare_text

    cfg = _setup(args)
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        pieces = prepare_text(text, raw=args.raw, max_chars=cfg.synth.max_text_chars)
    except RenderError as exc:
        print(f"voxgate synth: {exc}", file=sys.stderr)
        return 2
    engine = build_engine(cfg)
    r = Renderer(
        engine,
        pieces,
        args.profile,
        eq_gain_db=cfg.synth.eq_gain_db,
        wideband_rate=cfg.synth.wideband_rate,
    )
    parts = []
    while (out := r.step()) is not None:
        parts.append(out.data)
    with wave.open(args.output, "wb") as wf:
        wf.setnchannels(1)
        wf.setsampwidth(2)
        wf.setframerate(r.rate)
        wf.writeframes(b"".join(parts))
    print(f"wrote {args.output}: {r.samples / r.rate:.2f} s at {r.rate} Hz ({args.profile})")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from synth.app import run, run_worker

    cfg = _setup(args)
    cfg.bus.kind = "redis"
    cfg.validate()
    return run(run_worker(cfg))


def cmd_bench_synth(args: argparse.Namespace) -> int:
    import asyncio

    from synth.app import build_engine
    from synth.bench import bench_synth, format_report, main_json

    cfg = _setup(args)
    levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    engine = build_engine(cfg)
    result = asyncio.run(
        bench_synth(engine, repeats=args.repeats, levels=levels, profile=args.profile)
    )
    print(main_json(result) if args.json else format_report(result))
    return 0
