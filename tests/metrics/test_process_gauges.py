"""The process gauges a soak reads (voxgate_asyncio_tasks, voxgate_process_open_fds,
voxgate_process_resident_memory_bytes) follow what the process really holds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.metrics.conftest import MetricsGateway, scrape


async def test_task_and_fd_gauges_follow_the_process(metrics_gateway: MetricsGateway) -> None:
    url = f"{metrics_gateway.http}/metrics"
    before = await scrape(url)
    tasks0 = before.get("voxgate_asyncio_tasks")
    fds0 = before.get("voxgate_process_open_fds")
    assert tasks0 >= 1  # at least the gateway's own background tasks
    assert fds0 >= 3
    # Ten more tasks and five more descriptors, held across the scrape.
    stop = asyncio.Event()
    extra = [asyncio.create_task(stop.wait()) for _ in range(10)]
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
    try:
        during = await scrape(url)
    finally:
        stop.set()
        await asyncio.gather(*extra)
        for fd in fds:
            os.close(fd)
    # The scrape's own connection handling may add a task or a socket: at least the extra.
    assert during.get("voxgate_asyncio_tasks") - tasks0 >= 10
    assert during.get("voxgate_process_open_fds") - fds0 >= 5
    after = await scrape(url)
    assert after.get("voxgate_asyncio_tasks") < during.get("voxgate_asyncio_tasks") - 5
    assert after.get("voxgate_process_open_fds") <= during.get("voxgate_process_open_fds") - 5
    # Resident memory: the same process, so what the kernel reports for it (VmRSS, within
    # the few pages a scrape allocates).
    rss = during.get("voxgate_process_resident_memory_bytes")
    assert abs(rss - _vm_rss()) < 0.05 * rss
    assert rss > 10 * 2**20


def _vm_rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) * 1024  # kB
    raise AssertionError("no VmRSS in /proc/self/status")
