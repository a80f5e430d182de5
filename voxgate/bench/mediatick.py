"""``python -m voxgate.bench.mediatick``: the gateway's media tick in process, per call-tick.

What ``voxgate bench calls`` measures from outside (a gateway process, sipp, real sockets),
taken apart: N real SIP-leg media paths (:class:`RtpEndpoint` with its :class:`RtpSession`,
a :class:`Call` from a :class:`CallManager` with its playout, media coupling and barge-in
detector on arrival) driven by one :class:`MediaTicker` on a simulated clock, with the socket
replaced by a list, so the figures are the Python work per call and per 20 ms tick without
syscalls or timer noise:

- *tick*: the ticker's wake-ups (the agent frame pulled from the call, encoded, packed and
  handed to ``sendto``; the jitter buffer's frame handed to the call);
- *arrival*: each echoed packet through ``RtpEndpoint._datagram`` (SRTP off, the latch, the
  jitter buffer's push and decode, ``Call.on_caller_packet``), as sipp's ``-rtp_echo`` sends it;
- *detect*: the barge-in batches: the manager's timer and the calls' own pulls flush them.

Workloads: ``speech`` (the agent talks the whole time, every detector runs on every frame, the
worst case with barge-in on) and ``idle`` (nobody talks: the idle gate spares the detectors).
CPU is ``time.thread_time`` per round of 20 ms of media for all calls; percentiles are over
rounds.  ``--batched/--per-call`` chooses the media tick (the same run can compare both).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode
from voxgate.bench.util import cpu_model, percentiles

Int16Array = npt.NDArray[np.int16]
RATE = 8000
SPF = 160
ROUND_S = 0.02


class _NullTransport:
    """Stands in for the UDP transport: keeps what was sent for the echo."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sent.append((data, addr))

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 0)


class _Leg:
    def __init__(self, call: Any) -> None:
        self.call = call

    async def hangup(self, reason: str) -> None:
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        return None

    def media_stats(self) -> dict[str, float]:
        return {}


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimLoop:
    """The few loop methods MediaTicker uses, on a clock the harness moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timer: tuple[float, Any, _Handle] | None = None

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, cb: Any) -> _Handle:
        h = _Handle()
        self.timer = (when, cb, h)
        return h


def speech_like(samples: int, seed: int) -> Int16Array:
    """Voiced-speech-like agent audio: harmonics of a wandering pitch under a 4 Hz syllable
    envelope, about -20 dBFS, never silent for long (the detector stays busy)."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6))
    y = 0.1 * x * env / 1.5
    return np.asarray(np.clip(y * 32767, -32768, 32767), dtype=np.int16)


@dataclass
class Options:
    calls: int = 100
    seconds: float = 20.0
    workload: str = "speech"
    batched: bool = True
    srtp: bool = False
    phase: str = "sipp"
    batch_ms: float | None = None  # the manager's detector batch timer; None: its default


def _on_audio(call: Any) -> Any:
    """The SIP leg's jitter-buffer callback (gateway.legs.sip.ua): the frame's PCM to the call."""

    def deliver(frame: Any) -> None:
        call.on_caller_audio(frame.pcm)

    return deliver


def _playout(call: Any) -> dict[str, Any]:
    """The SIP leg's playout question (gateway.legs.sip.ua), where the tree has it."""
    wanted = getattr(call, "plays_caller_out", None)
    return {} if wanted is None else {"playout_wanted": wanted}


async def _setup(opts: Options) -> tuple[Any, Any, list[Any], list[_NullTransport], SimLoop]:
    from gateway import sdp
    from gateway.call.manager import CallManager
    from gateway.legs.sip.ua import attach_source
    from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
    from voxgate.contract.bus.memory import MemoryBus
    from voxgate.contract.config import BargeinSettings

    loop = asyncio.get_running_loop()
    sim = SimLoop()
    manager = CallManager(MemoryBus(), None, bargein=BargeinSettings())
    if opts.batch_ms is not None:
        manager.detect_batch_s = opts.batch_ms / 1000.0
    try:
        ticker = MediaTicker(batched=opts.batched)  # type: ignore[call-arg]
    except TypeError:  # a tree from before the batched tick (a same-session baseline)
        ticker = MediaTicker()
    endpoints = []
    transports = []
    media_s = opts.seconds + 2.0
    offer = sdp.parse(str(sdp.make_offer("127.0.0.1", 40000, ("PCMU",), 20)))
    ans = sdp.parse(str(sdp.answer(offer, "127.0.0.1", 30000)))
    params = sdp.negotiated(offer, ans)
    for i in range(opts.calls):
        call = manager.new_call("sip", "inbound", f"sip:c{i}@bench", "sip:ivr@gw")
        call.leg = _Leg(call)
        call.set_state("answered")
        call.feed_on_arrival()
        ep = RtpEndpoint(loop)
        tr = _NullTransport()
        ep.transport = tr  # type: ignore[assignment]
        ep.configure(
            params,
            on_audio=_on_audio(call),
            on_arrival=call.on_caller_packet,
            **_playout(call),
        )
        attach_source(ep, call)
        call.set_codec(params.codec)
        if opts.workload == "speech":
            call.play_audio("agent", speech_like(int(media_s * RATE), i), barge_in=True)
        endpoints.append(ep)
        transports.append(tr)
        sim.now = i * 0.0002  # calls join over the first period, as a ramp would spread them
        ticker._ticker.add(ep, sim.now)  # on the simulated clock, not the loop's
    ticker._loop = sim  # type: ignore[assignment]
    ticker._arm()
    return manager, ticker, endpoints, transports, sim


def _echo(tr: _NullTransport) -> list[bytes]:
    """What the caller's phone sends back: the packets as sipp's ``-rtp_echo`` does, with the
    audio 18 dB down (an echo path's loss, so the echo-aware detector keeps the agent talking,
    as over the line) and its own SSRC."""
    out = []
    for data, _ in tr.sent:
        quieter = (ulaw_decode(data[12:]).astype(np.int32) >> 3).astype(np.int16)
        out.append(b"\x80" + data[1:8] + b"\x12\x34\x56\x78" + ulaw_encode(quieter))
    tr.sent.clear()
    return out


async def _run(opts: Options) -> dict[str, Any]:
    manager, ticker, endpoints, transports, sim = await _setup(opts)
    peer = ("127.0.0.1", 40000)
    rounds = int(opts.seconds / ROUND_S)
    tick_us: list[float] = []
    arrive_us: list[float] = []
    detect_us: list[float] = []
    # The detector batch also runs inside a tick (``Call.pull_audio`` flushes what arrived
    # since the last one before the agent's frame goes): timed apart, wherever it runs.
    flush = manager.flush_detection
    in_flush = [0.0]
    flushes = 0

    def timed_flush() -> None:
        nonlocal flushes
        flushes += 1
        t0 = time.thread_time()
        flush()
        in_flush[0] += time.thread_time() - t0

    manager.flush_detection = timed_flush  # type: ignore[method-assign]
    gc.collect()
    gc.freeze()  # the gateway freezes its startup heap too (gateway.app)
    clock = time.thread_time
    rng = np.random.default_rng(17)
    # Where each phone's echo comes back: right after the send (sipp's -rtp_echo on loopback),
    # or on the phone's own clock, a fixed offset per call anywhere in the 20 ms period (a
    # real caller's packets keep their own phase against the gateway's ticks).
    if opts.phase == "random":
        offsets = [float(x) for x in rng.uniform(0.0, ROUND_S, len(endpoints))]
    else:
        offsets = [0.0] * len(endpoints)
    pending: list[tuple[float, int, Any, bytes]] = []  # (arrival, order, endpoint, packet)
    order = 0
    flush_due: float | None = None  # the manager's batch timer, on the simulated clock
    batch_s = float(getattr(manager, "detect_batch_s", 0.008))
    for _ in range(rounds):
        t_tick = t_arr = t_det = 0.0
        in_flush[0] = 0.0
        end = sim.now + ROUND_S
        while True:
            # The next event in time: a ticker wake-up, a packet arriving, the batch timer.
            t_timer = sim.timer[0] + 0.0002 if sim.timer is not None else math.inf
            t_pkt = pending[0][0] if pending else math.inf
            t_flush = flush_due if flush_due is not None else math.inf
            t_next = min(t_timer, t_pkt, t_flush)
            if t_next >= end:
                break
            if t_next == t_timer:
                assert sim.timer is not None
                _, cb, handle = sim.timer
                sim.timer = None
                if handle.cancelled:
                    continue
                sim.now = t_timer  # timers fire a little late
                c0 = clock()
                f0 = in_flush[0]
                cb()
                t_tick += clock() - c0 - (in_flush[0] - f0)
                # Preparing the echo is the phone's work, not the gateway's: not timed.
                for k, (tr, ep) in enumerate(zip(transports, endpoints, strict=True)):
                    for data in _echo(tr):
                        heapq.heappush(pending, (sim.now + offsets[k], order, ep, data))
                        order += 1
            elif t_next == t_pkt:
                sim.now = max(sim.now, t_pkt)
                c1 = clock()
                while pending and pending[0][0] <= sim.now:
                    _, _, ep, data = heapq.heappop(pending)
                    ep._datagram(data, peer)
                t_arr += clock() - c1
            else:
                sim.now = max(sim.now, t_flush)
                timed_flush()  # timed in in_flush, as the flushes inside a tick
            # The manager arms its timer when the first call of a batch is staged.
            if getattr(manager, "_flush", None) is not None and flush_due is None:
                flush_due = sim.now + batch_s
            elif getattr(manager, "_flush", None) is None:
                flush_due = None
        sim.now = end
        t_det += in_flush[0]
        tick_us.append(t_tick * 1e6 / opts.calls)
        arrive_us.append(t_arr * 1e6 / opts.calls)
        detect_us.append(t_det * 1e6 / opts.calls)
    gc.unfreeze()
    warm = min(50, rounds // 5)  # the first second: caches, first allocations
    stats: dict[str, Any] = {
        "tick_us_per_call_tick": percentiles(tick_us[warm:]),
        "arrival_us_per_packet": percentiles(arrive_us[warm:]),
        "detect_us_per_call_tick": percentiles(detect_us[warm:]),
    }
    total = [a + b + c for a, b, c in zip(tick_us, arrive_us, detect_us, strict=True)][warm:]
    stats["total_us_per_call_tick"] = percentiles(total)
    mean_total = float(np.mean(total))
    # One call-tick every 20 ms: µs per call-tick / 20000 µs = share of a core per call.
    stats["pct_core_per_call_mean"] = mean_total / 200.0
    sent = sum(ep.session.pacer.stats().sent for ep in endpoints)
    skipped = sum(ep.session.pacer.skipped_ticks for ep in endpoints)
    barged = sum(c.playout.stats.interrupted for c in manager.calls.values())
    return {
        "conditions": {
            "cpu": cpu_model(),
            "python": sys.version.split()[0],
            "calls": opts.calls,
            "seconds": opts.seconds,
            "workload": opts.workload,
            "media_tick": "batched" if opts.batched else "per-call",
            "echo_phase": opts.phase,
            "detect_batch_ms": batch_s * 1000.0,
            "rounds": rounds - warm,
        },
        "stats": stats,
        "packets_sent": sent,
        "skipped_ticks": skipped,
        "calls_cut_short": barged,
        "detector_batches_per_s": flushes / (rounds * ROUND_S),
        "ticker_error_ms": ticker.error.summary(),
    }


def run(opts: Options) -> dict[str, Any]:
    try:
        import uvloop

        return uvloop.run(_run(opts))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(_run(opts))


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        f"media tick in process — {c['calls']} calls, {c['workload']}, {c['media_tick']}, "
        f"echo phase {c['echo_phase']}, {c['rounds']} rounds of 20 ms; {c['cpu']}, "
        f"python {c['python']}",
        f"  {'(µs of CPU)':34} {'p50':>8} {'p95':>8} {'p99':>8} {'mean':>8}",
    ]
    for key, label in (
        ("tick_us_per_call_tick", "tick, per call-tick"),
        ("arrival_us_per_packet", "arrival, per packet"),
        ("detect_us_per_call_tick", "barge-in batch, per call-tick"),
        ("total_us_per_call_tick", "total, per call-tick"),
    ):
        s = r["stats"][key]
        lines.append(
            f"  {label:34} {s['p50']:8.1f} {s['p95']:8.1f} {s['p99']:8.1f} {s['mean']:8.1f}"
        )
    lines.append(
        f"  = {r['stats']['pct_core_per_call_mean']:.3f} % of a core per call (without the "
        f"kernel's share: syscalls, epoll); {r['packets_sent']} packets, "
        f"{r['skipped_ticks']} skipped ticks, {r['calls_cut_short']} barge-ins; "
        f"{r['detector_batches_per_s']:.0f} detector batches/s (timer "
        f"{c['detect_batch_ms']:.0f} ms)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.mediatick", description=__doc__)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--seconds", type=float, default=20.0, help="media time simulated")
    p.add_argument("--workload", choices=("speech", "idle"), default="speech")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batched", dest="batched", action="store_true", default=True)
    g.add_argument("--per-call", dest="batched", action="store_false")
    p.add_argument(
        "--phase",
        choices=("sipp", "random"),
        default="sipp",
        help="the echo right after the send (sipp -rtp_echo) or on each phone's own clock",
    )
    p.add_argument("--batch-ms", type=float, default=None, help="detector batch timer")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = run(Options(a.calls, a.seconds, a.workload, a.batched, phase=a.phase, batch_ms=a.batch_ms))
    print(json.dumps(r, indent=2) if a.json else format_report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
