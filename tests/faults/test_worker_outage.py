"""Workers through a Redis outage: the utterance in flight resumes where it stopped.

Real Redis (a private server that is stopped and restarted with its data), the worker loop in
this process with the stand-in tone engine (the worker layer, not the engine, is under test),
each worker and the "gateway" on a bus object of its own as separate processes would be.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from synth.worker import UtteranceStats, Worker
from tests.fakes import ToneEngine
from tests.faults.redis_server import PrivateRedis
from tests.waiting import wait_for
from voxgate.contract.bus import (
    AudioChunk,
    AudioMessage,
    BusDown,
    MemoryBus,
    RedisBus,
    SpeakRequest,
    UtteranceEnd,
)

pytestmark = [pytest.mark.redis]


@asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[Worker]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, warm=False))
    try:
        await wait_for(lambda: worker.ready, timeout=10)
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@asynccontextmanager
async def buses(url: str, n: int) -> AsyncIterator[list[RedisBus]]:
    prefix = f"vgfault-{uuid.uuid4().hex[:8]}"
    out = [RedisBus(url, prefix=prefix, reader_block_ms=500) for _ in range(n)]
    for b in out:
        await b.start()
    try:
        yield out
    finally:
        for b in out:
            await b.close()


async def test_an_utterance_cut_by_an_outage_resumes_without_a_rerender(
    redis_server: PrivateRedis,
) -> None:
    async with buses(redis_server.url, 3) as (gw, bus_a, bus_b):
        stats: dict[str, list[UtteranceStats]] = {"a": [], "b": []}
        a = Worker(bus_a, ToneEngine(step_s=0.05), name="a", claim_idle_ms=300,
                   on_stats=stats["a"].append)  # fmt: skip
        b = Worker(bus_b, ToneEngine(step_s=0.05), name="b", claim_idle_ms=300,
                   on_stats=stats["b"].append)  # fmt: skip
        # A chunk per word (and a tail): 40 and more, about 2 s of rendering.
        text = " ".join(["alpha", "bravo", "charlie", "delta", "echo"] * 8)
        req = SpeakRequest(call_id="c1", utterance_id=uuid.uuid4().hex, text=text)
        sub = await gw.subscribe("c1")
        got: list[AudioMessage] = []
        async with serving(a):
            await gw.submit(req)
            while len(got) < 5:
                m = await sub.get(10)
                assert m is not None
                got.append(m)
            async with serving(b):  # a second worker, idle, that could claim it
                redis_server.stop()
                await asyncio.sleep(1.5)  # five times claim_idle_ms
                redis_server.start()
                t_back = time.monotonic()
                while not isinstance(got[-1], UtteranceEnd):
                    m = await sub.get(10)
                    assert m is not None, f"stalled after {len(got)} messages"
                    got.append(m)
                    if len(got) == 6:
                        resumed_ms = (time.monotonic() - t_back) * 1000
                await wait_for(lambda: bool(stats["a"]), timeout=5)
                pending = await gw.pending()
                deadline = time.monotonic() + 5
                while pending != (0, 0) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    pending = await gw.pending()
        await sub.close()
    chunks = [m for m in got if isinstance(m, AudioChunk)]
    end = got[-1]
    assert isinstance(end, UtteranceEnd) and end.reason == "done"
    # Every chunk once, in order: worker a went on from where the outage stopped it; nobody
    # rendered the utterance again from seq 0 (worker b held off its claims after the outage).
    seqs = [c.seq for c in chunks]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 40
    assert end.samples == sum(c.samples for c in chunks)
    assert [s.outcome for s in stats["a"]] == ["done"] and stats["b"] == []
    assert pending == (0, 0)  # acknowledged
    assert a.bus.health.reconnects == 1 and b.bus.health.reconnects == 1
    print(f"\nresumed: next chunk {resumed_ms:.0f} ms after Redis answered again")


class AckOutageBus(MemoryBus):
    """The in-process bus, except that acks fail as if Redis were away while ``down``: the
    moment between a worker's last chunk and its ack (isolates the worker's ack bookkeeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.acks: list[str] = []

    async def ack(self, delivery_id: str) -> None:
        if self.down:
            self.health.failed(time.monotonic(), "Connection refused")
            raise BusDown("ack: Redis unavailable")
        self.acks.append(delivery_id)
        await super().ack(delivery_id)


async def test_an_ack_lost_to_an_outage_is_sent_later_and_never_rendered_again() -> None:
    bus = AckOutageBus()
    await bus.start()
    done: list[UtteranceStats] = []
    worker = Worker(bus, ToneEngine(), name="w", claim_idle_ms=200, on_stats=done.append)
    req = SpeakRequest(call_id="c1", utterance_id=uuid.uuid4().hex, text="one two three")
    sub = await bus.subscribe("c1")
    bus.down = True
    async with serving(worker):
        await bus.submit(req)
        await wait_for(lambda: bool(done), timeout=5)
        await wait_for(lambda: bool(worker._unacked), timeout=5)
        assert (await bus.pending())[1] == 1 and bus.acks == []
        # The bus comes back: the ack goes out; a claim handing the request back to this
        # worker (it looked idle all along) does not render it a second time.
        await bus.claim_stale("w", 0, 1)
        bus.down = False
        bus.health.succeeded(time.monotonic())
        await wait_for(lambda: bus.acks != [], timeout=5)
        await asyncio.sleep(0.5)
    assert await bus.pending() == (0, 0)
    assert [s.outcome for s in done] == ["done"]
    ends = []
    while (m := await sub.get(0.1)) is not None:
        if isinstance(m, UtteranceEnd):
            ends.append(m)
    assert len(ends) == 1
    await sub.close()
    await bus.close()
