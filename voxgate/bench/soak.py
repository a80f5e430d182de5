"""``voxgate bench soak``: many calls for a long time; does anything grow, is anything left?

Real processes, as deployed: ``voxgate gateway`` and one ``voxgate worker`` over a Redis bus
(a private ``redis-server`` on a free port by default, so its ``used_memory`` is ours alone;
``--redis URL`` uses a server already running, under a private key prefix). The load is the
Python SIP/RTP client (:mod:`voxgate.bench.sipclient`) in this process: ``--calls`` call slots,
each placing one call after another. Every call lives a random ``--life`` (20–60 s by default)
and then hangs up (or, one call in ten, presses 0 and lets the IVR hang up itself); its slot
dials the next at once. While it is up the caller:

* talks over the greeting 1.5–4 s after it starts (espeak-ng sentences at 8 kHz, −20 dBFS, sent
  as G.711 RTP: the barge-in detector's work, a cancel on the bus, the worker stopping);
* then every 4–9 s either presses a key (RFC 4733: 1, 2, 9 for menu prompts, 5 for the "not a
  valid option" prompt) or talks again (a barge-in when a prompt is playing).

Every ``--sample-s`` (60) it prints one row: the gateway's resident memory, open file
descriptors and asyncio tasks (its ``/metrics``: ``voxgate_process_resident_memory_bytes``,
``voxgate_process_open_fds``, ``voxgate_asyncio_tasks``), calls up, SIP transactions held, the
worker's RSS, Redis ``used_memory`` and the keys under the prefix by kind (audio streams and
cancel markers are per call/utterance; the request stream, wake streams and worker heartbeats
are per process), and what the calls did (calls ended, key presses and barge-ins the gateway
reported on ``/api/events``).

Verdicts at the end:

* *flat after warm-up*: over the samples after the first third of the run (at least one
  sample interval) and after ``WARMUP_CALLS`` (1000) calls ended, the least-squares slope
  of RSS, of fds and of tasks, divided by the calls that ended per minute in that window,
  i.e. what each finished call left behind on average.
  Thresholds: ``FLAT_RSS_BYTES_PER_CALL`` (2 KiB) and ``FLAT_COUNT_PER_CALL`` (0.005 fds or
  tasks, one in 200 calls). Why these: a live call costs the gateway ~100 KiB or more (its
  Call, leg, jitter buffer and history; ``rss_per_live_call`` below measures it in the run),
  so a leak of a whole call, of its buffers or of one fd/task per call is 20–200 times over
  the line; 2 KiB per call is 170 MiB a day at one call a second, worth failing a soak for. A
  slower leak needs a longer run to separate from the allocator's noise (the residual spread
  of RSS about the fitted line is printed). Fds and tasks are corrected for the calls up at
  the sample's instant (each live call holds its RTP socket and a few tasks): the count minus
  ``per_call × calls up``, ``per_call`` from the plateau against the idle baseline. The
  gateway's Redis connections are a pool: judged by its bound (idle + ``COMMAND_POOL_MAX``),
  not by a slope (it grows in steps to the most commands in flight at once, then stays).

  Why 1000 calls of warm-up: an ended call's objects (Call, SipLeg, RtpEndpoint, its
  RtpSession, jitter buffer, pacer, playout, detector: ~110 objects, ~70-90 KiB of RSS with
  their buffers) form reference cycles (``Call.leg`` -> ``SipLeg`` -> ``RtpEndpoint`` ->
  ``Call.on_caller_packet``...), so only a full (generation 2) collection frees them, and the
  first one after the gateway's ``gc.freeze()`` comes hundreds of ended calls in; and the
  gateway keeps the records of its last 500 ended calls (``ENDED_RECORDS``, with their
  transcripts). Measured in the 30-minute run with 50 calls (docs/bench-report/soak.md): RSS
  rose ~15 MiB/min for 6 min (418 calls ended), stepped once more at minutes 11-12 (783-865
  calls), then stayed within 1.8 MiB to minute 30 (2217 calls). Until then RSS climbs by the
  dead calls; after it, their memory is reused. A run too short to get there
  (the 3-minute test) judges RSS against ``rss_bytes_per_call`` instead: above what a dead
  call holds until that collection, so still a leak of a call's audio or its objects.
* *nothing left behind*: after the last call ends: 0 calls, 0 SIP transactions (UDP server
  transactions linger 64×T1, 32 s at the default ``--sip-t1-ms``: RFC 3261 §17.2.2 Timer J),
  tasks back to the idle count, fds back to the idle count, no audio stream, cancel marker or
  "gone" marker left in Redis (markers expire after ``bus.cancel_ttl_s``; the soak sets it to
  ``--cancel-ttl-s``, 30 s by default, so the wait is bounded), the gateway's Redis
  connections within its pool's bound. Waited for up to ``--settle-s``; the time each took is
  reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from voxgate.bench.localgw import free_port
from voxgate.bench.procs import Proc, http_json, wait_ready
from voxgate.bench.sipclient import ClientCall, SipClient, SipClientError
from voxgate.bench.util import cpu_model, fmt, strict_json
from voxgate.contract.bus.redis_bus import COMMAND_POOL_MAX

Int16Array = npt.NDArray[np.int16]

FLAT_RSS_BYTES_PER_CALL = 2048.0
WARMUP_CALLS = 1000
FLAT_COUNT_PER_CALL = 0.005
RATE = 8000
SPEECH_DBFS = -20.0
SENTENCES = (
    ("Hello? I would like to talk to somebody about my bill.", "en-us"),
    ("Sorry, can I speak to a real person please?", "en"),
    ("Wait, I already know my balance.", "en-us+f3"),
)
# Keys the caller presses: three menu prompts and one invalid option (ivr defaults).
DIGITS = ("1", "2", "9", "5")
HANGUP_DIGIT = "0"
# Redis keys under the prefix, by kind: (pattern after "<prefix>:", per call?).
KEY_KINDS = (
    ("synth:audio:", "audio", True),
    ("synth:cancel:", "cancel", True),
    ("synth:gone:", "gone", True),
    ("synth:req", "req", False),
    ("synth:wake:", "wake", False),
    ("synth:worker:", "worker", False),
)


@dataclass
class SoakOptions:
    minutes: float = 30.0
    calls: int = 50
    life_min_s: float = 20.0
    life_max_s: float = 60.0
    sample_s: float = 60.0
    redis: str | None = None  # None: a private redis-server
    cancel_ttl_s: float = 30.0
    settle_s: float = 90.0
    sip_t1_ms: int = 500
    seed: int = 1
    engine: str = "onnx"
    hangup_share: float = 0.1
    warmup_calls: int = WARMUP_CALLS
    rss_bytes_per_call: float = FLAT_RSS_BYTES_PER_CALL
    keep_dir: str | None = None
    quiet: bool = False
    # The rows as they come on stderr (with --json, stdout carries the JSON alone).
    progress_stderr: bool = False


# --- caller speech -------------------------------------------------------------------------------
def caller_sentences() -> list[Int16Array]:
    """The caller's sentences: espeak-ng, resampled to 8 kHz, scaled to −20 dBFS active level."""
    from scipy.signal import resample_poly

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng not found (make tools installs it)")
    out: list[Int16Array] = []
    for text, voice in SENTENCES:
        wav = subprocess.run(
            [exe, "-v", voice, "-s", "165", "--stdout", text], capture_output=True, check=True
        ).stdout
        with wave.open(io.BytesIO(wav)) as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float64) / 32768
        g = math.gcd(RATE, rate)
        y = resample_poly(x, RATE // g, rate // g)
        frames = y[: len(y) // 160 * 160].reshape(-1, 160)
        levels = np.sqrt(np.mean(frames**2, axis=1))
        active = frames[levels > levels.max() * 10 ** (-30 / 20)]
        level = float(np.sqrt(np.mean(active**2))) if len(active) else 1.0
        y = y * (10 ** (SPEECH_DBFS / 20) / max(level, 1e-9))
        out.append(np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16))
    return out


# --- one caller ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Action:
    at_s: float  # after the first greeting packet
    kind: str  # "speech" | "dtmf" | "hangup-key"
    arg: int | str


def plan_call(rng: random.Random, life_s: float, hangup_share: float) -> list[Action]:
    """What one caller does: a barge-in over the greeting, then keys and speech until its end;
    with probability ``hangup_share`` its last act is the IVR's hang-up key."""
    actions = [Action(rng.uniform(1.5, 4.0), "speech", rng.randrange(len(SENTENCES)))]
    while True:
        t = actions[-1].at_s + rng.uniform(4.0, 9.0)
        if t > life_s - 1.0:
            break
        if rng.random() < 0.6:
            actions.append(Action(t, "dtmf", rng.choice(DIGITS)))
        else:
            actions.append(Action(t, "speech", rng.randrange(len(SENTENCES))))
    if rng.random() < hangup_share:
        at = min(actions[-1].at_s + rng.uniform(2.0, 4.0), max(life_s, actions[-1].at_s))
        actions.append(Action(at, "hangup-key", HANGUP_DIGIT))
    return actions


@dataclass
class LoadStats:
    placed: int = 0
    answered: int = 0
    failed: int = 0
    ended: int = 0
    no_greeting: int = 0
    speech_sent: int = 0
    dtmf_sent: int = 0
    gateway_hangups: int = 0
    hangup_key_ignored: int = 0
    bye_errors: int = 0
    up: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)


class Load:
    """``calls`` slots placing calls one after another until ``stop`` is set."""

    def __init__(
        self,
        target: tuple[str, int],
        opts: SoakOptions,
        speech: Sequence[Int16Array],
    ) -> None:
        self.target = target
        self.opts = opts
        self.speech = speech
        self.stats = LoadStats()
        self.stop = asyncio.Event()
        self.hangup_now = asyncio.Event()
        self.client: SipClient | None = None
        self._rng = random.Random(opts.seed)

    async def run(self) -> None:
        self.client = await SipClient.open("127.0.0.1")
        try:
            slots = [
                asyncio.create_task(self._slot(i), name=f"soak-slot-{i}")
                for i in range(self.opts.calls)
            ]
            await asyncio.gather(*slots)
        finally:
            self.client.close()

    async def _slot(self, i: int) -> None:
        # Stagger the first INVITEs (10 a second) so the start is not a burst.
        await asyncio.sleep(i * 0.1)
        rng = random.Random(self._rng.random() + i)
        while not self.stop.is_set():
            await self._one_call(rng)

    async def _one_call(self, rng: random.Random) -> None:
        assert self.client is not None
        s = self.stats
        life = rng.uniform(self.opts.life_min_s, self.opts.life_max_s)
        plan = plan_call(rng, life, self.opts.hangup_share)
        s.placed += 1
        try:
            call = await self.client.invite(self.target, codecs=("PCMU",), timeout=10.0)
        except SipClientError as exc:
            s.failed += 1
            s.error(f"INVITE: {exc}")
            await asyncio.sleep(1.0)
            return
        if call.status != 200:
            s.failed += 1
            s.error(f"INVITE answered {call.status}")
            await asyncio.sleep(1.0)
            return
        s.answered += 1
        s.up += 1
        start = time.monotonic()
        try:
            await self._talk(call, plan, start + life)
        finally:
            s.up -= 1
            s.ended += 1
            await self._hang_up(call)

    async def _talk(self, call: ClientCall, plan: list[Action], end: float) -> None:
        s = self.stats
        media = call.media
        try:
            await media.wait_for_audio(after=call.acked_at, timeout=8.0)
        except TimeoutError:
            s.no_greeting += 1
        t0 = time.monotonic()
        for action in plan:
            if not await self._sleep_until(call, t0 + action.at_s):
                return
            if action.kind == "speech":
                media.send_audio(self.speech[int(action.arg)])
                s.speech_sent += 1
            else:
                try:
                    media.send_dtmf(str(action.arg))
                except SipClientError as exc:
                    s.error(f"DTMF: {exc}")
                    continue
                s.dtmf_sent += 1
                if action.kind == "hangup-key":
                    # The IVR says goodbye and hangs up itself (its BYE ends the call).
                    if await self._wait_remote_bye(call, 20.0):
                        s.gateway_hangups += 1
                    else:
                        s.hangup_key_ignored += 1
                    return
        await self._sleep_until(call, end)

    async def _sleep_until(self, call: ClientCall, when: float) -> bool:
        """False when the call ended (remote BYE) or the soak is hanging every call up."""
        while True:
            if call.ended or self.hangup_now.is_set():
                return False
            left = when - time.monotonic()
            if left <= 0:
                return True
            bye = asyncio.ensure_future(call.remote_bye.wait())
            now = asyncio.ensure_future(self.hangup_now.wait())
            await asyncio.wait({bye, now}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            bye.cancel()
            now.cancel()

    async def _wait_remote_bye(self, call: ClientCall, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call.remote_bye.wait(), timeout)
        return call.remote_bye.is_set()

    async def _hang_up(self, call: ClientCall) -> None:
        assert self.client is not None
        try:
            await call.bye(timeout=5.0)
        except SipClientError as exc:
            self.stats.bye_errors += 1
            self.stats.error(f"BYE: {exc}")
        finally:
            call.media.close()
            self.client.calls.pop(call.call_id, None)


# --- watching the processes ----------------------------------------------------------------------
@dataclass
class EventCounts:
    dtmf: int = 0
    bargein: int = 0
    utterances: int = 0
    calls_ended: int = 0
    overflow: int = 0
    disconnects: int = 0


async def watch_events(http: str, counts: EventCounts, stop: asyncio.Event) -> None:
    """Count the gateway's call events on ``/api/events`` (reconnecting if it drops)."""
    import aiohttp

    ws_url = http.replace("http://", "ws://") + "/api/events"
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.ws_connect(ws_url, heartbeat=20) as ws:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        ev = json.loads(msg.data)
                        kind = ev.get("type")
                        if kind == "dtmf":
                            counts.dtmf += 1
                        elif kind == "bargein":
                            counts.bargein += 1
                        elif kind == "utterance.started":
                            counts.utterances += 1
                        elif kind == "call.state" and ev.get("state") == "ended":
                            counts.calls_ended += 1
                        elif "dropped" in ev:
                            counts.overflow += 1
            except (aiohttp.ClientError, OSError, ValueError):
                pass
            if not stop.is_set():
                counts.disconnects += 1
                await asyncio.sleep(1.0)


def scrape_metrics(http: str) -> dict[str, float]:
    """The gauges and counters a soak reads from the gateway's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib_open(f"{http}/metrics") as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def urllib_open(url: str) -> Any:
    import urllib.request

    return urllib.request.urlopen(url, timeout=10.0)


def proc_rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _socket_owners(pid: int, redis_port: int | None) -> dict[str, str]:
    """Socket inode -> kind for ``pid``'s network namespace: "redis" (a TCP connection to the
    bus's Redis port), "tcp-listen", "tcp", "udp" (SIP and RTP), "unix"."""
    owners: dict[str, str] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6", "unix"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]
            for line in lines:
                f = line.split()
                if proto == "unix":
                    if len(f) > 6:
                        owners[f[6]] = "unix"
                    continue
                if len(f) < 10:
                    continue
                if proto.startswith("udp"):
                    owners[f[9]] = "udp"
                    continue
                remote_port = int(f[2].rsplit(":", 1)[1], 16)
                if f[3] == "0A":  # TCP_LISTEN
                    owners[f[9]] = "tcp-listen"
                elif redis_port is not None and remote_port == redis_port:
                    owners[f[9]] = "redis"
                else:
                    owners[f[9]] = "tcp"
    return owners


def proc_fds(pid: int, redis_port: int | None = None) -> dict[str, int]:
    """Open descriptors of ``pid`` by kind: sockets by what they are (``_socket_owners``),
    pipe, anon (eventfd, epoll...), file."""
    kinds: dict[str, int] = {}
    owners: dict[str, str] | None = None
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                if owners is None:
                    owners = _socket_owners(pid, redis_port)
                kind = owners.get(link[8:-1], "socket")
            elif link.startswith("pipe:"):
                kind = "pipe"
            elif link.startswith("anon_inode:"):
                kind = "anon"
            else:
                kind = "file"
            kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


async def redis_figures(r: Any, prefix: str) -> dict[str, Any]:
    """``used_memory`` and the keys under ``prefix`` by kind (``KEY_KINDS``)."""
    info = await r.info("memory")
    clients = await r.info("clients")
    counts = {name: 0 for _, name, _ in KEY_KINDS}
    counts["other"] = 0
    no_ttl_per_call = 0
    head = f"{prefix}:"
    async for raw in r.scan_iter(match=f"{prefix}:*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        rest = key[len(head) :]
        for pattern, name, per_call in KEY_KINDS:
            if rest.startswith(pattern):
                counts[name] += 1
                if per_call and await r.pttl(key) == -1:
                    no_ttl_per_call += 1
                break
        else:
            counts["other"] += 1
    return {
        "used_memory": int(info["used_memory"]),
        "clients": int(clients["connected_clients"]),
        "keys": counts,
        "per_call_keys": sum(counts[n] for _, n, per_call in KEY_KINDS if per_call),
        "per_call_keys_without_ttl": no_ttl_per_call,
    }


@dataclass
class Sample:
    t_s: float
    calls_up: float
    rss: float
    fds: float
    tasks: float
    sip_transactions: float
    worker_rss: float
    worker_fds: int
    redis_used: int
    keys: dict[str, int]
    per_call_keys: int
    calls_ended: int
    dtmf: int
    bargeins: int
    utterances: int
    loadavg: float
    fd_kinds: dict[str, int] = field(default_factory=dict)
    # The gateway's fds other than its Redis connections, and those connections (the bus's
    # pool keeps every connection it opened, up to its bound COMMAND_POOL_MAX: its size is the
    # most commands in flight at once, capped).
    fds_other: int = 0
    redis_conns: int = 0
    redis_clients: int = 0  # INFO clients: every client of the server (gateway, worker, us)


class Sampler:
    def __init__(
        self, http: str, gw: Proc, worker: Proc, redis_client: Any, prefix: str,
        redis_port: int | None,
    ) -> None:  # fmt: skip
        self.http = http
        self.redis_port = redis_port
        self.gw = gw
        self.worker = worker
        self.r = redis_client
        self.prefix = prefix
        self.events = EventCounts()
        self.load: LoadStats | None = None
        self.t0 = time.monotonic()

    async def sample(self) -> Sample:
        m = await asyncio.to_thread(scrape_metrics, self.http)
        red = await redis_figures(self.r, self.prefix)
        kinds = proc_fds(self.gw.pid, self.redis_port)
        return Sample(
            t_s=time.monotonic() - self.t0,
            calls_up=m.get("voxgate_calls_active", 0.0),
            rss=m.get("voxgate_process_resident_memory_bytes", 0.0),
            fds=m.get("voxgate_process_open_fds", 0.0),
            tasks=m.get("voxgate_asyncio_tasks", 0.0),
            sip_transactions=m.get("voxgate_sip_transactions", 0.0),
            worker_rss=proc_rss(self.worker.pid),
            worker_fds=sum(proc_fds(self.worker.pid).values()),
            redis_used=red["used_memory"],
            keys=red["keys"],
            per_call_keys=red["per_call_keys"],
            calls_ended=self.load.ended if self.load else 0,
            dtmf=self.events.dtmf,
            bargeins=self.events.bargein,
            utterances=self.events.utterances,
            loadavg=os.getloadavg()[0],
            fd_kinds=kinds,
            fds_other=sum(kinds.values()) - kinds.get("redis", 0),
            redis_conns=kinds.get("redis", 0),
            redis_clients=red["clients"],
        )


# --- verdicts ------------------------------------------------------------------------------------
def slope_per_minute(ts_s: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of ``ys`` against ``ts_s`` in units per minute, and the residuals'
    standard deviation."""
    t = np.asarray(ts_s, np.float64) / 60.0
    y = np.asarray(ys, np.float64)
    if len(t) < 3 or float(np.ptp(t)) == 0.0:
        return float("nan"), float("nan")
    a, b = np.polyfit(t, y, 1)
    resid = y - (a * t + b)
    return float(a), float(np.std(resid))


def flatness(
    samples: Sequence[Sample], idle: Sample, warmup_s: float, *, warmup_calls: int = 0,
    rss_bytes_per_call: float = FLAT_RSS_BYTES_PER_CALL,
) -> dict[str, Any]:  # fmt: skip
    """The flat-after-warm-up verdicts (see the module docstring)."""
    window = [s for s in samples if s.t_s >= warmup_s and s.calls_ended >= warmup_calls]
    if len(window) < 3:
        return {"ok": False, "reason": f"only {len(window)} samples after warm-up (need 3: "
                f"{warmup_s:.0f} s and {warmup_calls} calls ended)"}  # fmt: skip
    minutes = (window[-1].t_s - window[0].t_s) / 60.0
    ended = window[-1].calls_ended - window[0].calls_ended
    calls_per_min = ended / minutes if minutes > 0 else float("nan")
    up = float(np.median([s.calls_up for s in window]))
    out: dict[str, Any] = {
        "window_s": [round(window[0].t_s, 1), round(window[-1].t_s, 1)],
        "samples": len(window),
        "calls_ended_per_minute": calls_per_min,
        "median_calls_up": up,
    }
    ok = True
    for name, attr, threshold, corrected in (
        ("rss", "rss", rss_bytes_per_call, False),
        ("fds", "fds_other", FLAT_COUNT_PER_CALL, True),
        ("redis_conns", "redis_conns", FLAT_COUNT_PER_CALL, False),
        ("tasks", "tasks", FLAT_COUNT_PER_CALL, True),
    ):
        values = [float(getattr(s, attr)) for s in window]
        per_live = (float(np.median(values)) - float(getattr(idle, attr))) / up if up else 0.0
        if corrected:
            values = [v - per_live * s.calls_up for v, s in zip(values, window, strict=True)]
        slope, spread = slope_per_minute([s.t_s for s in window], values)
        per_call = slope / calls_per_min if calls_per_min and calls_per_min > 0 else math.nan
        good = not math.isnan(per_call) and per_call <= threshold
        if name == "redis_conns":
            # A connection pool, not a per-call resource: it grows in steps to the most
            # commands in flight at once and stops at its bound (COMMAND_POOL_MAX), so a step
            # inside a short window is no leak; more than the bound would be.
            good = max(values) <= idle.redis_conns + COMMAND_POOL_MAX
        ok = ok and good
        out[name] = {
            "slope_per_minute": slope,
            "residual_sd": spread,
            "per_ended_call": per_call,
            "threshold_per_ended_call": threshold,
            "per_live_call": per_live,
            "max": max(values),
            "ok": good,
        }
    out["redis_conns"]["bound"] = idle.redis_conns + COMMAND_POOL_MAX
    out["ok"] = ok
    return out


def left_behind(idle: Sample, end: Sample, client_calls: int) -> dict[str, Any]:
    checks = {
        "calls": (end.calls_up, 0.0),
        "client_calls": (float(client_calls), 0.0),
        "sip_transactions": (end.sip_transactions, 0.0),
        "tasks": (end.tasks, idle.tasks),
        "fds": (float(end.fds_other), float(idle.fds_other)),
        "per_call_redis_keys": (float(end.per_call_keys), 0.0),
    }
    out: dict[str, Any] = {
        name: {"end": got, "want": want, "ok": got <= want} for name, (got, want) in checks.items()
    }
    out["fd_kinds"] = {"idle": idle.fd_kinds, "end": end.fd_kinds}
    out["redis_conns"] = {
        "idle": idle.redis_conns,
        "end": end.redis_conns,
        "want": idle.redis_conns + COMMAND_POOL_MAX,
        "ok": end.redis_conns <= idle.redis_conns + COMMAND_POOL_MAX,
    }
    out["ok"] = all(v["ok"] for k, v in out.items() if isinstance(v, dict) and "ok" in v)
    return out


# --- the run -------------------------------------------------------------------------------------
def _start_redis(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: install redis or pass --redis URL")
    port = free_port(socket.SOCK_STREAM)
    p = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(work), "--logfile", str(work / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return p, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("the private redis-server did not start")


def _drop_prefix(redis_url: str, prefix: str) -> None:
    import redis

    with contextlib.suppress(redis.RedisError, OSError):
        r = redis.Redis.from_url(redis_url)
        try:
            keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)
        finally:
            r.close()


def _row(s: Sample, header: bool = False) -> str:
    if header:
        return (
            f"{'min':>6} {'calls':>5} {'rss MiB':>8} {'fds':>5} {'rconn':>5} {'tasks':>6} "
            f"{'sip tx':>6} "
            f"{'wrk MiB':>8} {'redis MiB':>9} {'audio':>5} {'cancel':>6} {'gone':>5} "
            f"{'other':>5} "
            f"{'ended':>6} {'dtmf':>5} {'barge':>5} {'load':>5}"
        )
    k = s.keys
    other = sum(v for n, v in k.items() if n not in ("audio", "cancel", "gone"))
    return (
        f"{s.t_s / 60:>6.1f} {s.calls_up:>5.0f} {s.rss / 2**20:>8.1f} {s.fds_other:>5} "
        f"{s.redis_conns:>5} {s.tasks:>6.0f} {s.sip_transactions:>6.0f} "
        f"{s.worker_rss / 2**20:>8.1f} "
        f"{s.redis_used / 2**20:>9.2f} {k.get('audio', 0):>5} {k.get('cancel', 0):>6} "
        f"{k.get('gone', 0):>5} {other:>5} {s.calls_ended:>6} {s.dtmf:>5} {s.bargeins:>5} "
        f"{s.loadavg:>5.2f}"
    )


async def _soak(
    opts: SoakOptions, http: str, sip: tuple[str, int], gw: Proc, worker: Proc,
    redis_url: str, prefix: str,
) -> dict[str, Any]:  # fmt: skip
    import redis.asyncio as aioredis

    r = aioredis.from_url(redis_url)
    redis_port = urlsplit(redis_url).port or 6379 if redis_url.startswith("redis") else None
    sampler = Sampler(http, gw, worker, r, prefix, redis_port)
    speech = await asyncio.to_thread(caller_sentences)
    stop_events = asyncio.Event()
    watcher = asyncio.create_task(watch_events(http, sampler.events, stop_events))

    def out(text: str, flush: bool = True) -> None:
        if not opts.quiet:
            print(text, flush=flush, file=sys.stderr if opts.progress_stderr else sys.stdout)

    try:
        await asyncio.sleep(2.0)
        idle = await sampler.sample()
        out(
            f"idle: rss {idle.rss / 2**20:.1f} MiB, fds {idle.fds:.0f} {idle.fd_kinds}, "
            f"tasks {idle.tasks:.0f}, redis keys {idle.keys}",
            flush=True,
        )
        load = Load(sip, opts, speech)
        sampler.load = load.stats
        sampler.t0 = time.monotonic()
        load_task = asyncio.create_task(load.run())
        samples: list[Sample] = []
        out(_row(idle, header=True), flush=True)
        duration = opts.minutes * 60.0
        n = 1
        while True:
            due = sampler.t0 + n * opts.sample_s
            if due > sampler.t0 + duration + 1e-6:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if load_task.done():
                break
            s = await sampler.sample()
            samples.append(s)
            out(_row(s), flush=True)
            n += 1
        remaining = sampler.t0 + duration - time.monotonic()
        if remaining > 0 and not load_task.done():
            await asyncio.sleep(remaining)
        # The end: no new calls, every call up is hung up now.
        load.stop.set()
        load.hangup_now.set()
        t_end = time.monotonic()
        await asyncio.wait_for(load_task, 30.0)
        settle = await _settle(sampler, idle, opts.settle_s)
        settle["hangup_s"] = round(time.monotonic() - t_end, 1)
        end = settle.pop("sample")
        out(
            f"after the last call ({settle['waited_s']:.1f} s): calls {end.calls_up:.0f}, "
            f"sip tx {end.sip_transactions:.0f}, tasks {end.tasks:.0f} (idle "
            f"{idle.tasks:.0f}), fds {end.fds_other} (idle {idle.fds_other}) {end.fd_kinds}, "
            f"per-call keys {end.per_call_keys}, rss {end.rss / 2**20:.1f} MiB",
            flush=True,
        )
    finally:
        stop_events.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        await r.aclose()
    warmup_s = max(duration / 3.0, opts.sample_s)
    return {
        "idle": asdict(idle),
        "samples": [asdict(s) for s in samples],
        "end": asdict(end),
        "settle": settle,
        "load": asdict(load.stats),
        "events": asdict(sampler.events),
        "warmup_s": warmup_s,
        "warmup_calls": opts.warmup_calls,
        "flat": flatness(
            samples,
            idle,
            warmup_s,
            warmup_calls=opts.warmup_calls,
            rss_bytes_per_call=opts.rss_bytes_per_call,
        ),
        "left_behind": left_behind(idle, end, len(load.client.calls) if load.client else 0),
    }


async def _settle(sampler: Sampler, idle: Sample, limit_s: float) -> dict[str, Any]:
    """Poll until nothing is left (see ``left_behind``) or ``limit_s``; when each item got
    back to its idle value."""
    t0 = time.monotonic()
    reached: dict[str, float] = {}
    s = await sampler.sample()
    while True:
        now = time.monotonic() - t0
        for name, done in (
            ("calls", s.calls_up == 0),
            ("sip_transactions", s.sip_transactions == 0),
            ("tasks", s.tasks <= idle.tasks),
            ("fds", s.fds_other <= idle.fds_other),
            ("per_call_redis_keys", s.per_call_keys == 0),
        ):
            if done:
                reached.setdefault(name, round(now, 1))
            else:
                reached.pop(name, None)
        if len(reached) == 5 or now >= limit_s:
            return {"sample": s, "waited_s": now, "reached_s": reached}
        await asyncio.sleep(1.0)
        s = await sampler.sample()


def run_soak(opts: SoakOptions) -> dict[str, Any]:
    work = Path(opts.keep_dir or tempfile.mkdtemp(prefix="vg-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    redis_proc: subprocess.Popen[bytes] | None = None
    if opts.redis is None:
        redis_proc, redis_url = _start_redis(work)
    else:
        redis_url = opts.redis
    prefix = f"vgsoak-{os.getpid()}"
    sip_port = free_port(both=True)
    http_port = free_port(socket.SOCK_STREAM)
    http = f"http://127.0.0.1:{http_port}"
    bus = ["--redis", redis_url, "--bus-prefix", prefix, "--bus-cancel-ttl-s",
           str(opts.cancel_ttl_s)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    cli = [sys.executable, "-m", "voxgate.cli"]
    cond = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1m_at_start": os.getloadavg()[0],
        "redis": "private redis-server" if redis_proc else redis_url,
        "options": asdict(opts),
    }
    worker = Proc(
        [*cli, "worker", *bus, "--engine", opts.engine, "--worker-http-listen", "",
         "--log-level", "warning"],
        work / "worker.log", env,
    )  # fmt: skip
    gw: Proc | None = None
    try:
        gw = Proc(
            [*cli, "gateway", *bus, "--sip-listen", f"127.0.0.1:{sip_port}",
             "--http-listen", f"127.0.0.1:{http_port}",
             "--gateway-max-calls", str(opts.calls + 20),
             "--gateway-sip-t1-ms", str(opts.sip_t1_ms),
             "--gateway-rtp-port-min", "36000", "--gateway-rtp-port-max", "44000",
             "--ivr-idle-timeout-s", "0", "--log-level", "warning"],
            work / "gateway.log", env,
        )  # fmt: skip
        wait_ready(http, gw, timeout=180.0)
        status, _ = http_json(f"{http}/readyz")
        if status != 200:
            raise RuntimeError(f"gateway /readyz answered {status}")
        result = _run(opts, http, ("127.0.0.1", sip_port), gw, worker, redis_url, prefix)
        cond["loadavg_1m_at_end"] = os.getloadavg()[0]
    finally:
        rc = gw.stop() if gw is not None else None
        wrc = worker.stop()
        if redis_proc is None:
            # A Redis of the user's: the run's keys go, once the processes are stopped (deleted
            # while the worker still ran, its request stream and group came back under the
            # prefix).
            _drop_prefix(redis_url, prefix)
        else:
            redis_proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                redis_proc.wait(10)
    result["conditions"] = cond
    result["gateway_exit"] = rc
    result["worker_exit"] = wrc
    result["gateway_log_tail"] = gw.tail(20) if gw is not None else ""
    result["work_dir"] = str(work)
    if not opts.keep_dir:
        shutil.rmtree(work, ignore_errors=True)
    clean = strict_json(result)
    assert isinstance(clean, dict)
    return clean


def _run(
    opts: SoakOptions, http: str, sip: tuple[str, int], gw: Proc, worker: Proc,
    redis_url: str, prefix: str,
) -> dict[str, Any]:  # fmt: skip
    coro = _soak(opts, http, sip, gw, worker, redis_url, prefix)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    res: dict[str, Any] = uvloop.run(coro)
    return res


# --- the report ----------------------------------------------------------------------------------
def format_report(r: dict[str, Any]) -> str:
    c, o = r["conditions"], r["conditions"]["options"]
    load, ev, flat, left = r["load"], r["events"], r["flat"], r["left_behind"]
    mark = {True: "ok", False: "FAILED"}
    lines = [
        f"voxgate bench soak — {o['calls']} calls for {o['minutes']:g} min, each "
        f"{o['life_min_s']:g}–{o['life_max_s']:g} s, sampled every {o['sample_s']:g} s",
        f"  conditions: {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f} → "
        f"{c.get('loadavg_1m_at_end', float('nan')):.2f}, python {c['python']}; gateway + "
        f"worker processes over {c['redis']}",
        f"  calls: {load['placed']} placed, {load['answered']} answered, {load['failed']} "
        f"failed, {load['no_greeting']} without a greeting; {load['gateway_hangups']} hung up "
        f"by the IVR (key 0), {load['bye_errors']} BYE errors",
        f"  caller: {load['speech_sent']} sentences, {load['dtmf_sent']} key presses; gateway "
        f"reported {ev['dtmf']} keys, {ev['bargein']} barge-ins, {ev['utterances']} "
        f"utterances, {ev['calls_ended']} calls ended",
        "",
        _row(Sample(**r["idle"]), header=True),
        *(_row(Sample(**s)) for s in r["samples"]),
        "",
    ]
    if "rss" in flat:
        lines.append(
            f"  flat after warm-up ({flat['window_s'][0] / 60:.1f}–{flat['window_s'][1] / 60:.1f}"
            f" min: a third of the run and {r.get('warmup_calls', 0)} calls ended; "
            f"{fmt(flat['calls_ended_per_minute'])} calls ended/min): "
            f"[{mark[flat['ok']]}]"
        )
        for name, unit, scale in (("rss", "KiB", 1 / 1024), ("fds", "", 1.0),
                                  ("redis_conns", "", 1.0), ("tasks", "", 1.0)):  # fmt: skip
            f = flat[name]
            if name == "redis_conns":
                lines.append(
                    f"    redis_conns (a bounded pool) slope {fmt(f['slope_per_minute'], '.3f')}"
                    f"/min, at most {f['max']:g} (bound {f['bound']:g})   [{mark[f['ok']]}]"
                )
                continue
            lines.append(
                f"    {name:<6} slope {fmt(f['slope_per_minute'] * scale, '.3f')} {unit}/min, "
                f"{fmt(f['per_ended_call'] * scale, '.4f')} {unit} per ended call (threshold "
                f"{f['threshold_per_ended_call'] * scale:g}), residual sd "
                f"{fmt(f['residual_sd'] * scale, '.2f')} {unit}, per live call "
                f"{fmt(f['per_live_call'] * scale, '.2f')} {unit}   [{mark[f['ok']]}]"
            )
    else:
        lines.append(f"  flat after warm-up: {flat.get('reason')} [FAILED]")
    settle = r["settle"]
    lines.append(
        f"  nothing left behind (waited {settle['waited_s']:.1f} s after hanging up; reached at "
        f"{settle['reached_s']}): [{mark[left['ok']]}]"
    )
    for name in ("calls", "client_calls", "sip_transactions", "tasks", "fds",
                 "per_call_redis_keys"):  # fmt: skip
        v = left[name]
        lines.append(f"    {name:<20} {v['end']:g} (want <= {v['want']:g})   [{mark[v['ok']]}]")
    lines.append(f"    fds by kind: idle {left['fd_kinds']['idle']}, end {left['fd_kinds']['end']}")
    lines.append(
        f"    Redis connections (a bounded pool, kept open): idle {left['redis_conns']['idle']}, "
        f"end {left['redis_conns']['end']} (want <= {left['redis_conns']['want']})   "
        f"[{mark[left['redis_conns']['ok']]}]"
    )
    if load["errors"]:
        lines.append(f"  first errors: {load['errors'][:5]}")
    return "\n".join(lines)


def markdown_table(r: dict[str, Any]) -> str:
    """The per-sample rows as a Markdown table (docs/bench-report/soak.md)."""
    head = (
        "| min | calls up | ended | gw RSS MiB | gw fds (no Redis) | gw Redis conns | tasks "
        "| SIP tx | worker RSS MiB | worker fds | Redis used MiB | audio | cancel | gone "
        "| other keys | keys (gw) | barge-ins (gw) | load 1m |"
    )
    rows = [head, "|" + "---|" * 18]
    for s in [r["idle"], *r["samples"], r["end"]]:
        k = s["keys"]
        other = sum(v for n, v in k.items() if n not in ("audio", "cancel", "gone"))
        rows.append(
            f"| {s['t_s'] / 60:.1f} | {s['calls_up']:.0f} | {s['calls_ended']} "
            f"| {s['rss'] / 2**20:.1f} | {s['fds_other']} | {s['redis_conns']} "
            f"| {s['tasks']:.0f} | {s['sip_transactions']:.0f} | {s['worker_rss'] / 2**20:.1f} "
            f"| {s['worker_fds']} | {s['redis_used'] / 2**20:.2f} | {k.get('audio', 0)} "
            f"| {k.get('cancel', 0)} | {k.get('gone', 0)} | {other} | {s['dtmf']} "
            f"| {s['bargeins']} | {s['loadavg']:.2f} |"
        )
    return "\n".join(rows)


def plot(r: dict[str, Any], path: Path) -> Path:
    """Gateway and worker RSS, fds and tasks, Redis memory and per-call keys against time."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    samples = [r["idle"], *r["samples"]]
    t = [s["t_s"] / 60 for s in samples]
    fig = Figure(figsize=(8.0, 6.0), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    a = axes[0]
    a.plot(t, [s["rss"] / 2**20 for s in samples], label="gateway RSS")
    a.plot(t, [s["worker_rss"] / 2**20 for s in samples], label="worker RSS")
    a.set_ylabel("MiB")
    a.legend(loc="center right", fontsize=8)
    a = axes[1]
    a.plot(t, [s["fds_other"] for s in samples], label="gateway fds (no Redis)")
    a.plot(t, [s["redis_conns"] for s in samples], label="gateway Redis conns")
    a.plot(t, [s["tasks"] for s in samples], label="gateway asyncio tasks")
    a.plot(t, [s["calls_up"] for s in samples], label="calls up", linestyle=":")
    a.set_ylabel("count")
    a.legend(loc="center right", fontsize=8)
    a = axes[2]
    a.plot(t, [s["redis_used"] / 2**20 for s in samples], label="Redis used_memory (MiB)")
    a.plot(t, [s["per_call_keys"] for s in samples], label="per-call keys")
    a.set_xlabel("minutes")
    a.legend(loc="center right", fontsize=8)
    warm = r["flat"].get("window_s")
    if warm:
        for ax in axes:
            ax.axvspan(warm[0] / 60, warm[1] / 60, color="0.9", zorder=0)
    fig.suptitle("voxgate bench soak (shaded: the window judged flat)", fontsize=10)
    fig.savefig(path, dpi=100)
    return path


def options_from_args(args: argparse.Namespace) -> SoakOptions:
    life = [float(x) for x in str(args.life).split("-", 1)]
    return SoakOptions(
        minutes=args.minutes,
        calls=args.calls,
        life_min_s=life[0],
        life_max_s=life[-1],
        sample_s=args.sample_s,
        redis=args.redis,
        cancel_ttl_s=args.cancel_ttl_s,
        settle_s=args.settle_s,
        sip_t1_ms=args.sip_t1_ms,
        seed=args.seed,
        engine=args.engine,
        warmup_calls=args.warmup_calls,
        keep_dir=args.keep,
        progress_stderr=args.json,
    )


def cmd_bench_soak(args: argparse.Namespace) -> int:
    try:
        opts = options_from_args(args)
    except ValueError:
        print(f"voxgate bench soak: --life wants MIN-MAX seconds, got {args.life!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    if not 0 < opts.life_min_s <= opts.life_max_s:
        print("voxgate bench soak: --life wants 0 < MIN <= MAX", file=sys.stderr)
        return 2
    try:
        result = run_soak(opts)
    except (RuntimeError, OSError, TimeoutError) as exc:
        print(f"voxgate bench soak: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print()
        print(format_report(result))
    ok = result["flat"].get("ok") and result["left_behind"].get("ok")
    return 0 if ok else 3
