"""``voxgate bench all --report DIR``: every benchmark in one run, a Markdown report with plots.

Stages, in this order (``--skip`` leaves any out):

- ``synth``: :func:`voxgate.bench.synth.bench_synth` (TTFA streaming vs whole-piece baseline, RTF);
- ``calls``: :func:`voxgate.bench.calls.run_bench` at several call counts (10/25/50/100; the
  largest is the full ``voxgate bench calls`` run and gives the pacing figures), for the
  calls-vs-CPU curve;
- ``bargein``: :func:`voxgate.bench.bargein.run_bench`;
- ``webrtc``: :func:`voxgate.bench.webrtc.run_bench`;
- ``agent``: :func:`voxgate.bench.agent.run_agent_bench` (the llm agent's voice-to-voice latency
  at the caller, its breakdown, CPU per conversation; pipecat's stock agent beside it);
- ``response``: the telephone chain's frequency response, *measured*: stepped sines and white
  noise through :func:`dsp.telephone.telephone` at the engine's rate, levels read with
  :mod:`dsp.meter`; plus the aliasing of inputs above 4 kHz;
- ``spectrogram``: one prompt rendered by the worker's render path (:class:`synth.render.Renderer`,
  narrowband), the engine's raw chunks tapped on the way in, before/after spectrograms.

Every benchmark is called in-process with the options its own ``voxgate bench X`` command would
build (its parser, its ``options_from_args``), except that ``bench calls`` starts the gateway
as a child process itself. A stage that raises is reported with its error and the others still
run; the exit status is 1 if any stage failed. ``--quick`` makes every stage short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shlex
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from voxgate.bench.util import cpu_model, fmt, json_default, percentiles, strict_json

STAGES = ("synth", "calls", "bargein", "webrtc", "agent", "response", "spectrogram")
TITLES = {
    "synth": "Synthesis: time to first audio",
    "calls": "Concurrent calls: pacing and CPU",
    "bargein": "Barge-in latency",
    "webrtc": "WebRTC: connect to first audio",
    "agent": "LLM agent: voice to voice",
    "response": "Telephone chain: frequency response",
    "spectrogram": "Before/after spectrogram of a prompt",
}
# Rough stage durations (s) on a 2-core box, quick / full: only for the progress bar's estimate.
EXPECTED_S = {
    "synth": (40.0, 150.0),
    "calls": (45.0, 260.0),
    "bargein": (60.0, 200.0),
    "webrtc": (40.0, 180.0),
    "agent": (70.0, 480.0),
    "response": (3.0, 3.0),
    "spectrogram": (8.0, 8.0),
}
CALL_COUNTS = {True: (3, 6), False: (10, 25, 50, 100)}
SPECTROGRAM_PROMPT = 0  # index into voxgate.bench.synth.PROMPTS
RESPONSE_LEVEL_DBFS = -20.0  # stepped sines: well under the limiter's ceiling even with the EQ
NOISE_LEVEL_DBFS = -30.0  # white noise RMS: peaks stay under the ceiling too
CUTOFF_HZ = 3800.0
EQ_BAND_HZ = (1000.0, 3000.0)


class StageFailed(Exception):
    """A stage failed after producing part of its result (kept in the report)."""

    def __init__(self, message: str, partial: dict[str, Any]) -> None:
        super().__init__(message)
        self.partial = partial


# --- progress ------------------------------------------------------------------------------------
def _clock(s: float) -> str:
    m, sec = divmod(int(s), 60)
    return f"{m}:{sec:02d}"


class StageProgress:
    """One stage's bar: ``step(label)`` marks the start of each of ``steps`` sub-steps; between
    steps the bar creeps on the expected duration (never past the next step)."""

    def __init__(self, owner: Progress, index: int, name: str, steps: int, expected_s: float):
        self.owner, self.index, self.name = owner, index, name
        self.steps = max(steps, 1)
        self.expected_step_s = max(expected_s, 1.0) / self.steps
        self.t0 = time.monotonic()
        self.t_step = self.t0
        self.done_steps = -1
        self.label = ""

    def step(self, label: str) -> None:
        self.done_steps += 1
        self.t_step = time.monotonic()
        self.label = label
        self.owner.line(self, event=True)

    def fraction(self) -> float:
        done = max(self.done_steps, 0)
        within = min((time.monotonic() - self.t_step) / self.expected_step_s, 0.95)
        return min((done + within) / self.steps, 0.99)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


class Progress:
    """Progress on stderr: a redrawn bar with elapsed time on a terminal, plain lines otherwise."""

    WIDTH = 24

    def __init__(self, total: int, stream: TextIO | None = None, tty: bool | None = None):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._lock = threading.Lock()
        self._current: StageProgress | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def line(self, sp: StageProgress, event: bool = False) -> None:
        head = f"[{sp.index}/{self.total}] {sp.name}"
        if self.tty:
            f = sp.fraction()
            n = round(f * self.WIDTH)
            bar = "#" * n + "-" * (self.WIDTH - n)
            label = f"  {sp.label}" if sp.label else ""
            self._write(
                f"\r\x1b[K{head:<20} [{bar}] {f * 100:3.0f}%  {_clock(sp.elapsed())}{label}"
            )
        elif event:
            self._write(f"{head}: {sp.label} ({_clock(sp.elapsed())})\n")

    def _ticker(self) -> None:
        while not self._stop.wait(0.5):
            sp = self._current
            if sp is not None:
                self.line(sp)

    @contextlib.contextmanager
    def stage(
        self, index: int, name: str, steps: int = 1, expected_s: float = 60.0
    ) -> Iterator[StageProgress]:
        sp = StageProgress(self, index, name, steps, expected_s)
        if not self.tty:
            self._write(f"[{index}/{self.total}] {name}: started\n")
        self._current = sp
        if self.tty and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._ticker, name="progress", daemon=True)
            self._thread.start()
        try:
            yield sp
        finally:
            self._current = None

    def finish(self, index: int, name: str, status: str, seconds: float) -> None:
        head = f"[{index}/{self.total}] {name}"
        if self.tty:
            self._write(f"\r\x1b[K{head:<20} {status} in {_clock(seconds)}\n")
        else:
            self._write(f"{head}: {status} in {seconds:.1f} s\n")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


# --- run context and results ---------------------------------------------------------------------
@dataclass
class Context:
    """What the stages share: the mode, the configuration, one engine, arrays for the plots."""

    quick: bool
    cfg: Any  # voxgate.contract.config.Config
    out_dir: Path
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    _engine: Any = None

    def engine(self) -> Any:
        if self._engine is None:
            from synth.app import build_engine

            self._engine = build_engine(self.cfg)
        return self._engine

    @property
    def engine_name(self) -> str:
        return str(self.cfg.synth.engine)


@dataclass
class StageResult:
    name: str
    status: str = "skipped"  # ok | failed | skipped
    seconds: float = 0.0
    result: dict[str, Any] | None = None
    error: str | None = None
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    notes: list[str] = field(default_factory=list)


Runner = Callable[[Context, StageProgress], dict[str, Any]]


def _cli_args(argv: list[str]) -> argparse.Namespace:
    """``voxgate bench NAME ARGS...`` parsed with that command's own options (the defaults a
    user gets)."""
    from voxgate.bench import options

    _, name, *rest = argv
    parser = argparse.ArgumentParser(prog=f"voxgate bench {name}")
    getattr(options, f"add_{name}_arguments")(parser)
    return parser.parse_args(rest)


def _host_conditions(quick: bool) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "quick": quick,
    }


# --- stages --------------------------------------------------------------------------------------
def run_synth(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from voxgate.bench.synth import bench_synth

    prog.step("loading the engine")
    engine = ctx.engine()
    load0 = os.getloadavg()[0]  # bench_synth reads the load when it ends, not when it starts
    repeats, levels = (1, (1, 2)) if ctx.quick else (3, (1, 2, 4, 8))
    prog.step(f"{repeats} pass(es), concurrency {','.join(map(str, levels))}")
    r = asyncio.run(bench_synth(engine, repeats=repeats, levels=levels, profile="narrowband"))
    r["conditions"]["quick"] = ctx.quick
    r["conditions"]["loadavg_1m_at_start"] = load0
    r["conditions"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    return r


def run_calls(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from voxgate.bench.calls import options_from_args, run_bench

    counts = CALL_COUNTS[ctx.quick]
    runs: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for n in counts:
        prog.step(f"{n} calls")
        argv = ["bench", "calls", "--calls", str(n), "--engine", ctx.engine_name]
        if ctx.quick:
            argv.append("--quick")
        elif n != max(counts):
            argv += ["--latency-calls", "3"]  # the curve's smaller runs: CPU, not greeting
        args = _cli_args(argv)
        try:
            runs[str(n)] = run_bench(options_from_args(args))
        except Exception as exc:
            errors.append(f"{n} calls: {_error_text(exc)}")
    ok = [n for n in counts if str(n) in runs]
    result: dict[str, Any] = {
        "counts": list(counts),
        "main": str(max(ok)) if ok else None,
        "runs": runs,
        "curve": [_curve_point(n, runs.get(str(n))) for n in counts],
        "errors": errors,
    }
    if ok:
        main = runs[str(max(ok))]
        result["conditions"] = dict(main["conditions"])
        result["met"] = main.get("met", main.get("pass", {}))
        result["targets"] = main.get("targets", {})
        result["samples"] = main.get("samples", {})
    if errors:
        raise StageFailed("; ".join(errors), result)
    return result


def _curve_point(n: int, r: dict[str, Any] | None) -> dict[str, Any]:
    if r is None:
        return {"calls": n, "error": True}
    cpu = r["cpu"]
    return {
        "calls": n,
        "held_min": r["calls"]["held_during_plateau"]["min"],
        "idle_pct": cpu["idle"].get("process_pct"),
        "process_pct": cpu["plateau"].get("process_pct"),
        "event_loop_pct": cpu["plateau"].get("event_loop_thread_pct"),
        "per_call_pct": cpu.get("per_call_pct_core"),
        "per_call_event_loop_pct": cpu.get("per_call_event_loop_pct_core"),
        "system_busy_pct": cpu.get("system_busy_pct_all_cores"),
        "ticker_p99_ms": r["pacing"]["ticker_send_error_ms"].get("p99"),
        "met_cpu_per_call": r.get("pass", {}).get("cpu_per_call"),
    }


def run_bargein(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from voxgate.bench.bargein import options_from_args, run_bench

    args = _cli_args(["bench", "bargein", *(["--quick"] if ctx.quick else [])])
    opts = options_from_args(args)
    opts.engine = ctx.engine_name
    prog.step(f"{opts.trials} trials, {opts.echo_seconds:g} s of echo")
    r = strict_json(run_bench(opts))
    assert isinstance(r, dict)
    return r


def run_webrtc(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from voxgate.bench.webrtc import options_from_args, run_bench

    args = _cli_args(["bench", "webrtc", *(["--quick"] if ctx.quick else [])])
    prog.step("running")
    r = strict_json(run_bench(options_from_args(args)))
    assert isinstance(r, dict)
    return r


def run_agent(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from voxgate.bench.agent import run_agent_bench

    quick = ctx.quick
    prog.step("3 trials, 1 conversation" if quick else "20 trials at 1, 2, 4 conversations")
    r = strict_json(
        run_agent_bench(trials=3 if quick else 20, concurrency=(1,) if quick else (1, 2, 4),
                        pipecat=False if quick else None)
    )  # fmt: skip
    assert isinstance(r, dict)
    return r


def _sine_gain_db(
    f: float, in_rate: int, eq_gain_db: float, seconds: float = 0.5, edge_s: float = 0.05
) -> float:
    """Output level minus input level (dB, RMS via :mod:`dsp.meter`) of a sine at ``f``
    through the telephone chain, edges (filter and EQ settling) left out."""
    from dsp.meter import dbfs_rms
    from dsp.telephone import OUT_RATE, telephone

    amp = 10 ** (RESPONSE_LEVEL_DBFS / 20) * math.sqrt(2)
    t = np.arange(round(seconds * in_rate)) / in_rate
    x = amp * np.sin(2 * np.pi * f * t)
    y = telephone(x, in_rate, eq_gain_db)
    e_in, e_out = round(edge_s * in_rate), round(edge_s * OUT_RATE)
    return dbfs_rms(y[e_out:-e_out]) - dbfs_rms(x[e_in:-e_in])


def measure_response(in_rate: int, eq_gain_db: float = 2.0) -> dict[str, Any]:
    """The chain's magnitude response, measured: stepped sines (0.5 s each) for 50–3990 Hz,
    white noise (Welch PSD out / in), and the level of sines above 4 kHz after the chain
    (aliasing: what folds back into the band)."""
    import scipy.signal

    from dsp.telephone import OUT_RATE, telephone

    freqs = [*np.arange(50.0, 3700.0, 50.0), *np.arange(3700.0, 3995.0, 10.0)]
    gains = [_sine_gain_db(float(f), in_rate, eq_gain_db) for f in freqs]
    # White noise: |H|^2 = PSD_out / PSD_in (both one-sided densities, per Hz).
    rng = np.random.default_rng(7)
    x = rng.standard_normal(in_rate * 20) * 10 ** (NOISE_LEVEL_DBFS / 20)
    y = telephone(x, in_rate, eq_gain_db).astype(np.float64)
    nper = 1024
    f_in, p_in = scipy.signal.welch(x, fs=in_rate, nperseg=round(nper * in_rate / OUT_RATE))
    f_out, p_out = scipy.signal.welch(y, fs=OUT_RATE, nperseg=nper)
    p_in_at = np.interp(f_out, f_in, p_in)
    keep = f_out < OUT_RATE / 2
    noise_db = 10 * np.log10(np.maximum(p_out[keep], 1e-30) / p_in_at[keep])
    alias_f = [float(f) for f in np.arange(4025.0, min(in_rate / 2, 11000.0), 25.0)]
    alias_db = [_sine_gain_db(f, in_rate, eq_gain_db, seconds=0.3) for f in alias_f]
    worst = int(np.argmax(alias_db)) if alias_db else -1

    def at(hz: float) -> float:
        return float(np.interp(hz, freqs, gains))

    def first_below(db: float) -> float | None:
        ref = at(1000.0)
        for f, g in zip(freqs, gains, strict=True):
            if f > 1000.0 and g <= ref + db:
                return float(f)
        return None

    points = {
        str(int(h)): at(h)
        for h in (300, 600, 1000, 1500, 2000, 2800, 3000, 3400, 3800, 3850, 3900, 3950, 3990)
    }
    band = [g for f, g in zip(freqs, gains, strict=True) if 1200 <= f <= 2800]
    low = [g for f, g in zip(freqs, gains, strict=True) if 300 <= f <= 600]
    result: dict[str, Any] = {
        "conditions": {
            **_host_conditions(False),
            "engine_rate": in_rate,
            "eq_gain_db": eq_gain_db,
            "method": "stepped sines at -20 dBFS, 0.5 s each (50 ms edges left out), RMS via "
            "dsp.meter; white noise at -30 dBFS, 20 s, Welch PSD ratio; through "
            "dsp.telephone.telephone (resampler + EQ + limiter)",
        },
        "freqs_hz": freqs,
        "gain_db": gains,
        "noise": {"freqs_hz": f_out[keep].tolist(), "gain_db": noise_db.tolist()},
        "points_db": points,
        "re_1khz_db": {k: v - points["1000"] for k, v in points.items()},
        "minus_3db_hz": first_below(-3.0),
        "minus_20db_hz": first_below(-20.0),
        "minus_60db_hz": first_below(-60.0),
        "alias": {
            "freqs_hz": alias_f,
            "gain_db": alias_db,
            "worst_db": alias_db[worst] if alias_db else None,
            "worst_at_hz": alias_f[worst] if alias_db else None,
        },
        "eq_band_1200_2800_db": {"min": min(band), "max": max(band)},
        "band_300_600_db": {"min": min(low), "max": max(low)},
    }
    # The chain's own documented specs (dsp/eq.py for the default +2 dB, dsp/resample.py,
    # dsp/telephone.py): judged on the measurement.
    spec = eq_gain_db == 2.0
    result["targets"] = {
        "band_300_600_db": "within ±0.3 dB (dsp/eq.py)",
        # The EQ alone is fitted to +1.7…+2.2 dB (dsp/eq.py); the whole chain adds the
        # resampler's passband ripple, so it is held to +2 dB ± 0.3.
        "eq_1200_2800_db": "+1.7…+2.3 dB (whole chain: +2 dB ± 0.3)",
        "at_3800_db": "~0 dB: within ±0.5 dB (dsp/eq.py, passband to 3.8 kHz)",
        "alias_db": "inputs above 4 kHz ≥ 80 dB down (dsp/telephone.py)",
    }
    result["met"] = {
        "band_300_600": (max(abs(g) for g in low) <= 0.3) if spec else None,
        "eq_1200_2800": (min(band) >= 1.7 and max(band) <= 2.3) if spec else None,
        "at_3800": abs(points["3800"]) <= 0.5,
        "alias": bool(alias_db) and max(alias_db) <= -80.0,
    }
    return result


def run_response(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    prog.step("engine rate")
    notes: list[str] = []
    try:
        in_rate = int(ctx.engine().sample_rate)
    except Exception as exc:  # the response does not need the engine, only its rate
        in_rate = 22050
        notes.append(f"engine not loaded ({exc}); assumed 22050 Hz")
    prog.step(f"sines and noise at {in_rate} Hz")
    r = measure_response(in_rate, float(ctx.cfg.synth.eq_gain_db))
    r["conditions"]["quick"] = ctx.quick
    r["notes"] = notes
    return r


class _TapEngine:
    """Wraps an engine: the raw chunks ``Renderer`` pulls from ``stream`` are kept."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.name, self.sample_rate, self.voice = engine.name, engine.sample_rate, engine.voice
        self.raw: list[npt.NDArray[np.float32]] = []

    def warmup(self) -> None:
        self._engine.warmup()

    def stream(self, text: str, should_stop: Any = None, *, urgent: bool = True) -> Iterator[Any]:
        for chunk in self._engine.stream(text, should_stop, urgent=urgent):
            self.raw.append(np.asarray(chunk.audio, np.float32))
            yield chunk

    def synthesize(self, text: str) -> Any:
        return self._engine.synthesize(text)


def _frame_levels(x: npt.NDArray[Any], rate: int) -> dict[str, float]:
    from dsp.meter import dbfs_rms

    n = rate // 50
    levels = [dbfs_rms(x[i : i + n]) for i in range(0, len(x) - n + 1, n)]
    return percentiles([v for v in levels if v > -100.0])  # speech frames, not digital silence


def _band_share_db(x: npt.NDArray[Any], rate: int, above_hz: float) -> float:
    spec = np.abs(np.fft.rfft(np.asarray(x, np.float64))) ** 2
    f = np.fft.rfftfreq(len(x), 1 / rate)
    return float(10 * np.log10(max(spec[f > above_hz].sum(), 1e-30) / max(spec.sum(), 1e-30)))


def run_spectrogram(ctx: Context, prog: StageProgress) -> dict[str, Any]:
    from dsp.meter import dbfs_peak, dbfs_rms
    from synth.render import Renderer, prepare_text
    from voxgate.bench.synth import PROMPTS

    prog.step("loading the engine")
    tap = _TapEngine(ctx.engine())
    prompt = PROMPTS[SPECTROGRAM_PROMPT]
    prog.step("rendering")
    pieces = prepare_text(prompt, raw=False, max_chars=ctx.cfg.synth.max_text_chars)
    r = Renderer(tap, pieces, "narrowband", eq_gain_db=ctx.cfg.synth.eq_gain_db)  # type: ignore[arg-type]
    parts = []
    while (out := r.step()) is not None:
        parts.append(out.data)
    after = np.frombuffer(b"".join(parts), "<i2").astype(np.float64) / 32768.0
    before = np.concatenate(tap.raw).astype(np.float64) if tap.raw else np.zeros(0)
    ctx.arrays["spectrogram"] = {"before": before, "after": after}

    def describe(x: npt.NDArray[Any], rate: int) -> dict[str, Any]:
        return {
            "rate": rate,
            "seconds": len(x) / rate,
            "rms_dbfs": dbfs_rms(x),
            "peak_dbfs": dbfs_peak(x),
            "frame_20ms_dbfs": _frame_levels(x, rate),
            "energy_above_3800_hz_db": _band_share_db(x, rate, 3800.0),
        }

    return {
        "conditions": {**_host_conditions(ctx.quick), "engine": tap.name, "voice": tap.voice},
        "prompt": prompt,
        "pieces": pieces,
        "before": describe(before, tap.sample_rate),
        "after": describe(after, r.rate),
    }


RUNNERS: dict[str, Runner] = {
    "synth": run_synth,
    "calls": run_calls,
    "bargein": run_bargein,
    "webrtc": run_webrtc,
    "agent": run_agent,
    "response": run_response,
    "spectrogram": run_spectrogram,
}


# --- plots ----------------------------------------------------------------------------------------
def _samples(r: dict[str, Any], key: str) -> list[float]:
    s = r.get("samples")
    vals = s.get(key) if isinstance(s, dict) else None
    return [float(v) for v in vals if v is not None] if isinstance(vals, list) else []


def plot_stage(sr: StageResult, ctx: Context) -> None:
    from voxgate.bench import plots as rp

    r = sr.result
    if r is None:
        return
    d = ctx.out_dir
    series: dict[str, list[float]] = {}
    if sr.name == "synth":
        fb = {
            "streaming": r.get("ttfa_streaming_ms", {}),
            "whole-piece baseline": r.get("ttfa_baseline_ms", {}),
        }
        series = {
            "streaming": _samples(r, "ttfa_stream_ms"),
            "whole-piece baseline": _samples(r, "ttfa_baseline_ms"),
        }
        if not any(series.values()):
            sr.notes.append("bench synth gave no raw samples: the CDF shows p50/p95/p99 only")
        t = r.get("targets", {}).get("ttfa_p95_1_ms")
        rp.cdf(
            d / "ttfa_cdf.png",
            "Time to first audio, one request at a time",
            "TTFA, ms (request read → first chunk published)",
            series,
            fb,
            {f"p95 target {t:g} ms": t} if t else None,
        )
        sr.figures.append(("ttfa_cdf.png", "TTFA CDF: streaming vs whole-piece baseline"))
    elif sr.name == "calls":
        main = r["runs"].get(r.get("main") or "", None)
        if main is not None:
            tk = main["pacing"]["ticker_send_error_ms"]
            if "counts" not in tk:
                sr.notes.append("no ticker histogram in bench calls' JSON")
            jitter = _samples(main, "pacing_error_ms")
            rp.pacing_histogram(
                d / "pacing_hist.png",
                tk.get("counts", []),
                float(tk.get("bin_ms") or 0.1),
                jitter,
                main.get("targets", {}).get("ticker_p99_ms"),
            )
            sr.figures.append(
                (
                    "pacing_hist.png",
                    f"Pacing error at {r['main']} calls: the gateway ticker's "
                    "send-time error and the sample calls' receive jitter",
                )
            )
        target = 0.5
        if main is not None:
            target = float(main.get("targets", {}).get("cpu_per_call_pct", target))
        if any(not pt.get("error") for pt in r["curve"]):
            rp.cpu_curve(d / "calls_cpu.png", r["curve"], target)
            sr.figures.append(("calls_cpu.png", "CPU vs number of concurrent calls"))
    elif sr.name == "bargein":
        keys = (
            ("VAD decision → zero", "decision_to_zero_ms"),
            ("speech onset → zero", "onset_to_zero_ms"),
        )
        for label, key in keys:
            vals = _samples(r, key)
            if not vals:  # older JSON: the per-trial rows hold the same numbers
                vals = [float(t[key]) for t in r.get("per_trial", []) if t.get(key) is not None]
                if vals:
                    sr.notes.append(f"{key}: no samples key, taken from per_trial")
            series[label] = vals
        fb = {label: r.get(key, {}) for label, key in keys}
        for label, vals in series.items():
            if not vals:
                sr.notes.append(f"{label}: no raw samples, plotted from p50/p95/p99")
        tg = r.get("targets", {})
        lines = {}
        if "decision_to_zero_p99_ms" in tg:
            lines[f"decision→zero p99 ≤ {tg['decision_to_zero_p99_ms']:g}"] = float(
                tg["decision_to_zero_p99_ms"]
            )
        if "onset_to_zero_p95_ms" in tg:
            lines[f"onset→zero p95 ≤ {tg['onset_to_zero_p95_ms']:g}"] = float(
                tg["onset_to_zero_p95_ms"]
            )
        rp.cdf(
            d / "bargein_cdf.png",
            "Barge-in: time until the agent's audio is at zero",
            "ms",
            series,
            fb,
            lines,
        )
        sr.figures.append(("bargein_cdf.png", "Barge-in latency CDF"))
    elif sr.name == "webrtc":
        key = "connect_to_first_audio_ms"
        vals = _samples(r, key)
        if not vals:
            sr.notes.append(f"{key}: no raw samples, plotted from p50/p95/p99")
        rp.cdf(
            d / "webrtc_cdf.png",
            "WebRTC: connect to first audio",
            "ms",
            {"connect → first audio": vals},
            {"connect → first audio": r.get(key, {})},
        )
        sr.figures.append(("webrtc_cdf.png", "WebRTC connect-to-first-audio CDF"))
    elif sr.name == "response":
        rp.frequency_response(
            d / "freq_response.png",
            r["freqs_hz"],
            r["gain_db"],
            noise_freqs_hz=r["noise"]["freqs_hz"],
            noise_gain_db=r["noise"]["gain_db"],
            cutoff_hz=CUTOFF_HZ,
            eq_band_hz=EQ_BAND_HZ,
        )
        sr.figures.append(("freq_response.png", "Measured frequency response of the chain"))
    elif sr.name == "spectrogram":
        a = ctx.arrays.get("spectrogram")
        if a is not None:
            rp.spectrogram_pair(
                d / "spectrogram.png",
                a["before"],
                r["before"]["rate"],
                a["after"],
                r["after"]["rate"],
                title=f"“{r['prompt']}”",
                cutoff_hz=CUTOFF_HZ,
            )
            sr.figures.append(("spectrogram.png", "Before (engine) / after (phone chain)"))


# --- markdown ------------------------------------------------------------------------------------
def _met_of(r: dict[str, Any]) -> dict[str, Any]:
    m = r.get("met")
    if not isinstance(m, dict):
        m = r.get("pass")
    return m if isinstance(m, dict) else {}


def _mark(v: Any) -> str:
    return "n/a" if v is None else ("met" if v else "**MISSED**")


def _met_summary(r: dict[str, Any] | None) -> str:
    if not r:
        return ""
    met = {k: v for k, v in _met_of(r).items() if v is not None}
    if not met:
        return ""
    missed = [k for k, v in met.items() if not v]
    s = f"{len(met) - len(missed)}/{len(met)} met"
    return s + (f" (missed: {', '.join(missed)})" if missed else "")


def _conditions_line(c: dict[str, Any]) -> str:
    load = fmt(c.get("loadavg_1m_at_start"), ".2f")
    if "loadavg_1m_at_end" in c:
        load += f" → {fmt(c.get('loadavg_1m_at_end'), '.2f')}"
    mode = "quick" if c.get("quick") else "full"
    return (
        f"{c.get('cpu', '?')}, {c.get('cores', '?')} cores, load (1 min) {load}, "
        f"python {c.get('python', '?')}, {mode} run"
    )


def _pct_table(rows: Sequence[tuple[str, dict[str, Any]]], unit: str) -> list[str]:
    out = [f"| {unit} | n | p50 | p95 | p99 |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, p in rows:
        p = p or {}
        out.append(
            f"| {name} | {p.get('n', 0)} | {fmt(p.get('p50'))} | {fmt(p.get('p95'))} "
            f"| {fmt(p.get('p99'))} |"
        )
    return out


def _targets_table(rows: Sequence[tuple[str, str, Any]]) -> list[str]:
    out = ["| target | measured | |", "| --- | ---: | --- |"]
    out += [f"| {t} | {v} | {_mark(m)} |" for t, v, m in rows]
    return out


def _cold_start_table(c: dict[str, Any]) -> list[str]:
    """``bench synth``'s cold start (issue 17): spawn → ready of fresh worker processes the old
    way and with the graph cache, and the TTFA of the request waiting at ready."""
    modes = c.get("modes") or {}
    if not modes:
        return []
    k = c.get("conditions") or {}
    out = [
        "",
        f"Worker cold start, spawn → ready ({k.get('runs_per_mode', '?')} fresh processes a mode, "
        f"interleaved; load (1 min) {fmt(k.get('loadavg_1m_at_start'), '.2f')} at start; "
        "in-memory bus). TTFA #1: the request sent the moment the worker was ready.",
        "",
        "| mode | ready p50, s | ready p95, s | TTFA #1 p50, ms | TTFA #1 p95, ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, m in modes.items():
        ready, first = m.get("start_to_ready_s") or {}, m.get("ttfa_first_ms") or {}
        out.append(
            f"| {name} | {fmt(ready.get('p50'), '.2f')} | {fmt(ready.get('p95'), '.2f')} "
            f"| {fmt(first.get('p50'), '.0f')} | {fmt(first.get('p95'), '.0f')} |"
        )
    warm = (modes.get("new: cache warm") or {}).get("start_to_ready_s") or {}
    out += [
        "",
        *_targets_table(
            [
                (
                    f"cache-warm spawn → ready p95 ≤ {fmt(c.get('target_s'), '.0f')} s",
                    fmt(warm.get("p95"), ".2f"),
                    c.get("pass"),
                )
            ]
        ),
    ]
    return out


def _section_body(sr: StageResult) -> list[str]:
    r = sr.result or {}
    met = _met_of(r)
    tg = r.get("targets", {})
    lines: list[str] = []
    if sr.name == "synth":
        rows = [
            ("streaming", r.get("ttfa_streaming_ms", {})),
            ("whole-piece baseline", r.get("ttfa_baseline_ms", {})),
        ]
        rows += [
            (f"streaming, {n} concurrent", p) for n, p in r.get("ttfa_concurrent_ms", {}).items()
        ]
        lines += _pct_table(rows, "TTFA, ms")
        conc = r.get("ttfa_concurrent_ms", {})
        lines += [
            "",
            *_targets_table(
                [
                    (
                        f"TTFA p95, 1 at a time ≤ {fmt(tg.get('ttfa_p95_1_ms'), '.0f')} ms",
                        fmt(conc.get("1", r.get("ttfa_streaming_ms", {})).get("p95")),
                        met.get("ttfa_p95_1"),
                    ),
                    (
                        f"TTFA p95, 4 at once ≤ {fmt(tg.get('ttfa_p95_4_ms'), '.0f')} ms",
                        fmt(conc.get("4", {}).get("p95")),
                        met.get("ttfa_p95_4"),
                    ),
                    (
                        f"streaming/baseline TTFA ratio (p50) ≤ {tg.get('ratio_max')}",
                        fmt(r.get("ratio_p50"), ".2f"),
                        met.get("ratio"),
                    ),
                    (f"RTF ≤ {tg.get('rtf_max')}", fmt(r.get("rtf"), ".4f"), met.get("rtf")),
                ]
            ),
        ]
        lines += _cold_start_table(r.get("cold_start") or {})
    elif sr.name == "calls":
        main = r.get("runs", {}).get(r.get("main") or "")
        if main is not None:
            p, g = main["pacing"], main["greeting"]
            lines += [f"Pacing and greeting at **{r['main']} calls** (the largest run):", ""]
            lines += _pct_table(
                [
                    ("ticker send-time error (gateway's own)", p["ticker_send_error_ms"]),
                    ("receive jitter vs 20 ms grid (sample calls)", p["receive_jitter_ms"]),
                    (
                        "first greeting packet after ACK (warm, sequential)",
                        g["first_audio_after_ack_ms"],
                    ),
                    ("first audio after ACK under load (gateway)", g["under_load_first_audio_ms"]),
                ],
                "ms",
            )
            held = main["calls"]["held_during_plateau"]
            u = main["underruns"]
            cpu = main["cpu"]
            lines += [
                "",
                *_targets_table(
                    [
                        (
                            f"{tg.get('calls')} calls held",
                            f"{held['min']}–{held['max']} of {main['calls']['target']}",
                            met.get("calls"),
                        ),
                        (
                            f"ticker p99 ≤ {tg.get('ticker_p99_ms')} ms",
                            fmt(p["ticker_send_error_ms"].get("p99")),
                            met.get("ticker_p99"),
                        ),
                        (
                            "no underruns / skipped ticks",
                            f"{u['playout_underrun_frames_total']} / {p['skipped_ticks_total']}",
                            met.get("underruns"),
                        ),
                        (
                            f"CPU per call (event loop) ≤ {tg.get('cpu_per_call_pct')} % of a core",
                            fmt(cpu.get("per_call_event_loop_pct_core"), ".3f"),
                            met.get("cpu_per_call"),
                        ),
                        (
                            f"greeting p95 ≤ {fmt(tg.get('greeting_p95_ms'), '.0f')} ms",
                            fmt(g["first_audio_after_ack_ms"].get("p95")),
                            met.get("greeting_p95"),
                        ),
                    ]
                ),
            ]
            if main.get("samples_note"):
                lines += [
                    "",
                    f"Samples: {main['samples_note']}; the ticker histogram is the "
                    "gateway's own (0.1 ms bins, plateau).",
                ]
            lines += ["", f"Mode: {main['conditions'].get('mode')}; {cpu.get('note')}."]
        lines += [
            "",
            "Calls vs CPU (% of one core, plateau; per call = (plateau − idle) / calls):",
            "",
            "| calls | held (min) | idle | process | event loop | per call | "
            "per call (loop) | box busy (all cores) | ticker p99 ms | CPU target |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for pt in r.get("curve", []):
            if pt.get("error"):
                lines.append(f"| {pt['calls']} | failed | | | | | | | | |")
                continue
            lines.append(
                f"| {pt['calls']} | {pt['held_min']} | {fmt(pt['idle_pct'])} | "
                f"{fmt(pt['process_pct'])} | {fmt(pt['event_loop_pct'])} | "
                f"{fmt(pt['per_call_pct'], '.3f')} | {fmt(pt['per_call_event_loop_pct'], '.3f')}"
                f" | {fmt(pt['system_busy_pct'])} | {fmt(pt['ticker_p99_ms'], '.2f')} | "
                f"{_mark(pt['met_cpu_per_call'])} |"
            )
        lines += [
            "",
            "The smaller runs of the curve place 3 greeting-latency calls instead of "
            "20; all else is `voxgate bench calls` with its defaults"
            + (" and `--quick`." if r.get("conditions", {}).get("quick") else "."),
        ]
    elif sr.name == "bargein":
        lines += _pct_table(
            [
                (k.replace("_ms", "").replace("_", " "), r.get(k, {}))
                for k in (
                    "decision_to_zero_ms",
                    "onset_to_zero_ms",
                    "onset_to_decision_ms",
                    "decision_to_client_silence_ms",
                    "worker_stop_ms",
                )
            ]
            # At the caller's side of the wire: the first speech packet sent → the first
            # faded / silent packet received (what the caller experiences; issue 17).
            + [
                ("caller: speech sent → faded packet", r.get("caller_onset_to_fade_packet_ms", {})),
                (
                    "caller: speech sent → silent packet",
                    r.get("caller_onset_to_silent_packet_ms", {}),
                ),
            ],
            "ms",
        )
        t, e = r.get("trials", {}), r.get("echo_only", {})
        lines += [
            "",
            *_targets_table(
                [
                    (
                        f"decision → zero p99 ≤ {fmt(tg.get('decision_to_zero_p99_ms'), '.0f')} ms",
                        fmt(r.get("decision_to_zero_ms", {}).get("p99")),
                        met.get("decision_to_zero"),
                    ),
                    (
                        f"onset → zero p95 ≤ {fmt(tg.get('onset_to_zero_p95_ms'), '.0f')} ms",
                        fmt(r.get("onset_to_zero_ms", {}).get("p95")),
                        met.get("onset_to_zero"),
                    ),
                    (
                        "caller side, speech sent → silent packet: p50 ≤ "
                        f"{fmt(tg.get('caller_onset_to_silence_p50_ms'), '.0f')}, p95 ≤ "
                        f"{fmt(tg.get('caller_onset_to_silence_p95_ms'), '.0f')} ms",
                        f"{fmt(r.get('caller_onset_to_silent_packet_ms', {}).get('p50'))} / "
                        f"{fmt(r.get('caller_onset_to_silent_packet_ms', {}).get('p95'))}",
                        met.get("caller_onset_to_silence"),
                    ),
                    (
                        "no false barge-ins on echo",
                        f"{e.get('false_bargeins')} in {fmt(e.get('echo_s'))} s",
                        met.get("false_bargeins_on_echo"),
                    ),
                    (
                        "no missed barge-ins",
                        f"{t.get('missed')} of {t.get('speech')}",
                        met.get("missed"),
                    ),
                ]
            ),
        ]
    elif sr.name == "agent":
        from voxgate.bench.agent import format_report

        lines += ["```", format_report(r).rstrip(), "```"]
    elif sr.name == "webrtc":
        rows = [
            ("connect → first audio", r.get("connect_to_first_audio_ms", {})),
            ("offer POST → answer", r.get("offer_round_trip_ms")),
            ("answer → first audio", r.get("answer_to_first_audio_ms")),
        ]
        lines += _pct_table([(n, p) for n, p in rows if p is not None], "ms")
        trows = []
        for k, v in met.items():
            limit = tg.get(f"{k}_p95_ms")
            if limit is not None and isinstance(r.get(f"{k}_ms"), dict):
                trows.append((f"{k.replace('_', ' ')} p95 ≤ {fmt(limit, '.0f')} ms",
                              fmt(r[f"{k}_ms"].get("p95")), v))  # fmt: skip
            else:
                trows.append((k.replace("_", " "), "", v))
        if trows:
            lines += ["", *_targets_table(trows)]
        if r.get("errors"):
            lines += ["", f"Failed calls: {len(r['errors'])}: {r['errors'][:3]}"]
        steps = r.get("concurrency") or []
        if steps:
            lines += [
                "",
                "Concurrent legs (held = every leg connected and every client got ≥ 95 % of its "
                "frames; the clients share the box):",
                "",
                "| legs | gateway CPU, % of a core | per leg | worst client, % of frames "
                "| connect failures | held |",
                "| ---: | ---: | ---: | ---: | ---: | --- |",
            ]
            for st in steps:
                lines.append(
                    f"| {st.get('legs')} | {fmt(st.get('gateway_cpu_pct'))} | "
                    f"{fmt(st.get('gateway_cpu_pct_per_leg'), '.2f')} | "
                    f"{fmt(st.get('worst_client_frames_pct'))} | {st.get('connect_failures')} | "
                    f"{'held' if st.get('held') else '**not held**'} |"
                )
            lines += ["", f"Most legs held: {r.get('max_legs_held')}."]
    elif sr.name == "response":
        rel = r.get("re_1khz_db", {})
        pts = r.get("points_db", {})
        lines += [
            "Measured gain (dB, sine in → 8 kHz out) at key frequencies; percentiles do not "
            "apply to a response.",
            "",
            "| Hz | " + " | ".join(pts) + " |",
            "| --- | " + " | ".join("---:" for _ in pts) + " |",
            "| gain, dB | " + " | ".join(fmt(v, ".2f") for v in pts.values()) + " |",
            "| re 1 kHz, dB | " + " | ".join(fmt(v, ".2f") for v in rel.values()) + " |",
            "",
        ]
        al = r.get("alias", {})
        edges = []
        for db in (3, 20, 60):
            hz = r.get(f"minus_{db}db_hz")
            edges.append(
                f"−{db} dB at {fmt(hz, '.0f')} Hz"
                if hz is not None
                else f"−{db} dB not reached below {fmt(r['freqs_hz'][-1], '.0f')} Hz "
                f"({fmt(rel.get(str(int(r['freqs_hz'][-1]))), '.1f')} dB there)"
            )
        lines += [
            "Relative to 1 kHz: " + ", ".join(edges) + ". The anti-alias filter's transition "
            "band is 3.8–4.0 kHz (windowed sinc cut at its middle: about −6 dB at 3.9 kHz).",
            "",
        ]
        band, low = r.get("eq_band_1200_2800_db", {}), r.get("band_300_600_db", {})
        lines += _targets_table(
            [
                (
                    tg.get("band_300_600_db", ""),
                    f"{fmt(low.get('min'), '.2f')} … {fmt(low.get('max'), '.2f')}",
                    met.get("band_300_600"),
                ),
                (
                    tg.get("eq_1200_2800_db", ""),
                    f"{fmt(band.get('min'), '.2f')} … {fmt(band.get('max'), '.2f')}",
                    met.get("eq_1200_2800"),
                ),
                (tg.get("at_3800_db", ""), fmt(pts.get("3800"), ".2f"), met.get("at_3800")),
                (
                    tg.get("alias_db", ""),
                    f"worst {fmt(al.get('worst_db'), '.1f')} dB "
                    f"(input {fmt(al.get('worst_at_hz'), '.0f')} Hz)",
                    met.get("alias"),
                ),
            ]
        )
        lines += [
            "",
            f"Method: {r.get('conditions', {}).get('method')}; engine rate "
            f"{r.get('conditions', {}).get('engine_rate')} Hz, EQ "
            f"{r.get('conditions', {}).get('eq_gain_db')} dB.",
        ]
    elif sr.name == "spectrogram":
        b, a = r.get("before", {}), r.get("after", {})
        lines += [
            f"Prompt: “{r.get('prompt')}” ({len(r.get('pieces', []))} chunker pieces), "
            "rendered by the worker's path (`synth.render.Renderer`, narrowband); "
            "*before* is the engine's raw chunks as the renderer pulled them.",
            "",
        ]
        lines += _pct_table(
            [
                (f"before: engine, {b.get('rate')} Hz", b.get("frame_20ms_dbfs", {})),
                (f"after: phone chain, {a.get('rate')} Hz", a.get("frame_20ms_dbfs", {})),
            ],
            "20 ms frame level, dBFS",
        )
        lines += [
            "",
            "| | duration s | RMS dBFS | peak dBFS | energy above 3.8 kHz, dB re total |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, d in (("before", b), ("after", a)):
            lines.append(
                f"| {name} | {fmt(d.get('seconds'), '.2f')} | {fmt(d.get('rms_dbfs'))} | "
                f"{fmt(d.get('peak_dbfs'))} | {fmt(d.get('energy_above_3800_hz_db'))} |"
            )
        lines += ["", "No targets for this section (it is a picture)."]
    return lines


def render_markdown(
    results: list[StageResult], host: dict[str, Any], total_s: float, argv: Sequence[str]
) -> str:
    quick = bool(host.get("quick"))
    failed = [s.name for s in results if s.status == "failed"]
    lines = [
        "# voxgate benchmark report",
        "",
        f"Generated {host['generated']} by `voxgate {shlex.join(argv)}` in {_clock(total_s)} "
        f"({'quick' if quick else 'full'} run).",
        "",
        f"Machine: {_conditions_line(host)}; {host.get('platform')}.",
        "",
        "| stage | status | time | targets |",
        "| --- | --- | ---: | --- |",
    ]
    for s in results:
        status = s.status if s.status != "failed" else "**FAILED**"
        lines.append(
            f"| [{s.name}](#{s.name}) | {status} | {_clock(s.seconds)} | {_met_summary(s.result)} |"
        )
    if failed:
        lines += ["", f"**Failed stages: {', '.join(failed)}** (error text in each section)."]
    lines += [
        "",
        'Percentiles are nearest-rank (an observed value). "met"/"MISSED" are the '
        "benchmarks' own verdicts (their `met`/`pass` fields).",
    ]
    for i, s in enumerate(results, 1):
        lines += ["", f'<a id="{s.name}"></a>', "", f"## {i}. {TITLES.get(s.name, s.name)}", ""]
        head = f"Stage `{s.name}`: **{s.status}**"
        if s.status != "skipped":
            head += f" in {s.seconds:.1f} s"
        lines.append(head + ".")
        if s.status == "skipped":
            lines += ["", "Left out (`--skip`)."]
            continue
        if s.error:
            lines += ["", "Error:", "", "```text", s.error.strip()[-3000:], "```"]
        if s.result:
            c = s.result.get("conditions")
            if isinstance(c, dict):
                lines += ["", f"Conditions: {_conditions_line(c)}."]
            try:
                body = _section_body(s)
            except Exception as exc:  # a malformed result must not lose the rest of the report
                body = [f"(could not tabulate this result: {type(exc).__name__}: {exc})"]
            lines += ["", *body]
        for note in s.notes:
            lines += ["", f"Note: {note}"]
        for fname, caption in s.figures:
            lines += ["", f"![{caption}]({fname})", "", f"*{caption}*"]
    return "\n".join(lines) + "\n"


# --- driver --------------------------------------------------------------------------------------
def parse_skip(values: Sequence[str]) -> set[str]:
    skip = {v.strip() for raw in values for v in raw.split(",") if v.strip()}
    unknown = skip - set(STAGES)
    if unknown:
        raise ValueError(
            f"unknown stage(s) {', '.join(sorted(unknown))}; stages: {', '.join(STAGES)}"
        )
    return skip


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip() + where


def run_report(
    out_dir: Path,
    *,
    quick: bool,
    skip: set[str],
    write_json: bool,
    cfg: Any,
    argv: Sequence[str] = (),
    stream: TextIO | None = None,
    tty: bool | None = None,
) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    host = _host_conditions(quick)
    host["generated"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ctx = Context(quick=quick, cfg=cfg, out_dir=out_dir)
    todo = [s for s in STAGES if s not in skip]
    progress = Progress(len(todo), stream, tty)
    results: list[StageResult] = []
    t_all = time.monotonic()
    index = 0
    try:
        for name in STAGES:
            sr = StageResult(name)
            results.append(sr)
            if name in skip:
                continue
            index += 1
            steps = len(CALL_COUNTS[quick]) if name == "calls" else 2
            expected = EXPECTED_S.get(name, (60.0, 60.0))[0 if quick else 1]
            t0 = time.monotonic()
            with progress.stage(index, name, steps, expected) as prog:
                try:
                    sr.result = RUNNERS[name](ctx, prog)
                    sr.status = "ok"
                except StageFailed as exc:
                    sr.status, sr.error, sr.result = "failed", str(exc), exc.partial
                except Exception as exc:
                    sr.status, sr.error = "failed", _error_text(exc)
                if sr.result is not None:
                    try:
                        plot_stage(sr, ctx)
                    except Exception as exc:
                        sr.status = "failed"
                        sr.error = (
                            (sr.error + "\n" if sr.error else "") + "plot: " + _error_text(exc)
                        )
            sr.seconds = time.monotonic() - t0
            progress.finish(index, name, sr.status, sr.seconds)
    finally:
        progress.close()
    host["loadavg_1m_at_end"] = os.getloadavg()[0]
    total = time.monotonic() - t_all
    (out_dir / "report.md").write_text(render_markdown(results, host, total, argv))
    if write_json:
        doc = {
            "generated": host["generated"],
            "quick": quick,
            "seconds": total,
            "conditions": host,
            "stages": {
                s.name: {
                    "status": s.status,
                    "seconds": s.seconds,
                    "error": s.error,
                    "notes": s.notes,
                    "figures": [f for f, _ in s.figures],
                    "result": s.result,
                }
                for s in results
            },
        }
        (out_dir / "report.json").write_text(
            json.dumps(strict_json(doc), indent=1, default=json_default) + "\n"
        )
    failed = [s.name for s in results if s.status == "failed"]
    summary = ", ".join(f"{s.name} {s.status}" for s in results if s.status != "skipped")
    print(f"voxgate bench all: {out_dir / 'report.md'} ({summary}; {total:.0f} s)")
    return 1 if failed else 0


def cmd_bench_all(args: argparse.Namespace) -> int:
    from voxgate.contract.config import load_from_args

    try:
        skip = parse_skip(args.skip)
    except ValueError as exc:
        print(f"voxgate bench all: {exc}", file=sys.stderr)
        return 2
    cfg = load_from_args(args)
    argv = ["bench", "all", "--report", args.report]
    argv += ["--quick"] * bool(args.quick) + ["--json"] * bool(args.json)
    argv += [f"--skip={','.join(s for s in STAGES if s in skip)}"] if skip else []
    return run_report(
        Path(args.report), quick=args.quick, skip=skip, write_json=args.json, cfg=cfg, argv=argv
    )
