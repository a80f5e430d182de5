"""``voxgate bench calls``: concurrent SIP calls against a real gateway process.

One run, in this order, against a gateway started as a subprocess (so its CPU can be read from
``/proc``): ``voxgate serve`` (embedded worker, the default) or, with ``--redis``,
``voxgate gateway`` plus one ``voxgate worker`` process (gateway CPU without synthesis in it).

1. idle baseline: the gateway's CPU with no call;
2. greeting latency with a warm worker: ``--latency-calls`` sequential calls from the Python
   client (:mod:`voxgate.bench.sipclient`), first non-silent RTP packet after our ACK;
3. load: sipp places ``N - K`` calls at ``--rate`` calls/s (a uac scenario with ``-rtp_echo``,
   so RTP flows both ways) and the Python client ``K`` sample calls with kernel-timestamped
   capture; every call is held ``--duration`` s. During the plateau (all calls up) it reads
   ``GET /api/calls``, the gateway's CPU per thread, and the gateway's own media-ticker
   statistics.

Where the figures come from:
- *ticker send-time error*: the gateway's ``MediaTicker.error`` histogram (``loop.time()``
  just before each call's ``sendto`` minus its schedule), plateau delta. ``voxgate serve`` has
  no endpoint for it, so the gateway runs as ``python -m voxgate.bench.calls child STATS --
  serve ...``: the same command line through :func:`voxgate.cli.main`, with
  :class:`gateway.app.Gateway` subclassed to dump its statistics to a file twice a second
  (read-only);
- *receive jitter*: |kernel arrival − (t0 + n·20 ms)| of every packet of the sample calls;
- *underruns*: the gateway's per-call playout underruns (silence sent while an utterance was
  playing because synthesis was behind) and pacer skipped ticks (a stall: media time skipped);
  on the receive side, seq gaps and timestamp jumps of the sample calls;
- *first audio under load*: per call, the gateway's ``utterance.started`` event time minus
  ``answered_at`` (the ACK), and the sample calls' first non-silent packet after ACK.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate.bench.localgw import free_port
from voxgate.bench.procs import (
    Proc,
    ahttp_json,
    cpu_between,
    cpu_sample,
    system_busy,
    wait_ready,
)
from voxgate.bench.sipclient import ClientCall, SipClient, SipClientError
from voxgate.bench.util import (
    calibration_cpu_s,
    cpu_model,
    fmt,
    json_default,
    percentiles,
    strict_json,
)

TARGETS = {
    "calls": 100,
    "ticker_p99_ms": 2.0,
    "underruns": 0,
    "cpu_per_call_pct": 0.30,  # issue 17: event-loop thread, 100 calls with barge-in on
    "greeting_p95_ms": 300.0,
}
STATS_PERIOD_S = 0.5
GC_LONG_MS = 1.0  # collections at least this long are kept one by one (with their time)
GC_LONG_CAP = 2000
SAMPLES_CAP = 5000  # raw pacing samples kept in the JSON (quantile-decimated beyond this)

# A uac that offers PCMU + telephone-event on sipp's echo port, holds for -d ms, then BYE.
SCENARIO = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="voxgate bench calls">
  <send retrans="500">
    <![CDATA[
      INVITE sip:ivr@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:bench@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:ivr@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: <sip:bench@[local_ip]:[local_port]>
      Max-Forwards: 70
      User-Agent: sipp-bench
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=bench 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 0 101
      a=rtpmap:0 PCMU/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-15
      a=ptime:20
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true"/>
  <send>
    <![CDATA[
      ACK sip:ivr@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:bench@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:ivr@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Contact: <sip:bench@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <pause/>
  <send retrans="500">
    <![CDATA[
      BYE sip:ivr@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:bench@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:ivr@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Contact: <sip:bench@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200" crlf="true"/>
</scenario>
"""


@dataclass
class BenchOptions:
    calls: int = 100
    rate: float = 20.0
    duration: float = 30.0
    sample_calls: int = 5
    latency_calls: int = 20
    idle_s: float = 5.0
    redis: str | None = None
    concurrency: int | None = None
    engine: str = "onnx"
    quick: bool = False
    sipp: str = "sipp"
    keep_dir: str | None = None
    greeting: str | None = None
    worker_nice: int = 0
    extra_args: list[str] = field(default_factory=list)


# --- the gateway's side (runs inside the child process) ----------------------------------------
def child_main(argv: Sequence[str]) -> int:
    """``python -m voxgate.bench.calls child STATS_FILE -- <voxgate args>``."""
    stats_path, rest = argv[0], list(argv[1:])
    if rest and rest[0] == "--":
        rest = rest[1:]
    import gateway.app as app

    base = app.Gateway

    class StatsGateway(base):  # type: ignore[valid-type,misc]
        async def start(self) -> None:
            await super().start()
            self._bench_task = asyncio.create_task(_dump_stats(self, Path(stats_path)))

    app.Gateway = StatsGateway  # type: ignore[misc]
    # The same command line as `voxgate serve|gateway ...` (not voxgate.cli: a benchmark is no
    # part of the command that registers it).
    import gateway.commands
    from voxgate import serve

    parser = argparse.ArgumentParser(prog="voxgate")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.register(sub)
    gateway.commands.register(sub)
    args = parser.parse_args(rest)
    return int(args.func(args))


async def _dump_stats(gw: Any, path: Path) -> None:
    """Write the gateway's pacing/playout statistics to ``path`` every ``STATS_PERIOD_S``."""
    from gateway.call.control import UtteranceStarted

    calls: dict[str, Any] = {}
    first_audio: dict[str, float] = {}
    sub = gw.manager.subscribe_events()

    async def watch() -> None:
        async for ev in sub:
            if isinstance(ev, UtteranceStarted) and ev.call_id not in first_audio:
                first_audio[ev.call_id] = ev.ts

    watcher = asyncio.create_task(watch())
    gc_rec = GcRecorder()
    gc.callbacks.append(gc_rec.callback)
    tmp = path.with_suffix(".tmp")
    try:
        while True:
            for cid, call in list(gw.manager.calls.items()):
                calls.setdefault(cid, call)
            err = gw.ticker.error
            bins = err._bins  # read-only: the histogram SendTimeStats keeps (no public view)
            nz = np.nonzero(bins)[0]
            per_call = {}
            for cid, call in calls.items():
                endpoint = getattr(call.leg, "endpoint", None)
                session = endpoint.session if endpoint is not None else None
                pacer = session.pacer if session is not None else None
                info = call.info
                per_call[cid] = {
                    "answered_at": info.answered_at,
                    "ended_at": info.ended_at,
                    "first_audio_at": first_audio.get(cid),
                    "playout_underruns": call.playout.stats.underruns,
                    "speech_frames": call.playout.stats.speech_frames,
                    "skipped_ticks": pacer.skipped_ticks if pacer is not None else 0,
                    "late_sends": pacer.late_sends if pacer is not None else 0,
                    "sent": pacer.stats().sent if pacer is not None else 0,
                }
            doc = {
                "time": time.time(),
                "live_calls": len(gw.manager.calls),
                "ticker": {
                    "bin_ms": err.bin_ms,
                    "count": err.count,
                    "max_ms": err.max_ms,
                    "bins": {str(int(i)): int(bins[i]) for i in nz},
                    "wakeups": gw.ticker.wakeups,
                    "batch_max_ms": gw.ticker.batch_max_s * 1000.0,
                    "scheduled": len(gw.ticker),
                    "timer": gw.ticker.timer_kind,
                },
                "calls": per_call,
                "gc": gc_rec.snapshot(),
            }
            tmp.write_text(json.dumps(doc))
            tmp.replace(path)
            await asyncio.sleep(STATS_PERIOD_S)
    finally:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(gc_rec.callback)
        watcher.cancel()
        await sub.aclose()


class GcRecorder:
    """The collector's pauses on the gateway's event-loop thread (``gc.callbacks``): count and
    total per generation, and each pause of at least ``GC_LONG_MS`` with its wall time, so the
    benchmark can tell a stall of the media ticker that a collection caused from one it did not
    (preemption: see ``runqueue_wait``)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.total_ms = [0.0, 0.0, 0.0]
        self.long: list[tuple[float, int, float]] = []  # (wall time at its end, generation, ms)
        self._t0: float | None = None

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        ms = (time.perf_counter() - self._t0) * 1000.0
        self._t0 = None
        gen = int(info.get("generation", 2))
        self.count[gen] += 1
        self.total_ms[gen] += ms
        if ms >= GC_LONG_MS and len(self.long) < GC_LONG_CAP:
            self.long.append((time.time(), gen, ms))

    def snapshot(self) -> dict[str, Any]:
        return {"count": list(self.count), "total_ms": list(self.total_ms), "long": list(self.long)}


def gc_window(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    """The collector's pauses between two stats dumps (``a`` None: since the start)."""
    ga, gb = (a or {}).get("gc"), (b or {}).get("gc")
    if not gb:
        return {}
    t_a = (a or {}).get("time", -math.inf) if ga else -math.inf
    t_b = b.get("time", math.inf) if b else math.inf
    count_a = ga["count"] if ga else [0, 0, 0]
    total_a = ga["total_ms"] if ga else [0.0, 0.0, 0.0]
    long = [ms for t, _, ms in gb["long"] if t_a < t <= t_b]
    return {
        "collections_by_generation": [
            int(x - y) for x, y in zip(gb["count"], count_a, strict=True)
        ],
        "total_ms_by_generation": [
            round(x - y, 3) for x, y in zip(gb["total_ms"], total_a, strict=True)
        ],
        "max_ms": max(long, default=0.0),
        f"pauses_ge_{GC_LONG_MS:g}_ms": len(long),
        "pauses_ge_20_ms": sum(1 for ms in long if ms >= 20.0),
        "source": "gc.callbacks in the gateway process, plateau (between the stats dumps)",
    }


def runqueue_wait(pid: int) -> tuple[float, int, int] | None:
    """(monotonic time, ns on a CPU, ns runnable but waiting for one) of ``pid``'s main thread
    (the event loop) from ``/proc/PID/task/PID/schedstat``; None where the kernel has none."""
    try:
        run, wait, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:3]
    except (OSError, ValueError):
        return None
    return time.monotonic(), int(run), int(wait)


def runqueue_between(
    a: tuple[float, int, int] | None, b: tuple[float, int, int] | None
) -> dict[str, Any]:
    """% of the interval the event-loop thread ran, and waited runnable (preempted or not yet
    scheduled: time its timers fired late for a reason that is not its own work)."""
    if a is None or b is None or b[0] <= a[0]:
        return {}
    dt = (b[0] - a[0]) * 1e9
    return {
        "on_cpu_pct": 100.0 * (b[1] - a[1]) / dt,
        "runqueue_wait_pct": 100.0 * (b[2] - a[2]) / dt,
        "source": "/proc/PID/task/PID/schedstat of the event-loop thread, plateau",
    }


# --- the benchmark's side ----------------------------------------------------------------------
def read_stats(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _delta_bins(a: dict[str, Any] | None, b: dict[str, Any]) -> npt.NDArray[np.int64]:
    """Per-bin counts of the packets ticked between two dumps of the ticker histogram."""
    tb = b["ticker"]
    bins_b = {int(k): v for k, v in tb["bins"].items()}
    bins_a = {int(k): v for k, v in (a["ticker"]["bins"] if a else {}).items()}
    size = max([*bins_b, *bins_a, 0]) + 1
    h = np.zeros(size, np.int64)
    for k, v in bins_b.items():
        h[k] += v
    for k, v in bins_a.items():
        h[k] -= v
    return h


def hist_delta(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Percentiles (bin upper edges, as ``SendTimeStats``) of the packets ticked between two
    dumps of the gateway's ticker histogram, and its per-bin counts (``counts``)."""
    h = _delta_bins(a, b)
    n = int(h.sum())
    bin_ms = float(b["ticker"]["bin_ms"])

    def pct(p: float) -> float:
        if n <= 0:
            return float("nan")
        rank = max(math.ceil(n * p / 100.0), 1)
        return (int(np.searchsorted(np.cumsum(h), rank)) + 1) * bin_ms

    top = (int(np.nonzero(h)[0].max()) + 1) * bin_ms if n > 0 else float("nan")
    nz = np.nonzero(h)[0]
    counts = [int(c) for c in h[: int(nz.max()) + 1]] if len(nz) else []
    return {
        "n": n, "p50": pct(50), "p95": pct(95), "p99": pct(99), "max": top,
        "bin_ms": bin_ms, "counts": counts,
    }  # fmt: skip


def decimate(values: list[float], cap: int = SAMPLES_CAP) -> list[float]:
    """``values`` sorted; beyond ``cap`` of them, ``cap`` evenly spaced order statistics (the
    distribution's shape and quantiles are kept, the time order is not)."""
    s = sorted(values)
    if len(s) <= cap:
        return s
    idx = np.linspace(0, len(s) - 1, cap).round().astype(np.int64)
    return [s[int(i)] for i in idx]


def conditions(opts: BenchOptions) -> dict[str, Any]:
    cpu = cpu_model()
    sipp_version = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([opts.sipp, "-v"], capture_output=True, text=True, timeout=5)
        sipp_version = next((ln.strip() for ln in out.stdout.splitlines() if "SIPp" in ln), "")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "engine": opts.engine,
        "mode": (
            "voxgate gateway + voxgate worker over Redis (separate processes)"
            if opts.redis
            else "voxgate serve (embedded worker in the gateway process)"
        ),
        "calls": opts.calls,
        "rate_cps": opts.rate,
        "duration_s": opts.duration,
        "sample_calls": opts.sample_calls,
        "latency_calls": opts.latency_calls,
        "worker_concurrency": opts.concurrency,
        "greeting": opts.greeting or "(the IVR's default, ~9 s of speech)",
        "worker_nice": opts.worker_nice,
        "load_generator": f"{sipp_version} uac -rtp_echo" if sipp_version else "python client",
        "quick": opts.quick,
    }


def parse_sipp_stats(path: Path) -> dict[str, Any]:
    """Successful/failed calls and the most simultaneous calls from sipp's ``-trace_stat``."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return {}
    if len(lines) < 2:
        return {}
    head = lines[0].rstrip(";").split(";")
    rows = [dict(zip(head, ln.rstrip(";").split(";"), strict=False)) for ln in lines[1:]]

    def num(row: dict[str, str], key: str) -> int:
        with contextlib.suppress(ValueError, KeyError):
            return int(row[key])
        return 0

    last = rows[-1]
    return {
        "successful": num(last, "SuccessfulCall(C)"),
        "failed": num(last, "FailedCall(C)"),
        "created": num(last, "TotalCallCreated"),
        "max_concurrent": max(num(r, "CurrentCall") for r in rows),
        "retransmissions": num(last, "Retransmissions(C)"),
    }


@dataclass
class SampleResult:
    first_audio_ms: float | None = None
    jitter_ms: list[float] = field(default_factory=list)
    packets: int = 0
    seq_gaps: int = 0
    skipped_frames: int = 0
    bye_status: int = 0
    error: str | None = None


async def _sample_call(
    client: SipClient, target: tuple[str, int], delay: float, hold: float
) -> SampleResult:
    res = SampleResult()
    await asyncio.sleep(delay)
    try:
        call = await client.invite(target, codecs=("PCMU",))
    except SipClientError as exc:
        res.error = str(exc)
        return res
    if call.status != 200:
        res.error = f"status {call.status}"
        return res
    end = time.monotonic() + hold
    with contextlib.suppress(TimeoutError):
        p = await call.media.wait_for_audio(after=call.acked_at, timeout=hold)
        res.first_audio_ms = (p.arrival - call.acked_at) * 1000.0
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    pkts = call.media.audio()
    res.jitter_ms = call.media.pacing_errors_ms(pkts)
    chk = call.media.check(pkts)
    res.packets, res.seq_gaps, res.skipped_frames = chk.packets, chk.seq_gaps, chk.skipped_frames
    try:
        res.bye_status = await call.bye()
    except SipClientError as exc:
        res.error = str(exc)
    return res


async def _latency_calls(target: tuple[str, int], n: int) -> tuple[list[float], list[str]]:
    client = await SipClient.open("127.0.0.1")
    out: list[float] = []
    errors: list[str] = []
    try:
        for _ in range(n):
            call: ClientCall | None = None
            try:
                call = await client.invite(target, codecs=("PCMU",))
                if call.status != 200:
                    errors.append(f"status {call.status}")
                    continue
                p = await call.media.wait_for_audio(after=call.acked_at, timeout=5.0)
                out.append((p.arrival - call.acked_at) * 1000.0)
            except (SipClientError, TimeoutError) as exc:
                errors.append(str(exc))
            finally:
                if call is not None and call.status == 200:
                    with contextlib.suppress(SipClientError):
                        await call.bye()
            await asyncio.sleep(0.3)  # let the cancelled greeting leave the worker
    finally:
        client.close()
    return out, errors


async def _load_phase(
    opts: BenchOptions,
    gw: Proc,
    sip_target: tuple[str, int],
    http: str,
    stats_path: Path,
    work: Path,
    other_pids: dict[str, int],
) -> dict[str, Any]:
    k = min(opts.sample_calls, opts.calls)
    n_sipp = opts.calls - k
    ramp = opts.calls / opts.rate
    hold = opts.duration
    sipp: Proc | None = None
    sipp_stat = work / "sipp_stats.csv"
    t0 = time.monotonic()
    t0_wall = time.time()
    if n_sipp > 0:
        scen = work / "uac_echo.xml"
        scen.write_text(SCENARIO)
        argv = [
            opts.sipp, f"{sip_target[0]}:{sip_target[1]}", "-sf", str(scen),
            "-i", "127.0.0.1", "-p", str(free_port()), "-mp", str(free_port(even=True)),
            "-rtp_echo", "-r", f"{opts.rate:g}", "-rp", "1000", "-m", str(n_sipp),
            "-l", str(n_sipp), "-d", str(int(hold * 1000)), "-nostdin",
            "-trace_stat", "-stf", str(sipp_stat), "-fd", "1",
            "-trace_err", "-error_file", str(work / "sipp_errors.log"),
            "-timeout", f"{int(ramp + hold + 60)}s", "-timeout_error",
        ]  # fmt: skip
        sipp = Proc(argv, work / "sipp.out")
    client = await SipClient.open("127.0.0.1")
    # The sample calls are spread over the ramp like sipp's (one every calls/rate/K s).
    samples = [
        asyncio.create_task(_sample_call(client, sip_target, i * ramp / max(k, 1), hold))
        for i in range(k)
    ]
    plateau_start = t0 + ramp + 1.0
    plateau_end = t0 + hold - 0.5
    if plateau_end - plateau_start < 1.0:
        plateau_end = plateau_start + 1.0  # too short to hold everyone: measure a second
    held: list[int] = []
    await asyncio.sleep(max(0.0, plateau_start - time.monotonic()))
    if sipp is not None:
        with contextlib.suppress(OSError):
            sipp_a = cpu_sample(sipp.pid)
    sys_a = system_busy()
    cpu_a = cpu_sample(gw.pid)
    sched_a = runqueue_wait(gw.pid)
    others_a = {name: cpu_sample(pid) for name, pid in other_pids.items()}
    stats_a = read_stats(stats_path)
    while time.monotonic() < plateau_end - 0.25:
        status, body = await ahttp_json(f"{http}/api/calls")
        if status == 200 and isinstance(body, dict):
            held.append(len(body.get("calls", [])))
        await asyncio.sleep(min(0.5, max(0.0, plateau_end - time.monotonic())))
    await asyncio.sleep(max(0.0, plateau_end - time.monotonic()))
    cpu_b = cpu_sample(gw.pid)
    sched_b = runqueue_wait(gw.pid)
    sys_b = system_busy()
    others = {
        name: cpu_between(pid, others_a[name], cpu_sample(pid)) for name, pid in other_pids.items()
    }
    if sipp is not None and sipp.p.poll() is None:
        with contextlib.suppress(OSError):
            others["sipp"] = cpu_between(sipp.pid, sipp_a, cpu_sample(sipp.pid))
    stats_b = read_stats(stats_path)
    sample_results = await asyncio.gather(*samples)
    client.close()
    sipp_rc: int | None = None
    if sipp is not None:
        try:
            sipp_rc = await asyncio.to_thread(sipp.p.wait, 60)
        except subprocess.TimeoutExpired:
            sipp_rc = sipp.stop()
        sipp.stop()
    await asyncio.sleep(2 * STATS_PERIOD_S + 0.2)  # the last calls' stats reach the file
    stats_end = read_stats(stats_path)
    return {
        "k": k,
        "n_sipp": n_sipp,
        "held": held,
        "cpu": cpu_between(gw.pid, cpu_a, cpu_b),
        "sched": runqueue_between(sched_a, sched_b),
        "cpu_others": others,
        "system_busy_pct": 100.0 * (sys_b[0] - sys_a[0]) / max(sys_b[1] - sys_a[1], 1),
        "t0_wall": t0_wall,
        "stats_a": stats_a,
        "stats_b": stats_b,
        "stats_end": stats_end,
        "samples": sample_results,
        "sipp": parse_sipp_stats(sipp_stat) if sipp is not None else {},
        "sipp_rc": sipp_rc,
        "sipp_tail": sipp.tail(5) if sipp is not None and sipp_rc else "",
    }


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    if shutil.which(opts.sipp) is None and opts.calls > opts.sample_calls:
        raise RuntimeError(f"{opts.sipp} not found; install sip-tester or use --sample-calls N")
    cond = conditions(opts)
    work = Path(opts.keep_dir or tempfile.mkdtemp(prefix="vg-bench-calls-"))
    work.mkdir(parents=True, exist_ok=True)
    sip_port = free_port(both=True)
    http_port = free_port(socket.SOCK_STREAM)
    http = f"http://127.0.0.1:{http_port}"
    stats_path = work / "gateway_stats.json"
    common = [
        "--sip-listen", f"127.0.0.1:{sip_port}", "--http-listen", f"127.0.0.1:{http_port}",
        "--gateway-max-calls", str(opts.calls + 50),
        "--gateway-rtp-port-min", "20000", "--gateway-rtp-port-max", "29999",
        "--ivr-idle-timeout-s", "0", "--log-level", "warning",
    ]  # fmt: skip
    # Synthesis options: for `voxgate serve` (its embedded worker); with --redis they go to the
    # worker process only (`voxgate gateway` has no synthesis and refuses them).
    synth = ["--engine", opts.engine]
    if opts.concurrency:
        synth += ["--concurrency", str(opts.concurrency)]
    if opts.greeting:
        common += ["--ivr-greeting", opts.greeting]
    env = dict(os.environ)
    child = [sys.executable, "-m", "voxgate.bench.calls", "child", str(stats_path), "--"]
    worker: Proc | None = None
    if opts.redis:
        prefix = f"vgbench-{os.getpid()}"
        bus = ["--redis", opts.redis, "--bus-prefix", prefix]
        gw = Proc([*child, "gateway", *common, *bus, *opts.extra_args], work / "gateway.log", env)
        nice = ["nice", "-n", str(opts.worker_nice)] if opts.worker_nice else []
        worker = Proc(
            [*nice, sys.executable, "-m", "voxgate.cli", "worker", *bus, *synth,
             "--log-level", "warning"],
            work / "worker.log", env,
        )  # fmt: skip
    else:
        gw = Proc([*child, "serve", *common, *synth, *opts.extra_args], work / "gateway.log", env)
    try:
        t_start = time.monotonic()
        wait_ready(http, gw)
        ready_s = time.monotonic() - t_start
        time.sleep(1.0)
        a = cpu_sample(gw.pid)
        time.sleep(opts.idle_s)
        idle = cpu_between(gw.pid, a, cpu_sample(gw.pid))
        sip_target = ("127.0.0.1", sip_port)
        lat, lat_errors = asyncio.run(_latency_calls(sip_target, opts.latency_calls))
        time.sleep(0.5)
        others = {"worker": worker.pid} if worker is not None else {}
        load = asyncio.run(_load_phase(opts, gw, sip_target, http, stats_path, work, others))
        cond["loadavg_1m_at_end"] = os.getloadavg()[0]
    finally:
        rc = gw.stop()
        if worker is not None:
            worker.stop()
    result = _report(opts, cond, ready_s, idle, lat, lat_errors, load)
    result["gateway_exit"] = rc
    result["work_dir"] = str(work)
    if not opts.keep_dir:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _report(
    opts: BenchOptions,
    cond: dict[str, Any],
    ready_s: float,
    idle: dict[str, Any],
    lat: list[float],
    lat_errors: list[str],
    load: dict[str, Any],
) -> dict[str, Any]:
    stats_b = load["stats_b"] or {}
    stats_end = load["stats_end"] or stats_b
    ticker = hist_delta(load["stats_a"], stats_b) if stats_b else {}
    calls = (stats_end or {}).get("calls", {})
    # Only the calls of the load phase (the latency calls came before it).
    load_calls = [c for c in calls.values() if (c["answered_at"] or 0) >= load["t0_wall"]]
    underruns = [c["playout_underruns"] for c in load_calls]
    skipped = [c["skipped_ticks"] for c in load_calls]
    first_gw = [
        (c["first_audio_at"] - c["answered_at"]) * 1000.0
        for c in load_calls
        if c["first_audio_at"] is not None and c["answered_at"] is not None
    ]
    never = sum(1 for c in load_calls if c["first_audio_at"] is None)
    samples: list[SampleResult] = load["samples"]
    jitter = [x for s in samples for x in s.jitter_ms]
    idle_pct = idle.get("process_pct", 0.0)
    plateau = load["cpu"]
    n = opts.calls
    held = load["held"]
    per_call = (plateau.get("process_pct", 0.0) - idle_pct) / n if n else 0.0
    per_call_loop = (
        (plateau.get("event_loop_thread_pct", 0.0) - idle.get("event_loop_thread_pct", 0.0)) / n
        if n
        else 0.0
    )
    greeting = percentiles(lat)
    result: dict[str, Any] = {
        "conditions": cond,
        "gateway_ready_s": round(ready_s, 2),
        "calls": {
            "target": n,
            "held_during_plateau": {
                "min": min(held) if held else 0,
                "max": max(held) if held else 0,
                "polls": len(held),
            },
            "sipp": load["sipp"],
            "sipp_exit": load["sipp_rc"],
            "sample_calls": load["k"],
            "sample_errors": [s.error for s in samples if s.error],
        },
        "pacing": {
            "ticker_send_error_ms": {
                **ticker,
                "source": "gateway MediaTicker.error histogram, plateau delta (0.1 ms bins)",
            },
            "receive_jitter_ms": {
                **percentiles(jitter),
                "max": max(jitter) if jitter else float("nan"),
                "source": "kernel arrival vs the stream's 20 ms grid, sample calls, whole call",
            },
            "ticker_batch_max_ms": stats_b.get("ticker", {}).get("batch_max_ms"),
            # What woke the ticker (gateway.media_timer): "timerfd" or "loop".
            "ticker_timer": stats_b.get("ticker", {}).get("timer"),
            "skipped_ticks_total": sum(skipped),
            # What a stall of the ticker can come from besides its own work: the collector
            # (its pauses on the loop thread) and the scheduler (the thread runnable, waiting).
            "gc_pauses": gc_window(load["stats_a"], stats_b),
            "event_loop_sched": load.get("sched", {}),
        },
        "underruns": {
            "playout_underrun_frames_total": sum(underruns),
            "calls_with_underruns": sum(1 for u in underruns if u),
            "per_call": percentiles([float(u) for u in underruns]),
            "receiver_seq_gaps": sum(s.seq_gaps for s in samples),
            "receiver_skipped_frames": sum(s.skipped_frames for s in samples),
            "source": "gateway Playout.stats.underruns per call (silence while an utterance "
            "plays: synthesis behind); receiver: seq gaps / timestamp jumps of sample calls",
        },
        "cpu": {
            "idle": idle,
            "plateau": plateau,
            "per_call_pct_core": per_call,
            "per_call_event_loop_pct_core": per_call_loop,
            # The same figure in CPU-seconds (they vary less than wall time): what the event-loop
            # thread spends per minute of one call.  The guard in make test compares it with a
            # stored budget, scaled by the calibration workload's CPU time on this machine.
            "event_loop_cpu_s_per_call_minute": per_call_loop / 100.0 * 60.0,
            "calibration_cpu_s": calibration_cpu_s(repeats=5),
            "note": (
                "process CPU includes the embedded worker's synthesis; the event-loop thread "
                "is the gateway (plus the worker's asyncio side); other threads are synthesis"
                if not opts.redis
                else "gateway process only; synthesis runs in the worker process"
            ),
        },
        "greeting": {
            "first_audio_after_ack_ms": {**greeting, "max": max(lat) if lat else float("nan")},
            "errors": lat_errors,
            "under_load_first_audio_ms": {
                **percentiles(first_gw),
                "max": max(first_gw) if first_gw else float("nan"),
                "never": never,
                "source": "gateway utterance.started − answered_at, every load-phase call",
            },
            "under_load_sample_first_audio_ms": percentiles(
                [s.first_audio_ms for s in samples if s.first_audio_ms is not None]
            ),
        },
        "targets": TARGETS,
        # Raw per-packet samples for plots (voxgate bench all --report); the ticker's own
        # histogram is pacing.ticker_send_error_ms.counts (bin_ms wide bins from 0).
        "samples": {"pacing_error_ms": decimate(jitter)},
        "samples_note": f"pacing_error_ms: receive jitter of the sample calls, {len(jitter)} "
        "packets, sorted" + (", quantile-decimated" if len(jitter) > SAMPLES_CAP else ""),
    }
    ok = result["pass"] = {
        "calls": bool(held) and min(held) >= n >= TARGETS["calls"],
        "ticker_p99": bool(ticker) and ticker.get("p99", math.inf) <= TARGETS["ticker_p99_ms"],
        "underruns": sum(underruns) == 0 and sum(skipped) == 0,
        "cpu_per_call": per_call_loop <= TARGETS["cpu_per_call_pct"],
        "greeting_p95": bool(lat) and greeting["p95"] <= TARGETS["greeting_p95_ms"],
    }
    del ok  # (kept in result)
    result["cpu"]["other_processes"] = load["cpu_others"]
    result["cpu"]["system_busy_pct_all_cores"] = load["system_busy_pct"]
    result["calls"]["load_calls_seen_by_gateway"] = len(load_calls)
    clean = strict_json(result)
    assert isinstance(clean, dict)
    return clean


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    p, u, cpu, g = r["pacing"], r["underruns"], r["cpu"], r["greeting"]
    calls = r["calls"]

    def row(name: str, d: dict[str, Any], extra: str = "") -> str:
        n = d.get("n", 0)
        return (
            f"  {name:<44}{n:>7}{fmt(d.get('p50')):>9}{fmt(d.get('p95')):>9}"
            f"{fmt(d.get('p99')):>9}{fmt(d.get('max')):>9}  {extra}"
        )

    def mark(key: str) -> str:
        return "ok" if r["pass"].get(key) else "MISSED"

    sipp = calls["sipp"] or {}
    held = calls["held_during_plateau"]
    lines = [
        f"voxgate bench calls — {c['calls']} calls at {c['rate_cps']:g}/s held "
        f"{c['duration_s']:g} s, engine {c['engine']}",
        f"  conditions: {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f} → "
        f"{c.get('loadavg_1m_at_end', float('nan')):.2f}, python {c['python']}",
        f"  gateway: {c['mode']}; load: {c['load_generator']} + {calls['sample_calls']} "
        "Python sample calls",
        "",
        f"  calls held in the plateau (GET /api/calls): min {held['min']} max {held['max']} "
        f"of {calls['target']} ({held['polls']} polls)   [{mark('calls')}]",
        f"  sipp: {sipp.get('successful', 0)} ok, {sipp.get('failed', 0)} failed, "
        f"max {sipp.get('max_concurrent', 0)} at once, "
        f"{sipp.get('retransmissions', 0)} retransmissions",
        "",
        f"  {'(ms)':<44}{'n':>7}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}",
        row(
            "ticker send-time error (gateway's own)",
            p["ticker_send_error_ms"],
            f"target p99 <= {r['targets']['ticker_p99_ms']} [{mark('ticker_p99')}]",
        ),
        row("receive jitter vs 20 ms grid (sample calls)", p["receive_jitter_ms"]),
        row(
            "first greeting packet after ACK (warm, seq.)",
            g["first_audio_after_ack_ms"],
            f"target p95 <= {r['targets']['greeting_p95_ms']:.0f} [{mark('greeting_p95')}]",
        ),
        row(
            "first audio after ACK under load (gateway)",
            g["under_load_first_audio_ms"],
            f"{g['under_load_first_audio_ms']['never']} never",
        ),
        row("first audio after ACK under load (samples)", g["under_load_sample_first_audio_ms"]),
        "",
        f"  underruns: {u['playout_underrun_frames_total']} playout frames in "
        f"{u['calls_with_underruns']} calls (synthesis behind); "
        f"{p['skipped_ticks_total']} skipped ticks (pacing stalls); receiver: "
        f"{u['receiver_seq_gaps']} seq gaps, {u['receiver_skipped_frames']} skipped frames"
        f"   [{mark('underruns')}]",
        f"  ticker ({p.get('ticker_timer') or '?'} timer) longest wake-up: "
        f"{fmt(p['ticker_batch_max_ms'], '.2f')} ms; collector pauses "
        f"max {fmt(p['gc_pauses'].get('max_ms'), '.1f')} ms, "
        f"{p['gc_pauses'].get('pauses_ge_20_ms', '-')} of 20 ms or more; event loop runnable but "
        f"waiting {fmt(p['event_loop_sched'].get('runqueue_wait_pct'))} % of the plateau",
        f"  CPU (% of one core): idle {fmt(cpu['idle'].get('process_pct'))}, plateau "
        f"{fmt(cpu['plateau'].get('process_pct'))} (event loop "
        f"{fmt(cpu['plateau'].get('event_loop_thread_pct'))}, other threads "
        f"{fmt(cpu['plateau'].get('other_threads_pct'))})",
        f"  per call: {fmt(cpu['per_call_pct_core'], '.3f')} % process, "
        f"{fmt(cpu['per_call_event_loop_pct_core'], '.3f')} % event loop "
        f"(target <= {r['targets']['cpu_per_call_pct']}) [{mark('cpu_per_call')}]; "
        f"{fmt(cpu['event_loop_cpu_s_per_call_minute'], '.3f')} event-loop CPU-s per call-minute "
        f"(calibration workload {fmt(cpu['calibration_cpu_s'], '.3f')} CPU-s)",
        f"    {cpu['note']}",
        f"  whole box busy during the plateau: {fmt(cpu['system_busy_pct_all_cores'])} % of all "
        f"cores; other processes: "
        + ", ".join(
            f"{k} {fmt(v.get('process_pct'))} %" for k, v in cpu["other_processes"].items()
        ),
    ]
    return "\n".join(lines)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    opts = BenchOptions(
        calls=args.calls,
        rate=args.rate,
        duration=args.duration,
        sample_calls=args.sample_calls,
        latency_calls=args.latency_calls,
        idle_s=args.idle,
        redis=args.redis,
        concurrency=args.concurrency,
        engine=args.engine,
        quick=args.quick,
        sipp=args.sipp,
        keep_dir=args.keep,
        greeting=args.greeting,
        worker_nice=args.worker_nice,
    )
    if args.quick:
        opts.calls = min(opts.calls, 6) if args.calls != 100 else 6
        opts.rate = 10.0 if args.rate == 20.0 else opts.rate
        opts.duration = 6.0 if args.duration == 30.0 else opts.duration
        opts.sample_calls = min(opts.sample_calls, 2)
        opts.latency_calls = min(opts.latency_calls, 3)
        opts.idle_s = min(opts.idle_s, 1.0)
    return opts


def cmd_bench_calls(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    try:
        result = run_bench(opts)
    except RuntimeError as exc:
        print(f"voxgate bench calls: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2, default=json_default))
    else:
        print(format_report(result))
    return 0


if __name__ == "__main__":  # pragma: no cover - the gateway child of the benchmark
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    print("usage: python -m voxgate.bench.calls child STATS_FILE -- <voxgate args>")
    sys.exit(2)
