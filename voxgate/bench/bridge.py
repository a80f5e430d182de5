"""``voxgate bench bridge``: the pipecat bridge (the ``stream`` agent) measured from both ends.

Four parts, one run, every time on the wall clock (``time.time``: the clock of the callers'
kernel packet timestamps, the same in every process of this machine):

1. **Added latency, both directions, and ``clear`` → silence** — an in-process gateway
   (:func:`voxgate.bench.localgw.local_gateway`, ``[agent] kind = "stream"``) bridged to a
   *probe bot* in a child process (a plain aiohttp WebSocket peer speaking Twilio Media
   Streams, :func:`serve_probe_bot`), called by the project's SIP client over real RTP.

   - caller → bot: the caller sends a loud 20 ms frame every ``PROBE_EVERY`` frames; the
     gateway's ``Call.on_caller_packet`` (where every agent's ear taps a SIP call, as each
     packet arrives; ``Call.on_caller_audio``, after the jitter buffer, with
     ``bargein.on_arrival`` off) is wrapped to note when each loud frame reached it, the probe bot
     notes when its ``media`` message arrived. *Bridge-added* = bot arrival − tap. *Raw* =
     bot arrival − the caller's send time (with ``on_arrival`` off it adds the jitter buffer
     and the wait for the tick).
   - bot → caller: the bot sends a 20 ms tone burst as one ``media`` message every 200–350 ms.
     Wrapped ``Call.play_audio`` notes its arrival in the gateway, wrapped ``Call.pull_audio``
     the media tick that took it; the caller notes the kernel arrival of the RTP packet. The
     wait for the next 20 ms tick (0–20 ms, the pacing every 20 ms media clock has, Twilio's
     too) is reported apart; *bridge-added* = (bot send → ``play_audio``) + (tick → packet at
     the caller).
   - ``clear``: the bot plays 2 s of tone, sends ``clear`` 0.4–0.9 s in; *clear → silence* =
     the caller's last audible sample (after the 10 ms fade: the packet's arrival plus the
     sample's offset in it) − the bot's send time of ``clear``.

2. **Bot-driven barge-in, end to end, against pipecat's own Twilio path** — the same unmodified
   pipecat bot (:mod:`voxgate.bench.pipecat_bot`: ``TwilioFrameSerializer``, Silero VAD,
   Piper), reached (a) by a SIP caller through voxgate and (b) by a Twilio-like WebSocket
   client that plays what it receives on a 20 ms speaker clock and flushes it on ``clear``, as
   Twilio does. Per trial the caller presses 5 (a long story), talks over it 1–2.5 s in, and
   the figure is the caller's speech onset (send time of its first audible sample) → the last
   audible sample of the bot at the caller.

3. **Echo**: the SIP caller returns the bot's voice at −15 dB / 120 ms (a hybrid's echo) and
   says nothing; the bot is kept talking (key 5 again after each end) for ``--echo-s`` seconds
   with ``[stream] echo_gate`` off, then on; the figure is the bot's ``InterruptionFrame``s per
   minute of its own speech (each one is a false interruption: nobody spoke).

4. **Capacity**: ``voxgate bench calls`` (:mod:`voxgate.bench.calls`: the gateway as its own
   process, sipp callers echoing RTP) with ``--agent-kind stream`` against the probe bot's
   ``/talk`` (speech at real time, in another process): voxgate's CPU per bridged call, its
   ticker send-time error, and the calls held.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode
from gateway.call.calls import Call
from voxgate.bench.bargein import SPEECH_DBFS, CallerMixer, caller_sentence, first_audible
from voxgate.bench.localgw import free_port, local_gateway
from voxgate.bench.options import add_bridge_arguments
from voxgate.bench.sipclient import ClientCall, RtpPeer, SipClient
from voxgate.bench.util import cpu_model, fmt, json_default, percentiles, strict_json

Int16Array = npt.NDArray[np.int16]

RATE = 8000
SPF = 160
LOUD = 4000  # a probe frame's peak is ~16000; speech-free frames are 0 (μ-law: a few LSB)
AUDIBLE = int(32768 * 10 ** (-45 / 20))  # a sample at or above −45 dBFS is heard
PROBE_EVERY = 13  # caller probe period in frames (260 ms: not a multiple of the bot's)
ECHO_GAIN_DB = -15.0
ECHO_DELAY_MS = 120
LOUD_ECHO_DB = -6.0
BOT_START_S = 90.0
TURN_GAP_S = 6.0
PARTS = ("probe", "bargein", "echo", "capacity")
# A trial whose bot was already silent this long before its VAD decided is no barge-in (a gap
# in the bot's own speech; a pause between words is well under it).
BOT_GAP_S = 0.15
GOALS = {"added_ms_p99": 5.0, "clear_to_silence_ms_p99": 30.0, "echo_false_per_min": 0.0}


def tone(n: int, amp: float = 16000.0, hz: float = 1000.0) -> Int16Array:
    t = np.arange(n) / RATE
    return np.round(amp * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def peak(pcm: npt.NDArray[Any]) -> int:
    return int(np.max(np.abs(pcm.astype(np.int32)))) if len(pcm) else 0


def _media(sid: str, pcm: Int16Array) -> str:
    payload = base64.b64encode(ulaw_encode(pcm)).decode()
    return json.dumps({"event": "media", "streamSid": sid, "media": {"payload": payload}})


# --- the probe bot (child process) ------------------------------------------------------------
class _JsonLog:
    def __init__(self, path: str) -> None:
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def write(self, ev: str, **data: Any) -> None:
        self._fh.write(json.dumps({"t": time.time(), "ev": ev, **data}) + "\n")


async def _start(ws: Any) -> dict[str, Any]:
    async for msg in ws:
        data = json.loads(msg.data)
        if data.get("event") == "start":
            start: dict[str, Any] = data["start"]
            return start
    raise ConnectionError("no start")


async def _read_loud(ws: Any, log: _JsonLog, call: str) -> None:
    """Note every inbound frame with a probe in it; ends with ``stop`` or the socket."""
    async for msg in ws:
        t = time.time()
        data = json.loads(msg.data)
        event = data.get("event")
        if event == "media":
            pcm = ulaw_decode(base64.b64decode(data["media"]["payload"]))
            if peak(pcm) > LOUD:
                log.write("in_loud", call=call, at=t)
        elif event == "stop":
            log.write("stop", call=call)
            return


def serve_probe_bot(port: int, log_path: str) -> None:
    """``/probe``: the latency and ``clear`` probe (module doc, part 1); ``/talk``: speech at
    real time in 20 ms messages, for as long as the call lasts (part 4)."""
    from aiohttp import web

    log = _JsonLog(log_path)

    async def probe(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=4 << 20)
        await ws.prepare(request)
        start = await _start(ws)
        sid, call = start["streamSid"], start["callSid"]
        q = request.query
        bursts, clears = int(q.get("bursts", "60")), int(q.get("clears", "20"))
        reader = asyncio.create_task(_read_loud(ws, log, call))
        rnd = random.Random(call)
        burst, long_tone = tone(SPF), tone(2 * RATE, amp=10000.0, hz=700.0)
        await asyncio.sleep(1.0)
        for _ in range(bursts):
            await asyncio.sleep(rnd.uniform(0.2, 0.35))
            text = _media(sid, burst)
            log.write("out_burst", call=call)
            await ws.send_str(text)
        await asyncio.sleep(0.5)
        for _ in range(clears):
            await ws.send_str(_media(sid, long_tone))
            await asyncio.sleep(rnd.uniform(0.4, 0.9))
            text = json.dumps({"event": "clear", "streamSid": sid})
            log.write("clear", call=call)
            await ws.send_str(text)
            await asyncio.sleep(0.6)
        log.write("done", call=call)
        with contextlib.suppress(Exception):
            await reader
        return ws

    async def talk(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=4 << 20)
        await ws.prepare(request)
        start = await _start(ws)
        sid = start["streamSid"]
        # Speech-like: a 300 Hz-modulated tone, 1.2 s on, 0.8 s off.
        t = np.arange(2 * RATE) / RATE
        voice = 6000 * np.sin(2 * np.pi * 440 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
        voice[int(1.2 * RATE) :] = 0
        pcm = np.round(voice).astype(np.int16)

        async def drain() -> None:
            async for msg in ws:
                if json.loads(msg.data).get("event") == "stop":
                    return

        reader = asyncio.create_task(drain())
        t0, n = time.monotonic(), 0
        while not reader.done():
            i = (n * SPF) % len(pcm)
            await ws.send_str(_media(sid, pcm[i : i + SPF]))
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
        return ws

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/probe", probe)
    app.router.add_get("/talk", talk)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)  # type: ignore[arg-type]


@dataclass
class BotProc:
    """A bot (the probe bot or the pipecat bot) in its own process, with its JSON-lines log."""

    argv: list[str]
    log: Path
    port: int = 0
    p: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = BOT_START_S) -> None:
        out = open(self.log.with_suffix(".out"), "wb")  # noqa: SIM115 - the child owns it
        self.p = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                tail = self.log.with_suffix(".out").read_text()[-2000:]
                raise RuntimeError(f"bot exited: {tail}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1),
            ):
                return
            time.sleep(0.2)
        raise RuntimeError("the bot did not start")

    def stop(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


@contextlib.contextmanager
def bot_process(kind: str, work: Path) -> Any:
    port = free_port(__import__("socket").SOCK_STREAM)
    log = work / f"{kind}-bot.jsonl"
    module = "voxgate.bench.bridge" if kind == "probe" else "voxgate.bench.pipecat_bot"
    argv = [sys.executable, "-m", module, *(["probe-bot"] if kind == "probe" else []),
            "--port", str(port), "--log", str(log)]  # fmt: skip
    bot = BotProc(argv, log, port)
    try:
        bot.start()
        yield bot
    finally:
        bot.stop()


# --- the gateway side (wrapped class-wide, this process only) ---------------------------------
@dataclass
class GatewayProbe:
    """When probe audio crossed the gateway: caller frames at the taps, bot audio into
    ``play_audio`` and out of ``pull_audio``, per call id."""

    tapped: dict[str, list[float]] = field(default_factory=dict)
    received: dict[str, list[float]] = field(default_factory=dict)
    ticked: dict[str, list[float]] = field(default_factory=dict)
    _loud: dict[str, bool] = field(default_factory=dict)
    _saved: list[tuple[str, Any]] = field(default_factory=list)

    def install(self) -> None:
        on_caller_audio, on_caller_packet, play_audio, pull_audio = (
            Call.on_caller_audio, Call.on_caller_packet, Call.play_audio, Call.pull_audio,
        )  # fmt: skip
        self._saved = [("on_caller_audio", on_caller_audio),
                       ("on_caller_packet", on_caller_packet), ("play_audio", play_audio),
                       ("pull_audio", pull_audio)]  # fmt: skip
        probe = self

        # The agents' ears tap the call where its caller audio comes in: on arrival when the
        # leg feeds it so (bargein.on_arrival), else at the tick after the jitter buffer.
        def tap(call: Call, pcm: Int16Array) -> None:
            if not call._on_arrival and peak(pcm) > LOUD:
                probe.tapped.setdefault(call.id, []).append(time.time())
            on_caller_audio(call, pcm)

        def tap_packet(call: Call, ts: int, pcm: Int16Array) -> None:
            if peak(pcm) > LOUD:
                probe.tapped.setdefault(call.id, []).append(time.time())
            on_caller_packet(call, ts, pcm)

        def play(call: Call, utterance_id: str, pcm: Int16Array, **kw: Any) -> int:
            if len(pcm) <= SPF and peak(pcm) > LOUD:  # a burst, not the 2 s tone
                probe.received.setdefault(call.id, []).append(time.time())
            return play_audio(call, utterance_id, pcm, **kw)

        def pull(call: Call, n: int, at: int | None = None) -> Int16Array:
            pcm = pull_audio(call, n, at)
            loud = peak(pcm) > LOUD
            if loud and not probe._loud.get(call.id, False):
                probe.ticked.setdefault(call.id, []).append(time.time())
            probe._loud[call.id] = loud
            return pcm

        setattr(Call, "on_caller_audio", tap)  # noqa: B010 (class-wide patch, bench process)
        setattr(Call, "on_caller_packet", tap_packet)  # noqa: B010
        setattr(Call, "play_audio", play)  # noqa: B010
        setattr(Call, "pull_audio", pull)  # noqa: B010

    def remove(self) -> None:
        for name, fn in self._saved:
            setattr(Call, name, fn)
        self._saved = []


# --- the caller side -------------------------------------------------------------------------
class ProbeCaller:
    """The SIP caller's frames: a loud probe every ``PROBE_EVERY`` frames (send times kept)."""

    def __init__(self, media: RtpPeer) -> None:
        self.media = media
        self.k = 0
        self.sent: list[float] = []
        self._probe = media.codec.encode(tone(SPF))
        self._quiet = media.codec.encode(np.zeros(SPF, np.int16))

    def install(self) -> None:
        self.media._next_frame = self.next_frame  # type: ignore[method-assign]

    def next_frame(self) -> bytes:
        self.k += 1
        if self.k % PROBE_EVERY == 0:
            self.sent.append(time.time())  # the send loop sends it right after this returns
            return self._probe
        return self._quiet


class Ear:
    """What a SIP caller heard, decoded once per packet (polled often while a trial runs)."""

    def __init__(self, media: RtpPeer) -> None:
        self.media = media
        self.heard: list[tuple[float, Int16Array]] = []
        self.last = 0.0  # arrival of the last packet with an audible sample
        self._seen = 0

    def packets(self) -> list[tuple[float, Int16Array]]:
        rx = self.media.received
        for p in rx[self._seen :]:
            if p.pt == self.media.payload_type:
                pcm = self.media.codec.decode(p.payload)
                self.heard.append((p.arrival, pcm))
                if peak(pcm) >= AUDIBLE:
                    self.last = p.arrival
        self._seen = len(rx)
        return self.heard

    def last_audible(self) -> float:
        self.packets()
        return self.last


def burst_arrivals(packets: list[tuple[float, Int16Array]], t_from: float) -> list[float]:
    """Arrival of the packet holding the first loud sample of each burst after ``t_from``."""
    out: list[float] = []
    quiet = True
    for t, pcm in packets:
        if t < t_from:
            continue
        loud = peak(pcm) > LOUD
        if loud and quiet:
            out.append(t)
        quiet = not loud
    return out


def silence_after(packets: list[tuple[float, Int16Array]], t: float, until: float) -> float | None:
    """When the caller heard the last audible sample in ``[t, until)``: its packet's arrival
    plus its offset in the packet. ``None`` when the audio had not stopped 100 ms before
    ``until`` (a pause between words is not silence: nothing may follow it in the window)."""
    last: float | None = None
    for arr, pcm in packets:
        if arr < t or arr >= until:
            continue
        idx = np.nonzero(np.abs(pcm.astype(np.int32)) >= AUDIBLE)[0]
        if len(idx):
            last = arr + (int(idx[-1]) + 1) / RATE
    if last is None or last > until - 0.1:
        return None
    return last


def _pair(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``b[i] − a[i]`` in ms, for as many as both have."""
    return [(y - x) * 1000 for x, y in zip(a, b, strict=False)]


async def _call(sip: tuple[str, int], gw: Any) -> tuple[SipClient, ClientCall, Call]:
    before = set(gw.manager.calls)
    client = await SipClient.open("127.0.0.1")
    call = await client.invite(sip, codecs=("PCMU",), send_media=False)
    if call.status != 200:
        client.close()
        raise RuntimeError(f"INVITE answered {call.status}")
    new = [c for cid, c in gw.manager.calls.items() if cid not in before]
    if len(new) != 1:
        client.close()
        raise RuntimeError("could not find the gateway's side of the call")
    return client, call, new[0]


async def _bye(client: SipClient, call: ClientCall) -> None:
    with contextlib.suppress(Exception):
        await call.bye(timeout=2.0)
    client.close()


@dataclass
class BridgeOptions:
    probe_calls: int = 2
    bursts: int = 60
    clears: int = 20
    bargein_trials: int = 8
    echo_s: float = 60.0
    capacity: list[int] = field(default_factory=lambda: [10, 40])
    capacity_hold_s: float = 20.0
    parts: tuple[str, ...] = PARTS
    keep_dir: str | None = None


async def _probe_part(opts: BridgeOptions, work: Path, engine: Any) -> dict[str, Any]:
    rows: dict[str, list[float]] = {k: [] for k in (
        "caller_to_bot_added", "caller_to_bot_raw", "bot_to_caller_added",
        "bot_to_caller_ws", "bot_to_caller_wire", "bot_to_caller_tick_wait",
        "bot_to_caller_raw", "clear_to_silence")}  # fmt: skip
    counts: dict[str, int] = {"caller_probes": 0, "bot_bursts": 0, "clears": 0, "unmatched": 0}
    with bot_process("probe", work) as bot:
        url = f"ws://127.0.0.1:{bot.port}/probe?bursts={opts.bursts}&clears={opts.clears}"
        overrides = {"agent.kind": "stream", "stream.url": url}
        async with local_gateway(engine, name="bench-bridge", overrides=overrides) as local:
            probe = GatewayProbe()
            probe.install()
            try:
                for i in range(opts.probe_calls):
                    await _probe_call(opts, local, bot, probe, rows, counts, i)
            finally:
                probe.remove()
    return {"rows": rows, "counts": counts}


async def _probe_call(
    opts: BridgeOptions, local: Any, bot: BotProc, probe: GatewayProbe,
    rows: dict[str, list[float]], counts: dict[str, int], i: int,
) -> None:  # fmt: skip
    client, call, gw_call = await _call(local.sip, local.gw)
    caller = ProbeCaller(call.media)
    caller.install()
    call.media.start_sending()
    t0 = time.time()
    deadline = time.monotonic() + 30 + opts.bursts * 0.4 + opts.clears * 2.0
    call_sid: str | None = None
    while time.monotonic() < deadline:
        evs = [e for e in bot.events() if e["t"] >= t0]
        done = [e for e in evs if e["ev"] == "done"]
        if done:
            call_sid = done[-1]["call"]
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)
    await _bye(client, call)
    await asyncio.sleep(0.3)
    if call_sid is None:
        raise RuntimeError("the probe bot did not finish its schedule")
    evs = [e for e in bot.events() if e.get("call") == call_sid]
    in_loud = [float(e["at"]) for e in evs if e["ev"] == "in_loud"]
    out_burst = [float(e["t"]) for e in evs if e["ev"] == "out_burst"]
    clears = [float(e["t"]) for e in evs if e["ev"] == "clear"]
    taps = probe.tapped.get(gw_call.id, [])
    recv = probe.received.get(gw_call.id, [])[: len(out_burst)]
    ticks = probe.ticked.get(gw_call.id, [])[: len(out_burst)]
    packets = Ear(call.media).packets()
    arrivals = burst_arrivals(packets, out_burst[0] if out_burst else t0)[: len(out_burst)]
    n = min(len(caller.sent), len(taps), len(in_loud))
    counts["caller_probes"] += n
    counts["unmatched"] += abs(len(taps) - len(in_loud))
    rows["caller_to_bot_added"] += _pair(taps[:n], in_loud[:n])
    rows["caller_to_bot_raw"] += _pair(caller.sent[:n], in_loud[:n])
    m = min(len(out_burst), len(recv), len(ticks), len(arrivals))
    counts["bot_bursts"] += m
    counts["unmatched"] += len(out_burst) - m
    ws = _pair(out_burst[:m], recv[:m])
    wait = _pair(recv[:m], ticks[:m])
    wire = _pair(ticks[:m], arrivals[:m])
    rows["bot_to_caller_ws"] += ws
    rows["bot_to_caller_tick_wait"] += wait
    rows["bot_to_caller_wire"] += wire
    rows["bot_to_caller_added"] += [a + b for a, b in zip(ws, wire, strict=True)]
    rows["bot_to_caller_raw"] += _pair(out_burst[:m], arrivals[:m])
    for t in clears:
        s = silence_after(packets, t, t + 0.5)  # the next tone starts 0.6 s after a clear
        if s is not None:
            rows["clear_to_silence"].append((s - t) * 1000)
            counts["clears"] += 1


# --- part 2 and 3: the pipecat bot --------------------------------------------------------------
class TwilioPhone:
    """Twilio's side of a Media Stream, as far as a caller hears it: paced inbound μ-law (with
    speech when asked), and the bot's audio played on a 20 ms speaker clock from a queue that
    ``clear`` empties (each played frame kept with its play time)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sid = "MZ" + os.urandom(16).hex()
        self.queue: Int16Array = np.zeros(0, np.int16)
        self.played: list[tuple[float, Int16Array]] = []
        self.last = 0.0  # play time of the last frame with an audible sample
        self.speech: Int16Array | None = None
        self.speech_sent: list[float] = []  # send time of each speech frame
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.ws.send_str(json.dumps({"event": "connected", "protocol": "Call",
                                           "version": "1.0.0"}))  # fmt: skip
        await self.ws.send_str(
            json.dumps(
                {
                    "event": "start",
                    "streamSid": self.sid,
                    "start": {
                        "accountSid": "AC" + "0" * 32,
                        "streamSid": self.sid,
                        "callSid": "CA" + os.urandom(16).hex(),
                        "tracks": ["inbound"],
                        "customParameters": {"from_number": "+15550100", "to_number": "+15550199"},
                        "mediaFormat": {
                            "encoding": "audio/x-mulaw",
                            "sampleRate": RATE,
                            "channels": 1,
                        },
                    },
                }
            )
        )
        self._tasks = [asyncio.create_task(self._tick()), asyncio.create_task(self._receive())]

    async def press(self, digit: str) -> None:
        await self.ws.send_str(
            json.dumps(
                {
                    "event": "dtmf",
                    "streamSid": self.sid,
                    "dtmf": {"track": "inbound_track", "digit": digit},
                }
            )
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.send_str(json.dumps({"event": "stop", "streamSid": self.sid}))
        for t in self._tasks:
            t.cancel()

    async def _tick(self) -> None:
        t0, n = time.monotonic(), 0
        while True:
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
            now = time.time()
            out, self.queue = self.queue[:SPF], self.queue[SPF:]
            self.played.append((now, out))
            if peak(out) >= AUDIBLE:
                self.last = now
            frame = np.zeros(SPF, np.int16)
            if self.speech is not None:
                i = len(self.speech_sent) * SPF
                piece = self.speech[i : i + SPF]
                frame[: len(piece)] = piece
                self.speech_sent.append(now)
                if i + SPF >= len(self.speech):
                    self.speech = None
            await self.ws.send_str(
                _media(self.sid, frame).replace('"media": {', '"media": {"track": "inbound", ', 1)
            )
            n += 1

    async def _receive(self) -> None:
        async for msg in self.ws:
            if not isinstance(msg.data, str):
                continue
            data = json.loads(msg.data)
            if data.get("event") == "media":
                pcm = ulaw_decode(base64.b64decode(data["media"]["payload"]))
                self.queue = np.concatenate((self.queue, pcm))
            elif data.get("event") == "clear":
                self.queue = np.zeros(0, np.int16)


def _audible_since(packets: list[tuple[float, Int16Array]], t: float) -> float:
    """Seconds of audible bot audio (frames with an audible sample) after ``t``."""
    return sum(len(p) / RATE for a, p in packets if a >= t and peak(p) >= AUDIBLE)


async def _wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return False


async def _trials(
    n: int, speech: Int16Array, press: Callable[[], Any], packets: Callable[[], list[Any]],
    last: Callable[[], float], talk: Callable[[Int16Array], Any],
    sent_time: Callable[[], float | None], bot: BotProc,
) -> list[dict[str, float]]:  # fmt: skip
    """Per trial (after one unmeasured warm-up): key 5, wait for the story, talk over it 1–2.5 s
    in; onset → the bot silent at the caller, split at the bot's ``InterruptionFrame`` (its VAD
    decided; the serializer sends ``clear`` then)."""
    onset_idx = first_audible(speech)
    out: list[dict[str, float]] = []
    rnd = random.Random(5)
    for i in range(n + 1):
        t_press = time.time()
        await press()
        if not await _wait_for(lambda t=t_press: last() > t, 30.0):  # type: ignore[misc]
            continue
        await asyncio.sleep(rnd.uniform(1.0, 2.5))
        talk(speech)
        if not await _wait_for(lambda: sent_time() is not None, 2.0):
            continue
        t_first = sent_time()
        assert t_first is not None
        onset = t_first + onset_idx / RATE
        await asyncio.sleep(len(speech) / RATE + 1.0)
        cuts = [e["t"] for e in bot.events() if e.get("event") == "InterruptionFrame"]
        decided = next((float(t) for t in cuts if t > onset), None)
        # Silence: the bot's last audible sample before it went quiet for good after its
        # decision (the window ends 0.6 s after it: a bot slow to generate can leave gaps
        # in its own speech, which are not silence).
        silent = None if decided is None else silence_after(packets(), onset, decided + 0.6)
        if i > 0:  # 0: the warm-up
            out.append(bargein_trial(onset, decided, silent))
        await _wait_for(lambda: time.time() - last() > 1.5, 30.0)
        # pipecat keeps the user's turn open for a while after they stop (no transcript
        # comes to end it in this bot): a new turn started inside it does not interrupt.
        await asyncio.sleep(TURN_GAP_S)
    return out


async def _bargein_voxgate(
    opts: BridgeOptions, engine: Any, bot: BotProc, speech: Int16Array, echo_gate: bool
) -> list[dict[str, float]]:
    url = f"ws://127.0.0.1:{bot.port}/ws"
    overrides = {"agent.kind": "stream", "stream.url": url, "stream.echo_gate": echo_gate}
    async with local_gateway(engine, name="bench-bridge", overrides=overrides) as local:
        client, call, _ = await _call(local.sip, local.gw)
        mixer = CallerMixer(call.media, echo=False)
        mixer.install()
        call.media.start_sending()
        times: list[float] = []
        orig = mixer.next_frame

        def next_frame() -> bytes:
            times.append(time.time())
            return orig()

        call.media._next_frame = next_frame  # type: ignore[method-assign]
        ear = Ear(call.media)
        try:
            await _wait_for(lambda: ear.last_audible() > 0, BOT_START_S)
            await _wait_for(lambda: time.time() - ear.last_audible() > 1.0, 30.0)

            async def press() -> None:
                call.media.send_dtmf("5")

            def talk(pcm: Int16Array) -> None:
                mixer.start_speech(pcm)

            def sent() -> float | None:
                k0 = mixer.speech_k0
                return times[k0] if mixer.speech is not None and len(times) > k0 else None

            return await _trials(opts.bargein_trials, speech, press, ear.packets,
                                 ear.last_audible, talk, sent, bot)  # fmt: skip
        finally:
            await _bye(client, call)


async def _bargein_pipecat(
    opts: BridgeOptions, bot: BotProc, speech: Int16Array
) -> list[dict[str, float]]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"ws://127.0.0.1:{bot.port}/ws") as ws,
    ):
        phone = TwilioPhone(ws)
        await phone.start()
        try:
            await _wait_for(lambda: phone.last > 0, BOT_START_S)
            await _wait_for(lambda: time.time() - phone.last > 1.0, 30.0)

            def talk(pcm: Int16Array) -> None:
                phone.speech_sent = []
                phone.speech = pcm

            def sent() -> float | None:
                return phone.speech_sent[0] if phone.speech_sent else None

            return await _trials(opts.bargein_trials, speech, lambda: phone.press("5"),
                                 lambda: phone.played, lambda: phone.last, talk,
                                 sent, bot)  # fmt: skip
        finally:
            await phone.close()


async def _echo(
    opts: BridgeOptions, engine: Any, bot: BotProc, echo_gate: bool, gain_db: float
) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{bot.port}/ws"
    overrides = {"agent.kind": "stream", "stream.url": url, "stream.echo_gate": echo_gate}
    async with local_gateway(engine, name="bench-bridge", overrides=overrides) as local:
        client, call, _ = await _call(local.sip, local.gw)
        mixer = CallerMixer(call.media, echo=True)
        mixer.gain = 10 ** (gain_db / 20)
        mixer._echo_buf = np.zeros(RATE * ECHO_DELAY_MS // 1000, np.int16)
        mixer.install()
        call.media.start_sending()
        ear = Ear(call.media)
        t0 = time.time()  # from the answer: the greeting's echo counts too
        try:
            await _wait_for(lambda: ear.last_audible() > 0, BOT_START_S)
            await _wait_for(lambda: time.time() - ear.last_audible() > 1.0, 30.0)
            while time.time() - t0 < opts.echo_s:
                call.media.send_dtmf("5")
                t_press = time.time()
                await _wait_for(lambda t=t_press: ear.last_audible() > t, 10.0)  # type: ignore[misc]
                await _wait_for(
                    lambda: time.time() - ear.last_audible() > 0.5,
                    max(1.0, opts.echo_s - (time.time() - t0)),
                )
            t1 = time.time()
            speaking_s = _audible_since(ear.packets(), t0)
        finally:
            await _bye(client, call)
    interruptions = distinct(
        e["t"] for e in bot.events() if e.get("event") == "InterruptionFrame" and t0 <= e["t"] <= t1
    )
    return {"echo_gate": echo_gate, "echo_db": gain_db, "run_s": round(t1 - t0, 1),
            "bot_speaking_s": round(speaking_s, 1), "false_interruptions": len(interruptions),
            "per_min": len(interruptions) / max(speaking_s / 60, 1e-9)}  # fmt: skip


def distinct(times: Iterable[float], within_s: float = 0.1) -> list[float]:
    """One interruption per burst of ``InterruptionFrame``s (pipecat pushes one per
    processor: the observer sees each frame several times)."""
    out: list[float] = []
    for t in sorted(times):
        if not out or t - out[-1] > within_s:
            out.append(t)
    return out


def bargein_trial(onset: float, decided: float | None, silent: float | None) -> dict[str, float]:
    """One bot-driven barge-in trial from the caller's speech onset, the bot's decision (its
    ``InterruptionFrame``) and the caller-side silence (:func:`silence_after`), seconds."""
    if decided is None or silent is None:
        # No interruption, or audio still playing 0.5 s after it.
        return {"missed": 1.0}
    if silent < decided - BOT_GAP_S:
        # The bot had fallen silent on its own long before its VAD decided (its TTS behind on
        # a loaded box leaves gaps in its speech): nothing was interrupted at the caller, so
        # the trial says nothing about the path. Counted, not measured.
        return {"bot_gap": 1.0}
    return {
        "total_ms": (silent - onset) * 1000,
        "onset_to_decision_ms": (decided - onset) * 1000,
        "decision_to_silence_ms": (silent - decided) * 1000,
    }


def _split(rows: list[dict[str, float]]) -> dict[str, Any]:
    return {
        **{
            key: _stats([r[key] for r in rows if key in r])
            for key in ("total_ms", "onset_to_decision_ms", "decision_to_silence_ms")
        },
        "missed": sum(1 for r in rows if "missed" in r),
        "bot_gap": sum(1 for r in rows if "bot_gap" in r),
        "trials": rows,
    }


async def _pipecat_part(opts: BridgeOptions, work: Path, engine: Any) -> dict[str, Any]:
    speech = caller_sentence(engine, "Excuse me, sorry, I have a quick question about that.")
    out: dict[str, Any] = {}
    with bot_process("pipecat", work) as bot:
        if "bargein" in opts.parts:
            # Alternating paths would need a call each; each path's first trial is a warm-up.
            out["bargein_voxgate"] = _split(
                await _bargein_voxgate(opts, engine, bot, speech, False)
            )
            out["bargein_pipecat_twilio"] = _split(await _bargein_pipecat(opts, bot, speech))
            out["bargein_voxgate_echo_gate"] = _split(
                await _bargein_voxgate(opts, engine, bot, speech, True)
            )
        if "echo" in opts.parts:
            # The issue's −15 dB, and a loud speakerphone's −6 dB.
            out["echo"] = [
                await _echo(opts, engine, bot, gate, db)
                for db in (ECHO_GAIN_DB, LOUD_ECHO_DB)
                for gate in (False, True)
            ]
    return out


# --- part 4: capacity --------------------------------------------------------------------------
def _capacity(opts: BridgeOptions, work: Path) -> list[dict[str, Any]]:
    from voxgate.bench.calls import BenchOptions, run_bench

    levels = []
    with bot_process("probe", work) as bot:
        for n in opts.capacity:
            r = run_bench(BenchOptions(
                calls=n, rate=10.0, duration=opts.capacity_hold_s + n / 10.0, sample_calls=3,
                latency_calls=3, idle_s=2.0,
                extra_args=["--agent-kind", "stream",
                            "--stream-url", f"ws://127.0.0.1:{bot.port}/talk"],
            ))  # fmt: skip
            cpu, pacing = r["cpu"], r["pacing"]
            levels.append({
                "calls": n,
                "held_min": r["calls"]["held_during_plateau"]["min"],
                "gateway_cpu_pct_core": cpu["plateau"].get("total_pct_core"),
                "per_call_pct_core": cpu["per_call_pct_core"],
                "per_call_event_loop_pct_core": cpu["per_call_event_loop_pct_core"],
                "ticker_send_error_ms": {
                        k: v for k, v in pacing["ticker_send_error_ms"].items() if k != "counts"
                    },
                "skipped_ticks": pacing["skipped_ticks_total"],
                "underrun_frames": r["underruns"]["playout_underrun_frames_total"],
                "sipp": r["calls"]["sipp"],
            })  # fmt: skip
    return levels


# --- the run ---------------------------------------------------------------------------------
def conditions() -> dict[str, Any]:
    import importlib.metadata as md

    return {
        "cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_1m_at_start": os.getloadavg()[0],
        "pipecat_ai": md.version("pipecat-ai"), "python": sys.version.split()[0],
        "codec": "PCMU 8 kHz, 20 ms",
        "echo": f"{ECHO_GAIN_DB:g} and {LOUD_ECHO_DB:g} dB, {ECHO_DELAY_MS} ms",
        "clock": "time.time() in every process; packet arrivals are kernel timestamps",
        "caller_speech_dbfs": SPEECH_DBFS,
    }  # fmt: skip


def run_bridge_bench(opts: BridgeOptions) -> dict[str, Any]:
    from synth.engines import load_engine

    work = Path(opts.keep_dir or tempfile.mkdtemp(prefix="vg-bench-bridge-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"conditions": conditions(), "options": asdict(opts),
                              "goals": GOALS}  # fmt: skip
    engine = load_engine("onnx")
    if "probe" in opts.parts:
        probe = asyncio.run(_probe_part(opts, work, engine))
        result["probe"] = {"counts": probe["counts"],
                           **{k: _stats(v) for k, v in probe["rows"].items()}}  # fmt: skip
    if "bargein" in opts.parts or "echo" in opts.parts:
        result["pipecat"] = asyncio.run(_pipecat_part(opts, work, engine))
    if "capacity" in opts.parts:
        result["capacity"] = _capacity(opts, work)
    result["conditions"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    result["work_dir"] = str(work)
    return result


def _stats(values: list[float]) -> dict[str, float]:
    return percentiles(values) | {"max": max(values, default=float("nan"))}


def _row(name: str, p: dict[str, Any]) -> str:
    return (
        f"  {name:<44} p50 {fmt(p.get('p50'))}  p95 {fmt(p.get('p95'))}  "
        f"p99 {fmt(p.get('p99'))}  max {fmt(p.get('max'))}  (n={p.get('n', '?')})"
    )


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        "voxgate bench bridge (the stream agent: SIP caller ↔ voxgate ↔ Twilio Media Streams bot)",
        f"  {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f} at start; "
        f"pipecat-ai {c['pipecat_ai']}; {c['codec']}; ms on {c['clock']}",
        "1. probe bot (aiohttp, own process)",
    ]
    p = r.get("probe")
    for key, label in (() if p is None else (
        ("caller_to_bot_added", "caller→bot, added (tap → bot's socket)"),
        ("caller_to_bot_raw", "caller→bot, raw (caller send → bot)"),
        ("bot_to_caller_added", "bot→caller, added (ws + tick→wire)"),
        ("bot_to_caller_ws", "  bot send → play_audio"),
        ("bot_to_caller_tick_wait", "  wait for the 20 ms tick (pacing)"),
        ("bot_to_caller_wire", "  tick → packet at the caller"),
        ("bot_to_caller_raw", "bot→caller, raw (bot send → packet)"),
        ("clear_to_silence", "clear → silence at the caller"),
    )):  # fmt: skip
        assert p is not None
        lines.append(_row(label, p[key]))
    if p is not None:
        lines.append(f"  counts: {p['counts']}")
    pc = r.get("pipecat", {})
    if "bargein_voxgate" in pc:
        lines.append("2. bot-driven barge-in, caller speech onset → bot silent at the caller "
                     "(same pipecat bot; split at its InterruptionFrame)")  # fmt: skip
        for key, label in (
            ("bargein_voxgate", "via voxgate (SIP, echo_gate off)"),
            ("bargein_voxgate_echo_gate", "via voxgate (SIP, echo_gate on)"),
            ("bargein_pipecat_twilio", "pipecat's own Twilio path (Twilio-like)"),
        ):
            lines.append(_row(label, pc[key]["total_ms"]))
            lines.append(_row("  onset → the bot's VAD decides", pc[key]["onset_to_decision_ms"]))
            lines.append(_row("  decision → silent at the caller",
                              pc[key]["decision_to_silence_ms"]))  # fmt: skip
            lines.append(
                f"    trials not measured: {pc[key]['missed']} missed (no interruption "
                f"heard), {pc[key].get('bot_gap', 0)} with the bot already silent"
            )
    if "echo" in pc:
        lines.append(f"3. echo ({ECHO_DELAY_MS} ms): false interruptions by the bot's VAD")
        for e in pc["echo"]:
            lines.append(f"  {e['echo_db']:g} dB, echo_gate {'on ' if e['echo_gate'] else 'off'}: "
                         f"{e['false_interruptions']} in {e['bot_speaking_s']} s of bot speech "
                         f"= {e['per_min']:.1f}/min")  # fmt: skip
    if "capacity" in r:
        lines.append("4. capacity (voxgate bench calls, --agent-kind stream, probe /talk bots)")
        for lv in r["capacity"]:
            t = lv["ticker_send_error_ms"]
            lines.append(
                f"  {lv['calls']:>4} calls: held {lv['held_min']}, CPU/call "
                f"{fmt(lv['per_call_pct_core'], '.2f')} % of a core (event loop "
                f"{fmt(lv['per_call_event_loop_pct_core'], '.2f')} %), ticker p99 "
                f"{fmt(t.get('p99'))} ms, skipped ticks {lv['skipped_ticks']}, underruns "
                f"{lv['underrun_frames']}"
            )
    lines.append(f"  load {c.get('loadavg_1m_at_end', float('nan')):.2f} at end")
    return "\n".join(lines)


def options_from_args(args: argparse.Namespace) -> BridgeOptions:
    return BridgeOptions(
        probe_calls=args.probe_calls, bursts=args.bursts, clears=args.clears,
        bargein_trials=args.bargein_trials, echo_s=args.echo_s,
        capacity=[int(x) for x in args.capacity.split(",") if x.strip()],
        capacity_hold_s=args.capacity_hold_s, keep_dir=args.keep_dir,
        parts=tuple(x.strip() for x in args.parts.split(",") if x.strip()),
    )  # fmt: skip


def cmd_bench_bridge(args: argparse.Namespace) -> int:
    result = run_bridge_bench(options_from_args(args))
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(
            json.dumps(strict_json(result), indent=2, default=json_default) + "\n"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m voxgate.bench.bridge")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("probe-bot")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--log", required=True)
    r = sub.add_parser("run")
    add_bridge_arguments(r)
    args = ap.parse_args(argv)
    if args.cmd == "probe-bot":
        serve_probe_bot(args.port, args.log)
        return 0
    return cmd_bench_bridge(args)


if __name__ == "__main__":
    sys.exit(main())
