"""The worker loop on both buses, with a stand-in engine isolating the worker layer.

The real engines and DSP have their own suites; the end-to-end tests with the real onnx engine
and separate processes are in test_worker_e2e.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from synth.worker import UtteranceStats, Worker
from tests.fakes import ToneEngine
from voxgate.contract.bus.base import Bus
from voxgate.contract.bus.schema import (
    ERR_BAD_REQUEST,
    ERR_DEADLINE,
    ERR_EMPTY_TEXT,
    ERR_ENGINE,
    ERR_TEXT_TOO_LONG,
    ERR_UNKNOWN_VOICE,
    AudioChunk,
    AudioMessage,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for _ in range(500):
            if worker.ready:
                break
            await asyncio.sleep(0.01)
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def req(text: str, call: str | None = None, **kw: Any) -> SpeakRequest:
    return SpeakRequest(
        call_id=call or uuid.uuid4().hex[:8], utterance_id=uuid.uuid4().hex, text=text, **kw
    )


async def collect(bus: Bus, r: SpeakRequest, timeout: float = 10.0) -> list[AudioMessage]:
    sub = await bus.subscribe(r.call_id)
    await bus.submit(r)
    out: list[AudioMessage] = []
    try:
        while True:
            m = await sub.get(timeout)
            assert m is not None, f"timed out after {[type(x).__name__ for x in out]}"
            out.append(m)
            if isinstance(m, UtteranceEnd | UtteranceError):
                return out
    finally:
        await sub.close()


def pcm(msgs: list[AudioMessage]) -> np.ndarray:
    return np.frombuffer(b"".join(m.data for m in msgs if isinstance(m, AudioChunk)), "<i2")


async def test_speaks_narrowband_in_order_then_ends(bus: Bus) -> None:
    async with running(Worker(bus, ToneEngine(), name="w1")):
        msgs = await collect(bus, req("one two three four five"))
    chunks = [m for m in msgs if isinstance(m, AudioChunk)]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.rate == 8000 for c in chunks)
    end = msgs[-1]
    assert isinstance(end, UtteranceEnd) and end.reason == "done"
    audio = pcm(msgs)
    assert end.samples == len(audio)
    # 5 words × 0.1 s at 16 kHz in → 0.5 s at 8 kHz out (plus at most the chain's flush).
    assert 3900 <= len(audio) <= 4400
    assert np.abs(audio).max() > 3000  # a real tone came through the chain
    # Offsets are contiguous.
    pos = 0
    for c in chunks:
        assert c.offset == pos
        pos += c.samples
    # Word marks are at the output rate, in order.
    starts = [w.start for c in chunks for w in c.words]
    assert starts == sorted(starts) and len(starts) == 5


async def test_wideband_profile_is_48k(bus: Bus) -> None:
    async with running(Worker(bus, ToneEngine(), name="w1")):
        msgs = await collect(bus, req("one two", profile="wideband"))
    assert {m.rate for m in msgs if isinstance(m, AudioChunk)} == {48000}
    assert 9000 <= len(pcm(msgs)) <= 10500


async def test_wideband_request_may_ask_for_its_rate(bus: Bus) -> None:
    # A 16 kHz browser leg asks for 16 kHz; the render cache keeps the two rates apart.
    async with running(Worker(bus, ToneEngine(), name="w1", cache_bytes=1 << 20)):
        msgs16 = await collect(bus, req("one two", profile="wideband", rate=16000))
        msgs48 = await collect(bus, req("one two", profile="wideband"))
    assert {m.rate for m in msgs16 if isinstance(m, AudioChunk)} == {16000}
    assert 3000 <= len(pcm(msgs16)) <= 3500
    assert {m.rate for m in msgs48 if isinstance(m, AudioChunk)} == {48000}


@pytest.mark.parametrize(
    ("text", "kw", "code"),
    [
        ("   ", {}, ERR_EMPTY_TEXT),
        ("...!", {}, ERR_EMPTY_TEXT),
        ("word " * 2000, {}, ERR_TEXT_TOO_LONG),
        ("hello", {"voice": "nobody"}, ERR_UNKNOWN_VOICE),
        ("hello", {"deadline": 1.0}, ERR_DEADLINE),
        ("boom please", {}, ERR_ENGINE),
    ],
)
async def test_bad_requests_get_errors_and_the_worker_keeps_serving(
    bus: Bus, text: str, kw: dict[str, Any], code: str
) -> None:
    async with running(Worker(bus, ToneEngine(fail_on="boom"), name="w1", max_text_chars=5000)):
        msgs = await collect(bus, req(text, **kw))
        assert isinstance(msgs[-1], UtteranceError), msgs
        assert msgs[-1].code == code
        assert msgs[-1].message
        # The next request on the same worker is served normally.
        ok = await collect(bus, req("still alive"))
        assert isinstance(ok[-1], UtteranceEnd) and ok[-1].reason == "done"
    lag, pending = await bus.pending()
    assert (lag, pending) == (0, 0)


async def test_malformed_entry_is_answered_on_the_call(bus: Bus) -> None:
    call = "c-" + uuid.uuid4().hex[:6]
    async with running(Worker(bus, ToneEngine(), name="w1")):
        sub = await bus.subscribe(call)
        await inject_raw_request(
            bus, {"v": "1", "call": call, "utt": "u1", "profile": "stereo", "text": "x"}
        )
        m = await sub.get(5)
        await sub.close()
        assert isinstance(m, UtteranceError) and m.code == ERR_BAD_REQUEST
        assert "profile" in m.message
        ok = await collect(bus, req("fine"))
        assert isinstance(ok[-1], UtteranceEnd)


async def inject_raw_request(bus: Bus, fields: dict[str, str]) -> None:
    inject = getattr(bus, "inject_raw_request", None)
    if inject is not None:
        await inject(fields)
        return
    await bus._redis.xadd(bus.request_stream, fields)  # type: ignore[attr-defined]


async def test_cancel_stops_within_one_chunk(bus: Bus) -> None:
    engine = ToneEngine(step_s=0.02)
    async with running(Worker(bus, engine, name="w1")):
        r = req(" ".join(["word"] * 200))
        sub = await bus.subscribe(r.call_id)
        await bus.submit(r)
        got: list[AudioMessage] = []
        while len([m for m in got if isinstance(m, AudioChunk)]) < 3:
            m = await sub.get(5)
            assert m is not None
            got.append(m)
        made_at_cancel = engine.chunks_made
        await bus.cancel(r.utterance_id)
        while not isinstance(got[-1], UtteranceEnd):
            m = await sub.get(5)
            assert m is not None
            got.append(m)
        await sub.close()
    assert got[-1].reason == "cancelled"  # type: ignore[union-attr]
    # At most the chunk in progress plus one already queued finish after the cancel.
    assert engine.chunks_made - made_at_cancel <= 2
    assert engine.chunks_made < 20


async def test_long_utterance_does_not_block_another_calls_first_audio(bus: Bus) -> None:
    engine = ToneEngine(step_s=0.01)
    stats: list[UtteranceStats] = []
    async with running(Worker(bus, engine, name="w1", concurrency=4, on_stats=stats.append)):
        long = req(" ".join(["long"] * 300))
        sub = await bus.subscribe(long.call_id)
        await bus.submit(long)
        first = await sub.get(5)
        assert isinstance(first, AudioChunk)
        short = await collect(bus, req("short one"))
        assert isinstance(short[-1], UtteranceEnd)
        # The long one is still going when the short one has finished.
        assert not any(s.utterance_id == long.utterance_id for s in stats)
        await bus.cancel(long.utterance_id)
        await sub.close()


async def test_dead_workers_request_is_claimed_by_another(bus: Bus) -> None:
    r = req("rescue me")
    sub = await bus.subscribe(r.call_id)
    await bus.submit(r)
    taken = await bus.read_requests("dead-worker", 1, 100)
    assert [d.request.utterance_id for d in taken if d.request] == [r.utterance_id]
    # The dead worker never answers; a live one claims the request after claim_idle_ms.
    async with running(Worker(bus, ToneEngine(), name="alive", claim_idle_ms=200)):
        msgs: list[AudioMessage] = []
        while not msgs or not isinstance(msgs[-1], UtteranceEnd):
            m = await sub.get(10)
            assert m is not None, "request was never claimed"
            msgs.append(m)
    await sub.close()
    assert msgs[-1].reason == "done"  # type: ignore[union-attr]
    assert (await bus.pending())[1] == 0


async def test_ready_only_after_warmup(bus: Bus) -> None:
    engine = ToneEngine(warmup_s=0.5)
    w = Worker(bus, engine, name="slow-warm")
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop))
    await asyncio.sleep(0.2)
    assert not w.ready
    assert await bus.ready_workers() == []
    t0 = time.monotonic()
    while not await bus.ready_workers():
        assert time.monotonic() - t0 < 5
        await asyncio.sleep(0.05)
    assert engine.warmed and w.ready
    info = (await bus.ready_workers())[0]
    assert info["name"] == "slow-warm" and info["engine"] == "tone"
    stop.set()
    await task
    assert await bus.ready_workers() == []  # retired on shutdown


async def test_concurrent_calls_each_get_their_own_audio(bus: Bus) -> None:
    async with running(Worker(bus, ToneEngine(step_s=0.002), name="w1", concurrency=4)):
        results = await asyncio.gather(
            *(collect(bus, req("a b c d", call=f"call{i}")) for i in range(12))
        )
    for i, msgs in enumerate(results):
        assert all(m.call_id == f"call{i}" for m in msgs)
        assert isinstance(msgs[-1], UtteranceEnd) and msgs[-1].reason == "done"


async def test_slow_utterance_is_not_claimed_from_a_live_worker(bus: Bus) -> None:
    # Rendering takes ~1.5 s, five times claim_idle_ms: the live worker keeps it (touch), so
    # neither it nor a second worker renders the utterance twice.
    r = req(" ".join(["slow"] * 30))
    sub = await bus.subscribe(r.call_id)
    a = Worker(bus, ToneEngine(step_s=0.05), name="a", claim_idle_ms=300)
    b = Worker(bus, ToneEngine(step_s=0.05), name="b", claim_idle_ms=300)
    async with running(a), running(b):
        await bus.submit(r)
        msgs: list[AudioMessage] = []
        while not msgs or not isinstance(msgs[-1], UtteranceEnd):
            m = await sub.get(10)
            assert m is not None
            msgs.append(m)
        await asyncio.sleep(0.5)  # a duplicate render would still be publishing
        assert await sub.get(0.2) is None
    await sub.close()
    seqs = [m.seq for m in msgs if isinstance(m, AudioChunk)]
    assert seqs == list(range(len(seqs)))


async def test_repeated_prompts_are_replayed_from_the_cache(bus: Bus) -> None:
    engine = ToneEngine()
    stats: list[UtteranceStats] = []
    worker = Worker(bus, engine, name="w1", cache_bytes=1 << 20, on_stats=stats.append)
    async with running(worker):
        first = await collect(bus, req("welcome to the line"))
        made = engine.chunks_made
        again = await collect(bus, req("welcome to the line"))
        assert engine.chunks_made == made  # no engine work the second time
        wide = await collect(bus, req("welcome to the line", profile="wideband"))
        assert engine.chunks_made > made  # another profile is another rendering
    assert pcm(first).tobytes() == pcm(again).tobytes()
    assert [m.seq for m in again if isinstance(m, AudioChunk)] == list(range(len(again) - 1))
    assert isinstance(again[-1], UtteranceEnd) and again[-1].samples == len(pcm(again))
    assert {m.rate for m in wide if isinstance(m, AudioChunk)} == {48000}
    assert stats[1].first_audio_at is not None and worker.cache is not None
    assert worker.cache.hits == 1


async def test_cancelled_renderings_are_not_cached(bus: Bus) -> None:
    engine = ToneEngine(step_s=0.02)
    worker = Worker(bus, engine, name="w1", cache_bytes=1 << 20)
    async with running(worker):
        r = req(" ".join(["word"] * 50))
        sub = await bus.subscribe(r.call_id)
        await bus.submit(r)
        assert isinstance(await sub.get(5), AudioChunk)
        await bus.cancel(r.utterance_id)
        while not isinstance(m := await sub.get(5), UtteranceEnd):
            assert m is not None
        await sub.close()
        assert worker.cache is not None and len(worker.cache) == 0
