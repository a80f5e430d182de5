"""``voxgate bench calls``' stall attribution: the collector's pauses recorded in the gateway
process (``GcRecorder`` on ``gc.callbacks``, windowed between two stats dumps) and the event-loop
thread's time runnable but waiting for a CPU (``/proc/PID/task/PID/schedstat``). Real collections
and this process's own scheduler statistics, no stand-ins."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from voxgate.bench.calls import GcRecorder, gc_window, runqueue_between, runqueue_wait


def _garbage(n: int) -> None:
    for _ in range(n):
        a: list[Any] = []
        a.append(a)  # a cycle: only the collector frees it


def test_recorder_counts_real_collections_and_windows_them() -> None:
    rec = GcRecorder()
    gc.callbacks.append(rec.callback)
    try:
        before: dict[str, Any] = {"time": time.time(), "gc": rec.snapshot()}
        time.sleep(0.01)
        _garbage(1000)
        gc.collect(0)
        gc.collect(2)
        after: dict[str, Any] = {"time": time.time(), "gc": rec.snapshot()}
    finally:
        gc.callbacks.remove(rec.callback)
    assert rec.count[2] >= 1 and rec.count[0] >= 1
    w = gc_window(before, after)
    assert w["collections_by_generation"][2] >= 1
    assert w["collections_by_generation"][0] >= 1
    assert all(t >= 0 for t in w["total_ms_by_generation"])
    assert w["total_ms_by_generation"][2] > 0
    # Pauses of 1 ms or more carry their time: only those inside the window count.
    rec.long = [(before["time"] - 1.0, 2, 50.0), (before["time"] + 0.005, 2, 25.0)]
    after["gc"] = rec.snapshot()
    w = gc_window(before, after)
    assert w["max_ms"] == 25.0 and w["pauses_ge_20_ms"] == 1 and w["pauses_ge_1_ms"] == 1
    assert gc_window(None, after)["pauses_ge_20_ms"] == 2  # from the start: both
    assert gc_window(before, None) == {}


def test_recorder_ignores_a_stop_without_a_start() -> None:
    rec = GcRecorder()
    rec.callback("stop", {"generation": 1})
    assert rec.count == [0, 0, 0]


@pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").exists(),
    reason="no schedstat in /proc",
)
def test_runqueue_wait_sees_this_thread_run() -> None:
    pid = os.getpid()
    a = runqueue_wait(pid)
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:  # 50 ms on a CPU
        pass
    b = runqueue_wait(pid)
    d = runqueue_between(a, b)
    assert d["on_cpu_pct"] > 10.0  # it ran for most of the interval
    assert d["runqueue_wait_pct"] >= 0.0
    assert runqueue_between(None, b) == {} and runqueue_between(b, a) == {}
    assert runqueue_wait(2**22 + 12345) is None  # no such process


def test_runqueue_wait_counts_waiting_behind_a_busy_process() -> None:
    # This thread and a spinning process pinned to one CPU: both always runnable, the
    # scheduler shares the CPU, so this thread spends a good part of the time waiting for it.
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity")
    pid = os.getpid()
    old = os.sched_getaffinity(0)
    cpu = min(old)
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    try:
        time.sleep(0.2)  # the spinner is up and running
        os.sched_setaffinity(0, {cpu})
        a = runqueue_wait(pid)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:
            pass
        b = runqueue_wait(pid)
    finally:
        os.sched_setaffinity(0, old)
        spinner.kill()
        spinner.wait()
    d = runqueue_between(a, b)
    assert d["runqueue_wait_pct"] > 10.0, d  # about half, with the CPU shared two ways
