"""Polling for a condition in async tests (with a deadline, so a broken feature fails fast)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_for(pred: Callable[[], object], timeout: float = 10.0, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(step)
