"""Shared fixtures: both buses (Redis is the real server make test starts)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

from voxgate.contract.bus import make_bus
from voxgate.contract.bus.base import Bus

REDIS_URL = os.environ.get("VOXGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    prefix = f"vgtest-{uuid.uuid4().hex[:10]}"
    b = make_bus(request.param, REDIS_URL, prefix, 2000, 60.0)
    await b.start()
    yield b
    await b.close()
    if request.param == "redis":
        import redis.asyncio as aioredis

        r = aioredis.from_url(REDIS_URL)
        keys = [k async for k in r.scan_iter(f"{prefix}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
