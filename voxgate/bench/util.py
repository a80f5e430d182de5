"""What every voxgate benchmark shares: nearest-rank percentiles, the run conditions' CPU
model, strict JSON (NaN means "no data" and becomes null), table formatting and the CLI tail."""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {
            "n": 0,
            "p50": float("nan"),
            "p95": float("nan"),
            "p99": float("nan"),
            "mean": float("nan"),
        }
    s = sorted(values)

    def pct(q: float) -> float:
        # Nearest-rank percentile: an observed value, no interpolation across outliers.
        k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
        return s[k]

    return {
        "n": len(s),
        "p50": pct(50),
        "p95": pct(95),
        "p99": pct(99),
        "mean": statistics.fmean(s),
    }


CALIBRATION_ROUNDS = 20_000


def calibration_cpu_s(rounds: int = CALIBRATION_ROUNDS, repeats: int = 3) -> float:
    """CPU-seconds (this process, best of ``repeats``) of a fixed workload shaped like the
    gateway's per-packet work: bytes slicing and struct packing, a heap, dict lookups and small
    numpy operations (table look-up, 10-element vector maths).  It imports nothing of voxgate,
    so a slower product cannot hide behind it: a CPU budget measured on one machine is scaled
    by this figure's ratio to carry it to another (same run, same interpreter and numpy)."""
    table = np.arange(256, dtype=np.int16) * 64
    payload = bytes(range(160))
    vec = np.linspace(1e-3, 1.0, 10)
    best = math.inf
    for _ in range(repeats):
        heap: list[tuple[float, int]] = []
        seen: dict[int, float] = {}
        t0 = time.process_time()
        acc = 0.0
        for i in range(rounds):
            hdr = struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 1234)
            pcm = table[np.frombuffer(hdr + payload[12:], dtype=np.uint8)]
            acc += float(np.maximum(vec * (i & 7), 1e-6).sum()) + int(pcm.any())
            heapq.heappush(heap, (i * 0.02, i))
            if len(heap) > 64:
                heapq.heappop(heap)
            seen[i & 1023] = acc
        best = min(best, time.process_time() - t0)
    return best


def cpu_model() -> str:
    """The CPU's model name (for the run conditions every benchmark prints)."""
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    return cpu


def strict_json(o: object) -> object:
    """NaN (no data) → None and numpy scalars → Python, recursively, so the JSON is strict."""
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, np.generic):
        return strict_json(o.item())
    if isinstance(o, dict):
        return {k: strict_json(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [strict_json(v) for v in o]
    return o


def json_default(o: object) -> object:
    """``json.dumps(default=...)`` for results holding numpy scalars or arrays."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def fmt(x: Any, spec: str = ".1f") -> str:
    """A table cell: the number formatted, or "n/a" for missing/NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(v) else format(v, spec)


def run_cli(
    name: str,
    run: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    as_json: bool,
) -> int:
    """The tail every ``voxgate bench X`` shares: run, then print JSON or the table; a bench
    that cannot run (missing tool, gateway not ready) prints one line and exits 1."""
    try:
        result = run()
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"voxgate bench {name}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(strict_json(result), indent=2, default=str))
    else:
        print(report(result))
    return 0
