"""``voxgate amd FILE.wav``: classify a recording of a call's start as a person or a machine.

The WAV (any rate, any channel count) is downmixed and resampled to 8 kHz with the project's
resampler (the telephone band: pass to 3.8 kHz), then run through
:func:`gateway.amd.offline.classify` with the default :class:`~gateway.amd.detector.AmdConfig`
(``--set NAME=VALUE`` overrides one setting); ``--words`` adds the jambonz word rule with the
bundled Whisper recogniser, as a live call with a recogniser runs it. Exit status 0 with the
verdict printed, 2 when the file cannot be read (or ``--words`` finds no recogniser).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imports stay lazy so ``voxgate --help`` does not load numpy
    from gateway.amd.detector import AmdConfig
    from gateway.amd.offline import Classification
    from gateway.stt.base import SpeechToText


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("amd", help="answering-machine detection on a recording (offline)")
    p.add_argument("file", metavar="FILE.wav", help="the call's audio from the answer on")
    p.add_argument("--json", action="store_true", help="print the verdict and events as JSON")
    p.add_argument(
        "--words",
        action="store_true",
        help="also the word rule: transcripts by the bundled speech-to-text (voxgate[stt])",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an AmdConfig setting (repeatable)",
    )
    p.set_defaults(func=cmd_amd)


def parse_settings(settings: list[str]) -> AmdConfig:
    """``AmdConfig`` with ``NAME=VALUE`` overrides, each parsed as its field's type."""
    from gateway.amd.detector import AmdConfig

    base = AmdConfig()
    values: dict[str, object] = {}
    for item in settings:
        name, sep, raw = item.partition("=")
        if not sep or not hasattr(base, name) or name == "phrases":
            raise ValueError(
                f"amd: bad setting {item!r} (want NAME=VALUE, NAME an AmdConfig field)"
            )
        values[name] = type(getattr(base, name))(raw)
    return AmdConfig.from_dict(values)


def classify_wav(
    path: str, config: AmdConfig | None = None, stt: SpeechToText | None = None
) -> Classification:
    """Read, downmix, resample to 8 kHz and classify ``path`` (with the word rule when ``stt``
    is given); ``WavError`` if unreadable."""
    import numpy as np

    from dsp.pcm import float_to_s16
    from dsp.resample import resample
    from dsp.wavio import read_wav_mono
    from gateway.amd.offline import RATE, classify

    rate, x = read_wav_mono(path)
    if rate != RATE:
        x = resample(x, rate, RATE, 3800.0, 4000.0)
    return classify(float_to_s16(np.asarray(x, np.float64)), config, stt)


def cmd_amd(args: argparse.Namespace) -> int:
    from dsp.wavio import WavError

    try:
        config = parse_settings(args.set)
    except ValueError as exc:
        print(f"voxgate amd: {exc}", file=sys.stderr)
        return 2
    stt: SpeechToText | None = None
    if args.words:
        from gateway.stt.whisper import SttUnavailable, WhisperStt

        try:
            stt = WhisperStt()
        except SttUnavailable as exc:
            print(f"voxgate amd: --words: {exc}", file=sys.stderr)
            return 2
    try:
        c = classify_wav(args.file, config, stt)
    except WavError as exc:
        print(f"voxgate amd: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.file, **c.to_dict()}, indent=2))
        return 0
    when = f" at {c.decision_ms} ms" if c.decision_ms is not None else ""
    cause = f" ({c.cause})" if c.cause else ""
    words = f", {c.recognitions} recognitions" if stt is not None else ""
    print(f"{args.file}: {c.result}{cause}{when} of {c.duration_ms} ms{words}")
    for e in c.events:
        extra = {k: v for k, v in e.to_dict().items() if k not in ("event", "at_ms")}
        details = " ".join(f"{k}={v}" for k, v in extra.items())
        print(f"  {e.at_ms:>6} ms  {e.name}  {details}".rstrip())
    return 0
