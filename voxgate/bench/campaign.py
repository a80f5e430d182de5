"""Campaign throughput on real SIP calls (``voxgate bench campaign``, or
``python -m voxgate.bench.campaign``):

- a ``voxgate serve`` process (its own CPU, read from /proc) runs one campaign of ``--contacts``
  contacts, created over its REST API, at ``--cps`` with ``--concurrency`` (``max_concurrent``);
- every contact is a ``sip:`` URI of one sipp UAS (``sip-fixtures/campaign/answer_hangup.xml``)
  that answers at once and hangs up after ``--hold-ms``, so the dialler's concurrency is
  ``cps × call length`` up to the cap;
- the answered calls run a silent call flow (``pause``): what is measured is the dialler, the
  SIP and the media path of the gateway, not speech synthesis (each greeting costs the worker
  ~0.1 s of CPU, which would cap a 2-core box at a few calls per second on its own).

Printed, with the run conditions: the dial rate sustained (dials over the span from the first
to the last), the spacing of consecutive dials p50/p95/p99 and its minimum against ``1/cps``
(the pacer's promise), the peak of concurrent calls against ``max_concurrent``, outcomes, and
the gateway's CPU (whole process and its event-loop thread: % of a core, CPU-seconds per call).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from voxgate.bench.localgw import free_port
from voxgate.bench.procs import Proc, cpu_between, cpu_sample, http_json, system_busy, wait_ready
from voxgate.bench.util import cpu_model, percentiles

ROOT = Path(__file__).resolve().parents[2]
UAS = ROOT / "sip-fixtures" / "campaign" / "answer_hangup.xml"
SILENT_FLOW = "# voxgate bench campaign: answered calls wait quietly for the callee's BYE.\n" \
    "[[flows.main]]\npause = 120\n"  # fmt: skip


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals ``[start, end)`` open at one time."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = now = 0
    for _, step in edges:  # an end sorts before a start at the same time (-1 < 1)
        now += step
        peak = max(peak, now)
    return peak


def summarise(record: dict[str, Any], cps: float, max_concurrent: int) -> dict[str, Any]:
    """Figures from a finished campaign's record (every contact with its attempts)."""
    attempts = [a for c in record["contacts"] for a in c["attempts"]]
    starts = sorted(float(a["started_at"]) for a in attempts)
    gaps_ms = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    spans = [
        (float(a["started_at"]), float(a["ended_at"]))
        for a in attempts
        if a.get("ended_at") is not None
    ]
    span_s = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    outcomes: dict[str, int] = {}
    for a in attempts:
        key = str(a["outcome"])
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        "attempts": len(attempts),
        "dials_per_s": round((len(starts) - 1) / span_s, 2) if span_s > 0 else None,
        "dial_gap_ms": percentiles(gaps_ms) if gaps_ms else {},
        "dial_gap_min_ms": round(min(gaps_ms), 2) if gaps_ms else None,
        "cps_interval_ms": round(1000 / cps, 2),
        "peak_concurrent": peak_overlap(spans),
        "max_concurrent": max_concurrent,
        "call_s": percentiles([e - s for s, e in spans]) if spans else {},
        "outcomes": outcomes,
        "span_s": round(span_s, 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is not installed (deploy/ensure-test-tools.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="vg-bench-campaign-"))
    flow = work / "silent.toml"
    flow.write_text(SILENT_FLOW)
    sip_port = free_port(both=True)
    http_port = free_port(socket.SOCK_STREAM)
    uas_port = free_port(both=True)
    http = f"http://127.0.0.1:{http_port}"
    gw = Proc(
        [sys.executable, "-m", "voxgate.cli", "serve",
         "--sip-listen", f"127.0.0.1:{sip_port}", "--http-listen", f"127.0.0.1:{http_port}",
         "--gateway-max-calls", str(args.concurrency + 50),
         "--gateway-rtp-port-min", "30000", "--gateway-rtp-port-max", "39999",
         "--agent-kind", "flow", "--flow-file", str(flow),
         "--campaign-db", str(work / "campaigns.sqlite"), "--log-level", "warning"],
        work / "gateway.log", dict(os.environ),
    )  # fmt: skip
    uas: Proc | None = None
    try:
        t0 = time.monotonic()
        wait_ready(http, gw)
        ready_s = time.monotonic() - t0
        uas = Proc(
            [sipp, "-sf", str(UAS), "-i", "127.0.0.1", "-p", str(uas_port),
             "-mp", str(free_port(even=True)), "-d", str(args.hold_ms), "-nostdin",
             "-m", str(args.contacts), "-max_socket", "4096", "-timeout", "600s"],
            work / "sipp.log",
        )  # fmt: skip
        time.sleep(0.5)
        body = {
            "agent": {"kind": "flow"},
            "cps": args.cps,
            "max_concurrent": args.concurrency,
            "ring_timeout_s": 10,
            "contacts": [
                {"to": f"sip:c{i}@127.0.0.1:{uas_port}", "vars": {}} for i in range(args.contacts)
            ],
        }
        busy0 = system_busy()
        a = cpu_sample(gw.pid)
        created = _post(f"{http}/api/campaigns", body)
        cid = created["id"]
        deadline = time.monotonic() + args.contacts / args.cps + args.hold_ms / 1000 + 120
        while True:
            _, rec = http_json(f"{http}/api/campaigns/{cid}?limit=0", timeout=10)
            if rec and rec["state"] in ("done", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"campaign not done in time: {rec and rec['totals']}")
            time.sleep(0.5)
        b = cpu_sample(gw.pid)
        busy1 = system_busy()
        _, record = http_json(f"{http}/api/campaigns/{cid}", timeout=30)
        cpu = cpu_between(gw.pid, a, b)
        figures = summarise(record, args.cps, args.concurrency)
        calls = max(figures["attempts"], 1)
        cpu_s = cpu["process_pct"] / 100 * cpu["seconds"]
        loop_s = cpu["event_loop_thread_pct"] / 100 * cpu["seconds"]
        box = 100.0 * (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
        return {
            "conditions": {
                "cpu": cpu_model(),
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "contacts": args.contacts,
                "cps": args.cps,
                "max_concurrent": args.concurrency,
                "hold_ms": args.hold_ms,
                "agent": "flow (silent pause)",
                "gateway_ready_s": round(ready_s, 1),
                "box_busy_pct": round(box, 1),
                "load_at_end": os.getloadavg()[0],
            },
            **figures,
            "gateway_cpu": {
                "seconds": cpu["seconds"],
                "process_pct": round(cpu["process_pct"], 1),
                "event_loop_thread_pct": round(cpu["event_loop_thread_pct"], 1),
                "cpu_s_per_call": round(cpu_s / calls, 4),
                "event_loop_cpu_s_per_call": round(loop_s / calls, 4),
            },
        }
    finally:
        if uas is not None:
            uas.stop()
        gw.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    g = r["dial_gap_ms"]
    cpu = r["gateway_cpu"]
    lines = [
        f"voxgate bench campaign — {c['contacts']} contacts at cps {c['cps']:g}, max_concurrent "
        f"{c['max_concurrent']}, callee hangs up after {c['hold_ms']} ms; agent {c['agent']}",
        f"  {c['cpu']}, {c['cores']} cores, Python {c['python']}; box busy {c['box_busy_pct']} % "
        f"during the run, load {c['load_at_end']:.2f} at the end",
        f"  dials sustained      {r['dials_per_s']} /s over {r['span_s']} s "
        f"({r['attempts']} attempts)",
        f"  dial spacing (ms)    p50 {g['p50']:.1f}  p95 {g['p95']:.1f}  p99 {g['p99']:.1f}  "
        f"min {r['dial_gap_min_ms']}  (1/cps = {r['cps_interval_ms']})",
        f"  concurrent calls     peak {r['peak_concurrent']} "
        f"(max_concurrent {r['max_concurrent']})",
        f"  call length (s)      p50 {r['call_s']['p50']:.2f}  p95 {r['call_s']['p95']:.2f}",
        f"  outcomes             {r['outcomes']}",
        f"  gateway CPU          {cpu['process_pct']} % of a core (event loop "
        f"{cpu['event_loop_thread_pct']} %) over {cpu['seconds']} s; "
        f"{cpu['cpu_s_per_call']} CPU-s per call ({cpu['event_loop_cpu_s_per_call']} on the loop)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxgate bench campaign", description=__doc__.split("\n")[0])
    p.add_argument("--contacts", type=int, default=300, help="contacts (default 300)")
    p.add_argument("--cps", type=float, default=20.0, help="campaign cps (default 20)")
    p.add_argument("--concurrency", type=int, default=100, help="max_concurrent (default 100)")
    p.add_argument("--hold-ms", type=int, default=6000, help="callee hangs up after (6000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
