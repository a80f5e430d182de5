"""``voxgate bench webrtc``: browser legs over real WebRTC on loopback.

The gateway runs as ``voxgate serve`` in a subprocess (embedded worker, the bundled voice), so
its CPU is its own and can be read from ``/proc``; the callers are aiortc clients in this
process (:mod:`voxgate.bench.webrtc_client` — what the softphone page does).

1. **Connect to first audio** (warm worker): ``--calls`` sequential calls of each of two client
   kinds, interleaved — a bare audio client (no data channel) and the softphone's (audio and a
   "control" data channel) — silent microphone, each hung up at its first audible frame, as an
   impatient caller does. Every phase is timed from the moment the offer is sent: answer,
   connected (ICE + DTLS), first RTP packet at the client, first decoded frame, first audible
   frame; p50/p95/max and the sorted samples, so a bimodal tail shows. Target p95 ≤ 400 ms for
   both kinds (issue 17). No greeting is heard to the end, so none lands in the worker's
   render cache: every first chunk is synthesised cold (``VOXGATE_SYNTH_CACHE_MB=0`` in the
   environment makes sure of it). The tail that used to be there (0.5–4 s in one call of
   three) was the worker still rendering the greetings of the calls hung up before: see
   ``WebRtcLeg.cancel_synthesis`` and docs/bench-report/webrtc.md.
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

TTFA_TARGET_MS = 400.0
HOLD_FRACTION = 0.95


@dataclass
class BenchOptions:
    calls: int = 20
    steps: tuple[int, ...] = (5, 10, 20, 30, 40)
    window_s: float = 5.0
    quick: bool = False
    keep_dir: str | None = None


PHASES = ("connected_ms", "first_rtp_ms", "first_frame_ms", "first_audio_ms")
KINDS = ("no_datachannel", "datachannel")


async def _connect_trial(http: str, *, datachannel: bool = True) -> dict[str, float]:
    """One call, as a browser makes it: every phase in ms from the moment the offer is sent
    (the POST starts) — answer, connected (ICE + DTLS), the first RTP packet at the receiver,
    the first decoded frame, the first audible frame (the greeting)."""
    from aiortc import RTCSessionDescription

    from voxgate.bench.webrtc_client import WebRtcClient

    client = WebRtcClient(http, datachannel=datachannel)
    try:
        client.pc.addTrack(client.mic)
        await client.pc.setLocalDescription(await client.pc.createOffer())
        t_offer = client.t_start = time.monotonic()
        status, body = await client.post_offer(client.pc.localDescription.sdp)
        if status != 200:
            raise RuntimeError(f"offer refused: {status} {body}")
        t_answer = time.monotonic()
        await client.pc.setRemoteDescription(
            RTCSessionDescription(sdp=str(body["sdp"]), type="answer")
        )
        await client.wait_audio(timeout=10)

        def ms(t: float | None) -> float:
            return (t - t_offer) * 1000 if t is not None else float("nan")

        return {
            "answer_ms": ms(t_answer),
            "connected_ms": ms(client.connected_at),
            "first_rtp_ms": ms(client.first_rtp_at),
            "first_frame_ms": ms(client.heard.first_frame_at),
            "first_audio_ms": ms(client.heard.first_audio_at),
        }
    finally:
        await client.hangup()


async def _ttfa_phase(http: str, calls: int) -> tuple[dict[str, list[dict[str, float]]], list[str]]:
    """``calls`` trials of each client kind, interleaved (same conditions for both)."""
    results: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    errors: list[str] = []
    for _ in range(calls):
        for kind in KINDS:
            try:
                trial = await _connect_trial(http, datachannel=kind == "datachannel")
                results[kind].append(trial)
            except Exception as exc:  # a failed call is a result, not the end of the run
                errors.append(f"{kind}: {type(exc).__name__}: {exc}")
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
        steps = (
            asyncio.run(_concurrency_phase(http, gw, opts.steps, opts.window_s))
            if opts.steps
            else []
        )
        cond["loadavg_1m_at_end"] = os.getloadavg()[0]
    finally:
        rc = gw.stop()
    # The headline figures are the softphone's (data channel) client, as before issue 17.
    dc = trials["datachannel"]
    ttfa = [t["first_audio_ms"] for t in dc]
    held = [s for s in steps if s["held"]]
    first_audio = {kind: phase_stats(trials[kind]) for kind in KINDS}
    return {
        "conditions": cond,
        "gateway_ready_s": round(ready_s, 2),
        "connect_to_first_audio_ms": percentiles(ttfa),
        "offer_round_trip_ms": percentiles([t["answer_ms"] for t in dc]),
        "answer_to_first_audio_ms": percentiles([t["first_audio_ms"] - t["answer_ms"] for t in dc]),
        "first_audio": first_audio,
        "errors": errors,
        "concurrency": steps,
        "max_legs_held": max((s["legs"] for s in held), default=0),
        "samples": {"connect_to_first_audio_ms": sorted(ttfa)},
        "targets": {"connect_to_first_audio_p95_ms": TTFA_TARGET_MS},
        "met": {
            "connect_to_first_audio": not errors
            and all(
                first_audio[k]["first_audio_ms"]["n"] == opts.calls
                and first_audio[k]["first_audio_ms"]["p95"] <= TTFA_TARGET_MS
                for k in KINDS
            ),
        },
        "gateway_exit": rc,
    }


def phase_stats(trials: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per phase: p50/p95/p99/mean, the max, and the sorted samples (a bimodal tail shows)."""
    out: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        vals = [t[phase] for t in trials if t[phase] == t[phase]]  # NaN: not reached
        out[phase] = {
            **percentiles(vals),
            "max": max(vals, default=float("nan")),
            "sorted": [round(v, 1) for v in sorted(vals)],
        }
    return out


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
        "  latency, ms (warm worker, one call at a time, softphone client with a data channel):",
        row(
            "offer sent → first audio",
            r["connect_to_first_audio_ms"],
            f"  target p95 ≤ {r['targets']['connect_to_first_audio_p95_ms']:.0f} [{met}]",
        ),
        row("  offer POST → answer", r["offer_round_trip_ms"]),
        row("  answer → first audio", r["answer_to_first_audio_ms"]),
    ]
    for kind, phases in r.get("first_audio", {}).items():
        lines.append(f"  {kind.replace('_', ' ')} client, ms from the offer sent:")
        for phase, d in phases.items():
            lines.append(
                f"    {phase.removesuffix('_ms').replace('_', ' '):<14} p50 {fmt(d['p50']):>7}  "
                f"p95 {fmt(d['p95']):>7}  max {fmt(d['max']):>7}  (n={d['n']})"
            )
        audible = phases["first_audio_ms"]["sorted"]
        lines.append(f"    first audio, sorted: {' '.join(f'{v:.0f}' for v in audible)}")
    if r["errors"]:
        lines.append(f"  failed calls: {len(r['errors'])}: {r['errors'][:3]}")
    if not r["concurrency"]:
        lines.append("  concurrent legs: not run (--steps 0)")
        return "\n".join(lines)
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
        # "0": the first-audio trials only.
        opts.steps = tuple(int(x) for x in args.steps.split(",") if int(x) > 0)
    if args.quick:
        opts.quick = True
        opts.calls = min(opts.calls, 3)
        opts.steps = (2, 4)
        opts.window_s = min(opts.window_s, 2.0)
    return opts


def cmd_bench_webrtc(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    return run_cli("webrtc", lambda: run_bench(opts), format_report, args.json)
