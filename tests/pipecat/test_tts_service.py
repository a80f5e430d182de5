"""``voxgate.pipecat.VoxgateTTSService`` in pipecat's own test harness (``run_test``) against a
real synthesis worker (the bundled onnx voice) on the in-memory bus, and once on Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import pytest
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test

from dsp.pcm import s16le_bytes_to_float
from synth.engines import load_engine
from synth.engines.base import Engine
from synth.worker import UtteranceStats, Worker
from tests.waiting import wait_for
from voxgate.contract.bus.base import Bus
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.redis_bus import RedisBus
from voxgate.pipecat import VoxgateTTSService

REDIS_URL = os.environ.get("VOXGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

GREETING = "Hello there, this is voxgate speaking. How are you today?"
# Long enough that the worker is still rendering it a second after it started.
LONG = " ".join(
    f"This is sentence number {n} of a long answer that the caller will not wait for."
    for n in range(1, 13)
)


class RecordingBus(MemoryBus):
    """The in-memory bus, noting every cancel."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[str] = []

    async def cancel(self, utterance_id: str) -> None:
        self.cancelled.append(utterance_id)
        await super().cancel(utterance_id)


@dataclass
class Live:
    bus: RecordingBus
    worker: Worker
    stats: list[UtteranceStats] = field(default_factory=list)


@pytest.fixture(scope="module")
def engine() -> Engine:
    e = load_engine("onnx")
    e.warmup()
    return e


async def _run_worker(bus: Bus, engine: Engine, stats: list[UtteranceStats]) -> tuple[
    Worker, asyncio.Event, asyncio.Task[None]
]:  # fmt: skip
    worker = Worker(bus, engine, name=f"w-{uuid.uuid4().hex[:6]}", on_stats=stats.append)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, warm=False))
    await wait_for(lambda: worker.ready, 10.0)
    return worker, stop, task


@pytest.fixture
async def live(engine: Engine) -> AsyncIterator[Live]:
    """A started recording memory bus with a real worker serving it."""
    bus = RecordingBus()
    await bus.start()
    stats: list[UtteranceStats] = []
    worker, stop, task = await _run_worker(bus, engine, stats)
    yield Live(bus, worker, stats)
    stop.set()
    await asyncio.wait_for(task, 10.0)
    await bus.close()


def _params(rate: int) -> PipelineParams:
    return PipelineParams(audio_out_sample_rate=rate)


def _audio(frames: Sequence[Frame]) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame)]


def _pcm(frames: Sequence[Frame]) -> np.ndarray:
    audio = b"".join(f.audio for f in _audio(frames))
    return s16le_bytes_to_float(audio).astype(np.float64)


def _dbfs(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x**2) + 1e-20))


def _band_ratio_db(x: np.ndarray, rate: int, above_hz: float) -> float:
    """Energy above ``above_hz`` relative to the whole signal, in dB."""
    spec = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / rate)
    return float(10 * np.log10(spec[freqs > above_hz].sum() / spec.sum() + 1e-20))


def _errors(up: Sequence[Frame]) -> list[str]:
    return [f.error for f in up if isinstance(f, ErrorFrame)]


def _index(frames: Sequence[Frame], kind: type[Frame]) -> list[int]:
    return [i for i, f in enumerate(frames) if isinstance(f, kind)]


def _words(frames: Sequence[Frame]) -> list[str]:
    return [f.text.strip() for f in frames if isinstance(f, TTSTextFrame)]


async def test_speaks_narrowband_at_8k(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus, profile="narrowband")
    down, up = await run_test(
        tts, frames_to_send=[TTSSpeakFrame(GREETING)], pipeline_params=_params(8000)
    )
    assert _errors(up) == []
    started, stopped = _index(down, TTSStartedFrame), _index(down, TTSStoppedFrame)
    audio = _index(down, TTSAudioRawFrame)
    assert len(started) == 1 and len(stopped) == 1 and audio
    assert started[0] < audio[0] and audio[-1] < stopped[0]
    assert {f.sample_rate for f in _audio(down)} == {8000}
    assert tts.worker_rate == 8000
    pcm = _pcm(down)
    # All of the worker's audio, unchanged: 10 words are ~3-4 s of speech.
    [stat] = live.stats
    assert stat.outcome == "done"
    assert pcm.size == round(stat.audio_s * 8000)
    assert 2.0 < pcm.size / 8000 < 6.0
    assert _dbfs(pcm) > -35.0
    # Telephone band: nothing left above the 3.8 kHz anti-alias filter's stop band.
    assert _band_ratio_db(pcm, 8000, 3950.0) < -40.0
    # Word timings from the engine's alignments become TTSTextFrames, in order.
    words = _words(down)
    assert words[:3] == ["Hello", "there", "this"] and words[-1] == "today"
    pts = [f.pts for f in down if isinstance(f, TTSTextFrame) and f.pts is not None]
    assert len(pts) == len(words) and pts == sorted(pts)
    [context_id] = [f.context_id for f in down if isinstance(f, TTSStartedFrame)]
    assert {f.context_id for f in _audio(down)} == {context_id}


async def test_narrowband_in_a_24k_pipeline_is_resampled_and_stays_band_limited(
    live: Live,
) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    down, up = await run_test(
        tts, frames_to_send=[TTSSpeakFrame(GREETING)], pipeline_params=_params(24000)
    )
    assert _errors(up) == []
    assert {f.sample_rate for f in _audio(down)} == {24000}
    assert tts.worker_rate == 8000
    pcm = _pcm(down)
    [stat] = live.stats
    # The resampler's output length is exact once flushed at the utterance's end.
    assert pcm.size == round(stat.audio_s * 24000)
    assert _dbfs(pcm) > -35.0
    assert _band_ratio_db(pcm, 24000, 4100.0) < -40.0


@pytest.mark.parametrize(
    ("rate", "worker_rate"), [(16000, 16000), (24000, 24000), (48000, 48000), (22050, 24000)]
)
async def test_wideband(live: Live, rate: int, worker_rate: int) -> None:
    tts = VoxgateTTSService(bus=live.bus, profile="wideband")
    down, up = await run_test(
        tts, frames_to_send=[TTSSpeakFrame(GREETING)], pipeline_params=_params(rate)
    )
    assert _errors(up) == []
    assert tts.worker_rate == worker_rate
    assert {f.sample_rate for f in _audio(down)} == {rate}
    pcm = _pcm(down)
    [stat] = live.stats
    assert abs(pcm.size - stat.audio_s * rate) <= 2
    assert _dbfs(pcm) > -35.0
    # Wideband indeed: the fricatives' energy above the telephone band is there.
    assert _band_ratio_db(pcm, rate, 4100.0) > -30.0
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 1


async def test_an_llm_turn_is_one_audio_context_in_sentence_order(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    down, up = await run_test(
        tts,
        frames_to_send=[
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello there. "),
            LLMTextFrame("Your order has shipped. "),
            LLMTextFrame("It arrives on Monday morning."),
            LLMFullResponseEndFrame(),
        ],
        pipeline_params=_params(8000),
    )
    assert _errors(up) == []
    # Three sentences, three utterances rendered concurrently, one context for pipecat.
    assert len(live.stats) == 3 and all(s.outcome == "done" for s in live.stats)
    assert len(_index(down, TTSStartedFrame)) == 1 and len(_index(down, TTSStoppedFrame)) == 1
    assert len({f.context_id for f in _audio(down)}) == 1
    assert _pcm(down).size == round(sum(s.audio_s for s in live.stats) * 8000)
    words = _words(down)
    assert words == ["Hello", "there", "Your", "order", "has", "shipped", "It", "arrives",
                     "on", "Monday", "morning"]  # fmt: skip
    pts = [f.pts for f in down if isinstance(f, TTSTextFrame) and f.pts is not None]
    assert len(pts) == len(words) and pts == sorted(pts)
    # Each sentence's words are timed after the previous sentence's audio: "Your" starts
    # after the whole first utterance ("Hello there.") has played.
    first_s = min(live.stats, key=lambda s: s.read_at).audio_s
    assert (pts[2] - pts[0]) / 1e9 > first_s * 0.8


async def test_bare_text_frames_are_a_context_per_sentence(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    down, up = await run_test(
        tts,
        frames_to_send=[TextFrame("Hello there. How are you? "), TextFrame("Fine")],
        pipeline_params=_params(8000),
    )
    assert _errors(up) == []
    # Outside an LLM turn nothing flushes a context: each sentence completes its own.
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 2
    assert _words(down) == ["Hello", "there", "How", "are", "you"]
    # "Fine" is only flushed by the EndFrame, after playback has ended: never sent to a worker.
    assert sorted(s.outcome for s in live.stats) == ["done", "done"]


async def test_interruption_cancels_the_utterance_on_the_bus(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    down, up = await run_test(
        tts,
        frames_to_send=[
            TTSSpeakFrame(LONG),
            SleepFrame(1.0),
            InterruptionFrame(),
            SleepFrame(1.0),
        ],
        pipeline_params=_params(8000),
    )
    assert _errors(up) == []
    await wait_for(lambda: live.stats, 5.0)
    [stat] = live.stats
    # The worker was told to stop and stopped early: all 12 sentences are ~50 s of audio.
    assert live.bus.cancelled == [stat.utterance_id]
    assert stat.outcome == "cancelled"
    assert stat.audio_s < 40.0
    [cut] = _index(down, InterruptionFrame)
    before, after = down[:cut], down[cut:]
    assert _audio(before), "audio played before the interruption"
    assert _audio(after) == [], "no audio of the interrupted utterance after it"
    # The audio we played is less than what the worker rendered before it stopped (we never
    # play what arrives after the cancel).
    assert _pcm(before).size <= round(stat.audio_s * 8000)


async def test_a_new_reply_after_an_interruption_is_spoken(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    down, up = await run_test(
        tts,
        frames_to_send=[
            TTSSpeakFrame(LONG),
            SleepFrame(0.8),
            InterruptionFrame(),
            SleepFrame(0.2),
            TTSSpeakFrame("Sure, go ahead."),
            SleepFrame(1.0),
        ],
        pipeline_params=_params(8000),
    )
    assert _errors(up) == []
    [cut] = _index(down, InterruptionFrame)
    after = down[cut:]
    assert len(_index(after, TTSStartedFrame)) == 1 and len(_index(after, TTSStoppedFrame)) == 1
    assert _words(after) == ["Sure", "go", "ahead"]
    outcomes = sorted(s.outcome for s in live.stats)
    assert outcomes == ["cancelled", "done"]
    done = next(s for s in live.stats if s.outcome == "done")
    assert _pcm(after).size == round(done.audio_s * 8000)


async def test_an_over_long_text_is_a_clear_error_frame(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)
    t0 = time.monotonic()
    down, up = await run_test(
        tts, frames_to_send=[TTSSpeakFrame("word " * 1100)], pipeline_params=_params(8000)
    )
    assert time.monotonic() - t0 < 5.0
    errors = _errors(up)
    assert any("text_too_long" in e and "limit is 5000" in e for e in errors), errors
    assert _audio(down) == []
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 1


async def test_the_bus_closing_mid_utterance_is_an_error_not_a_hang(live: Live) -> None:
    tts = VoxgateTTSService(bus=live.bus)

    async def close_at_first_audio() -> None:
        await wait_for(lambda: tts.first_audio_s, 10.0)
        await live.bus.close()

    closer = asyncio.create_task(close_at_first_audio())
    t0 = time.monotonic()
    down, up = await asyncio.wait_for(
        run_test(
            tts,
            frames_to_send=[
                TTSSpeakFrame(LONG),
                SleepFrame(1.0),
                TTSSpeakFrame("Are you still there?"),
                SleepFrame(0.5),
            ],
            pipeline_params=_params(8000),
        ),
        20.0,
    )
    await closer
    assert time.monotonic() - t0 < 10.0
    errors = _errors(up)
    assert any("bus lost" in e for e in errors), errors
    assert any("bus unreachable" in e and "closed" in e for e in errors), errors
    # Both contexts ended: the one cut short and the one never spoken.
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 2
    assert _audio(down)


async def test_no_worker_times_out_with_an_error_frame() -> None:
    bus = RecordingBus()
    await bus.start()
    tts = VoxgateTTSService(bus=bus, audio_timeout_s=1.0)
    t0 = time.monotonic()
    down, up = await asyncio.wait_for(
        run_test(tts, frames_to_send=[TTSSpeakFrame(GREETING)], pipeline_params=_params(8000)),
        20.0,
    )
    elapsed = time.monotonic() - t0
    await bus.close()
    assert 1.0 <= elapsed < 5.0
    errors = _errors(up)
    assert any("no audio" in e and "voxgate worker" in e for e in errors), errors
    assert len(bus.cancelled) == 1  # given up on the bus too, so a late worker skips it
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 1


async def test_an_unreachable_redis_is_an_error_frame_not_a_hang() -> None:
    tts = VoxgateTTSService(redis_url="redis://127.0.0.1:1/0", bus_timeout_s=1.0)
    t0 = time.monotonic()
    down, up = await asyncio.wait_for(
        run_test(
            tts,
            frames_to_send=[TTSSpeakFrame(GREETING)],
            pipeline_params=_params(8000),
            start_timeout=5.0,
        ),
        20.0,
    )
    assert time.monotonic() - t0 < 10.0
    errors = _errors(up)
    assert len([e for e in errors if "voxgate bus unreachable" in e]) == 2, errors  # start, speak
    assert _audio(down) == []
    assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 1


@pytest.mark.redis
async def test_over_redis_with_its_own_bus(engine: Engine) -> None:
    prefix = f"vgtest-pipecat-{uuid.uuid4().hex[:10]}"
    worker_bus = RedisBus(REDIS_URL, prefix=prefix)
    try:
        await worker_bus.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    stats: list[UtteranceStats] = []
    _, stop, task = await _run_worker(worker_bus, engine, stats)
    try:
        tts = VoxgateTTSService(redis_url=REDIS_URL, bus_prefix=prefix, profile="wideband")
        down, up = await run_test(
            tts,
            frames_to_send=[
                TTSSpeakFrame(GREETING),
                SleepFrame(0.5),
                TTSSpeakFrame(LONG),
                SleepFrame(1.0),
                InterruptionFrame(),
                SleepFrame(1.0),
            ],
            pipeline_params=_params(16000),
        )
        assert _errors(up) == []
        await wait_for(lambda: len(stats) == 2, 5.0)
        done, cancelled = sorted(stats, key=lambda s: s.outcome != "done")
        assert (done.outcome, cancelled.outcome) == ("done", "cancelled")
        [cut] = _index(down, InterruptionFrame)
        assert {f.sample_rate for f in _audio(down)} == {16000}
        assert _pcm(down[:cut]).size > round(done.audio_s * 16000)
        assert _audio(down[cut:]) == []
        # The service dropped its audio stream when it stopped.
        assert not await worker_bus._redis.exists(worker_bus.audio_stream(tts.call_id))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10.0)
        keys = [k async for k in worker_bus._redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await worker_bus._redis.delete(*keys)
        await worker_bus.close()


class _Relay:
    """A TCP relay in front of Redis that can be cut, as a network failure would cut it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        if self.server is not None:
            self.server.close()  # new connections are refused from now on
        for w in self.writers:
            w.transport.abort()


@pytest.mark.redis
async def test_redis_lost_mid_utterance_is_an_error_not_a_hang(engine: Engine) -> None:
    prefix = f"vgtest-pipecat-{uuid.uuid4().hex[:10]}"
    worker_bus = RedisBus(REDIS_URL, prefix=prefix)
    try:
        await worker_bus.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    url = urlsplit(REDIS_URL)
    relay = _Relay(url.hostname or "127.0.0.1", url.port or 6379)
    relay_port = await relay.start()
    stats: list[UtteranceStats] = []
    _, stop, task = await _run_worker(worker_bus, engine, stats)
    try:
        tts = VoxgateTTSService(
            redis_url=f"redis://127.0.0.1:{relay_port}{url.path}",
            bus_prefix=prefix,
            audio_timeout_s=1.5,
            bus_timeout_s=1.0,
        )

        async def cut_at_first_audio() -> None:
            await wait_for(lambda: tts.first_audio_s, 10.0)
            relay.cut()

        cutter = asyncio.create_task(cut_at_first_audio())
        t0 = time.monotonic()
        down, up = await asyncio.wait_for(
            run_test(
                tts,
                frames_to_send=[TTSSpeakFrame(LONG), SleepFrame(2.5)],
                pipeline_params=_params(8000),
            ),
            30.0,
        )
        await cutter
        assert time.monotonic() - t0 < 15.0
        errors = _errors(up)
        assert any("the audio stopped" in e and "unreachable" in e for e in errors), errors
        assert _audio(down)
        assert len(_index(down, TTSStartedFrame)) == len(_index(down, TTSStoppedFrame)) == 1
    finally:
        relay.cut()
        stop.set()
        await asyncio.wait_for(task, 20.0)
        keys = [k async for k in worker_bus._redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await worker_bus._redis.delete(*keys)
        await worker_bus.close()


class _FirstAudio(BaseObserver):
    """When each speak frame entered the service, and when each audio context's first audio
    frame left it (contexts play in the order they were spoken)."""

    def __init__(self, tts: VoxgateTTSService) -> None:
        super().__init__()
        self.tts = tts
        self.spoken: list[float] = []
        self.first_audio: dict[str | None, float] = {}

    async def on_push_frame(self, data: FramePushed) -> None:
        now = time.perf_counter()
        frame = data.frame
        if isinstance(frame, TTSSpeakFrame) and data.destination is self.tts:
            self.spoken.append(now)
        elif isinstance(frame, TTSAudioRawFrame) and data.source is self.tts:
            self.first_audio.setdefault(frame.context_id, now)


@pytest.mark.slow
async def test_time_to_first_audio_adds_little_to_the_workers(live: Live) -> None:
    """p50 over 10 utterances: speak frame in → first TTSAudioRawFrame out of the service,
    against the worker's own TTFA (request read → first chunk published)."""
    sentences = [
        f"Your reference number is {n} and your appointment is confirmed." for n in range(11)
    ]
    tts = VoxgateTTSService(bus=live.bus)
    obs = _FirstAudio(tts)
    frames: list[Frame] = []
    for s in sentences:
        frames += [TTSSpeakFrame(s), SleepFrame(1.0)]
    await run_test(tts, frames_to_send=frames, pipeline_params=_params(8000), observers=[obs])
    assert len(obs.first_audio) == len(sentences) == len(live.stats)
    # The first utterance is a warm-up (first-call costs in pipecat and the bus).
    spoken, first = obs.spoken[1:], list(obs.first_audio.values())[1:]
    stats = sorted(live.stats, key=lambda s: s.read_at)[1:]
    service = [(a - s) * 1000 for s, a in zip(spoken, first, strict=True)]
    worker = [((w.first_audio_at or w.end_at) - w.read_at) * 1000 for w in stats]
    to_worker = [(w.read_at - s) * 1000 for s, w in zip(spoken, stats, strict=True)]
    published = [w.first_audio_at or w.end_at for w in stats]
    from_worker = [(a - p) * 1000 for a, p in zip(first, published, strict=True)]
    p50 = statistics.median
    print(
        f"\nTTFA p50 over {len(service)} utterances: through the service {p50(service):.1f} ms "
        f"(min {min(service):.1f}, max {max(service):.1f}); the worker's own {p50(worker):.1f} ms; "
        f"speak frame -> worker read {p50(to_worker):.1f} ms, worker publish -> frame out "
        f"{p50(from_worker):.1f} ms"
    )
    assert all(a >= w for a, w in zip(service, worker, strict=True))
    assert p50(service) - p50(worker) < 30.0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="profile"):
        VoxgateTTSService(profile="superwide")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        VoxgateTTSService(bus=MemoryBus(), redis_url="redis://127.0.0.1:6379/0")
