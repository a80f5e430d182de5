"""Subcommands of the DSP package: ``voxgate dsp telephone`` (``voxgate bench dsp`` is
:mod:`voxgate.bench.commands`)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dsp", help="audio DSP tools (telephone shaping)")
    dsp_sub = p.add_subparsers(dest="dsp_command", metavar="TOOL")
    dsp_sub.required = True

    t = dsp_sub.add_parser(
        "telephone",
        help="run a WAV through the narrowband telephone chain, write an 8 kHz 16-bit mono WAV",
    )
    t.add_argument("input", metavar="IN.wav", help="mono/stereo WAV, 8-32-bit PCM or float")
    t.add_argument("output", metavar="OUT.wav", help="output path (8000 Hz, 16-bit, mono)")
    t.add_argument(
        "--codec",
        choices=("pcmu", "pcma"),
        help="also round-trip through G.711 mu-law (pcmu) or A-law (pcma)",
    )
    t.add_argument(
        "--eq-gain-db", type=float, default=2.0, help="mid-band (1-3 kHz) EQ gain (default 2.0)"
    )
    t.set_defaults(func=cmd_telephone)


def _error(msg: str) -> int:
    print(f"voxgate dsp: {msg}", file=sys.stderr)
    return 2


def cmd_telephone(args: argparse.Namespace) -> int:
    import numpy as np

    from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
    from dsp.pcm import float_to_s16, s16_to_float
    from dsp.telephone import TelephoneChain
    from dsp.wavio import WavError, read_wav_mono, write_wav_s16

    try:
        rate, x = read_wav_mono(args.input)
    except WavError as exc:
        return _error(str(exc))
    try:
        chain = TelephoneChain(rate, eq_gain_db=args.eq_gain_db)
    except ValueError as exc:
        return _error(f"{args.input}: unsupported sample rate {rate} Hz ({exc})")
    # One second at a time: bounded memory for long files, same result as one shot.
    step = max(rate, 1)
    parts = [chain.process(x[i : i + step]) for i in range(0, x.size, step)]
    parts.append(chain.process(np.zeros(0, dtype=np.float32), last=True))
    y = np.concatenate(parts)
    if args.codec:
        encode, decode = (
            (ulaw_encode, ulaw_decode) if args.codec == "pcmu" else (alaw_encode, alaw_decode)
        )
        y = s16_to_float(decode(encode(float_to_s16(y))))
    try:
        write_wav_s16(args.output, chain.out_rate, y)
    except OSError as exc:
        return _error(f"cannot write {args.output}: {exc}")
    print(
        f"{args.output}: {y.size} samples at {chain.out_rate} Hz"
        f" from {x.size} at {rate} Hz" + (f", {args.codec} round trip" if args.codec else "")
    )
    return 0
