"""Benchmark of call recording's CPU per call: the media side's cost per tick and the writer's
per 100 ms of audio, at 8 kHz (SIP) and 48 kHz (browser), stereo, into real files.

``python -m voxgate.bench.recording [--calls 20] [--seconds 30] [--dir DIR] [--json]``

``calls`` recordings are fed ``seconds`` of audio as fast as the CPU allows, the way the
gateway feeds them: each tick the agent's frame then the caller's (``Recorder.agent`` /
``Recorder.caller``, what ``Call.pull_audio`` and ``Call.on_caller_audio`` call), and every
100 ms of audio one writer step per recording (``Recorder.step``, what the writer thread runs
every ``POLL_S``: drain, align, write, header patch every 2 s). The two sides are timed apart
(``perf_counter_ns`` around each step, ``thread_time`` for the totals, this thread only), and
``finalise`` (the last write, header, fsync) on its own. The figure to read is ``cpu_pct``:
one recorded call's CPU as a share of one core, media side plus writer. No pass/fail: a shared
2-core box is noisy; the numbers are for reading.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from gateway.call.control import RecordingEvent
from gateway.media.recording import POLL_S, Recorder, open_new
from voxgate.bench.util import percentiles

FRAME_MS = 20


def bench(rate: int, calls: int, seconds: float, directory: Path) -> dict[str, Any]:
    n = rate * FRAME_MS // 1000
    rng = np.random.default_rng(rate)
    agent = [rng.integers(-8000, 8000, n).astype(np.int16) for _ in range(16)]
    caller = [rng.integers(-8000, 8000, n).astype(np.int16) for _ in range(16)]
    events: list[RecordingEvent] = []
    recs = [
        Recorder(
            recording_id=f"r{i}", call_id=f"c{i}", root=directory, name=f"{rate}-{i}.wav",
            channels="both", rate=rate, max_frames=10_000, notify=events.append,
        )
        for i in range(calls)
    ]  # fmt: skip
    ticks_per_step = round(POLL_S * 1000 / FRAME_MS)
    steps = round(seconds / POLL_S)
    push_us: list[float] = []  # one tick (two frames), per recording
    write_us: list[float] = []  # one writer step (100 ms of audio), per recording
    push_cpu = write_cpu = 0.0
    tick = 0
    for _ in range(steps):
        c0 = time.thread_time()
        for rec in recs:
            t0 = time.perf_counter_ns()
            for k in range(tick, tick + ticks_per_step):
                rec.agent(k * n, agent[k % 16])
                rec.caller(k * n, caller[k % 16])
            push_us.append((time.perf_counter_ns() - t0) / 1000 / ticks_per_step)
        c1 = time.thread_time()
        now = time.monotonic()
        for rec in recs:
            t0 = time.perf_counter_ns()
            rec.step(open_new, now)
            write_us.append((time.perf_counter_ns() - t0) / 1000)
        c2 = time.thread_time()
        push_cpu += c1 - c0
        write_cpu += c2 - c1
        tick += ticks_per_step
    c0 = time.thread_time()
    for rec in recs:
        rec.stop()
        rec.step(open_new, time.monotonic())
    finalise_cpu = time.thread_time() - c0
    failed = [r.error for r in recs if r.state != "stopped"]
    if failed:
        raise RuntimeError(f"recordings failed: {failed[:3]}")
    audio_s = calls * steps * POLL_S
    per_call_s = (push_cpu + write_cpu) / audio_s  # CPU-seconds per second of one call
    size = sum(r.bytes for r in recs)
    for r in recs:
        r.path.unlink()
    return {
        "rate": rate,
        "calls": calls,
        "audio_s_per_call": steps * POLL_S,
        "tick_us": {k: round(v, 3) for k, v in percentiles(push_us).items()},
        "writer_step_us": {k: round(v, 1) for k, v in percentiles(write_us).items()},
        "media_cpu_us_per_call_s": round(push_cpu / audio_s * 1e6, 1),
        "writer_cpu_us_per_call_s": round(write_cpu / audio_s * 1e6, 1),
        "finalise_ms_per_call": round(finalise_cpu / calls * 1000, 3),
        "cpu_pct": round(per_call_s * 100, 4),
        "bytes_per_call_s": round(size / audio_s),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voxgate.bench.recording", description=__doc__)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--dir", default="", help="where to write (default: a temporary dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir or None) as tmp:
        results = [bench(rate, args.calls, args.seconds, Path(tmp)) for rate in (8000, 48000)]
    if args.json:
        print(json.dumps({"recording": results, "cpu_count": os.cpu_count()}, indent=2))
        return 0
    print(f"recording: {args.calls} calls x {args.seconds:g} s, stereo, {os.cpu_count()} CPUs")
    for r in results:
        t, w = r["tick_us"], r["writer_step_us"]
        print(
            f"  {r['rate']:>5} Hz: media side per tick p50/p95/p99 {t['p50']}/{t['p95']}/"
            f"{t['p99']} us; writer per 100 ms p50/p95/p99 {w['p50']}/{w['p95']}/{w['p99']} us; "
            f"media {r['media_cpu_us_per_call_s']} + writer {r['writer_cpu_us_per_call_s']} "
            f"us CPU per call-second = {r['cpu_pct']} % of a core per call; finalise "
            f"{r['finalise_ms_per_call']} ms; {r['bytes_per_call_s']} B/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
