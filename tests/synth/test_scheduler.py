"""synth.scheduler.PriorityExecutor: priorities, and a step outliving its event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from synth.scheduler import PriorityExecutor


def test_first_chunks_jump_the_queue() -> None:
    pool = PriorityExecutor(1)
    gate = threading.Event()
    order: list[str] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: order.append(name)

    async def main() -> None:
        blocker = pool.submit(0, gate.wait)  # occupies the one thread
        later = [pool.submit(5, note(f"later{i}")) for i in range(3)]
        first = pool.submit(1, note("first"))
        gate.set()
        await asyncio.gather(blocker, first, *later)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert order == ["first", "later0", "later1", "later2"]


def test_a_step_finishing_after_its_loop_closed_does_not_kill_the_thread() -> None:
    pool = PriorityExecutor(1)
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(5)
        return 1

    async def abandon() -> None:
        pool.submit(0, slow)
        await asyncio.to_thread(started.wait, 5)

    asyncio.run(abandon())  # the loop closes while slow() still runs
    release.set()

    async def again() -> int:
        return await asyncio.wait_for(pool.submit(0, lambda: 2), 5)

    try:
        # The same (only) thread takes the next step: it survived posting to a closed loop.
        assert asyncio.run(again()) == 2
        assert all(t.is_alive() for t in pool._threads)
    finally:
        pool.shutdown()
