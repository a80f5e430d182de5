"""One cold start of a synthesis worker in this fresh process, for ``voxgate bench synth``.

It follows ``voxgate worker`` step by step (:func:`synth.commands.cmd_worker` and
:func:`synth.app.run_worker`): the worker, DSP and HTTP modules are imported, the engine is
built on a thread, the worker warms up and reports ready. The bus is in memory (no Redis round
trips in the figures) and no HTTP listener is started. ``--old`` is the way before issue 17: the
graph split from the voice file (no cache), all of the warm-up before ready. The graph cache is
the default one, under ``$XDG_CACHE_HOME`` (the bench sets it).

(Loading the engine on a thread during the imports was tried: onnxruntime's session building
did not overlap the GIL-bound imports enough to show in 10 interleaved runs, so it is not done.)

Prints one JSON line: ``time.time()`` stamps (the parent timed the spawn) and phase durations.
Top-level imports stay minimal: importing is part of what is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.cold_child")
    p.add_argument("--voice", default="", help="a Piper .onnx path; empty: the bundled voice")
    p.add_argument("--old", action="store_true", help="no graph cache, full warm-up first")
    args = p.parse_args(argv)

    from voxgate.contract.config import load

    cfg = load(None, env={}, overrides={"synth.voice": args.voice})
    # What voxgate worker imports before building its engine: synth.app (the worker and its
    # DSP), synth.health (aiohttp), the Redis client.
    import redis.asyncio  # noqa: F401

    import synth.app
    import synth.health
    from voxgate.contract.runtime import run

    imports_at = time.time()
    result: dict[str, Any] = {}

    def build() -> Any:
        if args.old:
            from synth.engines.onnx_engine import OnnxEngine

            return OnnxEngine(cfg.synth.voice, cfg.synth.threads, cache=False)
        return synth.app.build_engine(cfg)

    async def child() -> int:
        result.update(await _start(build, not args.old, imports_at))
        return 0

    run(child())  # uvloop, as voxgate worker
    print(json.dumps(result))
    return 0


async def _start(
    build: Callable[[], Any], background_warm: bool, imports_at: float
) -> dict[str, Any]:
    import asyncio
    import uuid

    from synth.engines.base import Engine
    from synth.worker import UtteranceStats, Worker
    from voxgate.bench.synth import PROMPTS
    from voxgate.contract.bus.memory import MemoryBus
    from voxgate.contract.bus.schema import SpeakRequest

    engine: Engine = await asyncio.to_thread(build)
    stats: list[UtteranceStats] = []
    bus = MemoryBus()
    await bus.start()
    worker = Worker(
        bus, engine, name="cold", on_stats=stats.append, background_warm=background_warm
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    while not worker.ready:
        await asyncio.sleep(0.002)
        if task.done():
            await task  # raises what failed
    ready_at = time.time()

    async def speak(n: int) -> float:
        await bus.submit(SpeakRequest(call_id=f"cold-{n}", utterance_id=uuid.uuid4().hex,
                                      text=PROMPTS[0], profile="narrowband"))  # fmt: skip
        deadline = time.monotonic() + 60
        while len(stats) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from the worker")
            await asyncio.sleep(0.002)
        s = stats[n - 1]
        if s.first_audio_at is None:
            raise RuntimeError(f"request {n} ended {s.outcome} without audio")
        return (s.first_audio_at - s.read_at) * 1000

    first = await speak(1)  # sent the moment the worker is ready, as a waiting call would be
    await worker.fully_warm.wait()
    fully_at = time.time()
    steady = await speak(2)
    stop.set()
    await task
    await bus.close()
    return {
        "imports_at": imports_at,
        "engine_s": getattr(engine, "load_s", float("nan")),
        "engine_how": getattr(engine, "load_how", ""),
        "warm_first_s": worker.warm_first_s,
        "warm_rest_s": worker.warm_rest_s,
        "ready_at": ready_at,
        "fully_warm_at": fully_at,
        "ttfa_first_ms": first,
        "ttfa_warm_ms": steady,
    }


if __name__ == "__main__":
    sys.exit(main())
