"""Blind transfer's numbers on real SIP calls (``python -m voxgate.bench.transfer``):

- REFER → call ended: from the gateway sending the REFER (its ``transfer`` started event) to
  the call's end (``call.state`` ended, "transferred": the BYE is out), with a transferee that
  answers 202 and NOTIFYs ``100 Trying`` and ``200 OK`` at once (sipp,
  ``sip-fixtures/scenarios/refer_blind.xml``): the gateway's own share of a transfer, since
  a real transferee's wait for the target to answer comes on top;
- REFER → outcome: to the 2xx sipfrag (``transfer`` completed).

An in-process gateway (memory bus, the onnx worker, the IVR agent) on loopback; sipp places
``--calls`` calls one after the other and the benchmark transfers each once it is answered.
Prints p50/p95/p99 with the run conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.call.calls import Call
from gateway.call.control import CallStateChanged, TransferEvent
from voxgate.bench.localgw import free_port, local_gateway
from voxgate.bench.util import cpu_model, percentiles

SCENARIO = Path(__file__).resolve().parents[2] / "sip-fixtures" / "scenarios" / "refer_blind.xml"
TARGET = "sip:agent@example.test"


def _ts(call: Call, kind: type, state: str) -> float:
    for e in call.history:
        if isinstance(e, kind) and getattr(e, "state", None) == state:
            return float(e.ts)
    raise RuntimeError(f"call {call.id}: no {kind.__name__} {state}")


async def _run(calls: int) -> dict[str, Any]:
    from synth.engines import load_engine

    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is not installed (deploy/ensure-test-tools.sh installs it)")
    engine = load_engine("onnx")
    work = Path(tempfile.mkdtemp(prefix="voxgate-bench-transfer-"))
    to_end: list[float] = []
    to_outcome: list[float] = []
    async with local_gateway(engine, name="bench-transfer") as local:
        manager = local.gw.manager
        proc = await asyncio.create_subprocess_exec(
            sipp, "-sf", str(SCENARIO), f"{local.sip[0]}:{local.sip[1]}", "-nostdin",
            "-i", "127.0.0.1", "-p", str(free_port(both=True)),
            "-mp", str(free_port(even=True)), "-m", str(calls), "-l", "1", "-s", "ivr",
            "-timeout", "120s", "-timeout_error", "-trace_err",
            "-error_file", str(work / "sipp.err"),
            cwd=work, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        seen: set[str] = set()
        done: list[Call] = []
        try:
            while len(done) < calls:
                ready = [c for c in manager.calls.values()
                         if c.info.state == "answered" and c.id not in seen]  # fmt: skip
                if not ready:
                    if proc.returncode is not None:
                        raise RuntimeError(f"sipp exited {proc.returncode}; see {work}")
                    await asyncio.sleep(0.005)
                    continue
                call = ready[0]
                seen.add(call.id)
                outcome = await call.transfer(TARGET)
                if outcome.result != "completed":
                    raise RuntimeError(f"transfer {outcome}")
                done.append(call)
            await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"sipp failed ({proc.returncode}); see {work}")
    for call in done:
        start = _ts(call, TransferEvent, "started")
        to_outcome.append((_ts(call, TransferEvent, "completed") - start) * 1000)
        to_end.append((_ts(call, CallStateChanged, "ended") - start) * 1000)
    return {
        "refer_to_call_ended_ms": percentiles(to_end),
        "refer_to_outcome_ms": percentiles(to_outcome),
        "conditions": {
            "transfers": calls,
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "gateway": "in-process, memory bus, onnx worker, IVR agent; UDP on loopback",
            "transferee": "sipp refer_blind.xml: 202, NOTIFY 100, NOTIFY 200 back to back",
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.transfer", description=__doc__)
    p.add_argument("--calls", type=int, default=20, help="transfers to time")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    out = asyncio.run(_run(args.calls))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("# blind transfer (ms)")
    print(f"{'case':<22}{'n':>4}{'p50':>8}{'p95':>8}{'p99':>8}")
    for name in ("refer_to_call_ended_ms", "refer_to_outcome_ms"):
        r = out[name]
        print(f"{name[:-3]:<22}{r['n']:>4}{r['p50']:>8.1f}{r['p95']:>8.1f}{r['p99']:>8.1f}")
    print("# " + ", ".join(f"{k}: {v}" for k, v in out["conditions"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
