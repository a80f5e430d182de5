"""The gateway's background readiness view survives a bus that fails in unexpected ways and
recovers when it answers again (a fake bus isolates this one layer)."""

from __future__ import annotations

import asyncio
from typing import cast

from gateway.readiness import WorkerReadiness
from voxgate.contract.bus.base import Bus
from voxgate.contract.bus.health import BusHealth


class FlakyBus:
    def __init__(self) -> None:
        self.health = BusHealth()
        self.fail: BaseException | None = RuntimeError("connection reset mid-reply")
        self.workers: list[dict[str, object]] = [{"name": "w1"}]

    async def ping(self) -> bool:
        if self.fail is not None:
            raise self.fail
        return True

    async def ready_workers(self) -> list[dict[str, object]]:
        return self.workers


async def test_an_unexpected_bus_error_keeps_it_unready_and_it_recovers() -> None:
    bus = FlakyBus()
    view = WorkerReadiness(cast(Bus, bus), fast_period_s=0.01)
    view.start()
    try:
        await asyncio.sleep(0.05)
        assert not view.ready  # the checks raised, the loop went on
        bus.fail = None
        assert await view.wait(1.0)
        bus.workers = []  # the last worker retired
        assert not await view.refresh() and not view.ready
    finally:
        await view.close()


async def test_it_turns_unready_the_moment_the_bus_marks_an_outage() -> None:
    # No refresh in between: the bus's bookkeeping (fed by whichever operation failed first,
    # typically the audio reader) is enough for SIP to answer 503 at once.
    bus = FlakyBus()
    bus.fail = None
    view = WorkerReadiness(cast(Bus, bus), period_s=3600)
    assert await view.refresh() and view.ready
    assert bus.health.failed(100.0, "Connection refused")
    assert not view.ready
    bus.health.succeeded(101.0)
    assert view.ready
