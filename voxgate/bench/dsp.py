"""Benchmark of the narrowband telephone chain: cost per 20 ms block and % of one core.

Streams a deterministic speech-like test signal through :class:`TelephoneChain` in engine-rate
blocks, timing each ``process`` call (``perf_counter_ns``) after a warm-up, and the whole run in
CPU time (``process_time``, all threads: honest if BLAS ever used a second thread).  For
comparison, in the same run: our one-shot twin on the same audio and scipy's
``resample_poly`` (its default, much shorter Kaiser filter, no EQ/limiter), per second of audio.
No pass/fail here: timings on a shared 2-core box are noisy, the numbers are for reading.
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy
import scipy.signal

from dsp.resample import design
from dsp.telephone import ATTEN_DB, OUT_RATE, PASS_HZ, STOP_HZ, TelephoneChain, telephone

WARMUP_BLOCKS = 50


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def speech_like(n: int, rate: int, seed: int = 1234) -> npt.NDArray[np.float32]:
    """Deterministic test audio: a gliding harmonic voice plus noise, about -20 dBFS RMS."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    f0 = 120.0 + 30.0 * np.sin(2 * np.pi * 0.7 * t)  # pitch glide
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = np.zeros(n, dtype=np.float64)
    for k in range(1, 30):
        if k * 150 < rate / 2:
            x += np.sin(k * phase) / k
    x *= 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2  # syllable-rate envelope
    x += 0.05 * rng.standard_normal(n)
    x *= 0.1 / math.sqrt(float(np.mean(x**2)))
    return x.astype(np.float32)


def _percentiles(us: npt.NDArray[np.float64]) -> dict[str, float]:
    p50, p95, p99 = np.percentile(us, [50, 95, 99])
    return {
        "p50": round(float(p50), 2),
        "p95": round(float(p95), 2),
        "p99": round(float(p99), 2),
        "mean": round(float(us.mean()), 2),
        "max": round(float(us.max()), 2),
    }


def run(iterations: int = 5000, in_rate: int = 22050, block_ms: int = 20) -> dict[str, Any]:
    """Time ``iterations`` blocks of ``block_ms`` through the chain; return a JSON-able report."""
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    block = in_rate * block_ms // 1000
    n_blocks = iterations + WARMUP_BLOCKS
    audio = speech_like(n_blocks * block, in_rate)
    blocks = audio.reshape(n_blocks, block)

    chain = TelephoneChain(in_rate)
    for b in blocks[:WARMUP_BLOCKS]:
        chain.process(b)
    times_ns = np.empty(iterations, dtype=np.int64)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    for i, b in enumerate(blocks[WARMUP_BLOCKS:]):
        t0 = time.perf_counter_ns()
        chain.process(b)
        times_ns[i] = time.perf_counter_ns() - t0
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    audio_s = iterations * block / in_rate
    us = times_ns.astype(np.float64) / 1e3

    timed_audio = audio[WARMUP_BLOCKS * block :]
    telephone(timed_audio[:block], in_rate)  # warm caches for the one-shot path
    s0 = time.perf_counter()
    telephone(timed_audio, in_rate)
    oneshot = time.perf_counter() - s0
    d = design(in_rate, OUT_RATE, PASS_HZ, STOP_HZ, ATTEN_DB)
    s0 = time.perf_counter()
    scipy.signal.resample_poly(timed_audio, d.up, d.down)
    poly = time.perf_counter() - s0

    return {
        "bench": "dsp.telephone",
        "conditions": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "in_rate": in_rate,
            "out_rate": OUT_RATE,
            "block_ms": block_ms,
            "block_samples_in": block,
            "iterations": iterations,
            "warmup_blocks": WARMUP_BLOCKS,
            "filter_taps": int(d.taps.size),
            "taps_per_output": math.ceil(d.taps.size / d.up),
            "latency_ms": round(1000.0 * chain.latency_samples / OUT_RATE, 2),
        },
        "per_block_us": _percentiles(us),
        "percent_core": {
            # % of one core per second of call audio.  cpu: process CPU time of the whole loop
            # (the cost; not inflated when the scheduler preempts us on a busy box).
            # wall: sum of the timed calls (includes preemption).  p50: typical block x rate.
            "cpu": round(100.0 * cpu / audio_s, 4),
            "wall": round(100.0 * float(us.sum()) / 1e6 / audio_s, 4),
            "loop_wall": round(100.0 * wall / audio_s, 4),
            "p50": round(100.0 * float(np.percentile(us, 50)) / 1e6 * in_rate / block, 4),
        },
        "baselines_percent_core": {
            "telephone_one_shot": round(100.0 * oneshot / audio_s, 4),
            "scipy_resample_poly_one_shot": round(100.0 * poly / audio_s, 4),
        },
    }


def format_report(r: dict[str, Any]) -> str:
    c, p, pc, b = r["conditions"], r["per_block_us"], r["percent_core"], r["baselines_percent_core"]
    return "\n".join(
        [
            f"bench dsp: telephone chain {c['in_rate']} -> {c['out_rate']} Hz, "
            f"{c['block_ms']} ms blocks ({c['block_samples_in']} samples), "
            f"{c['iterations']} blocks after {c['warmup_blocks']} warm-up",
            f"  conditions: {c['cpu']}, {c['cores']} cores, Python {c['python']}, "
            f"numpy {c['numpy']}, scipy {c['scipy']}, "
            f"{c['filter_taps']}-tap filter ({c['taps_per_output']}/output), "
            f"latency {c['latency_ms']} ms",
            f"  per block: p50 {p['p50']:.1f} us  p95 {p['p95']:.1f} us  p99 {p['p99']:.1f} us"
            f"  (mean {p['mean']:.1f}, max {p['max']:.1f})",
            f"  cost: {pc['cpu']:.3f} % of one core per second of audio (CPU time; "
            f"from p50 {pc['p50']:.3f} %, wall incl. preemption {pc['wall']:.3f} %; "
            "target <= 0.2 %)",
            f"  same audio, one-shot: ours {b['telephone_one_shot']:.3f} %, "
            f"scipy resample_poly {b['scipy_resample_poly_one_shot']:.3f} %",
        ]
    )
