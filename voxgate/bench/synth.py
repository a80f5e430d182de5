"""``voxgate bench synth``: time-to-first-audio and throughput of the synthesis worker.

Runs the real worker over the in-memory bus (so the figures are the worker's own, not Redis
round trips) on a fixed set of phone-agent prompts, in one run:
- TTFA (request read → first chunk published) p50/p95/p99, streaming vs a whole-piece baseline
  (each chunker piece synthesized in one engine call, then the same DSP), and their ratio;
- RTF (engine + DSP wall time / audio seconds) for the streaming path;
- TTFA p95 with 1, 2, 4 and 8 utterances submitted at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
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
) -> dict[str, Any]:
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
    return "\n".join(lines)


def main_json(r: dict[str, Any]) -> str:
    return json.dumps(r, indent=2, default=float)
