"""Several gateway *processes* on one campaign (one SQLite file, one Redis): each contact is
claimed by exactly one of them. The in-process tests share an interpreter; these do not."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.campaign.contacts import Contact
from gateway.campaign.redis_store import RedisCampaignStore
from gateway.campaign.sqlite_store import SqliteCampaignStore
from gateway.campaign.store import CampaignStore
from tests.campaign.conftest import REDIS_URL

# Claims, starts and finishes contacts until none is left; prints the indexes it dialled.
WORKER = """
import asyncio, json, sys
from gateway.campaign.outcomes import Outcome
from gateway.campaign.store import Attempt

async def main(kind, where, prefix, owner):
    if kind == "sqlite":
        from gateway.campaign.sqlite_store import SqliteCampaignStore
        store = SqliteCampaignStore(where)
    else:
        from gateway.campaign.redis_store import RedisCampaignStore
        store = RedisCampaignStore.from_url(where, prefix=prefix)
    mine = []
    while (c := await store.claim("c", owner, 1.0, 600)) is not None:
        assert await store.start_attempt("c", c.index, owner, 1.0)
        done = Attempt(1.0, 2.0, Outcome.HUMAN, 200)
        assert await store.finish_attempt("c", c.index, owner, done, None)
        mine.append(c.index)
    await store.close()
    print(json.dumps(mine))

asyncio.run(main(*sys.argv[1:]))
"""

N = 1000


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_three_processes_claim_each_contact_once(kind: str, tmp_path: Path) -> None:
    prefix = f"vgtest:{uuid.uuid4().hex[:12]}"
    store: CampaignStore
    if kind == "sqlite":
        where = str(tmp_path / "campaigns.sqlite")
        store = SqliteCampaignStore(where)
    else:
        where = REDIS_URL
        probe = Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
        try:
            await probe.ping()
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
        finally:
            await probe.aclose()
        store = RedisCampaignStore.from_url(REDIS_URL, prefix=prefix)
    try:
        await store.create(
            "c", {"agent": {"kind": "ivr"}}, [Contact(f"+1555{i:07d}") for i in range(N)], 0.0
        )
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WORKER,
                kind,
                where,
                prefix,
                f"gw-{n}",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for n in range(3)
        ]
        outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 120)
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err.decode()
        dialled = [json.loads(out) for out, _ in outs]
        every = sorted(i for mine in dialled for i in mine)
        assert every == list(range(N))  # each contact once, none left out
        record = await store.get("c")
        assert record is not None and record.totals.outcomes == {"human": N}
        assert record.totals.attempts == N
    finally:
        await store.close()
        if kind == "redis":
            r = Redis.from_url(REDIS_URL)
            keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await r.delete(*keys)
            await r.aclose()
