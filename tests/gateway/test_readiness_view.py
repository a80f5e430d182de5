"""The gateway's background readiness view survives a bus that fails in unexpected ways and
recovers when it answers again (a fake bus isolates this one layer)."""

from __future__ import annotations

import asyncio
from typing import cast

from gateway.readiness import WorkerReadiness
from voxgate.contract.bus.base import Bus


class FlakyBus:
    def __init__(self) -> None:
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
