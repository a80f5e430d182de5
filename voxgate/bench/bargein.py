"""``voxgate bench bargein``: barge-in latency, misses and false triggers over real SIP calls.

One process, one run (uvloop): an in-process :class:`gateway.app.Gateway` on free loopback
ports with a memory bus and a real onnx :class:`synth.worker.Worker` (no render cache: every
greeting is synthesised, so a cancel stops real work), and the Python SIP/RTP client
(:mod:`voxgate.bench.sipclient`) placing sequential calls.

Caller side: the client's outgoing frames come from a mixer that replaces the client's frame
source (``RtpPeer._next_frame``): optional echo (the agent's audio as received, −15 dB, 100 ms
later) plus, from a chosen frame on, a caller sentence (the project's TTS through the phone chain
at −20 dBFS active level).

1. *speech trials* (``--trials``; half with echo = double talk, half without): answer, wait for
   the greeting, start the sentence 0.5–3 s into it, watch for ``call.bargeins``;
2. *echo-only calls*: the client only echoes the greeting (−15 dB, 100 ms) until the greeting
   ends; every barge-in is false. Calls are added until ``--echo-seconds`` of greeting was echoed.

Where the figures come from (media times are the call's media clock, RTP timestamp − first
timestamp, in ms, the clock of ``gateway.call.control.BargeIn``):
- *ground-truth onset*: ``Call.on_caller_audio`` is wrapped (bench process only) to keep each
  caller frame with its media position; the client's frame that holds the sentence's first
  audible sample (first 10 ms window at ≥ −45 dBFS RMS) is found there by content (its G.711
  decoding), so the onset is that frame's gateway position + the sample's offset in the frame;
- *decision/zero*: ``BargeIn.decision_ms`` / ``zero_ms``; *worker stop*: ``WorkerStopped.stop_ms``;
- *client silence*: wall time from the gateway's decision (noted in the wrapper right after the
  ``on_caller_audio`` call that decided) to the kernel arrival time at the client of the RTP
  packet holding the agent's last non-zero sample;
- *missed*: no barge-in decided within 1 s after the ground-truth onset; *early*: a barge-in
  decided before the caller's onset (a false barge-in during a speech trial).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import platform
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dsp.pcm import float_to_s16
from dsp.telephone import telephone
from gateway.call.calls import Call
from gateway.call.control import UtteranceFinished, WorkerStopped
from gateway.media.bargein import VadEvent
from gateway.sip.message import Address
from synth.engines.base import Engine
from voxgate.bench.localgw import local_gateway
from voxgate.bench.sipclient import RtpPeer, SipClient, rms
from voxgate.bench.util import cpu_model, fmt, percentiles, run_cli

Int16Array = npt.NDArray[np.int16]

TARGETS = {
    "decision_to_zero_p99_ms": 20.0,
    "onset_to_zero_p95_ms": 120.0,
    # As the caller hears it (issue 17): sent speech packet → first silent packet received.
    "caller_onset_to_silence_p50_ms": 100.0,
    "caller_onset_to_silence_p95_ms": 120.0,
    "false_bargeins_on_echo": 0,
    "missed": 0,
}
# Per-trial latencies exported raw under the JSON report's "samples" key.
SAMPLE_KEYS = (
    "decision_to_zero_ms", "onset_to_zero_ms", "onset_to_decision_ms",
    "caller_onset_to_silent_packet_ms",
)  # fmt: skip
SENTENCES = (
    "Hello? I'd like to talk to somebody about my bill.",
    "Sorry, can I speak to a real person please?",
    "Wait, I already know my balance, I need the opening hours.",
    "Excuse me, my card was charged twice last month.",
    "Hi, yes, I'm calling about an appointment on Friday.",
    "No no, stop, I want to cancel my order.",
)
SPF = 160  # 20 ms at 8 kHz
RATE = 8000
SPEECH_DBFS = -20.0  # caller's active speech level
AUDIBLE_DBFS = -45.0  # a 10 ms window at or above this is "audible" (ground-truth onset)
ECHO_GAIN_DB = -15.0
ECHO_DELAY_MS = 100
MISS_WINDOW_MS = 1000.0
OFFSET_RANGE_S = (0.5, 3.0)


@dataclass
class BenchOptions:
    trials: int = 20
    echo_seconds: float = 60.0
    seed: int = 1
    quick: bool = False
    engine: str = "onnx"
    # Interleave trials with bargein.on_arrival off (the detector behind the jitter buffer).
    baseline: bool = False


# --- caller side -------------------------------------------------------------------------------
def caller_sentence(engine: Engine, text: str) -> Int16Array:
    """A caller's sentence through the phone chain, scaled to ``SPEECH_DBFS`` active level."""
    x = np.asarray(telephone(engine.synthesize(text), engine.sample_rate), np.float64)
    win = 160
    frames = x[: len(x) // win * win].reshape(-1, win)
    levels = np.sqrt(np.mean(frames**2, axis=1))
    active = frames[levels > levels.max() * 10 ** (-30 / 20)]
    level = float(np.sqrt(np.mean(active**2))) if len(active) else float(np.sqrt(np.mean(x**2)))
    return float_to_s16(x * (10 ** (SPEECH_DBFS / 20) / max(level, 1e-9)))


def first_audible(pcm: Int16Array, dbfs: float = AUDIBLE_DBFS) -> int:
    """Index of the first sample starting a 10 ms window whose RMS is at least ``dbfs``."""
    x = pcm.astype(np.float64) ** 2
    win = 80
    c = np.concatenate(([0.0], np.cumsum(x)))
    mean = (c[win:] - c[:-win]) / win
    thr = (32768 * 10 ** (dbfs / 20)) ** 2
    hits = np.nonzero(mean >= thr)[0]
    return int(hits[0]) if len(hits) else 0


class CallerMixer:
    """The client's frame source: echo of what it received (optional) + a caller sentence."""

    def __init__(self, media: RtpPeer, *, echo: bool) -> None:
        self.media = media
        self.echo = echo
        self.gain = 10 ** (ECHO_GAIN_DB / 20)
        self._echo_buf: Int16Array = np.zeros(RATE * ECHO_DELAY_MS // 1000, np.int16)
        self._rx_seen = 0
        self._slot: int | None = None  # the sender's slot of the last frame produced
        self.k = 0  # frames produced
        self.sent: list[Int16Array] = []  # each frame as sent, G.711-decoded
        self.speech: Int16Array | None = None
        self.speech_k0 = 0

    def install(self) -> None:
        self.media._next_frame = self.next_frame  # type: ignore[method-assign]

    def start_speech(self, speech: Int16Array) -> None:
        self.speech, self.speech_k0 = speech, self.k

    def next_frame(self) -> bytes:
        out = np.zeros(SPF, np.float64)
        if self.echo:
            rx = self.media.received
            new = [
                self.media.codec.decode(p.payload)
                for p in rx[self._rx_seen :]
                if p.pt == self.media.payload_type
            ]
            self._rx_seen = len(rx)
            if new:
                self._echo_buf = np.concatenate([self._echo_buf, *new])
            # A hybrid's echo has a fixed delay: the slots a key press took (event packets,
            # no audio frame asked for) let their echo go by, or every press would add its
            # length to the echo delay.
            slot = self.media.slot
            if self._slot is not None and slot > self._slot + 1:
                self._echo_buf = self._echo_buf[(slot - self._slot - 1) * SPF :]
            self._slot = slot
            take = self._echo_buf[:SPF]
            self._echo_buf = self._echo_buf[SPF:]
            out[: len(take)] += take.astype(np.float64) * self.gain
        if self.speech is not None:
            i = (self.k - self.speech_k0) * SPF
            piece = self.speech[i : i + SPF]
            out[: len(piece)] += piece
        frame = np.clip(np.round(out), -32768, 32767).astype(np.int16)
        data = self.media.codec.encode(frame)
        self.sent.append(self.media.codec.decode(data))  # what the gateway decodes
        self.k += 1
        return data


# --- gateway side ------------------------------------------------------------------------------
@dataclass
class GatewayTap:
    """Wraps ``Call.on_caller_audio`` (class-wide, this process only): each caller frame with its
    media position, and the wall time of each barge-in decision."""

    frames: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    decided_wall: dict[str, list[float]] = field(default_factory=dict)
    _orig: Callable[[Call, Int16Array], None] | None = None
    _orig_packet: Callable[[Call, int, Int16Array], None] | None = None
    _orig_vad: Callable[[Call, list[VadEvent]], None] | None = None

    def install(self) -> None:
        orig = Call.on_caller_audio
        orig_packet = Call.on_caller_packet
        orig_vad = Call.on_vad
        self._orig = orig
        self._orig_packet = orig_packet
        self._orig_vad = orig_vad
        tap = self

        # Where the gateway got each caller frame on its media clock: the tick that handed it
        # over (jitter buffer), or — fed on arrival — the agent's clock when the packet came
        # in, less the packet's 20 ms (the frame of a tick spans the 20 ms up to far_pos).
        def on_caller_audio(call: Call, pcm: Int16Array) -> None:
            if not call._on_arrival:
                pos = call.media.tick_pos
                data = np.asarray(pcm, np.int16).tobytes()
                tap.frames.setdefault(call.id, []).append((pos, data))
            orig(call, pcm)

        def on_caller_packet(call: Call, ts: int, pcm: Int16Array) -> None:
            pos = call.media.far_pos - len(pcm)
            tap.frames.setdefault(call.id, []).append((pos, np.asarray(pcm, np.int16).tobytes()))
            orig_packet(call, ts, pcm)

        # Decisions come from the detectors' batch (Call.on_vad), a few ms after the frame.
        def on_vad(call: Call, events: list[VadEvent]) -> None:
            n = len(call.bargeins)
            orig_vad(call, events)
            if len(call.bargeins) > n:
                tap.decided_wall.setdefault(call.id, []).append(time.time())

        setattr(Call, "on_caller_audio", on_caller_audio)  # noqa: B010 (class-wide patch)
        setattr(Call, "on_caller_packet", on_caller_packet)  # noqa: B010
        setattr(Call, "on_vad", on_vad)  # noqa: B010

    def remove(self) -> None:
        if self._orig is not None:
            setattr(Call, "on_caller_audio", self._orig)  # noqa: B010
            self._orig = None
        if self._orig_packet is not None:
            setattr(Call, "on_caller_packet", self._orig_packet)  # noqa: B010
            self._orig_packet = None
        if self._orig_vad is not None:
            setattr(Call, "on_vad", self._orig_vad)  # noqa: B010
            self._orig_vad = None

    def position_of(self, call_id: str, pcm: Int16Array) -> int | None:
        """Media position at which the gateway got a frame with exactly this PCM."""
        key = np.asarray(pcm, np.int16).tobytes()
        for pos, data in self.frames.get(call_id, []):
            if data == key:
                return pos
        return None


@dataclass
class Live:
    gw: Any
    sip: Address
    settings: dict[str, Any]


@contextlib.asynccontextmanager
async def live_gateway(engine: Engine) -> AsyncIterator[Live]:
    async with local_gateway(engine, name="bench-bargein") as local:
        # The gateway's own [bargein] section, as it runs (reported with the figures).
        settings = dataclasses.asdict(local.cfg.bargein)
        yield Live(local.gw, local.sip, settings)


# --- one call ------------------------------------------------------------------------------------
async def _place(live: Live, echo: bool) -> tuple[SipClient, Any, CallerMixer, Call]:
    before = set(live.gw.manager.calls)
    client = await SipClient.open("127.0.0.1")
    call = await client.invite(live.sip, codecs=("PCMU",), send_media=False)
    if call.status != 200 or call.media is None:
        client.close()
        raise RuntimeError(f"INVITE answered {call.status}")
    mixer = CallerMixer(call.media, echo=echo)
    mixer.install()
    call.media.start_sending()
    new = [c for cid, c in live.gw.manager.calls.items() if cid not in before]
    if len(new) != 1:
        client.close()
        raise RuntimeError("could not find the gateway's side of the call")
    return client, call, mixer, new[0]


async def _hang_up(client: SipClient, call: Any) -> None:
    with contextlib.suppress(Exception):
        await call.bye(timeout=2.0)
    client.close()


def _finished(gw_call: Call) -> list[UtteranceFinished]:
    return [e for e in gw_call.history if isinstance(e, UtteranceFinished)]


async def speech_trial(
    live: Live, tap: GatewayTap, speech: Int16Array, *, echo: bool, offset_s: float
) -> dict[str, Any]:
    client, call, mixer, gw_call = await _place(live, echo)
    media: RtpPeer = call.media
    try:
        await media.wait_for_audio(timeout=15)
        await asyncio.sleep(offset_s)
        audible = first_audible(speech)
        mixer.start_speech(speech)
        k_on = mixer.speech_k0 + audible // SPF
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end and not gw_call.bargeins:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.6)  # the fade's packets, the worker's acknowledgement
        while mixer.k <= k_on + 10:  # the onset frame (and a few after) went out
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
    finally:
        await _hang_up(client, call)

    gt: float | None = None
    for j in range(10):  # the onset frame, else the first later frame the gateway got intact
        pos = tap.position_of(gw_call.id, mixer.sent[k_on + j])
        if pos is not None:
            gt = (pos - j * SPF + audible % SPF) * 1000 / RATE
            break
    r: dict[str, Any] = {
        "echo": echo, "offset_s": round(offset_s, 3), "onset_ms": gt,
        "bargeins": len(gw_call.bargeins),
    }  # fmt: skip
    if gt is None:
        r["error"] = "the onset frame was not found on the gateway side"
        return r
    early = [b for b in gw_call.bargeins if b.decision_ms < gt]
    hits = [b for b in gw_call.bargeins if gt <= b.decision_ms <= gt + MISS_WINDOW_MS]
    r["early"] = len(early)
    r["missed"] = not hits
    if not hits:
        return r
    b = hits[0]
    idx = gw_call.bargeins.index(b)
    r.update(
        detector_onset_ms=b.onset_ms, decision_ms=b.decision_ms, zero_ms=b.zero_ms,
        decision_to_zero_ms=b.zero_ms - b.decision_ms, onset_to_zero_ms=b.zero_ms - gt,
        detector_onset_to_zero_ms=b.zero_ms - b.onset_ms,
        onset_to_decision_ms=b.decision_ms - gt, detector_onset_error_ms=b.onset_ms - gt,
    )  # fmt: skip
    stops = [
        e.stop_ms
        for e in gw_call.history
        if isinstance(e, WorkerStopped) and e.utterance_id == b.utterance_id
    ]
    r["worker_stop_ms"] = stops[0] if stops else None
    # What the caller heard: the last non-zero agent sample and when its packet arrived.
    walls = tap.decided_wall.get(gw_call.id, [])
    pkts, frames = media.frames()
    if pkts and idx < len(walls):
        ts0 = pkts[0].ts
        zero = round(b.zero_ms * RATE / 1000)
        last_arrival: float | None = None
        last_pos = -1
        after_zero = 0
        for p, f in zip(pkts, frames, strict=True):
            rel = (p.ts - ts0) & 0xFFFFFFFF
            if rel >= zero + RATE // 2:
                continue
            nz = np.nonzero(f)[0]
            if len(nz) and rel + int(nz[-1]) >= last_pos:
                last_pos, last_arrival = rel + int(nz[-1]), p.arrival
            if rel + SPF > zero:
                after_zero += int(np.count_nonzero(f[max(0, zero - rel) :]))
        if last_arrival is not None:
            r["decision_to_client_silence_ms"] = (last_arrival - walls[idx]) * 1000
            r["last_nonzero_sample_ms"] = last_pos * 1000 / RATE
        r["nonzero_after_zero"] = after_zero
    r.update(caller_side(media, pkts, frames, k_on, b.zero_ms))
    return r


def caller_side(
    media: RtpPeer, pkts: list[Any], frames: list[Int16Array], k_on: int, zero_ms: float
) -> dict[str, Any]:
    """The barge-in as the caller lives it, on the wall clock at the caller's socket: from the
    moment the client *sent* the packet holding its first audible sample to the kernel arrival
    of the first agent packet that is silent because of the barge-in (the first packet at or
    after the gateway's zero point, by RTP timestamp, so a pause in the agent's speech before
    the decision is not taken for it), and to the arrival of the packet carrying the fade's
    end (the last one with agent audio).  Packet arrival, not playout: a phone adds its own
    jitter buffer on top of both."""
    if k_on >= len(media.sent_at) or not pkts:
        return {}
    sent = media.sent_at[k_on]
    ts0 = pkts[0].ts
    zero = round(zero_ms * RATE / 1000)
    silent: tuple[float, int] | None = None  # (arrival, peak) of the first packet past zero
    fade: float | None = None  # arrival of the packet holding the zero point
    for p, f in zip(pkts, frames, strict=True):
        rel = (p.ts - ts0) & 0xFFFFFFFF
        if rel >= zero and (silent is None or p.arrival < silent[0]):
            if rel < zero + 4 * SPF:  # the packets right after the zero point only
                silent = (p.arrival, int(np.abs(f).max(initial=0)))
        elif rel < zero <= rel + SPF:
            fade = p.arrival
    out: dict[str, Any] = {}
    if silent is not None:
        out["caller_onset_to_silent_packet_ms"] = (silent[0] - sent) * 1000
        out["silent_packet_peak"] = silent[1]
    if fade is not None:
        out["caller_onset_to_fade_packet_ms"] = (fade - sent) * 1000
    return out


async def echo_only_call(live: Live) -> dict[str, Any]:
    client, call, mixer, gw_call = await _place(live, echo=True)
    media: RtpPeer = call.media
    try:
        await media.wait_for_audio(timeout=15)
        t_end = time.monotonic() + 40
        while time.monotonic() < t_end and not _finished(gw_call):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the last echo goes back
    finally:
        await _hang_up(client, call)
    pkts, frames = media.frames()
    loud = [p.ts for p, f in zip(pkts, frames, strict=True) if rms(f) > 30]
    echo_s = ((loud[-1] - loud[0]) & 0xFFFFFFFF) / RATE + SPF / RATE if loud else 0.0
    rx, tx = rms(np.concatenate(frames)) if frames else 0.0, rms(np.concatenate(mixer.sent))
    return {
        "echo_s": echo_s,
        "echo_level_db": 20 * math.log10(max(tx, 1e-9) / max(rx, 1e-9)),
        "false_bargeins": len(gw_call.bargeins),
        "outcomes": [e.outcome for e in _finished(gw_call)],
    }


# --- the run -------------------------------------------------------------------------------------
def conditions(opts: BenchOptions, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    cpu = cpu_model()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "event_loop": "uvloop",
        "engine": opts.engine,
        "mode": "in-process gateway + onnx worker (memory bus, no render cache), loopback SIP/RTP",
        "trials": opts.trials,
        "echo_seconds_min": opts.echo_seconds,
        "seed": opts.seed,
        "quick": opts.quick,
        "baseline_interleaved": opts.baseline,
        "caller_speech_dbfs": SPEECH_DBFS,
        "audible_onset_dbfs": AUDIBLE_DBFS,
        "echo_gain_db": ECHO_GAIN_DB,
        "echo_delay_ms": ECHO_DELAY_MS,
        "offset_into_greeting_s": list(OFFSET_RANGE_S),
        "bargein_settings": settings or {},
    }


async def _run(opts: BenchOptions) -> dict[str, Any]:
    from synth.engines import load_engine

    cond = conditions(opts)
    engine = load_engine(opts.engine)
    speeches = [caller_sentence(engine, s) for s in SENTENCES]
    rng = random.Random(opts.seed)
    tap = GatewayTap()
    tap.install()
    trials: list[dict[str, Any]] = []
    echo_calls: list[dict[str, Any]] = []
    try:
        async with live_gateway(engine) as live:
            cond["bargein_settings"] = live.settings
            # One unmeasured call first: the first call pays for lazy set-up on both sides.
            await echo_only_warmup(live)
            settings = live.gw.manager.bargein
            on_arrival = settings.on_arrival
            for i in range(opts.trials):
                # Pairs: each sentence once without echo and once with it (double talk).
                n = (i // 2) % len(speeches)
                offset = rng.uniform(*OFFSET_RANGE_S)
                modes = (on_arrival, False) if opts.baseline else (on_arrival,)
                for mode in modes if i % 2 else modes[::-1]:
                    settings.on_arrival = mode  # read by the SIP leg as the call starts
                    trial = await speech_trial(
                        live, tap, speeches[n], echo=i % 2 == 1, offset_s=offset
                    )
                    trials.append({"sentence": n, "on_arrival": mode, **trial})
            settings.on_arrival = on_arrival
            while sum(c["echo_s"] for c in echo_calls) < opts.echo_seconds:
                echo_calls.append(await echo_only_call(live))
                if len(echo_calls) >= 50 or echo_calls[-1]["echo_s"] <= 0:
                    break
    finally:
        tap.remove()
    cond["loadavg_1m_at_end"] = os.getloadavg()[0]
    r = report(cond, [t for t in trials if t["on_arrival"] == on_arrival], echo_calls)
    base = [t for t in trials if t["on_arrival"] != on_arrival]
    if base:
        b = report(cond, base, [])
        r["baseline"] = {
            "on_arrival": not on_arrival,
            **{k: b[k] for k in ("trials", "by_echo", "samples", *_LATENCY_KEYS)},
        }
    return r


async def echo_only_warmup(live: Live) -> None:
    client, call, _mixer, _gw_call = await _place(live, echo=False)
    try:
        await call.media.wait_for_audio(timeout=30)
        await asyncio.sleep(0.3)
    finally:
        await _hang_up(client, call)


_LATENCY_KEYS = (
    "caller_onset_to_silent_packet_ms", "caller_onset_to_fade_packet_ms", "decision_to_zero_ms",
    "onset_to_zero_ms", "onset_to_decision_ms",
)  # fmt: skip


def report(
    cond: dict[str, Any], trials: list[dict[str, Any]], echo_calls: list[dict[str, Any]]
) -> dict[str, Any]:
    def vals(key: str, rows: list[dict[str, Any]] | None = None) -> list[float]:
        rows = trials if rows is None else rows
        return [float(t[key]) for t in rows if t.get(key) is not None]

    def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "trials": len(rows),
            "onset_to_zero_ms": percentiles(vals("onset_to_zero_ms", rows)),
            "decision_to_zero_ms": percentiles(vals("decision_to_zero_ms", rows)),
            "missed": sum(1 for t in rows if t.get("missed") is True),
            "early": sum(int(t.get("early", 0)) for t in rows),
        }

    echo_s = sum(c["echo_s"] for c in echo_calls)
    false_n = sum(int(c["false_bargeins"]) for c in echo_calls)
    missed = sum(1 for t in trials if t.get("missed") is True)
    errors = [t["error"] for t in trials if "error" in t]
    r: dict[str, Any] = {
        "conditions": cond,
        "trials": {
            "speech": len(trials),
            "with_echo": sum(1 for t in trials if t["echo"]),
            "without_echo": sum(1 for t in trials if not t["echo"]),
            "measured": sum(1 for t in trials if t.get("onset_to_zero_ms") is not None),
            "missed": missed,
            "early_bargeins": sum(int(t.get("early", 0)) for t in trials),
            "errors": errors,
        },
        "decision_to_zero_ms": percentiles(vals("decision_to_zero_ms")),
        "decision_to_client_silence_ms": percentiles(vals("decision_to_client_silence_ms")),
        "caller_onset_to_silent_packet_ms": percentiles(vals("caller_onset_to_silent_packet_ms")),
        "caller_onset_to_fade_packet_ms": percentiles(vals("caller_onset_to_fade_packet_ms")),
        # A "silent" packet that was not (its peak): 0 when the fade ends in the packet before.
        "silent_packet_peak_max": max([int(t.get("silent_packet_peak", 0)) for t in trials] or [0]),
        "onset_to_zero_ms": percentiles(vals("onset_to_zero_ms")),
        "detector_onset_to_zero_ms": percentiles(vals("detector_onset_to_zero_ms")),
        "onset_to_decision_ms": percentiles(vals("onset_to_decision_ms")),
        "detector_onset_error_ms": percentiles(vals("detector_onset_error_ms")),
        "worker_stop_ms": percentiles(vals("worker_stop_ms")),
        # Barge-ins whose utterance the worker was still synthesising (a cancel to acknowledge);
        # for the others synthesis had already finished (RTF well under 1).
        "worker_stops_acknowledged": len(vals("worker_stop_ms")),
        "nonzero_samples_after_zero": sum(int(t.get("nonzero_after_zero", 0)) for t in trials),
        "by_echo": {
            "with_echo": block([t for t in trials if t["echo"]]),
            "without_echo": block([t for t in trials if not t["echo"]]),
        },
        "echo_only": {
            "calls": len(echo_calls),
            "echo_s": echo_s,
            "false_bargeins": false_n,
            "false_per_min": false_n / (echo_s / 60) if echo_s > 0 else float("nan"),
            "greetings_done": sum(1 for c in echo_calls if c["outcomes"][:1] == ["done"]),
            "echo_level_db": percentiles([c["echo_level_db"] for c in echo_calls]),
        },
        "targets": TARGETS,
        "per_trial": trials,
        # Raw per-trial values (trial order, measured trials only) for CDF plots.
        "samples": {key: vals(key) for key in SAMPLE_KEYS},
    }
    d2z, o2z = r["decision_to_zero_ms"]["p99"], r["onset_to_zero_ms"]["p95"]
    c2s = r["caller_onset_to_silent_packet_ms"]
    r["met"] = {
        "caller_onset_to_silence": not math.isnan(c2s["p95"])
        and c2s["p50"] <= TARGETS["caller_onset_to_silence_p50_ms"]
        and c2s["p95"] <= TARGETS["caller_onset_to_silence_p95_ms"],
        "decision_to_zero": not math.isnan(d2z) and d2z <= TARGETS["decision_to_zero_p99_ms"],
        "onset_to_zero": not math.isnan(o2z) and o2z <= TARGETS["onset_to_zero_p95_ms"],
        "false_bargeins_on_echo": false_n <= TARGETS["false_bargeins_on_echo"] and echo_s > 0,
        "missed": missed <= TARGETS["missed"] and not errors,
    }
    return r


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    import uvloop

    return uvloop.run(_run(opts))


# --- output --------------------------------------------------------------------------------------
def format_report(r: dict[str, Any]) -> str:
    c, t, e, met = r["conditions"], r["trials"], r["echo_only"], r["met"]

    def row(name: str, d: dict[str, Any], extra: str = "") -> str:
        return (
            f"  {name:<44} p50 {fmt(d['p50']):>7}  p95 {fmt(d['p95']):>7}  p99 {fmt(d['p99']):>7}"
            f"  (n={d['n']}){extra}"
        )

    def mark(key: str) -> str:
        return "met" if met[key] else "MISSED"

    lines = [
        "voxgate bench bargein",
        f"  conditions: {c['cpu']}, {c['cores']} cores, load {c['loadavg_1m_at_start']:.2f} → "
        f"{c.get('loadavg_1m_at_end', float('nan')):.2f}, python {c['python']}, {c['event_loop']}",
        f"  {c['mode']}; engine {c['engine']}; seed {c['seed']}"
        + ("; QUICK" if c["quick"] else ""),
        f"  caller speech {c['caller_speech_dbfs']} dBFS, {c['offset_into_greeting_s'][0]}–"
        f"{c['offset_into_greeting_s'][1]} s into the greeting; echo {c['echo_gain_db']} dB "
        f"@ {c['echo_delay_ms']} ms; onset = first 10 ms at ≥ {c['audible_onset_dbfs']} dBFS",
        f"  detector: {c['bargein_settings']}",
        f"  speech trials: {t['speech']} ({t['with_echo']} double talk, {t['without_echo']} "
        f"without echo), measured {t['measured']}",
        "  latency, ms:",
        row(
            "caller side: speech packet sent → first silent packet",
            r["caller_onset_to_silent_packet_ms"],
            f"  target p50 ≤ {r['targets']['caller_onset_to_silence_p50_ms']:.0f}, p95 ≤ "
            f"{r['targets']['caller_onset_to_silence_p95_ms']:.0f} "
            f"[{mark('caller_onset_to_silence')}]",
        ),
        row(
            "caller side: speech packet sent → fade's last packet",
            r["caller_onset_to_fade_packet_ms"],
        ),
        row(
            "VAD decision → output at zero (media)",
            r["decision_to_zero_ms"],
            f"  target p99 ≤ {r['targets']['decision_to_zero_p99_ms']:.0f} "
            f"[{mark('decision_to_zero')}]",
        ),
        row("VAD decision → client got last non-zero (wall)", r["decision_to_client_silence_ms"]),
        row(
            "speech onset (ground truth) → zero",
            r["onset_to_zero_ms"],
            f"  target p95 ≤ {r['targets']['onset_to_zero_p95_ms']:.0f} [{mark('onset_to_zero')}]",
        ),
        row("  with echo (double talk)", r["by_echo"]["with_echo"]["onset_to_zero_ms"]),
        row("  without echo", r["by_echo"]["without_echo"]["onset_to_zero_ms"]),
        row("detector onset → zero", r["detector_onset_to_zero_ms"]),
        row("speech onset → VAD decision", r["onset_to_decision_ms"]),
        row("detector onset − true onset", r["detector_onset_error_ms"]),
        row(
            "worker stop (cancel → end acknowledged)",
            r["worker_stop_ms"],
            f"  of {t['measured']} barge-ins; the rest had finished synthesis",
        ),
        f"  non-zero samples sent after the zero point: {r['nonzero_samples_after_zero']}",
        f"  missed barge-ins (no decision within 1 s of onset): {t['missed']} of {t['speech']} "
        f"[{mark('missed')}]; early (before the onset): {t['early_bargeins']}"
        + (f"; errors: {t['errors']}" if t["errors"] else ""),
        f"  echo only (−15 dB, no caller speech): {e['calls']} calls, {fmt(e['echo_s'])} s of "
        f"echo, {e['false_bargeins']} false barge-ins = {fmt(e['false_per_min'], '.2f')}/min "
        f"[{mark('false_bargeins_on_echo')}]; greetings played to the end: "
        f"{e['greetings_done']}/{e['calls']}; echo sent at {fmt(e['echo_level_db']['p50'])} dB "
        "re the received agent audio",
        "  reference: pipecat 1.14 stock telephony agent, onset → silence 326 ms p50 / 625 ms "
        "p95, hard cut",
    ]
    base = r.get("baseline")
    if base:
        lines += [
            f"  same-run baseline, bargein.on_arrival = {str(base['on_arrival']).lower()} "
            f"({base['trials']['speech']} trials, interleaved; missed {base['trials']['missed']}):",
            row("caller side: speech packet sent → first silent packet",
                base["caller_onset_to_silent_packet_ms"]),
            row("speech onset (ground truth) → zero", base["onset_to_zero_ms"]),
            row("speech onset → VAD decision", base["onset_to_decision_ms"]),
        ]  # fmt: skip
    return "\n".join(lines)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    opts = BenchOptions(
        trials=args.trials,
        echo_seconds=args.echo_seconds,
        seed=args.seed,
        quick=args.quick,
        engine=getattr(args, "engine", "onnx"),
        baseline=getattr(args, "baseline", False),
    )
    if opts.quick:
        opts.trials = min(opts.trials, 4)
        opts.echo_seconds = min(opts.echo_seconds, 15.0)
    return opts


def cmd_bench_bargein(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    return run_cli("bargein", lambda: run_bench(opts), format_report, args.json)
