"""Fixtures for the bus contract suite: each test gets a started bus of each kind.

Redis tests use the real server (``VOXGATE_TEST_REDIS_URL``, default 127.0.0.1:6379/0), each
under its own random key prefix, and delete every key under that prefix afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest
from redis.asyncio import Redis

from voxgate.contract.bus import Bus, MemoryBus, RedisBus, SpeakRequest

REDIS_URL = os.environ.get("VOXGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

BusFactory = Callable[..., Awaitable[Bus]]


@pytest.fixture
def prefix() -> str:
    return f"vgtest:{uuid.uuid4().hex[:12]}"


async def _connect_or_skip() -> Redis:
    r = Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
    try:
        await r.ping()
    except Exception as exc:  # pragma: no cover - depends on the machine
        await r.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    return r


async def _cleanup(r: Redis, prefix: str) -> None:
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await r.delete(*keys)
    await r.aclose()


@pytest.fixture
async def raw_redis(prefix: str) -> AsyncIterator[Redis]:
    """A plain client for poking at the layout; removes the test's keys afterwards."""
    r = await _connect_or_skip()
    yield r
    await _cleanup(r, prefix)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def bus_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def bus_factory(bus_kind: str, prefix: str) -> AsyncIterator[BusFactory]:
    """Builds started buses of the parametrized kind (all sharing the test's prefix)."""
    made: list[Bus] = []
    raw = await _connect_or_skip() if bus_kind == "redis" else None

    async def make(peer_of: Bus | None = None, **kwargs: object) -> Bus:
        """A new started bus; ``peer_of``: another process's view of the same bus (for memory,
        which lives in one process, that is the very same object)."""
        b: Bus
        if peer_of is not None and isinstance(peer_of, MemoryBus):
            return peer_of
        if bus_kind == "memory":
            b = MemoryBus(**kwargs)  # type: ignore[arg-type]
        else:
            b = RedisBus(REDIS_URL, prefix=prefix, **kwargs)  # type: ignore[arg-type]
        await b.start()
        made.append(b)
        return b

    yield make
    for b in made:
        await b.close()
    if raw is not None:
        await _cleanup(raw, prefix)


@pytest.fixture
async def bus(bus_factory: BusFactory) -> Bus:
    return await bus_factory()


async def inject_request(bus: Bus, fields: Mapping[str, str | bytes]) -> str:
    """Append a raw (possibly malformed) request entry, bypassing SpeakRequest."""
    if isinstance(bus, MemoryBus):
        return bus.add_raw_request(fields)
    assert isinstance(bus, RedisBus)
    r = Redis.from_url(bus.url)
    try:
        entry_id = await r.xadd(bus.request_stream, dict(fields))  # type: ignore[arg-type]
    finally:
        await r.aclose()
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def speak(i: int, call: str = "call-1", **kwargs: object) -> SpeakRequest:
    return SpeakRequest(call_id=call, utterance_id=f"utt-{i}", text=f"hello number {i}", **kwargs)  # type: ignore[arg-type]
