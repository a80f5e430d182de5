"""RedisBus specifics: key layout, TTLs, the shared reader's resilience, connection errors."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.bus.conftest import REDIS_URL, speak
from tests.bus.test_contract import chunk, collect
from voxgate.contract.bus import AudioChunk, BusError, MemoryBus, RedisBus, make_bus
from voxgate.contract.bus.schema import AudioMessage, audio_to_fields

pytestmark = pytest.mark.redis


@pytest.fixture
async def started(raw_redis: Redis, prefix: str) -> AsyncIterator[list[RedisBus]]:
    """Started RedisBus instances appended by the test are closed afterwards."""
    buses: list[RedisBus] = []
    yield buses
    for b in buses:
        await b.close()


async def new_bus(started: list[RedisBus], prefix: str, **kwargs: object) -> RedisBus:
    b = RedisBus(REDIS_URL, prefix=prefix, **kwargs)  # type: ignore[arg-type]
    await b.start()
    started.append(b)
    return b


async def reader_ids(raw: Redis, bus: RedisBus) -> list[str]:
    clients = await raw.client_list()
    return [str(c["id"]) for c in clients if c.get("name") == bus.reader_name]


async def wait_reader(raw: Redis, bus: RedisBus, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = await reader_ids(raw, bus)
        if ids:
            return ids
        await asyncio.sleep(0.01)
    raise AssertionError("reader connection never appeared")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_key_layout_and_ttls(raw_redis: Redis, started: list[RedisBus], prefix: str) -> None:
    bus = await new_bus(started, prefix, cancel_ttl_s=30.0)
    await bus.submit(speak(1))
    await bus.cancel("utt-1")
    await bus.heartbeat("w1", {"voice": "joe"}, ttl_s=10)
    await bus.publish(chunk("c1", 0))
    assert await raw_redis.type(f"{prefix}:synth:req") == b"stream"
    groups = await raw_redis.xinfo_groups(f"{prefix}:synth:req")
    assert [g["name"] for g in groups] == [b"synth"]
    assert 0 < await raw_redis.pttl(f"{prefix}:synth:cancel:utt-1") <= 30_000
    assert 0 < await raw_redis.pttl(f"{prefix}:synth:worker:w1") <= 10_000
    raw_hb = await raw_redis.get(f"{prefix}:synth:worker:w1")
    assert raw_hb is not None and json.loads(raw_hb) == {"worker": "w1", "voice": "joe"}
    audio = f"{prefix}:synth:audio:c1"
    assert await raw_redis.type(audio) == b"stream"
    # A crashed gateway never calls drop_call: the stream must expire on its own.
    assert 0 < await raw_redis.pttl(audio) <= 600_000
    await bus.drop_call("c1")
    assert not await raw_redis.exists(audio)
    # A late chunk after hang-up (the worker's "cancelled" end, a chunk in flight) does not
    # re-create the stream: the call's "gone" marker, living cancel_ttl_s, drops it.
    gone = f"{prefix}:synth:gone:c1"
    assert 0 < await raw_redis.pttl(gone) <= 30_000
    await bus.publish(chunk("c1", 1))
    assert not await raw_redis.exists(audio)
    # Subscribed again (a pipecat service restarted under the same call id), it is live again;
    # its stream, as every stream, never exists without a TTL.
    sub = await bus.subscribe("c1")
    assert not await raw_redis.exists(gone)
    await bus.publish(chunk("c1", 2))
    assert 0 < await raw_redis.pttl(audio) <= 600_000
    await sub.close()
    # Starting another bus on the same prefix is fine (BUSYGROUP is not an error).
    await new_bus(started, prefix)


async def test_audio_stream_is_capped(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix, audio_maxlen=50)
    for seq in range(600):
        await bus.publish(chunk("c", seq))
    # MAXLEN ~ trims whole radix-tree nodes (100 entries by default): roughly, never below.
    assert 50 <= await raw_redis.xlen(f"{prefix}:synth:audio:c") <= 250


async def test_wake_key_removed_at_close(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    sub = await bus.subscribe("c")
    await sub.close()
    await bus.close()
    assert [k async for k in raw_redis.scan_iter(match=f"{prefix}:synth:wake:*")] == []


async def test_reader_survives_client_kill_without_loss_or_duplicates(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    gateway = await new_bus(started, prefix)
    worker = await new_bus(started, prefix)
    calls, chunks = 5, 40
    subs = {f"c{i}": await gateway.subscribe(f"c{i}") for i in range(calls)}
    await wait_reader(raw_redis, gateway)

    async def publish_all() -> None:
        for seq in range(chunks):
            for call in subs:
                await worker.publish(chunk(call, seq))
            await asyncio.sleep(0.005)

    publisher = asyncio.create_task(publish_all())
    kills = 0
    for _ in range(3):
        await asyncio.sleep(0.05)
        for cid in await wait_reader(raw_redis, gateway):
            kills += await raw_redis.client_kill_filter(_id=cid)
    await publisher
    assert kills >= 3
    results = await asyncio.gather(*(collect(s, chunks, timeout=10.0) for s in subs.values()))
    for call, got in zip(subs, results, strict=True):
        assert [m.seq for m in got] == list(range(chunks)), call
    for s in subs.values():
        assert await s.get(timeout=0.05) is None  # nothing delivered twice
    # Killed while idle, then published to while it reconnects: still delivered.
    for cid in await wait_reader(raw_redis, gateway):
        await raw_redis.client_kill_filter(_id=cid)
    await worker.publish(chunk("c0", chunks))
    assert [m.seq for m in await collect(subs["c0"], 1)] == [chunks]
    assert len(await wait_reader(raw_redis, gateway)) == 1


async def test_one_reader_connection_for_hundreds_of_calls(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    subs = [await bus.subscribe(f"call-{i}") for i in range(300)]
    for i in range(300):
        await bus.publish(chunk(f"call-{i}", 0))
        await bus.publish(chunk(f"call-{i}", 1))
    results = await asyncio.gather(*(collect(s, 2) for s in subs))
    assert all([m.seq for m in got] == [0, 1] for got in results)
    assert len(await reader_ids(raw_redis, bus)) == 1


async def test_new_subscription_does_not_wait_out_the_block(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix, reader_block_ms=3000)
    await wait_reader(raw_redis, bus)
    await asyncio.sleep(0.1)  # the reader is now inside a 3 s XREAD BLOCK
    sub = await bus.subscribe("late")
    t0 = time.monotonic()
    await bus.publish(chunk("late", 0))
    msg = await sub.get(timeout=2.5)
    assert msg is not None and msg.seq == 0
    assert time.monotonic() - t0 < 0.5


async def test_malformed_audio_entries_are_skipped(
    raw_redis: Redis, started: list[RedisBus], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = await new_bus(started, prefix)
    sub = await bus.subscribe("c")
    key = f"{prefix}:synth:audio:c"
    await bus.publish(chunk("c", 0))
    good: dict[str, bytes] = audio_to_fields(chunk("c", 1))
    junk: list[dict[str, bytes]] = [
        {**good, "v": b"99"},
        {**good, "data": b"\x01\x02\x03"},
        {**good, "type": b"mystery"},
        {**good, "seq": b"one"},
        {**good, "words": b"{not json"},
        {b"x": b"\xff"},  # type: ignore[dict-item]
    ]
    with caplog.at_level(logging.WARNING, logger="voxgate.contract.bus"):
        for fields in junk:
            await raw_redis.xadd(key, fields)  # type: ignore[arg-type]
        await raw_redis.xadd(key, {"oops": "1"})
        await bus.publish(chunk("c", 1))
        got: list[AudioMessage] = await collect(sub, 2)
    assert [m.seq for m in got] == [0, 1]
    assert sum("malformed audio entry" in r.getMessage() for r in caplog.records) == len(junk) + 1
    # The reader is still alive afterwards.
    await bus.publish(chunk("c", 2))
    assert [m.seq for m in await collect(sub, 1)] == [2]


async def test_wrongtype_key_does_not_stop_other_calls(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    await raw_redis.set(f"{prefix}:synth:audio:bad", b"not a stream")
    with pytest.raises(BusError, match="WRONGTYPE"):
        await bus.subscribe("bad")
    await raw_redis.delete(f"{prefix}:synth:audio:bad")
    bad = await bus.subscribe("bad")
    # The key turns into a string after subscribing: XREAD over all streams is refused.
    await raw_redis.set(f"{prefix}:synth:audio:bad", b"not a stream")
    ok = await bus.subscribe("ok")
    await bus.publish(chunk("ok", 0))
    assert [m.seq for m in await collect(ok, 1, timeout=5.0)] == [0]
    await bad.close()


async def test_pending_lag_fallback_when_redis_cannot_tell(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    for i in range(5):
        await bus.submit(speak(i))
    await bus.read_requests("w", count=1, block_ms=100)
    # XDEL inside the undelivered range makes XINFO GROUPS report lag as nil (Redis 7).
    entries = await raw_redis.xrange(f"{prefix}:synth:req")
    assert entries is not None and entries[2][0] is not None
    await raw_redis.xdel(f"{prefix}:synth:req", entries[2][0])
    assert await bus.pending() == (3, 1)


async def test_group_recreated_after_stream_deleted(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    await raw_redis.delete(f"{prefix}:synth:req")  # e.g. an operator's DEL / FLUSHDB
    await bus.submit(speak(1))  # XADD re-creates the stream, without the group
    got = []
    for _ in range(3):
        got += await bus.read_requests("w", count=5, block_ms=50)
        if got:
            break
    assert [d.utterance_id for d in got] == ["utt-1"]


async def test_claim_reports_delivery_count(started: list[RedisBus], prefix: str) -> None:
    bus = await new_bus(started, prefix)
    await bus.submit(speak(1))
    await bus.read_requests("a", count=1, block_ms=100)
    for expected in (2, 3, 4):
        await asyncio.sleep(0.03)
        claimed = await bus.claim_stale(f"w{expected}", min_idle_ms=20, count=5)
        assert [d.deliveries for d in claimed] == [expected]


async def test_malformed_heartbeat_ignored(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    await raw_redis.set(f"{prefix}:synth:worker:broken", b"{nope")
    await bus.heartbeat("w1", {}, ttl_s=5)
    assert await bus.ready_workers() == [{"worker": "w1"}]


async def test_prefix_with_glob_characters_sees_only_itself(
    raw_redis: Redis, started: list[RedisBus], prefix: str
) -> None:
    star = await new_bus(started, f"{prefix}:*")
    plain = await new_bus(started, f"{prefix}:x")
    await plain.heartbeat("w", {}, ttl_s=5)
    assert await star.ready_workers() == []


async def test_unreachable_url_raises_bus_error_naming_it() -> None:
    port = closed_port()
    bus = RedisBus(f"redis://:hunter2@127.0.0.1:{port}/0", prefix="vgtest:unreachable")
    t0 = time.monotonic()
    with pytest.raises(BusError) as info:
        await bus.start()
    assert time.monotonic() - t0 < 5.0
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert not await bus.ping()
    await bus.close()


async def test_calls_before_start_raise_bus_error() -> None:
    bus = RedisBus(REDIS_URL, prefix="vgtest:unstarted")
    with pytest.raises(BusError, match="not started"):
        await bus.submit(speak(1))
    with pytest.raises(BusError, match="not started"):
        await bus.subscribe("c")


async def test_bad_url_raises_bus_error() -> None:
    with pytest.raises(BusError, match="bad Redis URL"):
        await RedisBus("http://nope", prefix="vgtest:bad").start()


def test_make_bus() -> None:
    assert isinstance(make_bus("memory", REDIS_URL, "p", 10, 1.0), MemoryBus)
    rb = make_bus("redis", REDIS_URL, "p", 10, 1.0)
    assert isinstance(rb, RedisBus) and rb.request_stream == "p:synth:req"
    with pytest.raises(ValueError, match="unknown bus kind"):
        make_bus("kafka", REDIS_URL, "p", 10, 1.0)


async def test_audio_chunk_objects_survive_redis_byte_for_byte(
    started: list[RedisBus], prefix: str
) -> None:
    bus = await new_bus(started, prefix)
    sub = await bus.subscribe("c")
    data = b"\x00" * 4 + bytes(range(256)) * 4
    sent = AudioChunk(call_id="c", utterance_id="ü-1", seq=0, rate=16000, data=data, offset=7)
    await bus.publish(sent)
    assert await sub.get(timeout=2) == sent


def _socket_fds() -> int:
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


async def test_command_pool_is_bounded(started: list[RedisBus], prefix: str) -> None:
    """A burst of commands waits for a connection instead of opening one each: redis-py's default
    pool kept every connection a burst opened (the soak: 10 calls hung up at once left 13), and
    the 101st command in flight failed with "Too many connections", taken for an outage."""
    from voxgate.contract.bus.redis_bus import COMMAND_POOL_MAX

    bus = await new_bus(started, prefix, cancel_ttl_s=5.0)
    before = _socket_fds()
    await asyncio.gather(*(bus.cancel(f"utt-{i}") for i in range(200)))
    opened = _socket_fds() - before
    # More than one: the burst really ran concurrently; at most the bound, not 200.
    assert 1 < opened <= COMMAND_POOL_MAX
    # ... and the 200 all went through.
    assert all([await bus.is_cancelled(f"utt-{i}") for i in range(200)])
