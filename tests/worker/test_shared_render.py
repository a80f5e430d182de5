"""Utterances asking for a prompt that is being rendered follow that one rendering
(synth/shared.py), and a repeated prompt whose callers all left is finished for the cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import numpy as np
import pytest

from synth.engines.base import EngineChunk
from synth.worker import UtteranceStats, Worker
from tests.fakes import ToneEngine
from tests.worker.test_worker import collect, pcm, req
from tests.worker.test_worker import running as started
from voxgate.contract.bus.base import Bus, Subscription
from voxgate.contract.bus.schema import (
    ERR_ENGINE,
    AudioChunk,
    AudioMessage,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)

# 12 words: 12 chunks of the tone engine (one a word; no digits, which the normalizer expands).
TEXT = "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima"
CACHE = 1 << 22


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """The worker ready and its background warm-up done (it renders too: chunks_made)."""
    async with started(worker):
        await asyncio.wait_for(worker.fully_warm.wait(), 10)
        yield worker


def solo(text: str) -> np.ndarray:
    """What one utterance of ``text`` sounds like, rendered alone (no sharing, no cache)."""

    async def one() -> np.ndarray:
        from voxgate.contract.bus.memory import MemoryBus

        bus = MemoryBus()
        await bus.start()
        try:
            async with running(Worker(bus, ToneEngine(), name="solo")):
                return pcm(await collect(bus, req(text)))
        finally:
            await bus.close()

    return asyncio.run(one())


async def hear(bus: Bus, r: SpeakRequest, chunks: int) -> Subscription:
    """Submit ``r`` and take its first ``chunks`` chunks; the subscription stays open."""
    sub = await bus.subscribe(r.call_id)
    await bus.submit(r)
    for _ in range(chunks):
        assert isinstance(await sub.get(5), AudioChunk)
    return sub


def check_whole(msgs: list[AudioMessage], want: np.ndarray) -> None:
    chunks = [m for m in msgs if isinstance(m, AudioChunk)]
    assert [m.seq for m in chunks] == list(range(len(chunks)))
    end = msgs[-1]
    assert isinstance(end, UtteranceEnd) and end.reason == "done", end
    assert end.seq == len(chunks) and end.samples == len(want)
    assert pcm(msgs).tobytes() == want.tobytes()


async def test_a_burst_of_one_prompt_is_rendered_once(bus: Bus) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine(step_s=0.01)
    stats: list[UtteranceStats] = []
    worker = Worker(bus, engine, name="w1", concurrency=8, cache_bytes=CACHE, on_stats=stats.append)
    async with running(worker):
        made = engine.chunks_made  # the warm-up's
        got = await asyncio.gather(*(collect(bus, req(TEXT)) for _ in range(6)))
        assert engine.chunks_made - made == 12  # one rendering for six callers
        assert (worker.renderings["rendered"], worker.renderings["followed"]) == (1, 5)
    for msgs in got:
        check_whole(msgs, want)
    # Its compute is counted once, on the utterance that started it.
    assert sorted(s.compute_s > 0 for s in stats if s.audio_s > 0.5) == [False] * 5 + [True]


async def test_a_late_follower_gets_the_chunks_already_made_at_once(bus: Bus) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine(step_s=0.03)
    async with running(Worker(bus, engine, name="w1", cache_bytes=CACHE)):
        sub = await hear(bus, req(TEXT), 4)
        late = await collect(bus, req(TEXT))
        rest: list[AudioMessage] = []
        while not isinstance(m := await sub.get(5), UtteranceEnd):
            assert m is not None
            rest.append(m)
        await sub.close()
    check_whole(late, want)
    assert len(rest) == sum(isinstance(m, AudioChunk) for m in late) - 4


async def test_the_caller_who_started_it_leaving_does_not_cut_the_others_short(bus: Bus) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine(step_s=0.03)
    async with running(Worker(bus, engine, name="w1", cache_bytes=CACHE)):
        leader = req(TEXT)
        sub = await hear(bus, leader, 1)
        follower = asyncio.create_task(collect(bus, req(TEXT)))
        await asyncio.sleep(0.1)
        await bus.cancel(leader.utterance_id)  # barge-in on the first call
        while not isinstance(m := await sub.get(5), UtteranceEnd):
            assert m is not None
        await sub.close()
        assert m.reason == "cancelled"
        check_whole(await follower, want)


async def cut_short(bus: Bus, r: SpeakRequest, chunks: int) -> None:
    sub = await hear(bus, r, chunks)
    await bus.cancel(r.utterance_id)
    while not isinstance(m := await sub.get(5), UtteranceEnd):
        assert m is not None
    assert m.reason == "cancelled"
    await sub.close()


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_a_repeated_prompt_every_caller_cuts_short_is_finished_for_the_cache(
    bus: Bus,
) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine(step_s=0.02)
    worker = Worker(bus, engine, name="w1", cache_bytes=CACHE)
    async with running(worker):
        assert worker.cache is not None
        made = engine.chunks_made
        await cut_short(bus, req(TEXT), 2)  # asked once: a one-off, not finished
        await asyncio.sleep(0.3)
        assert len(worker.cache) == 0 and engine.chunks_made - made <= 4
        await cut_short(bus, req(TEXT), 2)  # asked again: a prompt that repeats
        await wait_until(lambda: len(worker.cache or ()) == 1)
        before = engine.chunks_made
        again = await collect(bus, req(TEXT))
        assert engine.chunks_made == before  # replayed, no engine work
        assert worker.renderings == {
            "replayed": 1, "rendered": 2, "followed": 0, "finished_unheard": 1, "stopped": 1,
            "prerendered": 0,
        }  # fmt: skip
    check_whole(again, want)


async def test_a_new_caller_joins_a_rendering_finishing_for_the_cache(bus: Bus) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine(step_s=0.05)
    worker = Worker(bus, engine, name="w1", cache_bytes=CACHE)
    async with running(worker):
        await cut_short(bus, req(TEXT), 1)
        made = engine.chunks_made
        await cut_short(bus, req(TEXT), 1)  # now finishing in the background
        joined = await collect(bus, req(TEXT))
        assert engine.chunks_made - made <= 12  # still that one rendering
    check_whole(joined, want)


class MidwayFailure(ToneEngine):
    def stream(
        self, text: str, should_stop: Callable[[], bool] | None = None, *, urgent: bool = True
    ) -> Iterator[EngineChunk]:
        for i, chunk in enumerate(super().stream(text, should_stop, urgent=urgent)):
            if i == 3 and "boom" in text:
                raise RuntimeError("engine exploded midway")
            yield chunk


async def test_an_engine_failure_reaches_every_follower_and_the_worker_goes_on(
    bus: Bus,
) -> None:
    engine = MidwayFailure(step_s=0.03)
    async with running(Worker(bus, engine, name="w1", cache_bytes=CACHE)) as worker:
        text = "boom " + TEXT
        got = await asyncio.gather(*(collect(bus, req(text)) for _ in range(3)))
        for msgs in got:
            assert isinstance(msgs[-1], UtteranceError) and msgs[-1].code == ERR_ENGINE, msgs
        ok = await collect(bus, req("still alive"))
        assert isinstance(ok[-1], UtteranceEnd) and ok[-1].reason == "done"
        assert worker.cache is not None and len(worker.cache) == 1  # only "still alive"


async def test_with_the_cache_off_every_utterance_renders_on_its_own(bus: Bus) -> None:
    engine = ToneEngine(step_s=0.01)
    async with running(Worker(bus, engine, name="w1", concurrency=4)):
        made = engine.chunks_made
        await asyncio.gather(*(collect(bus, req(TEXT)) for _ in range(3)))
        assert engine.chunks_made - made == 3 * 12


async def test_a_worker_stopping_mid_background_finish_stops_cleanly(bus: Bus) -> None:
    engine = ToneEngine(step_s=0.05)
    worker = Worker(bus, engine, name="w1", cache_bytes=CACHE)
    long = " ".join(["word"] * 200)
    async with running(worker):
        await cut_short(bus, req(long), 1)
        await cut_short(bus, req(long), 1)
        await asyncio.sleep(0.2)
        assert worker._render_tasks  # finishing in the background
    # running() waited for run() to return: nothing of the rendering is left behind.
    assert not worker._render_tasks and not worker._renders
    assert worker.cache is not None and len(worker.cache) == 0


async def test_prompts_listed_for_prerender_are_replayed_from_the_first_call(bus: Bus) -> None:
    want = await asyncio.to_thread(solo, TEXT)
    engine = ToneEngine()
    worker = Worker(bus, engine, name="w1", cache_bytes=CACHE, prerender=[TEXT])
    async with running(worker):  # ready first; the prompts after it, in the background
        assert worker.renderings["prerendered"] == 2  # narrowband and wideband (48 kHz)
        made = engine.chunks_made
        first = await collect(bus, req(TEXT))
        wide = await collect(bus, req(TEXT, profile="wideband"))
        assert engine.chunks_made == made and worker.renderings["replayed"] == 2
        other = await collect(bus, req("something else"))
        assert engine.chunks_made > made and isinstance(other[-1], UtteranceEnd)
    check_whole(first, want)
    assert {m.rate for m in wide if isinstance(m, AudioChunk)} == {48000}


def test_prerender_config_is_checked() -> None:
    from voxgate.contract.config import ConfigError, SynthConfig

    SynthConfig(prerender=["Welcome."]).validate()
    for bad in (SynthConfig(prerender=["  "]), SynthConfig(prerender=["x" * 6000]),
                SynthConfig(prerender=["Welcome."], cache_mb=0)):  # fmt: skip
        with pytest.raises(ConfigError, match=r"synth\.prerender"):
            bad.validate()


async def test_at_most_four_unheard_renderings_wait_for_the_background_turn() -> None:
    from synth.worker import MAX_UNHEARD
    from voxgate.contract.bus.memory import MemoryBus

    bus = MemoryBus()
    await bus.start()
    engine = ToneEngine(step_s=0.02)
    worker = Worker(bus, engine, name="w1", cache_bytes=CACHE)
    # Long enough (80 chunks, 1.6 s a rendering) that none finishes before the last is asked.
    texts = [" ".join([f"prompt{chr(97 + i)}"] * 80) for i in range(MAX_UNHEARD + 2)]
    try:
        async with running(worker):
            for text in texts * 2:  # each asked twice, each time cut short at once
                await cut_short(bus, req(text), 1)
            await wait_until(lambda: not worker._render_tasks, 30)
    finally:
        await bus.close()
    # The second asks: MAX_UNHEARD finished for the cache, the ones beyond that room stopped.
    assert worker.renderings["finished_unheard"] == MAX_UNHEARD
    assert worker.renderings["stopped"] == len(texts) + 2
    assert worker.cache is not None and len(worker.cache) == MAX_UNHEARD
