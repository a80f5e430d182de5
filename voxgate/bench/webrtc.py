"""``voxgate bench webrtc``: browser legs over real WebRTC on loopback.

The gateway runs as ``voxgate serve`` in a subprocess (embedded worker, the bundled voice), so
its CPU is its own and can be read from ``/proc``; the callers are aiortc clients in this
process (:mod:`voxgate.bench.webrtc_client` — what the softphone page does).

1. **Connect to first audio** (warm worker): ``--calls`` sequential calls, each from before the
   offer is made to the first audible frame of the greeting at the client; broken down into
   the offer round trip (POST → answer) and the rest (ICE + DTLS + SCTP, synthesis, first
   packet). Target p50/p95 ≤ 500 ms.
2. **Concurrent legs**: calls are added in steps and held; at each step, over a window, the
   gateway's CPU (% of one core) and, at every client, the agent's audio arriving in time
   (frames received / frames due). A step *holds* when every leg connected and every client got
   ≥ 95 % of its frames; the largest step that holds is reported, with the gateway's CPU per leg.
   The window starts once every greeting has played: it measures the legs (Opus, SRTP, the
   barge-in detector, playout), not the embedded worker synthesising the greetings.
   The clients share this 2-core box with the gateway (they decode and encode Opus too), so the
   count is a floor for the gateway, which the per-leg CPU figure lets you extrapolate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxgate.bench.localgw import free_port
from voxgate.bench.procs import Proc, cpu_between, cpu_sample, wait_ready
from voxgate.bench.util import cpu_model, fmt, percentiles, run_cli

TTFA_TARGET_MS = 500.0
HOLD_FRACTION = 0.95


@dataclass
class BenchOptions:
    calls: int = 20
    steps: tuple[int, ...] = (5, 10, 20, 30, 40)
    window_s: float = 5.0
    quick: bool = False
    keep_dir: str | None = None


async def _connect_trial(http: str) -> dict[str, float]:
    from voxgate.bench.webrtc_client import WebRtcClient

    client = WebRtcClient(http)
    try:
        t0 = time.monotonic()
        client.t_start = t0
        client.pc.addTrack(client.mic)
        await client.pc.setLocalDescription(await client.pc.createOffer())
        t_offer = time.monotonic()
        status, body = await client.post_offer(client.pc.localDescription.sdp)
        if status != 200:
            raise RuntimeError(f"offer refused: {status} {body}")
        t_answer = time.monotonic()
        from aiortc import RTCSessionDescription

        await client.pc.setRemoteDescription(
            RTCSessionDescription(sdp=str(body["sdp"]), type="answer")
        )
        first = await client.wait_audio(timeout=10)
        return {
            "connect_to_first_audio_ms": first * 1000,
            "offer_round_trip_ms": (t_answer - t_offer) * 1000,
            "answer_to_first_audio_ms": (client.heard.first_audio_at or 0) * 1000 - t_answer * 1000,
        }
    finally:
        await client.hangup()


async def _ttfa_phase(http: str, calls: int) -> tuple[list[dict[str, float]], list[str]]:
    results: list[dict[str, float]] = []
    errors: list[str] = []
    for _ in range(calls):
        try:
            results.append(await _connect_trial(http))
        except Exception as exc:  # a failed call is a result, not the end of the run
            errors.append(f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(0.3)
    return results, errors


async def _concurrency_phase(
    http: str, gw: Proc, steps: tuple[int, ...], window_s: float
) -> list[dict[str, Any]]:
    from voxgate.bench.webrtc_client import WebRtcClient

    clients: list[WebRtcClient] = []
    out: list[dict[str, Any]] = []
    try:
        for target in steps:
            failed = 0
            t_add = time.monotonic()
            while len(clients) < target:
                client = WebRtcClient(http)
                try:
                    await client.connect(timeout=20)
                    clients.append(client)
                except Exception:
                    failed += 1
                    await client.close()
                    if failed > 3:
                        break
            add_s = time.monotonic() - t_add
            # Measure the legs, not the synthesis of their greetings (the worker shares the
            # gateway process under `voxgate serve`): wait until every greeting has played.
            await _greetings_done(clients, timeout=60.0)
            counts = [len(c.heard.frames) for c in clients]
            a = cpu_sample(gw.pid)
            t0 = time.monotonic()
            await asyncio.sleep(window_s)
            cpu = cpu_between(gw.pid, a, cpu_sample(gw.pid))
            due = (time.monotonic() - t0) * 50  # 20 ms frames
            fractions = [
                (len(c.heard.frames) - n) / due for c, n in zip(clients, counts, strict=True)
            ]
            worst = min(fractions) if fractions else 0.0
            held = failed == 0 and len(clients) == target and worst >= HOLD_FRACTION
            out.append({
                "legs": len(clients), "target": target, "connect_failures": failed,
                "add_s": round(add_s, 2), "gateway_cpu_pct": round(cpu["process_pct"], 1),
                "gateway_cpu_pct_per_leg": round(cpu["process_pct"] / max(len(clients), 1), 2),
                "worst_client_frames_pct": round(100 * worst, 1),
                "held": held,
            })  # fmt: skip
            if not held:
                break
    finally:
        for c in clients:
            await c.hangup()
    return out


async def _greetings_done(clients: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(m.get("type") == "utterance.finished" for m in c.messages) for c in clients):
            return
        await asyncio.sleep(0.2)


def conditions(opts: BenchOptions) -> dict[str, Any]:
    import aiortc

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "aiortc": aiortc.__version__,
        "mode": "voxgate serve subprocess (embedded onnx worker); aiortc clients in the bench "
        "process; loopback, host candidates only",
        "quick": opts.quick,
    }


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    cond = conditions(opts)
    work = Path(opts.keep_dir or tempfile.mkdtemp(prefix="vg-bench-webrtc-"))
    work.mkdir(parents=True, exist_ok=True)
    http_port = free_port(socket.SOCK_STREAM)
    http = f"http://127.0.0.1:{http_port}"
    max_legs = max(opts.steps) if opts.steps else 1
    argv = [
        sys.executable, "-m", "voxgate.cli", "serve",
        "--sip-listen", f"127.0.0.1:{free_port(both=True)}",
        "--http-listen", f"127.0.0.1:{http_port}",
        "--gateway-max-calls", str(max_legs + 10), "--ivr-idle-timeout-s", "0",
        "--log-level", "warning",
    ]  # fmt: skip
    gw = Proc(argv, work / "gateway.log", dict(os.environ))
    try:
        t0 = time.monotonic()
        wait_ready(http, gw)
        ready_s = time.monotonic() - t0
        trials, errors = asyncio.run(_ttfa_phase(http, opts.calls))
        steps = asyncio.run(_concurrency_phase(http, gw, opts.steps, opts.window_s))
        cond["loadavg_1m_at_end"] = os.getloadavg()[0]
    finally:
        rc = gw.stop()
    ttfa = [t["connect_to_first_audio_ms"] for t in trials]
    ttfa_stats = percentiles(ttfa)
    held = [s for s in steps if s["held"]]
    return {
        "conditions": cond,
        "gateway_ready_s": round(ready_s, 2),
        "connect_to_first_audio_ms": ttfa_stats,
        "offer_round_trip_ms": percentiles([t["offer_round_trip_ms"] for t in trials]),
        "answer_to_first_audio_ms": percentiles([t["answer_to_first_audio_ms"] for t in trials]),
        "errors": errors,
        "concurrency": steps,
        "max_legs_held": max((s["legs"] for s in held), default=0),
        "samples": {"connect_to_first_audio_ms": sorted(ttfa)},
        "targets": {"connect_to_first_audio_p95_ms": TTFA_TARGET_MS},
        "met": {
            "connect_to_first_audio": bool(ttfa)
            and not errors
            and ttfa_stats["p95"] <= TTFA_TARGET_MS,
        },
        "gateway_exit": rc,
    }


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]

    def row(name: str, d: dict[str, Any], extra: str = "") -> str:
        return (
            f"  {name:<36} p50 {fmt(d['p50']):>7}  p95 {fmt(d['p95']):>7}  p99 {fmt(d['p99']):>7}"
            f"  (n={d['n']}){extra}"
        )

    met = "met" if r["met"]["connect_to_first_audio"] else "MISSED"
    lines = [
        "voxgate bench webrtc",
        f"  conditions: {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f} → "
        f"{c.get('loadavg_1m_at_end', float('nan')):.2f}, python {c['python']}, "
        f"aiortc {c['aiortc']}" + ("; QUICK" if c["quick"] else ""),
        f"  {c['mode']}",
        "  latency, ms (warm worker, one call at a time):",
        row(
            "connect → first audio",
            r["connect_to_first_audio_ms"],
            f"  target p95 ≤ {r['targets']['connect_to_first_audio_p95_ms']:.0f} [{met}]",
        ),
        row("  offer POST → answer", r["offer_round_trip_ms"]),
        row("  answer → first audio", r["answer_to_first_audio_ms"]),
    ]
    if r["errors"]:
        lines.append(f"  failed calls: {len(r['errors'])}: {r['errors'][:3]}")
    lines.append("  concurrent legs (held = all connected, every client ≥ 95 % of frames):")
    for s in r["concurrency"]:
        lines.append(
            f"    {s['legs']:>3} legs: gateway CPU {s['gateway_cpu_pct']:5.1f} % of a core "
            f"({s['gateway_cpu_pct_per_leg']:.2f} %/leg), worst client "
            f"{s['worst_client_frames_pct']:.1f} % of frames, connect failures "
            f"{s['connect_failures']} → {'held' if s['held'] else 'NOT held'}"
        )
    lines.append(f"  most legs held: {r['max_legs_held']} (clients share the box: a floor)")
    return "\n".join(lines)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    opts = BenchOptions(calls=args.calls, window_s=args.window)
    if args.steps:
        opts.steps = tuple(int(x) for x in args.steps.split(","))
    if args.quick:
        opts.quick = True
        opts.calls = min(opts.calls, 3)
        opts.steps = (2, 4)
        opts.window_s = min(opts.window_s, 2.0)
    return opts


def cmd_bench_webrtc(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    return run_cli("webrtc", lambda: run_bench(opts), format_report, args.json)
