"""The processes a benchmark starts (a gateway, a worker, sipp) and what it reads of them: CPU
per thread from /proc, readiness over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class CpuSample:
    t: float
    total: int  # utime + stime of the process, clock ticks
    threads: dict[int, tuple[str, int]]  # tid -> (comm, ticks)


def cpu_sample(pid: int) -> CpuSample:
    def ticks(stat: str) -> int:
        fields = stat[stat.rindex(")") + 2 :].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)

    t = time.monotonic()
    total = ticks(Path(f"/proc/{pid}/stat").read_text())
    threads: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            comm = (task / "comm").read_text().strip()
            threads[int(task.name)] = (comm, ticks((task / "stat").read_text()))
    return CpuSample(t, total, threads)


def cpu_between(pid: int, a: CpuSample, b: CpuSample) -> dict[str, Any]:
    """% of one core over [a, b]: the whole process, its main (event loop) thread, the rest."""
    dt = b.t - a.t
    if dt <= 0:
        return {"seconds": 0.0}

    def pct(ticks: int) -> float:
        return 100.0 * ticks / CLK_TCK / dt

    main = b.threads.get(pid, ("", 0))[1] - a.threads.get(pid, ("", 0))[1]
    total = b.total - a.total
    by_name: dict[str, int] = {}
    for tid, (comm, tk) in b.threads.items():
        if tid != pid:
            by_name[comm] = by_name.get(comm, 0) + tk - a.threads.get(tid, (comm, 0))[1]
    return {
        "seconds": round(dt, 2),
        "process_pct": pct(total),
        "event_loop_thread_pct": pct(main),
        "other_threads_pct": pct(total - main),
        "other_threads_by_name_pct": {k: round(pct(v), 2) for k, v in sorted(by_name.items())},
    }


def system_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat: how loaded the whole box was."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f)


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        # A benchmark measures from readiness on (idle CPU windows, first calls): its workers
        # warm everything before they report ready, not in the background after it.
        env = dict(os.environ if env is None else env)
        env.setdefault("VOXGATE_WORKER_WARM_BACKGROUND", "false")
        fh = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self._fh = fh
        self.p = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._fh.close()
        return self.p.returncode

    def tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


def http_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


async def ahttp_json(url: str) -> tuple[int, Any]:
    # A gateway at full load may answer slowly; that is a figure, not a reason to abort.
    return await asyncio.to_thread(http_json, url, 10.0)


def wait_ready(http: str, proc: Proc, timeout: float = 120.0) -> None:
    """Until the gateway at ``http`` answers /readyz with 200 (its worker warmed up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise RuntimeError(f"the gateway exited ({proc.p.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError):
            status, _ = http_json(f"{http}/readyz", timeout=1.0)
            if status == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"the gateway was not ready within {timeout} s:\n{proc.tail()}")
