"""``voxgate bench amd``: answering-machine detection accuracy on generated greetings, offline.

Each greeting stands for a call's audio from the answer on, made locally:

- *people*: a short answer ("Hello?", "Yes?", "This is Dana." …) after 0.3–1.0 s of silence,
  then 4 s of silence (the person waits for the caller);
- *machines*: a 3–15 s voicemail greeting after 0.2–0.6 s, then, for two thirds of them, a beep
  (1000, 440 or 850 Hz, 300–1000 ms, −15 dBFS) 0.3–0.8 s after the greeting, then 3 s silence.

Speech is espeak-ng (several voices and rates) and the project's Piper voice (``onnx`` engine),
through the telephone chain to 8 kHz (:func:`dsp.telephone.telephone`), scaled to
``SPEECH_DBFS`` active level (as :func:`voxgate.bench.bargein.caller_sentence` does); every
other greeting gets white background noise at ``NOISE_DBFS`` RMS; then a μ-law round trip
(:mod:`dsp.g711`), as on the call's audio path. Each greeting runs through a fresh
:class:`gateway.amd.detector.AmdDetector` (:func:`gateway.amd.offline.classify`).

Figures: accuracy (people → ``human``; machines → ``machine``; anything else is wrong), the
confusion table, the decision time after the answer p50/p95 for people and for machines, and,
for machines with a beep, how far the voicemail start (``amd.beep`` or ``amd.greeting_ended``)
lies from the beep's true end.

``--words`` runs the same greetings a second time with the jambonz word rule, as a live call
with a recogniser runs it (:class:`gateway.amd.speech.AmdEars` segments, partial and final
transcripts by the bundled Whisper, each reaching the detector once the media time has
advanced by the recogniser's measured compute time; no recognition after the first decision),
and reports both. ``--speech-dbfs``/``--noise-dbfs`` change the line: the word rule matters on
quiet lines, where app_amd's fixed ``silence_threshold`` hears a greeting as silence.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode
from dsp.pcm import float_to_s16
from dsp.telephone import telephone
from gateway.amd.commands import parse_settings
from gateway.amd.detector import AmdConfig
from gateway.amd.offline import Classification, classify
from gateway.stt.base import SpeechToText
from voxgate.bench.util import cpu_model, percentiles

Int16Array = npt.NDArray[np.int16]
Float64Array = npt.NDArray[np.float64]

RATE = 8000
SPEECH_DBFS = -20.0
NOISE_DBFS = -45.0  # under app_amd's silence_threshold (256 mean |x| ≈ −40 dBFS RMS for noise)
BEEP_DBFS = -15.0
PIPER = "piper"

PEOPLE = (
    "Hello?",
    "Yes?",
    "This is Dana.",
    "Hello, who is this?",
    "Hi.",
    "Hello.",
    "Yeah?",
    "Dana speaking.",
    "Hello, hello?",
    "Good morning.",
    "Hi, who's calling?",
    "Speaking.",
)
MACHINES = (
    "Hi, you've reached Dana. Please leave a message after the tone.",
    "Hello, this is Sam. I can't come to the phone right now. Leave a message.",
    "You have reached the voicemail of John Miller. I'm not available right now. Please leave "
    "your name, your number and a short message, and I will call you back as soon as I can.",
    "The person you are calling is not available. At the tone, please record your message. "
    "When you have finished recording, you may hang up or press pound for more options.",
    "Hi, it's Alex. Sorry I missed your call. Leave a message and I'll get back to you.",
    "Thank you for calling Bright Dental. Our office is closed. Our hours are Monday to Friday, "
    "eight to five. Please leave your name and number after the tone.",
)
ESPEAK_VOICES = (("en-us", 165), ("en-us+f3", 150), ("en-us+m3", 180), ("en-gb", 140))
BEEPS_HZ = (1000.0, 440.0, 850.0)


@dataclass(frozen=True, slots=True)
class Greeting:
    """One generated call start; ``truth`` is ``human`` or ``machine``; times in ms."""

    truth: str
    text: str
    voice: str
    noise: bool
    beep_hz: float | None
    beep_end_ms: int | None
    speech_ms: int
    pcm: Int16Array

    def label(self) -> str:
        beep = f", beep {self.beep_hz:g} Hz" if self.beep_hz else ""
        noise = ", noise" if self.noise else ""
        return f"{self.truth}: {self.text[:28]!r} [{self.voice}{noise}{beep}]"


class Voices:
    """espeak-ng and Piper speech as float audio at their own rates (Piper loaded lazily)."""

    def __init__(self, piper: bool) -> None:
        self.piper = piper
        self._engine: Any = None
        self.espeak = shutil.which("espeak-ng")

    def available(self) -> list[str]:
        names = [v for v, _ in ESPEAK_VOICES] if self.espeak else []
        return names + ([PIPER] if self.piper else [])

    def speak(self, text: str, voice: str) -> tuple[Float64Array, int]:
        if voice == PIPER:
            if self._engine is None:
                from synth.engines import load_engine

                self._engine = load_engine("onnx")
            audio = np.asarray(self._engine.synthesize(text), np.float64)
            return audio, int(self._engine.sample_rate)
        if self.espeak is None:
            raise FileNotFoundError("espeak-ng")
        rate = dict(ESPEAK_VOICES)[voice]
        out = subprocess.run(
            [self.espeak, "-v", voice, "-s", str(rate), "--stdout", text],
            capture_output=True,
            check=True,
        ).stdout
        with wave.open(io.BytesIO(out)) as w:
            sr = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        return data.astype(np.float64) / 32768.0, sr


def phone_speech(audio: Float64Array, rate: int, dbfs: float = SPEECH_DBFS) -> Float64Array:
    """Through the telephone chain, trimmed of leading/trailing silence, at ``dbfs`` active
    level."""
    x = np.asarray(telephone(audio, rate), np.float64)
    win = 160
    frames = x[: len(x) // win * win].reshape(-1, win)
    levels = np.sqrt(np.mean(frames**2, axis=1))
    loud = levels > levels.max() * 10 ** (-40 / 20)
    idx = np.nonzero(loud)[0]
    x = x[idx[0] * win : (idx[-1] + 1) * win] if len(idx) else x
    active = frames[levels > levels.max() * 10 ** (-30 / 20)]
    level = float(np.sqrt(np.mean(active**2))) if len(active) else 1.0
    return x * (10 ** (dbfs / 20) / max(level, 1e-9))


def tone(freq: float, ms: int, dbfs: float) -> Float64Array:
    n = RATE * ms // 1000
    t = np.arange(n) / RATE
    ramp = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / 40.0)  # 5 ms ramps
    y: Float64Array = np.sqrt(2) * 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t) * ramp
    return y


def silence(ms: int) -> Float64Array:
    return np.zeros(RATE * ms // 1000)


def make_greetings(
    people: int,
    machines: int,
    seed: int = 1,
    piper: bool = True,
    *,
    speech_dbfs: float = SPEECH_DBFS,
    noise_dbfs: float = NOISE_DBFS,
) -> list[Greeting]:
    """``people`` + ``machines`` greetings, deterministic for a seed (voices cycle)."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    voices = Voices(piper)
    names = voices.available()
    if not names:
        raise RuntimeError("no voice: install espeak-ng or allow Piper")
    out: list[Greeting] = []
    specs = [("human", PEOPLE[i % len(PEOPLE)], i) for i in range(people)] + [
        ("machine", MACHINES[i % len(MACHINES)], i) for i in range(machines)
    ]
    for truth, text, i in specs:
        voice = names[(i + (i // len(names))) % len(names)]
        noise = i % 2 == 1
        speech = phone_speech(*voices.speak(text, voice), speech_dbfs)
        beep_hz: float | None = None
        beep_end: int | None = None
        if truth == "human":
            lead = rng.randint(300, 1000)
            parts = [silence(lead), speech, silence(4000)]
        else:
            lead = rng.randint(200, 600)
            parts = [silence(lead), speech]
            if i % 3 != 2:
                beep_hz = BEEPS_HZ[i % len(BEEPS_HZ)]
                gap, dur = rng.randint(300, 800), rng.randint(300, 1000)
                parts += [silence(gap), tone(beep_hz, dur, BEEP_DBFS)]
                beep_end = sum(len(p) for p in parts) * 1000 // RATE
            parts.append(silence(3000))
        x = np.concatenate(parts)
        if noise:
            x = x + nrng.normal(0.0, 10 ** (noise_dbfs / 20), len(x))
        pcm = ulaw_decode(ulaw_encode(float_to_s16(x)))
        out.append(
            Greeting(truth, text, voice, noise, beep_hz, beep_end, len(speech) * 1000 // RATE, pcm)
        )
    return out


def evaluate(
    greetings: Sequence[Greeting], config: AmdConfig, stt: SpeechToText | None = None
) -> dict[str, Any]:
    """Classify each greeting (with the word rule when ``stt`` is given); accuracy, confusion
    table, decision times, per-greeting rows."""
    results: list[tuple[Greeting, Classification]] = [
        (g, classify(g.pcm, config, stt)) for g in greetings
    ]
    columns = ("human", "machine", "no_speech", "decision_timeout", "undecided")
    confusion = {t: {c: 0 for c in columns} for t in ("human", "machine")}
    times: dict[str, list[float]] = {"human": [], "machine": []}
    beep_err: list[float] = []
    rows = []
    for g, c in results:
        confusion[g.truth][c.result] += 1
        if c.decision_ms is not None:
            times[g.truth].append(float(c.decision_ms))
        if g.beep_end_ms is not None and c.voicemail_from_ms is not None:
            beep_err.append(float(c.voicemail_from_ms - g.beep_end_ms))
        rows.append(
            {
                "truth": g.truth,
                "text": g.text,
                "voice": g.voice,
                "noise": g.noise,
                "beep_hz": g.beep_hz,
                "beep_end_ms": g.beep_end_ms,
                "speech_ms": g.speech_ms,
                "result": c.result,
                "cause": c.cause,
                "decision_ms": c.decision_ms,
                "voicemail_from_ms": c.voicemail_from_ms,
                "recognitions": c.recognitions,
            }
        )
    correct = sum(1 for g, c in results if c.result == g.truth)
    beeps = [(g, c) for g, c in results if g.beep_end_ms is not None]
    beeps_heard = sum(1 for _, c in beeps if any(e.name == "amd.beep" for e in c.events))
    return {
        "n": len(results),
        "correct": correct,
        "accuracy": correct / len(results) if results else float("nan"),
        "confusion": confusion,
        "decision_ms": {k: percentiles(v) for k, v in times.items()},
        "beeps": {"n": len(beeps), "heard": beeps_heard},
        "voicemail_start_minus_beep_end_ms": percentiles(beep_err),
        "words": stt is not None,
        "recognitions": sum(c.recognitions for _, c in results),
        "stt_s": round(sum(c.stt_s for _, c in results), 2),
        "rows": rows,
    }


def conditions(args: argparse.Namespace, config: AmdConfig) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "people": args.people,
        "machines": args.machines,
        "seed": args.seed,
        "voices": Voices(not args.no_piper).available(),
        "speech_dbfs": args.speech_dbfs,
        "noise_dbfs": args.noise_dbfs,
        "beep_dbfs": BEEP_DBFS,
        "path": "telephone chain 8 kHz, mu-law round trip",
        "amd_config": {
            f: getattr(config, f) for f in config.__dataclass_fields__ if f != "phrases"
        },
    }


def format_report(res: dict[str, Any] | list[dict[str, Any]], cond: dict[str, Any]) -> str:
    """Results of :func:`evaluate` (a list: without and with the word rule) as text."""
    runs: list[dict[str, Any]] = res if isinstance(res, list) else [res]
    lines = [line for r in runs for line in (*_format_run(r), "")]
    lines.append(
        "run conditions: " + json.dumps({k: v for k, v in cond.items() if k != "amd_config"})
    )
    lines.append("amd config: " + json.dumps(cond["amd_config"]))
    return "\n".join(lines)


def _format_run(res: dict[str, Any]) -> list[str]:
    how = (
        f"heuristic + beep + word rule ({res['recognitions']} recognitions, "
        f"{res['stt_s']:.1f} s recogniser CPU)"
        if res.get("words")
        else "heuristic + beep"
    )
    lines = [
        f"AMD on {res['n']} generated greetings, {how}: {res['correct']}/{res['n']} correct "
        f"({100 * res['accuracy']:.1f} %, goal >= 95 %)",
        "",
        "confusion (rows: truth; columns: verdict)",
    ]
    cols = list(next(iter(res["confusion"].values())))
    lines.append(f"{'':>10} " + " ".join(f"{c:>16}" for c in cols))
    for truth, row in res["confusion"].items():
        lines.append(f"{truth:>10} " + " ".join(f"{row[c]:>16}" for c in cols))
    lines.append("")
    for k, p in res["decision_ms"].items():
        goal = "  (goal p50 <= 2500 ms)" if k == "human" else ""
        lines.append(
            f"decision after answer, {k:>7}: n={p['n']} p50={p['p50']:.0f} ms "
            f"p95={p['p95']:.0f} ms p99={p['p99']:.0f} ms{goal}"
        )
    b = res["beeps"]
    v = res["voicemail_start_minus_beep_end_ms"]
    lines.append(f"beeps heard: {b['heard']}/{b['n']}")
    lines.append(
        f"voicemail start - true beep end: n={v['n']} p50={v['p50']:.0f} ms p95={v['p95']:.0f} ms"
    )
    wrong = [r for r in res["rows"] if r["result"] != r["truth"]]
    if wrong:
        lines.append("")
        lines.append("misclassified:")
        for r in wrong:
            lines.append(
                f"  {r['truth']:>7} -> {r['result']} ({r['cause']} at {r['decision_ms']} ms): "
                f"{r['text'][:40]!r} [{r['voice']}{', noise' if r['noise'] else ''}]"
            )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="voxgate bench amd", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--people", type=int, default=24, help="greetings by people (default 24)")
    p.add_argument("--machines", type=int, default=24, help="voicemail greetings (default 24)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-piper", action="store_true", help="espeak-ng voices only")
    p.add_argument(
        "--words",
        action="store_true",
        help="also run with the word rule (the bundled Whisper recogniser) and report both",
    )
    p.add_argument(
        "--speech-dbfs",
        type=float,
        default=SPEECH_DBFS,
        help=f"speech active level (default {SPEECH_DBFS:g}; a quiet line: -43)",
    )
    p.add_argument(
        "--noise-dbfs",
        type=float,
        default=NOISE_DBFS,
        help=f"background noise RMS on every other greeting (default {NOISE_DBFS:g})",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an AmdConfig setting (repeatable), e.g. --set maximum_number_of_words=2",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = parse_settings(args.set)
    except ValueError as exc:
        print(f"voxgate bench amd: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    stt: SpeechToText | None = None
    if args.words:
        from gateway.stt.whisper import SttUnavailable, WhisperStt

        try:
            stt = WhisperStt()
        except SttUnavailable as exc:
            print(f"voxgate bench amd: --words: {exc}", file=sys.stderr)
            return 2
    greetings = make_greetings(
        args.people, args.machines, args.seed, piper=not args.no_piper,
        speech_dbfs=args.speech_dbfs, noise_dbfs=args.noise_dbfs,
    )  # fmt: skip
    t1 = time.perf_counter()
    res = evaluate(greetings, config)
    t2 = time.perf_counter()
    cond = conditions(args, config)
    cond["generate_s"] = round(t1 - t0, 2)
    cond["classify_s"] = round(t2 - t1, 2)
    out: dict[str, Any] = {"results": res}
    if stt is not None:
        out["words"] = evaluate(greetings, config, stt)
        cond["stt"] = stt.name
        cond["classify_words_s"] = round(time.perf_counter() - t2, 2)
    if args.json:
        print(json.dumps({**out, "conditions": cond}, indent=2))
    elif "words" in out:
        print(format_report([out["results"], out["words"]], cond))
    else:
        print(format_report(res, cond))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
