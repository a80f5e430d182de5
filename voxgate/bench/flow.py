"""The call-flow engine's numbers on a real SIP call (``python -m voxgate.bench.flow``):

- key → the next prompt's first audio (the gateway's ``dtmf`` event to the prompt's
  ``utterance.started``: its first audio on the line), for a prompt from the flow file that the
  synthesis cache holds (an IVR menu's case), a prompt a local webhook answers with (the same
  text each time: cached), and a webhook prompt that is new every time (synthesised);
- the webhook's round trip (POST, signed, to a loopback aiohttp server, to the verbs checked),
  as the engine measures it: what a webhook adds to a turn.

An in-process gateway (memory bus, the onnx worker) on loopback; the project's SIP UAC keys
``--presses`` digits per case by RFC 4733, waiting for the answer's first audio each time.
Prints p50/p95/p99 with the run conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.call.calls import Call
from gateway.call.control import DtmfReceived, UtteranceStarted
from gateway.flow.engine import FlowAgent
from voxgate.bench.localgw import local_gateway
from voxgate.bench.sipclient import SipClient
from voxgate.bench.util import cpu_model, percentiles

FLOW = """
[[flows.main]]
[flows.main.gather]
num_digits = 1
finish_on_key = ""
timeout = 60
say = "Press a key."
branches = {{ "1" = "file", "2" = "{hook}/fresh", "3" = "{hook}/same" }}

[[flows.file]]
say = "You pressed one. This prompt comes from the flow file."
[[flows.file]]
redirect = "main"
"""


async def _hook(base: list[str]) -> tuple[web.AppRunner, list[float]]:
    served: list[float] = []
    count = [0]

    async def handle(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        await request.read()
        count[0] += 1
        text = (
            f"This answer is number {count[0]} from the webhook."
            if request.match_info["name"] == "fresh"
            else "This answer comes from the webhook, the same each time."
        )
        resp = web.json_response([{"say": text}, {"redirect": "main"}])
        served.append(time.perf_counter() - t0)
        return resp

    app = web.Application()
    app.router.add_post("/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base.append(f"http://127.0.0.1:{port}")
    return runner, served


def _started_after(call: Call, ts: float, words: str = "") -> UtteranceStarted | None:
    return next((e for e in call.history if isinstance(e, UtteranceStarted) and e.ts > ts
                 and words in e.text), None)  # fmt: skip


async def _run(presses: int) -> dict[str, Any]:
    from synth.engines import load_engine

    base: list[str] = []
    runner, served = await _hook(base)
    work = Path(tempfile.mkdtemp(prefix="voxgate-bench-flow-"))
    flow_file = work / "bench.toml"
    flow_file.write_text(FLOW.format(hook=base[0]))
    os.environ["VOXGATE_BENCH_FLOW_SECRET"] = "bench"
    overrides = {"agent.kind": "flow", "flow.file": str(flow_file),
                 "flow.secret_env": "VOXGATE_BENCH_FLOW_SECRET"}  # fmt: skip
    engine = load_engine("onnx")
    results: dict[str, list[float]] = {"file": [], "webhook_same": [], "webhook_fresh": []}
    round_trips: list[float] = []
    try:
        async with local_gateway(engine, name="bench-flow", overrides=overrides) as local:
            webhook = local.gw.agents.flows.webhook
            verbs = webhook.verbs

            async def timed(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await verbs(*a, **kw)
                finally:
                    round_trips.append(time.perf_counter() - t0)

            webhook.verbs = timed  # type: ignore[method-assign]
            client = await SipClient.open("127.0.0.1")
            try:
                call = await client.invite(local.sip, codecs=("PCMU",))
                if call.status != 200 or call.media is None:
                    raise RuntimeError(f"the call was not answered: {call.status}")
                (gw_call,) = local.gw.manager.calls.values()
                for _ in range(500):
                    if isinstance(gw_call.agent, FlowAgent) and _started_after(gw_call, 0):
                        break
                    await asyncio.sleep(0.01)
                # (key, case, words of the answer): the answer's start, not the menu prompt
                # queued behind the answer (which a key may start for a tick before the
                # gather takes the key and stops it).
                plan = [("1", "file", "flow file"), ("3", "webhook_same", "same each time"),
                        ("2", "webhook_fresh", "is number")]  # fmt: skip
                for i in range(presses * len(plan) + len(plan)):  # round 1 warms the cache
                    digit, case, words = plan[i % len(plan)]
                    await call.media.send_dtmf(digit, duration_ms=60)
                    key = await _wait(lambda n=i + 1: _last_key(gw_call, n))
                    started = await _wait(lambda k=key, w=words: _started_after(gw_call, k.ts, w))
                    if i >= len(plan):
                        results[case].append(started.ts - key.ts)
                    await asyncio.sleep(0.3)
                await call.bye()
            finally:
                client.close()
    finally:
        await runner.cleanup()
    ms = {k: percentiles([x * 1000 for x in v]) for k, v in results.items()}
    return {
        "key_to_first_audio_ms": ms,
        "webhook_round_trip_ms": percentiles([x * 1000 for x in round_trips[3:]]),
        "webhook_server_ms": percentiles([x * 1000 for x in served[3:]]),
        "conditions": {
            "presses_per_case": presses,
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "engine": "onnx (en_US-joe-medium), in-process worker, memory bus",
            "webhook": "aiohttp on 127.0.0.1, HMAC-signed requests",
            "dtmf": "RFC 4733 from the project's UAC, 60 ms presses",
        },
    }


def _last_key(call: Call, n: int) -> DtmfReceived | None:
    keys = [e for e in call.history if isinstance(e, DtmfReceived)]
    return keys[-1] if len(keys) >= n else None


async def _wait(get: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while (value := get()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the flow did not answer the key")
        await asyncio.sleep(0.005)
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.flow", description=__doc__)
    p.add_argument("--presses", type=int, default=20, help="timed key presses per case")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    out = asyncio.run(_run(args.presses))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("# call flow: key -> next prompt's first audio (ms)")
    print(f"{'case':<16}{'n':>4}{'p50':>8}{'p95':>8}{'p99':>8}")
    rows = [*out["key_to_first_audio_ms"].items(),
            ("webhook RTT", out["webhook_round_trip_ms"])]  # fmt: skip
    for name, r in rows:
        print(f"{name:<16}{r['n']:>4}{r['p50']:>8.1f}{r['p95']:>8.1f}{r['p99']:>8.1f}")
    print("# " + ", ".join(f"{k}: {v}" for k, v in out["conditions"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
