"""``voxgate bench synth``: time-to-first-audio and throughput of the synthesis worker.

Runs the real worker over the in-memory bus (so the figures are the worker's own, not Redis
round trips) on a fixed set of phone-agent prompts, in one run:
- TTFA (request read → first chunk published) p50/p95/p99, streaming vs a whole-piece baseline
  (each chunker piece synthesized in one engine call, then the same DSP), and their ratio;
- RTF (engine + DSP wall time / audio seconds) for the streaming path;
- TTFA p95 with 1, 2, 4 and 8 utterances submitted at once;
- cold start: a fresh worker process from spawn to ready, the old way (split the graph and warm
  everything before ready) against the new (graph cache, cold and warm; warm-up of what the
  first request needs, the rest in the background), and the TTFA of the request sent the moment
  it is ready. Each run is its own process (:mod:`voxgate.bench.cold_child`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from synth.engines.base import Engine
from synth.worker import UtteranceStats, Worker
from voxgate.bench.util import cpu_model, percentiles
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.schema import SpeakRequest

PROMPTS = [
    "Thank you for calling Acme Bank. How can I help you today?",
    "Your current balance is $1,234.56, and your next payment is due on 03/15/2026.",
    "Please say or enter your account number, followed by the pound key.",
    "I'm sorry, I didn't catch that. Could you repeat it, please?",
    "Your appointment with Dr. Smith is confirmed for Tuesday at 3:45 PM.",
    "To hear these options again, press 9. To speak with an agent, press 0.",
    "Your confirmation code is 4 8 2 7 1. Again, that's 48271.",
    "Great, I've updated your address. Is there anything else I can help you with?",
]

TARGETS = {"ttfa_p95_1_ms": 120.0, "ttfa_p95_4_ms": 250.0, "ratio_max": 0.5, "rtf_max": 0.05}


@dataclass
class _Collector:
    stats: list[UtteranceStats] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, s: UtteranceStats) -> None:
        self.stats.append(s)
        self.changed.set()

    async def wait_for(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stats) < n:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))


async def _run_rounds(
    engine: Engine, *, whole: bool, rounds: list[list[str]], profile: str
) -> list[UtteranceStats]:
    bus = MemoryBus()
    await bus.start()
    collect = _Collector()
    worker = Worker(
        bus,
        engine,
        name="bench",
        concurrency=max(len(r) for r in rounds),
        whole=whole,
        on_stats=collect,
    )
    stop = asyncio.Event()
    # The engine was warmed once before all rounds; every round's worker starts warm.
    task = asyncio.create_task(worker.run(stop, warm=False))
    await asyncio.sleep(0)
    done = 0
    try:
        for texts in rounds:
            for text in texts:
                await bus.submit(
                    SpeakRequest(
                        call_id=f"bench-{uuid.uuid4().hex[:8]}",
                        utterance_id=uuid.uuid4().hex,
                        text=text,
                        profile=profile,  # type: ignore[arg-type]
                    )
                )
            done += len(texts)
            await collect.wait_for(done)
    finally:
        stop.set()
        await task
        await bus.close()
    return collect.stats


def _ttfa_ms(stats: list[UtteranceStats]) -> list[float]:
    return [(s.first_audio_at - s.read_at) * 1000 for s in stats if s.first_audio_at is not None]


async def bench_synth(
    engine: Engine,
    *,
    repeats: int = 3,
    levels: tuple[int, ...] = (1, 2, 4, 8),
    profile: str = "narrowband",
    cold_runs: int = 3,
) -> dict[str, Any]:
    # Cold starts first, while the bench's own engine sits idle (each is a separate process).
    voice = engine.voice if os.path.isfile(engine.voice) else ""  # "": the bundled voice
    cold = cold_start(cold_runs, voice=voice) if engine.name == "onnx" and cold_runs > 0 else {}
    # The worker's own warm-up (engine graphs and shapes, DSP designs, text frontend), exactly
    # what a worker does before it announces readiness.
    warm_s = await Worker(MemoryBus(), engine, name="bench-warmup").warmup()
    # The first real request after warm-up must be as fast as the tenth: same prompt, 10 times.
    first_ten = _ttfa_ms(
        await _run_rounds(engine, whole=False, rounds=[[PROMPTS[0]]] * 10, profile=profile)
    )
    # Interleave baseline and streaming runs so machine noise hits both alike.
    stream_stats: list[UtteranceStats] = []
    base_stats: list[UtteranceStats] = []
    for _ in range(repeats):
        stream_stats += await _run_rounds(
            engine, whole=False, rounds=[[p] for p in PROMPTS], profile=profile
        )
        base_stats += await _run_rounds(
            engine, whole=True, rounds=[[p] for p in PROMPTS], profile=profile
        )
    stream = percentiles(_ttfa_ms(stream_stats))
    base = percentiles(_ttfa_ms(base_stats))
    audio_s = sum(s.audio_s for s in stream_stats)
    compute_s = sum(s.compute_s for s in stream_stats)
    conc: dict[str, dict[str, float]] = {}
    for n in levels:
        rounds = [
            [PROMPTS[(r * n + i) % len(PROMPTS)] for i in range(n)]
            for r in range(max(repeats * 2, 24 // n))
        ]
        conc[str(n)] = percentiles(
            _ttfa_ms(await _run_rounds(engine, whole=False, rounds=rounds, profile=profile))
        )
    ratio = stream["p50"] / base["p50"] if base["p50"] else float("nan")
    result: dict[str, Any] = {
        "conditions": conditions(engine, profile, warm_s),
        "ttfa_streaming_ms": stream,
        "ttfa_baseline_ms": base,
        "ratio_p50": ratio,
        "ratio_p95": stream["p95"] / base["p95"] if base["p95"] else float("nan"),
        "rtf": compute_s / audio_s if audio_s else float("nan"),
        "audio_s": audio_s,
        "ttfa_concurrent_ms": conc,
        "first_request_ms": first_ten[0],
        "requests_2_to_10_ms": percentiles(first_ten[1:]),
        "targets": TARGETS,
        "cold_start": cold,
        # Raw per-request TTFA (ms) for plots (voxgate bench all --report): every request.
        "samples": {
            "ttfa_stream_ms": _ttfa_ms(stream_stats),
            "ttfa_baseline_ms": _ttfa_ms(base_stats),
        },
    }
    result["pass"] = {
        "ttfa_p95_1": conc.get("1", stream)["p95"] <= TARGETS["ttfa_p95_1_ms"],
        "ttfa_p95_4": conc["4"]["p95"] <= TARGETS["ttfa_p95_4_ms"] if "4" in conc else None,
        "ratio": ratio <= TARGETS["ratio_max"],
        "rtf": result["rtf"] <= TARGETS["rtf_max"],
    }
    return result


def conditions(engine: Engine, profile: str, warm_s: float) -> dict[str, Any]:
    cpu = cpu_model()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "engine": engine.name,
        "voice": engine.voice,
        "engine_rate": engine.sample_rate,
        "profile": profile,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_1m_at_start": load1,
        "python": platform.python_version(),
        "warmup_s": round(warm_s, 3),
        "bus": "memory (in-process)",
        "prompts": len(PROMPTS),
    }


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        f"voxgate bench synth — engine={c['engine']} voice={c['voice']} profile={c['profile']}",
        f"  conditions: {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f}, "
        f"python {c['python']}, warm-up {c['warmup_s']} s, bus {c['bus']}, {c['prompts']} prompts",
        "",
        f"  {'TTFA (ms)':<28}{'n':>5}{'p50':>9}{'p95':>9}{'p99':>9}",
    ]

    def row(name: str, p: dict[str, float]) -> str:
        return f"  {name:<28}{p['n']:>5}{p['p50']:>9.1f}{p['p95']:>9.1f}{p['p99']:>9.1f}"

    lines.append(row("streaming", r["ttfa_streaming_ms"]))
    lines.append(row("whole-piece baseline", r["ttfa_baseline_ms"]))
    for n, p in r["ttfa_concurrent_ms"].items():
        lines.append(row(f"streaming, {n} concurrent", p))
    t = r["targets"]
    ok = r["pass"]

    def mark(v: bool | None) -> str:
        return "n/a" if v is None else ("ok" if v else "MISSED")

    later = r["requests_2_to_10_ms"]
    lines += [
        "",
        f"  first request after warm-up: {r['first_request_ms']:.1f} ms;"
        f" requests 2-10 of the same prompt: p50 {later['p50']:.1f} ms, max {later['p99']:.1f} ms",
        f"  streaming/baseline TTFA ratio: p50 {r['ratio_p50']:.2f}  p95 {r['ratio_p95']:.2f}"
        f"   (target <= {t['ratio_max']}: {mark(ok['ratio'])})",
        f"  RTF (engine+DSP wall / audio): {r['rtf']:.4f} over {r['audio_s']:.1f} s of audio"
        f"   (target <= {t['rtf_max']}: {mark(ok['rtf'])})",
        f"  TTFA p95 at 1: target <= {t['ttfa_p95_1_ms']:.0f} ms: {mark(ok['ttfa_p95_1'])};"
        f"  at 4: target <= {t['ttfa_p95_4_ms']:.0f} ms: {mark(ok['ttfa_p95_4'])}",
    ]
    lines += format_cold(r.get("cold_start", {}))
    return "\n".join(lines)


def main_json(r: dict[str, Any]) -> str:
    return json.dumps(r, indent=2, default=float)


# --- cold start ---------------------------------------------------------------------------

COLD_MODES = {
    # name: (graph cache, warm the rest in the background)
    "old: split, full warm-up": ("none", False),
    "new: cache cold": ("cold", True),
    "new: cache warm": ("warm", True),
}
COLD_TARGET_S = 2.0


def cold_start(runs: int, *, voice: str = "", timeout_s: float = 120.0) -> dict[str, Any]:
    """Spawn → ready of fresh worker processes, ``runs`` of each mode, interleaved so machine
    noise hits all alike; and the TTFA of a request sent the moment each is ready."""
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in COLD_MODES}
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory(prefix="voxgate-cold-") as tmp:
        warm_dir = os.path.join(tmp, "warm")
        # Fill the warm cache once (not measured).
        _cold_child_run(voice, warm_dir, True, timeout_s)
        for run in range(runs):
            for name, (cache, background) in COLD_MODES.items():
                cache_dir = {
                    "none": "",
                    "cold": os.path.join(tmp, f"cold-{run}"),
                    "warm": warm_dir,
                }[cache]
                samples[name].append(_cold_child_run(voice, cache_dir, background, timeout_s))
    modes: dict[str, Any] = {}
    for name, runs_ in samples.items():
        modes[name] = {
            "start_to_ready_s": percentiles([r["ready_s"] for r in runs_]),
            "imports_s": percentiles([r["imports_s"] for r in runs_]),
            "engine_s": percentiles([r["engine_s"] for r in runs_]),
            "warm_before_ready_s": percentiles([r["warm_first_s"] for r in runs_]),
            "after_imports_to_ready_s": percentiles([r["ready_s"] - r["imports_s"] for r in runs_]),
            "fully_warm_s": percentiles([r["fully_warm_s"] for r in runs_]),
            "ttfa_first_ms": percentiles([r["ttfa_first_ms"] for r in runs_]),
            "ttfa_warm_ms": percentiles([r["ttfa_warm_ms"] for r in runs_]),
            "runs": runs_,
        }
    warm = modes["new: cache warm"]["start_to_ready_s"]
    return {
        "conditions": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "loadavg_1m_at_start": load1,
            "runs_per_mode": runs,
            "how": "python -m voxgate.bench.cold_child: `voxgate worker`'s start (imports, "
            "engine, warm-up, uvloop) on an in-memory bus (no Redis round trips), no HTTP "
            "listener; spawn timed by the parent",
        },
        "modes": modes,
        "target_s": COLD_TARGET_S,
        "pass": warm["p95"] <= COLD_TARGET_S,
    }


def _cold_child_run(
    voice: str, cache_dir: str, background: bool, timeout_s: float
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "voxgate.bench.cold_child", "--voice", voice]
    if not background:
        cmd.append("--old")
    # The worker's graph cache lives under $XDG_CACHE_HOME; none at all for the old way.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env["XDG_CACHE_HOME"] = cache_dir or os.path.join(tempfile.gettempdir(), "unused")
    spawned = time.time()
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"cold-start child failed ({out.returncode}): {out.stderr[-2000:]}")
    r: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("imports", "ready", "fully_warm"):
        r[f"{k}_s"] = r.pop(f"{k}_at") - spawned
    return r


def format_cold(c: dict[str, Any]) -> list[str]:
    if not c:
        return []
    k = c["conditions"]
    lines = [
        "",
        f"  cold start, spawn → ready ({k['runs_per_mode']} runs a mode, {k['cpu']}, "
        f"{k['cores']} cores, load {k['loadavg_1m_at_start']:.2f}; in-memory bus):",
        f"  {'mode':<28}{'ready p50':>10}{'p95':>7}{'imports':>9}{'engine':>8}{'warm':>7}"
        f"{'all warm':>9}{'TTFA#1 p50':>11}{'p95':>7}{'later':>7}",
    ]
    for name, m in c["modes"].items():
        ready = m["start_to_ready_s"]
        lines.append(
            f"  {name:<28}{ready['p50']:>9.2f}s{ready['p95']:>6.2f}s"
            f"{m['imports_s']['p50']:>8.2f}s{m['engine_s']['p50']:>7.2f}s"
            f"{m['warm_before_ready_s']['p50']:>6.2f}s{m['fully_warm_s']['p50']:>8.2f}s"
            f"{m['ttfa_first_ms']['p50']:>9.0f}ms{m['ttfa_first_ms']['p95']:>5.0f}ms"
            f"{m['ttfa_warm_ms']['p50']:>5.0f}ms"
        )
    ok = "ok" if c["pass"] else "MISSED"
    lines += [
        f"  cache-warm spawn → ready p95, target <= {c['target_s']:.0f} s: {ok}",
        "  (p50s but where marked. imports: spawn → the worker's modules imported; engine: its",
        "  load (graph split or cache, sessions); warm: warm-up before ready; all warm: spawn →",
        "  background warm-up done, the first request served meanwhile; TTFA#1: the request sent",
        "  the moment the worker was ready; later: one sent after the background warm-up)",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.synth")
    p.add_argument("--runs", type=int, default=3, help="runs a mode")
    p.add_argument("--voice", default="")
    args = p.parse_args(argv)
    print("\n".join(format_cold(cold_start(args.runs, voice=args.voice))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
