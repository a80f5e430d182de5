"""Fixtures of the campaign tests.

Stores: each test gets a factory of store instances over one backend, a real Redis
(``VOXGATE_TEST_REDIS_URL``, default 127.0.0.1:6379/0; skipped when unreachable) under a random
key prefix deleted afterwards, or one SQLite file in ``tmp_path``. Several instances from one
factory are several gateways sharing the campaign.

Real calls: ``gw``, an in-process gateway (memory bus, the real onnx worker, free loopback
ports, its campaigns in ``tmp_path``), and ``sipp``, the callees' runner (sipp processes reaped
in the test's loop)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.campaign.redis_store import RedisCampaignStore
from gateway.campaign.sqlite_store import SqliteCampaignStore
from gateway.campaign.store import CampaignStore
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.interop.conftest import Sipp, need, port_block
from voxgate.bench.localgw import LocalGateway, local_gateway

REDIS_URL = os.environ.get("VOXGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

StoreFactory = Callable[[], CampaignStore]


@pytest.fixture(params=["sqlite", "redis"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    stores: list[CampaignStore] = []
    if request.param == "sqlite":
        path = tmp_path / "campaigns.sqlite"

        def make() -> CampaignStore:
            stores.append(SqliteCampaignStore(path))
            return stores[-1]

        yield make
        for s in stores:
            await s.close()
        return
    probe = Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
    try:
        await probe.ping()
    except Exception as exc:  # pragma: no cover - depends on the machine
        await probe.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    prefix = f"vgtest:{uuid.uuid4().hex[:12]}"

    def make_redis() -> CampaignStore:
        stores.append(RedisCampaignStore.from_url(REDIS_URL, prefix=prefix))
        return stores[-1]

    yield make_redis
    for s in stores:
        await s.close()
    keys = [k async for k in probe.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await probe.delete(*keys)
    await probe.aclose()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture
async def gw(engine: Engine, tmp_path: Path) -> AsyncIterator[LocalGateway]:
    lo, hi = port_block(100)
    overrides = {
        "gateway.rtp_port_min": lo,
        "gateway.rtp_port_max": hi,
        "campaign.db": str(tmp_path / "campaigns.sqlite"),
    }
    async with local_gateway(engine, name="campaign", overrides=overrides) as local:
        yield local


@pytest.fixture
async def sipp(tmp_path: Path) -> AsyncIterator[Sipp]:
    need("sipp")
    runner = Sipp(tmp_path)
    try:
        yield runner
    finally:
        runner.close()
        for proc in runner.procs:  # reaped in this loop, not by a finaliser after it closed
            await proc.wait()
