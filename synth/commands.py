"""Subcommands of the synthesis side: normalize, synth, worker (``bench synth`` is
:mod:`voxgate.bench.commands`)."""

from __future__ import annotations

import argparse
import sys
import wave

from voxgate.contract.config import (
    SYNTH_KEYS,
    WORKER_KEYS,
    Config,
    SubParsers,
    add_config_arguments,
    load_from_args,
)


def register(sub: SubParsers) -> None:
    from synth.text.cli import register as register_text

    register_text(sub)

    p = sub.add_parser(
        "synth", help="synthesize TEXT to a WAV file through the worker's render path"
    )
    p.add_argument("text", help="text to speak ('-' reads stdin)")
    p.add_argument("-o", "--output", required=True, help="output WAV path")
    p.add_argument("--profile", choices=("narrowband", "wideband"), default="narrowband")
    p.add_argument("--raw", action="store_true", help="skip the text normalizer")
    add_config_arguments(p, SYNTH_KEYS)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("worker", help="run a synthesis worker against a shared Redis bus")
    add_config_arguments(p, WORKER_KEYS)
    p.set_defaults(func=cmd_worker)


def _setup(args: argparse.Namespace) -> Config:
    from voxgate.contract.logs import setup_logging

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
    from synth.app import run_worker
    from voxgate.contract.runtime import run

    cfg = _setup(args)
    cfg.bus.kind = "redis"
    cfg.validate()
    return run(run_worker(cfg))
