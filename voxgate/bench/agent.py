"""``voxgate bench agent``: the ``llm`` agent's voice-to-voice latency as the caller experiences
it, where that time goes, what a conversation costs in CPU, and how many fit on this box.

What runs (every part a separate process, as a user runs them):

- ``voxgate serve --agent-kind llm --llm-base-url URL`` on free loopback ports (embedded
  synthesis worker), started as ``python -m voxgate.bench.agent child STATS -- serve ...``: the
  same command line, plus measurement only — the recogniser and end-of-turn model are loaded
  (with the project's own ``load_ears``) before the gateway starts, so their native threads can
  be told apart and named in ``/proc``, and the end-of-turn model's CPU time is counted;
- ``voxgate mock-llm`` with a script whose every answer is one short sentence (at once);
- this process: the project's SIP/RTP client (:mod:`voxgate.bench.sipclient`) placing calls and
  asking spoken questions (10 sentences, in the project's Piper voice and in espeak-ng voices,
  through the telephone chain at −20 dBFS active level, G.711 μ-law), and the gateway's
  ``/api/events`` WebSocket.

Per trial (one question)::

    v2v = arrival (kernel time) of the first audible agent packet after the question
          − send time of the RTP packet that carries the question's last speech sample

*last speech sample*: the question's trailing silence trimmed at −45 dBFS (the last 10 ms
window at or above it, then the last sample at that level in it); *audible*: a 10 ms window of
the packet at or above −45 dBFS — the definitions of :mod:`voxgate.bench.pipecat_agent`, so the
two systems are measured alike. The send time is taken in the client's paced send loop when that
packet's payload is built (the client's frame source is replaced: ``RtpPeer._next_frame``), a
few µs before ``sendto``. All clocks are the wall clock of this one machine.

Where the time goes, from the gateway's events (additive: the parts sum to v2v):
end of turn decided (``agent.turn`` ``decided_at`` − last speech sent; it contains the silence
wait ``turn.min_silence_ms`` and the recogniser/end-of-turn compute not hidden behind it,
``stt_ms``/``eot_ms``), LLM first token (``first_token_at`` − ``decided_at``), first clause
queued (``first_say_at`` − ``first_token_at``), TTS first audio (``utterance.started`` of the
reply's first piece − ``first_say_at``), and to the caller (first audible arrival −
``utterance.started``; split into the first non-silent packet's arrival and the voice's quiet
lead-in). A question with more than one ``agent.turn`` was mis-split; one with none was missed.

CPU: ``--concurrency 1,2,4``: K conversations at once, each asking its questions back to back
(staggered starts, 0.3–1 s pauses); the gateway process's CPU from ``/proc`` over the window in
which all K are talking, per conversation, split into speech-to-text (CTranslate2's threads and
the STT pool thread less the end-of-turn model), end-of-turn model (its counted thread CPU) and
the rest (event loop: SIP/RTP/playout; synthesis; other), less the idle gateway's CPU. The
highest K whose v2v meets the goal (p50 ≤ 500 ms, p95 ≤ 800 ms, a missed reply counting as
infinitely late) is how many simultaneous conversations fit on this box.

pipecat (``--pipecat``, default on when pipecat-ai is installed): the stock pipecat phone agent
of :mod:`voxgate.bench.pipecat_agent` on the SAME question audio and the same mock LLM, after
the gateway has been stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import io
import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate.bench.procs import CpuSample, Proc, cpu_sample, http_json, wait_ready
from voxgate.bench.util import cpu_model, fmt, percentiles, run_cli, strict_json

Int16Array = npt.NDArray[np.int16]
Float32Array = npt.NDArray[np.float32]

RATE = 8000
SPF = 160  # 20 ms at 8 kHz
WIN = 80  # 10 ms analysis window
AUDIBLE_DBFS = -45.0
SPEECH_DBFS = -20.0  # the caller's active speech level
TAIL_S = 0.1  # what is kept of the question after its last speech sample (all below −45 dBFS)
QUIET_S = 1.0  # the agent's reply is over when nothing audible arrived for this long
THINK_S = (0.3, 1.0)  # the caller's pause before each question, after the reply
REPLY_TIMEOUT_S = 12.0
GREETING_TIMEOUT_S = 40.0
STAGGER_S = 1.7  # conversation i starts i·STAGGER_S after the first
STATS_PERIOD_S = 0.2
GOAL = {"p50_ms": 500.0, "p95_ms": 800.0}
# Experiment only (bench option --partial-every-ms): the gateway child decodes captions this
# often instead of gateway.agents.hearing.PARTIAL_EVERY_MS.
PARTIAL_ENV = "VGBENCH_PARTIAL_EVERY_MS"  # not VOXGATE_*: those are config keys
REPLY = "Sure, I can help you with that."
# Every answer a different short sentence whose first clause (the gateway's first utterance of
# the reply) is new each time: an LLM does not repeat itself, and a repeated first clause
# ("Sure,") would be replayed from the worker's render cache instead of synthesised.
_OPENERS = ("I can help with", "Happy to help with", "Let me look at", "I will check",
            "Let me pull up", "I can sort out", "Let me find", "I will look into",
            "Let me check on", "I can take care of", "I will help you with", "Let me go over",
            "I can look up", "Let me review", "I will sort out")  # fmt: skip
_TOPICS = (
    "your order", "the booking", "your account", "the delivery", "your plan", "the invoice",
    "your appointment", "the payment", "your question", "the refund", "your address",
    "the reservation", "your bill", "the schedule", "your request",
)  # fmt: skip


def script(n: int = 300) -> dict[str, Any]:
    """The mock LLM's script: ``n`` distinct one-sentence answers in order, then ``REPLY``."""
    replies = []
    for i in range(n):
        topic = _TOPICS[(i // len(_OPENERS)) % len(_TOPICS)]
        rounds = i // (len(_OPENERS) * len(_TOPICS))
        topic += f" number {rounds + 1}" if rounds else ""
        replies.append(f"{_OPENERS[i % len(_OPENERS)]} {topic}, one moment.")
    return {"turns": [{"reply": r} for r in replies], "default": {"reply": REPLY}}


PIPER = "piper"

# (question, a key word the recogniser must hear, voice: "piper" or an espeak-ng voice)
QUESTIONS: tuple[tuple[str, str, str], ...] = (
    ("What time do you open on Saturday?", "saturday", PIPER),
    ("Can you tell me my account balance please?", "balance", "en-us+f4"),
    ("I would like to book a table for two tonight.", "table", PIPER),
    ("Where is your nearest store to the train station?", "station", "en-gb-x-rp"),
    ("How much does the monthly plan cost?", "plan", PIPER),
    ("My internet has been down since this morning.", "internet", "en-us+f3"),
    ("Can I change the delivery address for my order?", "address", PIPER),
    ("I need to cancel my appointment on Friday.", "friday", "en-us+m3"),
    ("Do you have any rooms available next weekend?", "weekend", PIPER),
    ("Please send me a copy of my last invoice.", "invoice", "en-gb+f2"),
)


# --- caller audio ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    text: str
    keyword: str
    voice: str
    pcm: Int16Array  # 8 kHz, through the telephone chain
    last: int  # index of the last speech sample

    @property
    def seconds(self) -> float:
        return len(self.pcm) / RATE


def _window_energy(pcm: Int16Array) -> npt.NDArray[np.float64]:
    x = pcm.astype(np.float64) ** 2
    c = np.concatenate(([0.0], np.cumsum(x)))
    out: npt.NDArray[np.float64] = (c[WIN:] - c[:-WIN]) / WIN
    return out


def _level(dbfs: float) -> float:
    return 32768.0 * 10 ** (dbfs / 20)


def audible(pcm: Int16Array, dbfs: float = AUDIBLE_DBFS) -> bool:
    """Whether some 10 ms window of ``pcm`` has an RMS of at least ``dbfs``."""
    if len(pcm) == 0:
        return False
    if len(pcm) < WIN:
        return float(np.mean(pcm.astype(np.float64) ** 2)) >= _level(dbfs) ** 2
    return bool(np.any(_window_energy(pcm) >= _level(dbfs) ** 2))


def last_speech_sample(pcm: Int16Array, dbfs: float = AUDIBLE_DBFS) -> int:
    """The last sample at ``dbfs`` or above in the last 10 ms window whose RMS reaches it."""
    if len(pcm) < WIN:
        raise ValueError("question shorter than 10 ms")
    hits = np.nonzero(_window_energy(pcm) >= _level(dbfs) ** 2)[0]
    if not len(hits):
        raise ValueError(f"question has no 10 ms window at or above {dbfs} dBFS")
    start = int(hits[-1])
    loud = np.nonzero(np.abs(pcm[start : start + WIN].astype(np.int32)) >= _level(dbfs))[0]
    return start + (int(loud[-1]) if len(loud) else WIN - 1)


def _espeak(text: str, voice: str) -> tuple[Float32Array, int]:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise FileNotFoundError("espeak-ng")
    out = subprocess.run(
        [exe, "-v", voice, "-s", "165", "--stdout", text], capture_output=True, check=True
    ).stdout
    with wave.open(io.BytesIO(out)) as w:
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    return (data.astype(np.float32) / 32768.0), rate


def make_questions(
    specs: Sequence[tuple[str, str, str]] = QUESTIONS, engine_name: str = "onnx"
) -> list[Question]:
    """Each question spoken (Piper's joe voice or espeak-ng; espeak-ng missing: Piper), through
    the telephone chain to 8 kHz, scaled to ``SPEECH_DBFS`` active level, trimmed ``TAIL_S``
    after its last speech sample."""
    from dsp.pcm import float_to_s16
    from dsp.telephone import telephone
    from synth.engines import load_engine

    engine = load_engine(engine_name)
    out: list[Question] = []
    for text, keyword, voice in specs:
        audio: Float32Array
        if voice != PIPER:
            try:
                audio, rate = _espeak(text, voice)
            except (OSError, subprocess.CalledProcessError, wave.Error):
                voice = PIPER
        if voice == PIPER:
            audio, rate = np.asarray(engine.synthesize(text), np.float32), engine.sample_rate
        x = np.asarray(telephone(audio, rate), np.float64)
        frames = x[: len(x) // SPF * SPF].reshape(-1, SPF)
        levels = np.sqrt(np.mean(frames**2, axis=1))
        active = frames[levels > levels.max() * 10 ** (-30 / 20)]
        level = float(np.sqrt(np.mean(active**2))) if len(active) else 1.0
        pcm = float_to_s16(x * (10 ** (SPEECH_DBFS / 20) / max(level, 1e-9)))
        last = last_speech_sample(pcm)
        pcm = pcm[: last + 1 + int(TAIL_S * RATE)].copy()
        out.append(Question(text, keyword, voice, pcm, last))
    return out


class CallerVoice:
    """The client's frame source (replaces ``RtpPeer._next_frame``): a queued question, else
    silence; notes the wall time each question's first packet and the packet carrying its last
    speech sample were built (``sendto`` follows at once)."""

    def __init__(self, media: Any) -> None:
        self.media = media
        self.k = 0
        self._pcm: Int16Array | None = None
        self._last = 0
        self._pos = 0
        self._t_first = math.nan
        self._t_last = math.nan
        self._done: asyncio.Future[tuple[float, float]] | None = None

    def install(self) -> None:
        self.media._next_frame = self.next_frame

    def say(self, pcm: Int16Array, last: int) -> asyncio.Future[tuple[float, float]]:
        """Queue a question (from the next frame on); the future gives (first packet sent,
        last-speech packet sent) once all of it is out."""
        if self._pcm is not None:
            raise RuntimeError("a question is still being said")
        self._pcm, self._last, self._pos = pcm, last, 0
        self._t_first = self._t_last = math.nan
        self._done = asyncio.get_running_loop().create_future()
        return self._done

    def next_frame(self) -> bytes:
        out = np.zeros(SPF, np.int16)
        pcm = self._pcm
        if pcm is not None:
            piece = pcm[self._pos : self._pos + SPF]
            out[: len(piece)] = piece
            now = time.time()
            if self._pos == 0:
                self._t_first = now
            if self._pos <= self._last < self._pos + SPF:
                self._t_last = now
            self._pos += SPF
            if self._pos >= len(pcm):
                self._pcm = None
                if self._done is not None and not self._done.done():
                    self._done.set_result((self._t_first, self._t_last))
        self.k += 1
        data: bytes = self.media.codec.encode(out)
        return data


# --- what the client heard -----------------------------------------------------------------
class Ear:
    """What arrived at the client: per packet its kernel arrival time, whether it was audible
    (−45 dBFS in a 10 ms window) and whether it held any sound at all (not digital silence)."""

    def __init__(self, media: Any) -> None:
        self.media = media
        self._seen = 0
        self.arrival: list[float] = []
        self.loud: list[bool] = []
        self.sound: list[bool] = []

    def update(self) -> None:
        rx = self.media.received
        pt = self.media.payload_type
        for p in rx[self._seen :]:
            if p.pt != pt:
                continue
            pcm = self.media.codec.decode(p.payload)
            self.arrival.append(p.arrival)
            self.loud.append(audible(pcm))
            self.sound.append(bool(np.any(np.abs(pcm.astype(np.int32)) > 1)))
        self._seen = len(rx)

    def first(self, after: float, *, loud: bool = True) -> float | None:
        flags = self.loud if loud else self.sound
        for t, f in zip(self.arrival, flags, strict=True):
            if f and t >= after:
                return t
        return None

    def loud_between(self, a: float, b: float) -> bool:
        return any(f and a <= t <= b for t, f in zip(self.arrival, self.loud, strict=True))

    def last_loud(self) -> float:
        for t, f in zip(reversed(self.arrival), reversed(self.loud), strict=True):
            if f:
                return t
        return 0.0

    async def wait_audible(self, after: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while True:
            self.update()
            t = self.first(after)
            if t is not None or time.monotonic() > deadline:
                return t
            await asyncio.sleep(0.01)

    async def wait_quiet(self, quiet_s: float = QUIET_S, timeout: float = 60.0) -> bool:
        """Until nothing audible has arrived for ``quiet_s`` (packets still arriving)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.update()
            if self.arrival and self.arrival[-1] - self.last_loud() >= quiet_s:
                return True
            await asyncio.sleep(0.05)
        return False


# --- the gateway process (child side) ------------------------------------------------------
def _tids() -> dict[int, int]:
    out: dict[int, int] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            stat = (task / "stat").read_text()
            f = stat[stat.rindex(")") + 2 :].split()
            out[int(task.name)] = int(f[11]) + int(f[12])
    return out


def _name_thread(tid: int, name: str) -> None:
    with contextlib.suppress(OSError):
        Path(f"/proc/self/task/{tid}/comm").write_text(name[:15])


class _EotClock:
    """Thread CPU time spent in the end-of-turn model's ``predict`` (it runs on the calling
    thread: one intra-op thread)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.calls = 0
        self._lock = threading.Lock()

    def add(self, s: float) -> None:
        with self._lock:
            self.cpu_s += s
            self.calls += 1


def _instrument(cfg: Any, stats_path: Path) -> None:
    """Load the ears now (one thread alive: what computes during a warm decode is the
    recogniser's, during a warm prediction the model's), name those threads and every Python
    thread in /proc, count the model's CPU, and hand the gateway these ears."""
    import gateway.app
    from gateway.agents import registry
    from gateway.stt import turn as turn_mod

    clock = _EotClock()
    every = os.environ.get(PARTIAL_ENV)
    if every:  # an experiment (--partial-every-ms): how often captions are decoded
        from gateway.agents import hearing

        setattr(hearing, "PARTIAL_EVERY_MS", int(every))  # noqa: B010
    predict = turn_mod.SmartTurn.predict

    @functools.wraps(predict)
    def counted(self: Any, audio: Any) -> Any:
        t0 = time.thread_time()
        try:
            return predict(self, audio)
        finally:
            clock.add(time.thread_time() - t0)

    setattr(turn_mod.SmartTurn, "predict", counted)  # noqa: B010 (this process only)
    main = threading.get_native_id()
    before = set(_tids())
    ears = registry.load_ears(cfg)
    noise = np.random.default_rng(0).normal(0, 0.02, 2 * 16000).astype(np.float32)
    labels: dict[int, str] = {}

    def busy(run: Callable[[], object], label: str) -> None:
        a = _tids()
        for _ in range(2):
            run()
        for tid, ticks in _tids().items():
            if tid != main and tid not in labels and ticks > a.get(tid, 0):
                labels[tid] = label

    busy(lambda: ears.stt.transcribe(noise), "vg-stt")
    model = ears.model
    if model is not None:
        busy(lambda: model.predict(noise), "vg-eot")
    for tid in set(_tids()) - before - set(labels) - {main}:
        labels[tid] = "vg-ears-idle"
    if not hasattr(gateway.app, "AgentRegistry"):
        print("bench agent: gateway.app.AgentRegistry is gone; the CPU split by part is "
              "unreliable (the gateway loads its own ears)", file=sys.stderr)  # fmt: skip
    setattr(  # noqa: B010 - the gateway's registry gets these ears (this process only)
        gateway.app, "AgentRegistry",
        functools.partial(registry.AgentRegistry, ears_loader=lambda _cfg: ears),
    )  # fmt: skip

    def dump() -> None:
        tmp = stats_path.with_suffix(".tmp")
        while True:
            for tid, name in labels.items():
                _name_thread(tid, name)
            for th in threading.enumerate():
                if th.native_id is not None and th.native_id != main:
                    _name_thread(th.native_id, th.name)
            doc = {"t": time.time(), "eot_cpu_s": clock.cpu_s, "eot_calls": clock.calls}
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps(doc))
                tmp.replace(stats_path)
            time.sleep(STATS_PERIOD_S)

    threading.Thread(target=dump, name="vg-bench-stats", daemon=True).start()


def child_main(argv: Sequence[str]) -> int:
    """``python -m voxgate.bench.agent child STATS_FILE -- serve <voxgate serve args>``."""
    stats_path, rest = Path(argv[0]), list(argv[1:])
    if rest and rest[0] == "--":
        rest = rest[1:]
    import gateway.commands
    from voxgate import serve
    from voxgate.contract.config import load_from_args

    parser = argparse.ArgumentParser(prog="voxgate")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.register(sub)
    gateway.commands.register(sub)
    args = parser.parse_args(rest)
    _instrument(load_from_args(args), stats_path)
    return int(args.func(args))


def _read_stats(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict):
            return doc
    return {}


# --- CPU ---------------------------------------------------------------------------------------
def cpu_groups(
    pid: int, a: CpuSample, b: CpuSample, eot_cpu_s: float, clk_tck: int | None = None
) -> dict[str, float]:
    """% of one core over [a, b] by part: stt, turn (end-of-turn model), event_loop, synth
    (synthesis pool + unnamed native threads: onnxruntime's), bench (the stats thread), other
    (every other thread, and threads gone before ``b``), total."""
    from voxgate.bench.procs import CLK_TCK

    tck = clk_tck or CLK_TCK
    dt = b.t - a.t
    if dt <= 0:
        return {}
    by: dict[str, int] = {}
    for tid, (comm, ticks) in b.threads.items():
        d = ticks - a.threads.get(tid, (comm, 0))[1]
        if tid == pid:
            key = "event_loop"
        elif comm == "vg-stt" or comm.startswith("stt"):
            key = "stt_raw"
        elif comm == "vg-eot":
            key = "eot_native"
        elif comm.startswith("synth") or comm == "python":
            key = "synth"
        elif comm == "vg-bench-stats":
            key = "bench"
        else:
            key = "other"
        by[key] = by.get(key, 0) + d

    def pct(ticks: float) -> float:
        return 100.0 * ticks / tck / dt

    total = pct(b.total - a.total)
    turn = 100.0 * eot_cpu_s / dt + pct(by.get("eot_native", 0))
    stt = max(0.0, pct(by.get("stt_raw", 0)) - 100.0 * eot_cpu_s / dt)
    out = {
        "seconds": dt,
        "total": total,
        "stt": stt,
        "turn": turn,
        "event_loop": pct(by.get("event_loop", 0)),
        "synth": pct(by.get("synth", 0)),
        "bench": pct(by.get("bench", 0)),
    }
    out["other"] = total - sum(v for k, v in out.items() if k not in ("seconds", "total"))
    return out


# --- one conversation ----------------------------------------------------------------------------
@dataclass
class Level:
    """What the conversations of one concurrency level share."""

    k: int
    sip: tuple[str, int]
    http: str
    questions: list[Question]
    per_call: int
    rng: random.Random
    ready: int = 0
    all_ready: asyncio.Event = field(default_factory=asyncio.Event)
    first_done: asyncio.Event = field(default_factory=asyncio.Event)
    trials: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    send_late_max_ms: float = 0.0


async def _gateway_call_id(http: str, user: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = await asyncio.to_thread(http_json, f"{http}/api/calls", 5.0)
        if status == 200 and isinstance(body, dict):
            for c in body.get("calls", []):
                if f"sip:{user}@" in str(c.get("remote", "")):
                    return str(c["id"])
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the gateway does not list the call from {user}")


async def conversation(level: Level, i: int, *, label: str, measured: bool = True) -> None:
    """One call: wait for the greeting, then ask ``level.per_call`` questions back to back."""
    from voxgate.bench.sipclient import SipClient

    await asyncio.sleep(i * STAGGER_S)
    user = f"vgbench-{label}-{i}"
    client = await SipClient.open("127.0.0.1")
    counted_ready = False
    try:
        call = await client.invite(level.sip, codecs=("PCMU",), user=user, send_media=False)
        if call.status != 200:
            raise RuntimeError(f"INVITE answered {call.status}")
        media = call.media
        voice = CallerVoice(media)
        voice.install()
        media.start_sending()
        ear = Ear(media)
        gw_id = await _gateway_call_id(level.http, user)
        t0 = time.time()
        if await ear.wait_audible(t0 - 1.0, GREETING_TIMEOUT_S) is None:
            raise TimeoutError("no greeting")
        await ear.wait_quiet()
        level.ready += 1
        counted_ready = True
        if level.ready >= level.k:
            level.all_ready.set()
        for j in range(level.per_call):
            qi = (i * 3 + j) % len(level.questions)
            q = level.questions[qi]
            await asyncio.sleep(level.rng.uniform(*THINK_S))
            await ear.wait_quiet(0.5)
            t_first, t_last = await voice.say(q.pcm, q.last)
            heard = await ear.wait_audible(t_last, REPLY_TIMEOUT_S)
            if heard is not None:
                await ear.wait_quiet()
            ear.update()
            trial: dict[str, Any] = {
                "call": i, "gateway_call_id": gw_id, "index": j, "question": qi,
                "text": q.text, "keyword": q.keyword, "voice": q.voice,
                "t_first": t_first, "t_last": t_last,
                "arrival": heard, "early": ear.loud_between(t_first, t_last),
                "first_sound": ear.first(t_last, loud=False),
                "_ear": ear,
            }  # fmt: skip
            if measured:
                level.trials.append(trial)
        level.send_late_max_ms = max(level.send_late_max_ms, media.send_late_max * 1000)
        level.first_done.set()
        with contextlib.suppress(Exception):
            await call.bye(timeout=2.0)
    except (OSError, RuntimeError, TimeoutError) as exc:
        level.errors.append(f"call {i}: {exc}")
        if not counted_ready:
            level.ready += 1
            if level.ready >= level.k:
                level.all_ready.set()
        level.first_done.set()
    finally:
        client.close()


# --- the per-trial breakdown -------------------------------------------------------------------
PARTS = ("end_of_turn_ms", "llm_first_token_ms", "first_clause_ms", "tts_first_audio_ms",
         "to_caller_ms")  # fmt: skip
DETAILS = ("stt_ms", "eot_ms", "decision_after_silence_ms", "send_ms", "voice_lead_in_ms",
           "partial_done_after_end_ms")  # fmt: skip


def analyse(
    trial: dict[str, Any],
    events: list[dict[str, Any]],
    window_end: float,
    min_silence_ms: float,
    sound_after: Callable[[float], float | None] | None = None,
) -> dict[str, Any]:
    """The trial's figures from the gateway's events of its call (dicts as ``/api/events``
    sends them) between its first question packet and ``window_end`` (the next question)."""
    t_first, t_last, arrival = trial["t_first"], trial["t_last"], trial.get("arrival")
    r: dict[str, Any] = {
        k: v for k, v in trial.items() if not k.startswith("_") and k not in ("first_sound",)
    }
    r["v2v_ms"] = (arrival - t_last) * 1000 if arrival is not None else math.nan
    mine = [e for e in events if e.get("call_id") == trial["gateway_call_id"]]
    turns = [
        e for e in mine
        if e.get("type") == "agent.turn" and t_first - 0.05 <= e.get("decided_at", 0) < window_end
    ]  # fmt: skip
    r["turns"] = len(turns)
    r["missed"] = not turns
    r["misplit"] = len(turns) > 1
    errors = [e for e in mine if e.get("type") == "agent.error" and t_first <= e["ts"] < window_end]
    r["agent_errors"] = [f"{e.get('kind')}: {e.get('message')}" for e in errors]
    if not turns:
        return r
    after = [e for e in turns if e["decided_at"] >= t_last]
    turn = after[0] if after else turns[-1]
    r["heard_text"] = " ".join(str(e.get("text", "")) for e in turns)
    r["heard_ok"] = str(trial["keyword"]).lower() in r["heard_text"].lower()
    r["reason"] = turn.get("reason")
    r["probability"] = turn.get("probability")
    decided = float(turn["decided_at"])
    r["end_of_turn_ms"] = (decided - t_last) * 1000
    r["decision_after_silence_ms"] = r["end_of_turn_ms"] - min_silence_ms
    r["stt_ms"] = turn.get("stt_ms")
    r["eot_ms"] = turn.get("eot_ms")
    partials = [
        e["ts"] for e in mine
        if e.get("type") == "transcript" and e.get("role") == "caller" and not e.get("final")
        and t_first <= e["ts"] <= decided
    ]  # fmt: skip
    r["partial_done_after_end_ms"] = (
        (max(partials) - t_last) * 1000 if partials and max(partials) > t_last else None
    )
    first_token, first_say = turn.get("first_token_at"), turn.get("first_say_at")
    if first_token is not None:
        r["llm_first_token_ms"] = (first_token - decided) * 1000
    if first_token is not None and first_say is not None:
        r["first_clause_ms"] = (first_say - first_token) * 1000
    utt = turn.get("utterance_id")
    started = next(
        (e["ts"] for e in mine
         if e.get("type") == "utterance.started" and e.get("utterance_id") == utt),
        None,
    )  # fmt: skip
    if started is not None and first_say is not None:
        r["tts_first_audio_ms"] = (started - first_say) * 1000
    if started is not None and arrival is not None:
        r["to_caller_ms"] = (arrival - started) * 1000
        sound = sound_after(started) if sound_after is not None else trial.get("first_sound")
        if sound is not None and sound <= arrival:
            r["send_ms"] = (sound - started) * 1000
            r["voice_lead_in_ms"] = (arrival - sound) * 1000
    if all(r.get(p) is not None for p in PARTS) and arrival is not None:
        r["sum_of_parts_ms"] = sum(float(r[p]) for p in PARTS)
    return r


def stats(values: Sequence[float]) -> dict[str, float]:
    """Nearest-rank percentiles (``voxgate.bench.util.percentiles``) plus min and max."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, float] = dict(percentiles(vals))
    out["min"] = min(vals) if vals else math.nan
    out["max"] = max(vals) if vals else math.nan
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) is not None and math.isfinite(r[key])]
    return statistics.median(vals) if vals else math.nan


def within_goal(v2v: Sequence[float]) -> tuple[bool, dict[str, float]]:
    """p50/p95 with a missed reply (NaN) counted as infinitely late."""
    vals = sorted(math.inf if not math.isfinite(v) else v for v in v2v)
    if not vals:
        return False, {"p50": math.nan, "p95": math.nan}

    def pct(q: float) -> float:
        return vals[max(0, min(len(vals) - 1, round(q / 100 * len(vals) + 0.5) - 1))]

    p50, p95 = pct(50), pct(95)
    return p50 <= GOAL["p50_ms"] and p95 <= GOAL["p95_ms"], {"p50": p50, "p95": p95}


# --- the run -----------------------------------------------------------------------------------
@dataclass
class AgentBenchOptions:
    trials: int = 20
    concurrency: tuple[int, ...] = (1, 2, 4)
    pipecat: bool | None = None  # None: when pipecat-ai is installed
    seed: int = 1
    engine: str = "onnx"
    overrides: dict[str, str] = field(default_factory=dict)  # config key -> value, to the gateway
    config_path: str | None = None
    keep_dir: str | None = None
    warmup: bool = True
    idle_s: float = 3.0
    questions: tuple[tuple[str, str, str], ...] = QUESTIONS
    partial_every_ms: int | None = None  # experiment: caption decode interval in the gateway


def pipecat_available() -> bool:
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("pipecat", "fastapi", "uvicorn", "faster_whisper", "piper")
    )


def _free_port(kind: int) -> int:
    from voxgate.bench.localgw import free_port

    return free_port(kind, both=kind == socket.SOCK_DGRAM)


def _wait_http(url: str, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise RuntimeError(f"{proc.argv[3:5]} exited ({proc.p.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError):
            status, _ = http_json(url, timeout=1.0)
            if status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def _flag(key: str) -> str:
    return "--" + key.replace(".", "-").replace("_", "-")


def _effective_config(opts: AgentBenchOptions, llm_url: str) -> dict[str, Any]:
    import dataclasses

    from voxgate.contract.config import load

    cfg = load(
        opts.config_path, os.environ,
        {**opts.overrides, "agent.kind": "llm", "llm.base_url": llm_url},
    )  # fmt: skip
    llm = dataclasses.asdict(cfg.llm)
    return {
        "turn": dataclasses.asdict(cfg.turn),
        "llm": {k: llm[k] for k in ("model", "temperature", "max_tokens", "timeout_s", "greeting")},
        "synth": {"engine": cfg.synth.engine},
    }


def gateway_metrics(http: str) -> dict[str, float]:
    """The gateway's ``/metrics``, each family summed over its labels (``_total`` dropped)."""
    import urllib.request

    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{http}/metrics", timeout=5.0) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            name = name.split("{", 1)[0].removesuffix("_total")
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
    return out


async def _events(http: str, sink: list[dict[str, Any]], opened: asyncio.Event) -> None:
    import aiohttp

    url = http.replace("http://", "ws://") + "/api/events"
    async with aiohttp.ClientSession() as s, s.ws_connect(url, heartbeat=20) as ws:
        opened.set()
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                with contextlib.suppress(ValueError):
                    sink.append(json.loads(msg.data))
            elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                break


async def _run_level(
    k: int, per_call: int, sip: tuple[str, int], http: str, questions: list[Question],
    gw: Proc, stats_path: Path, rng: random.Random, label: str, measured: bool = True,
) -> tuple[Level, dict[str, Any]]:  # fmt: skip
    level = Level(k, sip, http, questions, per_call, rng)
    window: dict[str, Any] = {}

    m0 = await asyncio.to_thread(gateway_metrics, http)

    async def watch_cpu() -> None:
        await level.all_ready.wait()
        a = await asyncio.to_thread(cpu_sample, gw.pid)
        sa = _read_stats(stats_path)
        window["load_1m_start"] = os.getloadavg()[0]
        m = await asyncio.to_thread(gateway_metrics, http)
        window["jitter_buffer_ms"] = m.get("voxgate_jitter_buffer_depth_seconds", math.nan) * 1000
        await level.first_done.wait()
        b = await asyncio.to_thread(cpu_sample, gw.pid)
        sb = _read_stats(stats_path)
        eot = float(sb.get("eot_cpu_s", 0.0)) - float(sa.get("eot_cpu_s", 0.0))
        window["cpu"] = cpu_groups(gw.pid, a, b, eot)

    watcher = asyncio.create_task(watch_cpu())
    await asyncio.gather(*(conversation(level, i, label=label, measured=measured)
                           for i in range(k)))  # fmt: skip
    with contextlib.suppress(Exception):
        await asyncio.wait_for(watcher, 5.0)
    watcher.cancel()
    m1 = await asyncio.to_thread(gateway_metrics, http)
    key = "voxgate_playout_underruns"
    window["underrun_frames"] = m1.get(key, 0.0) - m0.get(key, 0.0) if key in m1 else math.nan
    return level, window


async def _measure(
    opts: AgentBenchOptions, questions: list[Question], sip: tuple[str, int], http: str,
    gw: Proc, stats_path: Path, min_silence_ms: float,
) -> dict[str, Any]:  # fmt: skip
    events: list[dict[str, Any]] = []
    opened = asyncio.Event()
    ev_task = asyncio.create_task(_events(http, events, opened))
    await asyncio.wait_for(opened.wait(), 10.0)
    rng = random.Random(opts.seed)
    out: dict[str, Any] = {"levels": []}
    try:
        # Idle gateway first (its own timers, the worker's heartbeat): subtracted per level.
        a = await asyncio.to_thread(cpu_sample, gw.pid)
        sa = _read_stats(stats_path)
        await asyncio.sleep(opts.idle_s)
        b = await asyncio.to_thread(cpu_sample, gw.pid)
        eot = float(_read_stats(stats_path).get("eot_cpu_s", 0.0)) - float(sa.get("eot_cpu_s", 0))
        out["idle_cpu"] = cpu_groups(gw.pid, a, b, eot)
        if opts.warmup:  # the first call pays for lazy set-up on both sides: not measured
            w, _ = await _run_level(1, 1, sip, http, questions, gw, stats_path, rng, "warmup",
                                    measured=False)  # fmt: skip
            out["warmup_errors"] = w.errors
        for k in opts.concurrency:
            per_call = max(3 if k > 1 else 1, math.ceil(opts.trials / k))
            load0 = os.getloadavg()
            level, window = await _run_level(k, per_call, sip, http, questions, gw, stats_path,
                                             rng, f"c{k}")  # fmt: skip
            await asyncio.sleep(0.5)  # the last events
            out["levels"].append(
                _level_report(level, window, events, min_silence_ms, out["idle_cpu"], load0)
            )
            await asyncio.sleep(1.0)
    finally:
        ev_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await ev_task
    out["events_seen"] = len(events)
    return out


def _level_report(
    level: Level, window: dict[str, Any], events: list[dict[str, Any]], min_silence_ms: float,
    idle: dict[str, float], load0: tuple[float, float, float],
) -> dict[str, Any]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    by_call: dict[int, list[dict[str, Any]]] = {}
    for t in level.trials:
        by_call.setdefault(t["call"], []).append(t)
    for trials in by_call.values():
        trials.sort(key=lambda t: t["t_first"])
        for n, t in enumerate(trials):
            end = trials[n + 1]["t_first"] if n + 1 < len(trials) else math.inf
            ear: Ear = t["_ear"]

            def sound_after(ts: float, ear: Ear = ear) -> float | None:
                return ear.first(ts, loud=False)

            rows.append(analyse(t, events, end, min_silence_ms, sound_after))
    rows.sort(key=lambda r: r["t_first"])
    v2v = [float(r["v2v_ms"]) for r in rows]
    ok, goal_p = within_goal(v2v)
    cpu = window.get("cpu") or {}
    k = level.k
    per_conv: dict[str, float] = {}
    if cpu:
        for key in ("stt", "turn"):
            per_conv[key] = cpu[key] / k

        # The rest: event loop, synthesis, other; the idle gateway's share and the bench's
        # own stats thread are not the conversations'.
        def rest_of(c: dict[str, float]) -> float:
            return (
                c.get("total", 0.0) - c.get("stt", 0.0) - c.get("turn", 0.0) - c.get("bench", 0.0)
            )

        per_conv["rest"] = (rest_of(cpu) - rest_of(idle)) / k
        per_conv["total"] = per_conv["stt"] + per_conv["turn"] + per_conv["rest"]
    return {
        "concurrency": k,
        "calls": k,
        "questions_per_call": level.per_call,
        "trials": len(rows),
        "v2v_ms": stats(v2v),
        "goal_check": {**goal_p, "within_goal": ok},
        "parts_ms": {p: _median(rows, p) for p in (*PARTS, *DETAILS, "sum_of_parts_ms")},
        "missed": sum(1 for r in rows if r["missed"]),
        "misplit": sum(1 for r in rows if r["misplit"]),
        "no_reply": sum(1 for r in rows if not math.isfinite(r["v2v_ms"])),
        "early": sum(1 for r in rows if r["early"]),
        "heard_ok": sum(1 for r in rows if r.get("heard_ok")),
        "reasons": {
            reason: sum(1 for r in rows if r.get("reason") == reason)
            for reason in sorted({str(r.get("reason")) for r in rows if r.get("reason")})
        },
        "v2v_ms_by_reason": {
            reason: stats([float(r["v2v_ms"]) for r in rows if r.get("reason") == reason])
            for reason in sorted({str(r.get("reason")) for r in rows if r.get("reason")})
        },
        "playout_underrun_frames": window.get("underrun_frames", math.nan),
        "jitter_buffer_ms": window.get("jitter_buffer_ms", math.nan),
        "caption_delayed_final": sum(
            1 for r in rows if (r.get("partial_done_after_end_ms") or 0) > 100
        ),
        "cpu_window": cpu,
        "cpu_per_conversation_pct": per_conv,
        "loadavg_at_start": [round(x, 2) for x in load0],
        "client_send_late_max_ms": level.send_late_max_ms,
        "errors": level.errors,
        "per_trial": rows,
    }


def run_agent_bench(
    trials: int = 20,
    concurrency: Sequence[int] = (1, 2, 4),
    *,
    pipecat: bool | None = None,
    seed: int = 1,
    overrides: Mapping[str, str] | None = None,
    config_path: str | None = None,
    keep_dir: str | None = None,
    warmup: bool = True,
    questions: Sequence[tuple[str, str, str]] = QUESTIONS,
    engine: str = "onnx",
    partial_every_ms: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark (see the module doc) and return its report as a dict; ``pipecat``:
    also measure the pipecat baseline (None: when pipecat-ai is installed)."""
    opts = AgentBenchOptions(
        trials=trials, concurrency=tuple(concurrency), pipecat=pipecat, seed=seed,
        overrides=dict(overrides or {}), config_path=config_path, keep_dir=keep_dir,
        warmup=warmup, questions=tuple(questions), engine=engine,
        partial_every_ms=partial_every_ms,
    )  # fmt: skip
    return run(opts)


def run(opts: AgentBenchOptions) -> dict[str, Any]:
    if not opts.concurrency or min(opts.concurrency) < 1 or opts.trials < 1:
        raise ValueError("trials and every concurrency level must be at least 1")
    started = time.monotonic()
    load_start = os.getloadavg()
    code = code_fingerprint()
    work = Path(opts.keep_dir or tempfile.mkdtemp(prefix="vg-bench-agent-"))
    work.mkdir(parents=True, exist_ok=True)
    questions = make_questions(opts.questions, opts.engine)
    script_path = work / "mock_llm_script.json"
    requests = 2 + sum(max(3, math.ceil(opts.trials / k)) * k for k in opts.concurrency)
    script_path.write_text(json.dumps(script(requests + opts.trials + 10)))
    llm_port = _free_port(socket.SOCK_STREAM)
    llm_url = f"http://127.0.0.1:{llm_port}/v1"
    py = sys.executable
    mock_argv = ["-m", "voxgate.cli", "mock-llm", "--port", str(llm_port)]
    mock = Proc([py, *mock_argv, "--script", str(script_path)], work / "mock_llm.log")
    result: dict[str, Any] = {}
    gw: Proc | None = None
    try:
        _wait_http(f"http://127.0.0.1:{llm_port}/requests", mock)
        config = _effective_config(opts, llm_url)
        sip_port = _free_port(socket.SOCK_DGRAM)
        http_port = _free_port(socket.SOCK_STREAM)
        http = f"http://127.0.0.1:{http_port}"
        stats_path = work / "gateway_stats.json"
        serve = [
            "serve", "--sip-listen", f"127.0.0.1:{sip_port}",
            "--http-listen", f"127.0.0.1:{http_port}", "--agent-kind", "llm",
            "--llm-base-url", llm_url, "--log-level", "warning", "--engine", opts.engine,
            "--gateway-max-calls", str(max(opts.concurrency) + 8),
        ]  # fmt: skip
        if opts.config_path:
            serve += ["--config", opts.config_path]
        for key, value in opts.overrides.items():
            serve += [_flag(key), str(value)]
        child = [py, "-m", "voxgate.bench.agent", "child", str(stats_path), "--"]
        env = dict(os.environ)
        env.pop(PARTIAL_ENV, None)
        if opts.partial_every_ms:
            env[PARTIAL_ENV] = str(opts.partial_every_ms)
        gw = Proc([*child, *serve], work / "gateway.log", env)
        t0 = time.monotonic()
        wait_ready(http, gw)
        ready_s = time.monotonic() - t0
        time.sleep(1.0)
        min_silence = float(config["turn"]["min_silence_ms"])
        measured = _event_loop_run(
            _measure(opts, questions, ("127.0.0.1", sip_port), http, gw, stats_path, min_silence)
        )
        gw_rc = gw.stop()
        gw_tail = gw.tail(30) if gw_rc not in (0, -15, None) else ""
        gw = None
        load_mid = os.getloadavg()
        pipecat = _pipecat(opts, llm_url, questions)
    finally:
        if gw is not None:
            gw.stop()
        mock.stop()
    result = {
        "conditions": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in load_start],
            "loadavg_after_voxgate": [round(x, 2) for x in load_mid],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "trials": opts.trials,
            "concurrency": list(opts.concurrency),
            "seed": opts.seed,
            "gateway": "voxgate serve (subprocess, embedded onnx worker), agent llm",
            "gateway_ready_s": round(ready_s, 1),
            "llm": "voxgate mock-llm (subprocess): one short sentence at once, a different one "
            f"each time ({script(1)['turns'][0]['reply']!r}, ...)",
            "audible_dbfs": AUDIBLE_DBFS,
            "caller_speech_dbfs": SPEECH_DBFS,
            "codec": "PCMU",
            "quiet_after_reply_s": QUIET_S,
            "think_s": list(THINK_S),
            "goal": GOAL,
            "config": config,
            "overrides": opts.overrides,
            "experiment_partial_every_ms": opts.partial_every_ms,
            "run_s": round(time.monotonic() - started, 1),
            "gateway_exit": gw_rc,
            "gateway_log_tail": gw_tail,
            "code": code,
        },
        "questions": [_question_doc(q) for q in questions],
        **measured,
        "pipecat": pipecat,
    }
    levels = result["levels"]
    fit = [lv["concurrency"] for lv in levels if lv["goal_check"]["within_goal"]]
    first = levels[0] if levels else {}
    per_conv = [lv["cpu_per_conversation_pct"].get("total", math.nan) for lv in levels]
    per_conv_max = max((v for v in per_conv if math.isfinite(v)), default=math.nan)
    result["summary"] = {
        "v2v_ms": first.get("v2v_ms", {}),
        "parts_ms": first.get("parts_ms", {}),
        "cpu_per_conversation_pct": levels[-1]["cpu_per_conversation_pct"] if levels else {},
        "fits_concurrency": max(fit) if fit else 0,
        "cpu_bound_conversations": (
            math.floor((os.cpu_count() or 1) * 100 / per_conv_max)
            if math.isfinite(per_conv_max) and per_conv_max > 0 else None
        ),
        "pipecat_v2v_ms": pipecat.get("v2v_ms") if isinstance(pipecat, dict) else None,
    }  # fmt: skip
    result["work_dir"] = str(work)
    if not opts.keep_dir:
        shutil.rmtree(work, ignore_errors=True)
    return result


CODE_FILES = (
    "gateway/stt/whisper.py", "gateway/stt/segmenter.py", "gateway/stt/turn.py",
    "gateway/agents/hearing.py", "gateway/agents/llm.py", "gateway/call/calls.py",
)  # fmt: skip


def code_fingerprint() -> dict[str, str]:
    """The commit and a digest of the files the figures depend on (other people edit them)."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    out: dict[str, str] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
        out["commit"] = head.stdout.strip()
    for rel in CODE_FILES:
        with contextlib.suppress(OSError):
            out[rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()[:12]
    return out


def _question_doc(q: Question) -> dict[str, Any]:
    return {
        "text": q.text,
        "keyword": q.keyword,
        "voice": q.voice,
        "seconds": round(q.seconds, 2),
        "last_speech_s": round(q.last / RATE, 3),
    }


def _event_loop_run(coro: Any) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        out: dict[str, Any] = asyncio.run(coro)
        return out
    res: dict[str, Any] = uvloop.run(coro)
    return res


def _pipecat(opts: AgentBenchOptions, llm_url: str, questions: list[Question]) -> dict[str, Any]:
    """The pipecat baseline on the same questions and mock LLM, or why it was not run."""
    want = opts.pipecat
    if want is None:
        want = pipecat_available()
        if not want:
            return {"skipped": "pipecat-ai (or what its phone pipeline needs) is not installed"}
    if not want:
        return {"skipped": "--no-pipecat"}
    try:
        from voxgate.bench.pipecat_agent import run_pipecat_baseline
    except ImportError as exc:
        return {"skipped": f"voxgate.bench.pipecat_agent is not importable: {exc}"}
    try:
        r = run_pipecat_baseline(
            llm_url, opts.trials, [(q.pcm, q.last) for q in questions],
            texts=[q.text for q in questions],
        )  # fmt: skip
    except Exception as exc:  # the baseline is optional: say why it failed
        return {"error": f"{type(exc).__name__}: {exc}"}
    return dict(r)


# --- output ------------------------------------------------------------------------------------
def _ms(x: Any) -> str:
    return fmt(x, ".0f")


PART_LABELS = (
    ("end_of_turn_ms", "end of turn decided (decided_at − last speech sent)"),
    ("decision_after_silence_ms", "  of which beyond the silence window (turn.min_silence_ms)"),
    ("stt_ms", "  recogniser compute for the final (stt_ms, overlaps)"),
    ("eot_ms", "  end-of-turn model compute (eot_ms, overlaps)"),
    ("partial_done_after_end_ms", "  a caption still decoding after speech end (when any)"),
    ("llm_first_token_ms", "LLM first token (first_token_at − decided_at)"),
    ("first_clause_ms", "first clause queued (first_say_at − first_token_at)"),
    ("tts_first_audio_ms", "TTS first audio (utterance.started − first_say_at)"),
    ("to_caller_ms", "to the caller (first audible arrival − utterance.started)"),
    ("send_ms", "  first non-silent packet arrives"),
    ("voice_lead_in_ms", "  the voice's quiet onset until audible"),
    ("sum_of_parts_ms", "sum of the parts (median of per-trial sums)"),
)


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    t = c["config"]["turn"]
    lines = [
        "voxgate bench agent — voice-to-voice latency of the llm agent, as the caller hears it",
        f"  conditions: {c['cpu']}, {c['cores']} cores, python {c['python']}; load average "
        f"{c['loadavg_at_start']} → {c['loadavg_after_voxgate']} (after voxgate) → "
        f"{c['loadavg_at_end']}",
        f"  {c['gateway']}, ready in {c['gateway_ready_s']} s; {c['llm']}",
        f"  turn: min_silence_ms {t['min_silence_ms']}, max_silence_ms {t['max_silence_ms']}, "
        f"smart_turn {t['smart_turn']} (threshold {t['threshold']}), vad_aggressiveness "
        f"{t['vad_aggressiveness']}, stt_threads {t['stt_threads']}"
        + (f"; overrides {c['overrides']}" if c["overrides"] else "")
        + (
            f"; EXPERIMENT: captions decoded every {c['experiment_partial_every_ms']} ms"
            if c.get("experiment_partial_every_ms")
            else ""
        ),
        f"  {len(r['questions'])} questions ("
        + ", ".join(sorted({q["voice"] for q in r["questions"]}))
        + f"), {min(q['seconds'] for q in r['questions']):.1f}–"
        f"{max(q['seconds'] for q in r['questions']):.1f} s, {c['caller_speech_dbfs']} dBFS, "
        f"{c['codec']}; audible = a 10 ms window ≥ {c['audible_dbfs']} dBFS; trials {c['trials']}"
        f" per level, concurrency {c['concurrency']}, run {c['run_s']} s",
        "",
        "voice-to-voice (packet with the last speech sample sent → first audible agent packet), "
        "ms:",
        "  conc trials   p50   p95   p99   min   max  missed misplit early no-reply heard"
        "   CPU/conv % (stt+turn+rest)   goal",
    ]
    for lv in r["levels"]:
        v, pc = lv["v2v_ms"], lv["cpu_per_conversation_pct"]
        cpu = (
            f"{fmt(pc.get('total'), '.0f'):>4} ({fmt(pc.get('stt'), '.0f')}+"
            f"{fmt(pc.get('turn'), '.0f')}+{fmt(pc.get('rest'), '.0f')})"
            if pc else "n/a"
        )  # fmt: skip
        lines.append(
            f"  {lv['concurrency']:>4} {lv['trials']:>6} {_ms(v['p50']):>5} {_ms(v['p95']):>5} "
            f"{_ms(v['p99']):>5} {_ms(v['min']):>5} {_ms(v['max']):>5} {lv['missed']:>7} "
            f"{lv['misplit']:>7} {lv['early']:>5} {lv['no_reply']:>8} "
            f"{lv['heard_ok']:>2}/{lv['trials']:<3} {cpu:>24}   "
            + ("met" if lv["goal_check"]["within_goal"] else "MISSED")
            + (f"  errors: {lv['errors']}" if lv["errors"] else "")
        )
    first = r["levels"][0] if r["levels"] else None
    if first is not None:
        lines += ["", f"where the time goes (medians at concurrency {first['concurrency']}), ms:"]
        for key, label in PART_LABELS:
            lines.append(f"  {label:<66} {_ms(first['parts_ms'].get(key)):>6}")
        lines.append(f"  {'voice-to-voice':<66} {_ms(first['v2v_ms']['p50']):>6}")
        lines.append(
            f"  turn decided by: {first['reasons']}; finals that waited for a caption decode "
            f"(> 100 ms after speech end): {first['caption_delayed_final']} of {first['trials']}"
        )
        for reason, v in first.get("v2v_ms_by_reason", {}).items():
            lines.append(
                f"  v2v when decided by {reason}: p50 {_ms(v['p50'])}, p95 {_ms(v['p95'])} "
                f"(n={v['n']})"
            )
        lines.append(
            f"  inbound jitter buffer (mean depth) {fmt(first.get('jitter_buffer_ms'))} ms; "
            f"playout underrun frames {fmt(first.get('playout_underrun_frames'), '.0f')}"
        )
        lines += ["", "CPU of the gateway process (% of one core), window with all K talking:"]
        idle = r.get("idle_cpu", {})
        lines.append(f"  idle gateway: {fmt(idle.get('total'))}")
        for lv in r["levels"]:
            w = lv["cpu_window"]
            if not w:
                continue
            lines.append(
                f"  K={lv['concurrency']}: total {fmt(w['total'])} over {fmt(w['seconds'])} s = "
                f"stt {fmt(w['stt'])}, turn model {fmt(w['turn'])}, event loop "
                f"{fmt(w['event_loop'])}, synthesis {fmt(w['synth'])}, other {fmt(w['other'])}; "
                f"per conversation {fmt(lv['cpu_per_conversation_pct'].get('total'))}"
            )
    s = r["summary"]
    lines += [
        "",
        f"fits on this box: {s['fits_concurrency']} simultaneous conversation(s) within the goal "
        f"(p50 ≤ {GOAL['p50_ms']:.0f} ms, p95 ≤ {GOAL['p95_ms']:.0f} ms, a missed reply counts "
        f"as late); CPU alone would allow about {s['cpu_bound_conversations']}",
    ]
    pc = r.get("pipecat") or {}
    if "v2v_ms" in pc:
        p = pc["v2v_ms"]
        v = s["v2v_ms"]
        lines += [
            "",
            "side by side (same questions, same mock LLM, concurrency 1), voice-to-voice ms:",
            "  system                                       n   p50   p95   p99   min   max",
            f"  {'voxgate llm agent (SIP/RTP, G.711)':<42} {v['n']:>4} {_ms(v['p50']):>5} "
            f"{_ms(v['p95']):>5} {_ms(v['p99']):>5} {_ms(v['min']):>5} {_ms(v['max']):>5}",
            f"  {'pipecat stock phone agent (Twilio ws)':<42} {p['n']:>4} {_ms(p['p50']):>5} "
            f"{_ms(p['p95']):>5} {_ms(p['p99']):>5} {_ms(p['min']):>5} {_ms(p['max']):>5}",
        ]
        lines += _pipecat_parts(pc)
    else:
        lines += ["", f"pipecat baseline: {pc.get('skipped') or pc.get('error')}"]
    return "\n".join(lines)


def _pipecat_parts(pc: dict[str, Any]) -> list[str]:
    rows = [t.get("pipecat", {}) for t in pc.get("trials", []) if not t.get("warmup")]
    keys = (
        ("vad_stopped_ms", "VAD stopped"), ("transcript_ms", "transcript"),
        ("user_turn_stopped_ms", "turn ended"), ("llm_response_start_ms", "LLM response"),
        ("tts_started_ms", "TTS started"), ("bot_started_speaking_ms", "bot speaking"),
    )  # fmt: skip
    parts = [f"{label} {_ms(_median(rows, key))}" for key, label in keys]
    return ["  pipecat, medians after the last speech sample (ms): " + ", ".join(parts)]


def options_from_args(args: argparse.Namespace) -> AgentBenchOptions:
    levels = tuple(int(x) for x in str(args.concurrency).split(",") if x.strip())
    overrides = {
        k[4:]: str(v) for k, v in vars(args).items() if k.startswith("cfg:") and v is not None
    }
    opts = AgentBenchOptions(
        trials=args.trials, concurrency=levels, pipecat=args.pipecat, seed=args.seed,
        overrides=overrides, config_path=getattr(args, "config", None), keep_dir=args.keep,
        partial_every_ms=getattr(args, "partial_every_ms", None),
    )  # fmt: skip
    if args.quick:
        opts.trials = min(opts.trials, 3)
        opts.concurrency = (1,)
        opts.pipecat = False if args.pipecat is None else args.pipecat
    return opts


def cmd_bench_agent(args: argparse.Namespace) -> int:
    from voxgate.contract.config import ConfigError, load

    try:
        opts = options_from_args(args)
        load(opts.config_path, os.environ, opts.overrides)  # a bad key or value: one line
    except (ValueError, ConfigError) as exc:
        print(f"voxgate bench agent: {exc}", file=sys.stderr)
        return 2
    return run_cli("agent", lambda: run(opts), format_report, args.json)


def main_json(result: dict[str, Any]) -> str:
    return json.dumps(strict_json(result), indent=2, default=str)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    print("usage: voxgate bench agent [--help]", file=sys.stderr)
    sys.exit(2)
