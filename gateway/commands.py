"""Subcommands of the gateway side: ``voxgate gateway`` (the gateway alone, workers on Redis)
and ``voxgate transcribe`` (what the gateway's speech-to-text hears in a WAV file).

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
    t = sub.add_parser(
        "transcribe", help="print what the speech-to-text hears in a WAV file (any rate, length)"
    )
    t.add_argument("wav", metavar="FILE.wav", help="mono or stereo WAV (8 or 16 kHz calls, ...)")
    t.add_argument("--json", action="store_true", help="print JSON (text, seconds, compute_s)")
    t.set_defaults(func=cmd_transcribe)


def cmd_transcribe(args: argparse.Namespace) -> int:
    import json
    import sys

    from dsp.wavio import WavError, read_wav_mono
    from gateway.stt.base import to_stt_rate
    from gateway.stt.whisper import SttUnavailable, WhisperStt

    try:
        rate, x = read_wav_mono(args.wav)
        audio = to_stt_rate(x, rate)
        stt = WhisperStt()
    except (WavError, ValueError, SttUnavailable) as exc:
        print(f"voxgate transcribe: {exc}", file=sys.stderr)
        return 2
    result = stt.transcribe(audio)
    if args.json:
        doc = {"text": result.text, "seconds": round(result.seconds, 3),
               "compute_s": round(result.compute_s, 3), "engine": stt.name}  # fmt: skip
        print(json.dumps(doc))
    else:
        print(result.text)
    return 0


def cmd_gateway(args: argparse.Namespace) -> int:
    from gateway.app import run_gateway
    from voxgate.contract.logs import setup_logging
    from voxgate.contract.runtime import run

    cfg = load_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    cfg.bus.kind = "redis"
    cfg.validate()
    return run(run_gateway(cfg))
