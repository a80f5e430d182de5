"""The options of ``voxgate bench calls|bargein|webrtc``: one definition for the command
(:mod:`voxgate.bench.commands`) and for the report, which runs the same benchmarks with the
same defaults (:mod:`voxgate.bench.report`).  Only argparse here, so ``voxgate --help`` stays
fast."""

from __future__ import annotations

import argparse


def add_calls_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench calls`` (the command and the report parse the same)."""
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--calls", type=int, default=100, help="concurrent calls (default 100)")
    p.add_argument("--rate", type=float, default=20.0, help="calls per second (default 20)")
    p.add_argument(
        "--duration", type=float, default=30.0, help="seconds each call is held (default 30)"
    )
    p.add_argument(
        "--sample-calls", type=int, default=5,
        help="of the calls, how many the Python client places and records (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--latency-calls", type=int, default=20,
        help="sequential calls for the greeting latency with a warm worker (default 20)",
    )  # fmt: skip
    p.add_argument("--idle", type=float, default=5.0, help="idle CPU baseline, s (default 5)")
    p.add_argument(
        "--redis", metavar="URL", default=None,
        help="run voxgate gateway + one voxgate worker over this Redis instead of voxgate serve",
    )  # fmt: skip
    p.add_argument("--concurrency", type=int, default=None, help="worker synth.concurrency")
    p.add_argument("--engine", default="onnx", choices=("onnx", "torch"))
    p.add_argument(
        "--greeting", default=None,
        help="IVR greeting text (e.g. 'Hello.' to measure pacing without synthesis load)",
    )  # fmt: skip
    p.add_argument(
        "--worker-nice", type=int, default=0,
        help="with --redis: run the worker process at this nice level (default 0)",
    )  # fmt: skip
    p.add_argument("--sipp", default="sipp", help="the sipp binary (default: sipp on PATH)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep logs and stats in DIR")
    p.add_argument(
        "--quick", action="store_true",
        help="a short smoke run: 6 calls at 10/s held 6 s, 3 latency calls",
    )  # fmt: skip


def add_bargein_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench bargein`` (the command and the report parse the same)."""
    b.add_argument("--json", action="store_true", help="print JSON instead of a table")
    b.add_argument("--trials", type=int, default=20, help="calls with caller speech (default 20)")
    b.add_argument(
        "--echo-seconds", type=float, default=60.0,
        help="echo-only greeting audio to collect, s (default 60)",
    )  # fmt: skip
    b.add_argument("--seed", type=int, default=1, help="offsets into the greeting (default 1)")
    b.add_argument(
        "--quick", action="store_true", help="a short smoke run: 4 trials, 15 s of echo"
    )  # fmt: skip
    b.add_argument(
        "--baseline", action="store_true",
        help="interleave as many trials with the detector behind the jitter buffer "
        "(bargein.on_arrival = false): a same-run baseline",
    )  # fmt: skip


def add_webrtc_arguments(w: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench webrtc`` (the command and the report parse the same)."""
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w.add_argument(
        "--calls", type=int, default=20, help="sequential calls for connect → first audio (20)"
    )
    w.add_argument(
        "--steps", default=None, metavar="N,N,...",
        help="concurrent legs to hold, in steps (default 5,10,20,30,40)",
    )  # fmt: skip
    w.add_argument("--window", type=float, default=5.0, help="seconds measured per step (5)")
    w.add_argument("--quick", action="store_true", help="a short smoke run: 3 calls, 2 and 4 legs")


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench agent`` (the llm agent's voice-to-voice latency)."""
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--trials", type=int, default=20, help="questions at each concurrency level (default 20)"
    )
    p.add_argument(
        "--concurrency", default="1,2,4", metavar="K,K,...",
        help="simultaneous conversations per level (default 1,2,4)",
    )  # fmt: skip
    p.add_argument(
        "--pipecat", action=argparse.BooleanOptionalAction, default=None,
        help="also measure pipecat's stock phone agent on the same questions (default: on when "
        "pipecat-ai is installed)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="the callers' pauses (default 1)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep logs in DIR")
    p.add_argument(
        "--quick", action="store_true", help="a short smoke run: 3 trials at concurrency 1"
    )  # fmt: skip
    p.add_argument(
        "--partial-every-ms", type=int, default=None, metavar="MS",
        help="experiment: the gateway decodes live captions every MS ms instead of its built-in "
        "interval (a large value: no captions)",
    )  # fmt: skip


def add_bridge_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench bridge``."""
    p.add_argument("--probe-calls", type=int, default=2, help="probe calls in part 1 (2)")
    p.add_argument("--bursts", type=int, default=60)
    p.add_argument("--clears", type=int, default=20)
    p.add_argument("--bargein-trials", type=int, default=8, help="per path (8)")
    p.add_argument(
        "--echo-s", type=float, default=60.0, help="bot talking over echo, per setting (60)"
    )
    p.add_argument("--capacity", default="10,40", help="bridged call counts, comma-separated")
    p.add_argument("--capacity-hold-s", type=float, default=20.0)
    p.add_argument(
        "--parts", default="probe,bargein,echo,capacity",
        help="which parts to run (comma-separated; default all four)",
    )  # fmt: skip
    p.add_argument("--keep-dir")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")


def add_soak_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``voxgate bench soak`` (calls renewed for minutes; leaks and leftovers)."""
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--minutes", type=float, default=30.0, help="how long calls run (default 30)")
    p.add_argument("--calls", type=int, default=50, help="calls up at once (default 50)")
    p.add_argument(
        "--life", default="20-60", metavar="MIN-MAX",
        help="each call lives a uniform random MIN-MAX seconds (default 20-60)",
    )  # fmt: skip
    p.add_argument(
        "--sample-s", type=float, default=60.0, help="seconds between samples (default 60)"
    )
    p.add_argument(
        "--redis", metavar="URL", default=None,
        help="use this Redis (under a private key prefix) instead of a private redis-server",
    )  # fmt: skip
    p.add_argument(
        "--cancel-ttl-s", type=float, default=30.0,
        help="bus.cancel_ttl_s of the gateway and worker: how long cancel markers live (30)",
    )  # fmt: skip
    p.add_argument(
        "--sip-t1-ms", type=int, default=500,
        help="gateway.sip_t1_ms: SIP T1; UDP server transactions linger 64×T1 after the last "
        "call (500: 32 s)",
    )  # fmt: skip
    p.add_argument(
        "--settle-s", type=float, default=90.0,
        help="after the last call, wait at most this long for everything to be released (90)",
    )  # fmt: skip
    p.add_argument(
        "--warmup-calls", type=int, default=1000,
        help="judge flatness only after this many calls ended (default 1000: ended calls are "
        "freed by a full collection, the first one some 500-700 calls in)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="the callers' choices (default 1)")
    p.add_argument("--engine", default="onnx", choices=("onnx", "torch"))
    p.add_argument("--keep", metavar="DIR", default=None, help="keep logs in DIR")
