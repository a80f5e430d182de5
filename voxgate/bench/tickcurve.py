"""``python -m voxgate.bench.tickcurve RUNS --png OUT.png``: the calls-vs-CPU curve of two
builds measured in the same session, from ``voxgate bench calls --json`` files.

``RUNS`` holds ``{build}_{calls}_{try}.json`` files (e.g. ``before_100_a.json``,
``after_100_b.json``), the runs alternated between the builds so that a noisy box weighs on
both alike.  Prints a Markdown table per call count (event-loop CPU, CPU-seconds per
call-minute, ticker send-time error, skipped ticks; the median over tries, every try listed)
and draws :func:`voxgate.bench.plots.cpu_curve_compare`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(runs: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """build → calls → runs, in file-name order."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for f in sorted(runs.glob("*.json")):
        parts = f.stem.split("_")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        try:
            r = json.loads(f.read_text())
        except ValueError:
            continue
        out[parts[0]][int(parts[1])].append(r)
    return out


def point(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One curve point: medians over the tries (``cpu_curve_compare``'s keys and more)."""

    def med(get: Any) -> float:
        return float(statistics.median(get(r) for r in rs))

    return {
        "calls": rs[0]["conditions"]["calls"],
        "tries": len(rs),
        "held_min": min(r["calls"]["held_during_plateau"]["min"] for r in rs),
        "event_loop_pct": med(lambda r: r["cpu"]["plateau"]["event_loop_thread_pct"]),
        "per_call_event_loop_pct": med(lambda r: r["cpu"]["per_call_event_loop_pct_core"]),
        "cpu_s_per_call_minute": med(lambda r: r["cpu"]["event_loop_cpu_s_per_call_minute"]),
        "each_per_call": [r["cpu"]["per_call_event_loop_pct_core"] for r in rs],
        "ticker": {
            q: med(lambda r, q=q: r["pacing"]["ticker_send_error_ms"][q])
            for q in ("p50", "p95", "p99", "max")
        },
        "worst_p99": max(r["pacing"]["ticker_send_error_ms"]["p99"] for r in rs),
        "skipped": [r["pacing"]["skipped_ticks_total"] for r in rs],
        "load": [round(r["conditions"]["loadavg_1m_at_start"], 2) for r in rs],
        "calibration": med(lambda r: r["cpu"]["calibration_cpu_s"]),
        "cpu": rs[0]["conditions"]["cpu"],
    }


def table(curves: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| calls | build | held (min) | event loop % | per call % (each try) | CPU-s per call-min "
        "| ticker p50 / p95 / p99 / max ms | skipped ticks | load at start |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    counts = sorted({p["calls"] for pts in curves.values() for p in pts})
    for n in counts:
        for build, pts in curves.items():
            p = next((p for p in pts if p["calls"] == n), None)
            if p is None:
                continue
            t = p["ticker"]
            each = ", ".join(f"{x:.3f}" for x in p["each_per_call"])
            lines.append(
                f"| {n} | {build} | {p['held_min']} | {p['event_loop_pct']:.1f} | "
                f"{p['per_call_event_loop_pct']:.3f} ({each}) | {p['cpu_s_per_call_minute']:.3f} | "
                f"{t['p50']:.1f} / {t['p95']:.1f} / {t['p99']:.1f} / {t['max']:.1f} | "
                f"{', '.join(str(s) for s in p['skipped'])} | "
                f"{', '.join(str(x) for x in p['load'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voxgate.bench.tickcurve", description=__doc__)
    ap.add_argument("runs", type=Path)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--target", type=float, default=0.30, help="per-call target, % of a core")
    ap.add_argument("--json", action="store_true", help="print the curve points as JSON")
    a = ap.parse_args(argv)
    data = load(a.runs)
    curves = {b: [point(rs) for _, rs in sorted(by.items())] for b, by in sorted(data.items())}
    if a.json:
        print(json.dumps(curves, indent=2))
    else:
        print(table(curves))
    if a.png is not None:
        from voxgate.bench.plots import cpu_curve_compare

        cpu_curve_compare(a.png, curves, a.target, core_budget_pct=100.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
