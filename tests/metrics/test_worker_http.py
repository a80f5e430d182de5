"""The worker's HTTP listener: /healthz, /readyz (503 until warm, 200 after), /metrics."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import synth.app
from synth.health import WorkerHttp
from synth.worker import Worker
from tests.fakes import ToneEngine
from tests.metrics.conftest import scrape
from voxgate.bench.localgw import free_port
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.schema import SpeakRequest, UtteranceEnd, UtteranceError
from voxgate.contract.config import ConfigError, load


async def get_json(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json()


async def speak(bus: MemoryBus, text: str, **kw: Any) -> str:
    req = SpeakRequest(call_id=uuid.uuid4().hex[:8], utterance_id=uuid.uuid4().hex, text=text,
                       trace_id="t" * 16, **kw)  # fmt: skip
    sub = await bus.subscribe(req.call_id)
    await bus.submit(req)
    try:
        while True:
            m = await sub.get(10)
            assert m is not None
            if isinstance(m, UtteranceEnd):
                return m.reason
            if isinstance(m, UtteranceError):
                return m.code
    finally:
        await sub.close()


@pytest.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    b = MemoryBus()
    await b.start()
    yield b
    await b.close()


async def test_readyz_is_503_until_warm_then_200(bus: MemoryBus) -> None:
    worker = Worker(bus, ToneEngine(warmup_s=1.0), name="w-http")
    http = WorkerHttp(bus, worker)
    port = await http.start("127.0.0.1:0")
    base = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(0.1)  # warming up (1 s)
        assert (await get_json(f"{base}/healthz"))[0] == 200
        status, body = await get_json(f"{base}/readyz")
        assert status == 503
        assert body == {"ready": False, "warm": False, "bus": True, "worker": "w-http"}
        m = await scrape(f"{base}/metrics")
        assert m.get("voxgate_worker_ready") == 0
        for _ in range(100):
            status, body = await get_json(f"{base}/readyz")
            if status == 200:
                break
            await asyncio.sleep(0.05)
        assert (status, body["ready"], body["warm"]) == (200, True, True)

        assert await speak(bus, "one two three four") == "done"
        assert await speak(bus, "hello", voice="nobody") == "unknown_voice"
        m = await scrape(f"{base}/metrics")
        assert m.get("voxgate_worker_ready") == 1
        assert m.get("voxgate_worker_inflight") == 0
        assert m.get("voxgate_worker_concurrency") == 4
        assert m.get("voxgate_worker_utterances_total", outcome="done") == 1
        assert m.get("voxgate_worker_utterances_total", outcome="error") == 1
        assert m.get("voxgate_worker_utterances_cancelled_total") == 0
        assert m.get("voxgate_worker_errors_total", code="unknown_voice") == 1
        assert m.get("voxgate_worker_errors_total", code="engine_error") == 0
        # The one utterance served was rendered (no cache hit, nobody to follow).
        assert m.get("voxgate_worker_renderings_total", outcome="rendered") == 1
        assert m.get("voxgate_worker_renderings_total", outcome="followed") == 0
        assert m.get("voxgate_worker_time_to_first_chunk_seconds_count") == 1
        assert m.get("voxgate_worker_rtf_count") == 1
        assert 0 < m.get("voxgate_worker_rtf_sum") < 5
        assert m.get("voxgate_worker_request_stream_lag") == 0
        assert m.get("voxgate_worker_request_stream_pending") == 0
    finally:
        stop.set()
        await task
        await http.close()
    # Retired: not ready any more (the process is still alive).


async def test_readyz_needs_the_bus(bus: MemoryBus) -> None:
    worker = Worker(bus, ToneEngine(), name="w-bus")
    http = WorkerHttp(bus)  # before the engine is loaded: no worker yet
    port = await http.start("127.0.0.1:0")
    base = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    try:
        status, body = await get_json(f"{base}/readyz")
        assert (status, body["warm"], body["worker"]) == (503, False, None)
        async with aiohttp.ClientSession() as s, s.get(f"{base}/metrics") as r:
            assert r.status == 200
        http.attach(worker)
        task = asyncio.create_task(worker.run(stop))
        for _ in range(100):
            if (await get_json(f"{base}/readyz"))[0] == 200:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("never ready")
        stop.set()
        await task
        status, body = await get_json(f"{base}/readyz")
        assert (status, body["warm"]) == (503, False)  # retired
        await bus.close()
        status, body = await get_json(f"{base}/readyz")
        assert (status, body["bus"]) == (503, False)
        assert (await get_json(f"{base}/healthz"))[0] == 200
    finally:
        stop.set()
        if task is not None:
            await task
        await http.close()


async def test_voxgate_worker_serves_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_worker`` (``voxgate worker``) listens on worker.http_listen from the start."""
    stops: list[asyncio.Event] = []
    monkeypatch.setattr(synth.app, "install_stop_signals", stops.append)
    monkeypatch.setattr(synth.app, "build_engine", lambda cfg: ToneEngine(warmup_s=0.5))
    port = free_port(socket.SOCK_STREAM)
    cfg = load(None, env={}, overrides={"worker.http_listen": f"127.0.0.1:{port}",
                                        "worker.name": "w-cli"})  # fmt: skip
    task = asyncio.create_task(synth.app.run_worker(cfg))
    base = f"http://127.0.0.1:{port}"
    try:
        seen = set()
        for _ in range(200):
            try:
                status, _ = await get_json(f"{base}/readyz")
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.02)
                continue
            seen.add(status)
            if status == 200:
                break
            await asyncio.sleep(0.02)
        assert seen == {503, 200}
        m = await scrape(f"{base}/metrics")
        assert m.get("voxgate_worker_ready") == 1
    finally:
        assert stops, "run_worker installed no stop handler"
        stops[0].set()
        assert await asyncio.wait_for(task, 10) == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        await get_json(f"{base}/healthz")


def test_http_listen_config() -> None:
    assert load(None, env={}).worker.http_listen == "127.0.0.1:9091"
    assert load(None, env={"VOXGATE_WORKER_HTTP_LISTEN": ""}).worker.http_listen == ""
    with pytest.raises(ConfigError, match=r"worker\.http_listen"):
        load(None, env={"VOXGATE_WORKER_HTTP_LISTEN": "nowhere"})
