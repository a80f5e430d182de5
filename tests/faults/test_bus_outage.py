"""The Redis bus through a real Redis that stops, restarts, and restarts empty.

A private ``redis-server`` (tests.faults.redis_server) is stopped with SHUTDOWN SAVE (the
restart finds its data) or killed and started empty (the data is lost). What is checked:

- while it is down, operations fail fast (microseconds once the outage is known), the outage
  is logged once, and the audio reader does not spin;
- when it is back, the same bus object reconnects by itself (the readiness ping ends the
  outage), a subscription made before the outage goes on receiving without duplicates, and
  the pending requests are still there;
- after a restart that lost the data, the consumer group and the streams are created again
  (NOGROUP handled) and new requests flow.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from tests.faults.redis_server import PrivateRedis
from tests.waiting import wait_for
from voxgate.contract.bus import AudioChunk, BusError, RedisBus, SpeakRequest

pytestmark = [pytest.mark.redis]

BUS_LOG = "voxgate.contract.bus.redis"


@pytest.fixture
async def bus(redis_server: PrivateRedis) -> AsyncIterator[RedisBus]:
    b = RedisBus(redis_server.url, prefix=f"vgfault-{uuid.uuid4().hex[:8]}", reader_block_ms=500)
    await b.start()
    yield b
    await b.close()


def chunk(call: str, utt: str, seq: int) -> AudioChunk:
    return AudioChunk(call, utt, seq, 8000, b"\x01\x00" * 160)


def request(call: str = "c1") -> SpeakRequest:
    return SpeakRequest(call_id=call, utterance_id=uuid.uuid4().hex, text="Hello there.")


async def test_an_outage_fails_fast_logs_once_and_the_bus_reconnects_by_itself(
    bus: RedisBus, redis_server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=BUS_LOG)
    sub = await bus.subscribe("c1")
    await bus.publish(chunk("c1", "u1", 0))
    first = await sub.get(5)
    assert isinstance(first, AudioChunk) and first.seq == 0
    pending = request()
    await bus.submit(pending)
    [delivery] = await bus.read_requests("w1", 1, 100)  # delivered, never acked

    redis_server.stop()
    # The reader's blocking XREAD sees the connection drop: the bus knows at once.
    await wait_for(lambda: not bus.health.up, timeout=3)
    failures = []
    t0 = time.perf_counter()
    for _ in range(50):
        try:
            await bus.submit(request())
        except BusError as exc:
            failures.append((time.perf_counter() - t0, str(exc)))
        t0 = time.perf_counter()
    assert len(failures) == 50
    # Refused without touching the network: well under a millisecond each on this box.
    assert sorted(f[0] for f in failures)[25] < 0.005, failures[:3]
    assert "unavailable" in failures[-1][1] and str(redis_server.port) in failures[-1][1]
    assert not await bus.ping()
    await asyncio.sleep(1.5)  # the reader waits on the backoff; it must not log per attempt
    lost = [r for r in caplog.records if r.name == BUS_LOG and "lost Redis" in r.message]
    assert len(lost) == 1, [r.message for r in caplog.records]

    redis_server.start()  # SHUTDOWN SAVE: the same data comes back
    t_back = time.monotonic()
    assert await bus.ping()  # the probe ends the outage
    assert bus.health.up and bus.health.reconnects == 1
    assert bus.health.outage_seconds(time.monotonic()) >= 1.5
    back = [r for r in caplog.records if r.name == BUS_LOG and "is back" in r.message]
    assert len(back) == 1
    # The subscription made before the outage goes on: the next chunk arrives, the one
    # received before is not delivered again.
    await bus.publish(chunk("c1", "u1", 1))
    nxt = await sub.get(5)
    assert isinstance(nxt, AudioChunk) and nxt.seq == 1, nxt
    reconnect_s = time.monotonic() - t_back
    assert await sub.get(0.3) is None
    # The request delivered before the outage is still pending (RDB kept the group's PEL).
    assert (await bus.pending())[1] == 1
    await bus.ack(delivery.id)
    assert await bus.pending() == (0, 0)
    await sub.close()
    ms = reconnect_s * 1000
    print(f"\nreconnect: first audio through the pre-outage subscription {ms:.0f} ms after Redis")


async def test_a_restart_that_lost_the_data_recreates_the_group_and_streams(
    bus: RedisBus, redis_server: PrivateRedis
) -> None:
    sub = await bus.subscribe("c2")
    await bus.publish(chunk("c2", "u1", 0))
    assert isinstance(await sub.get(5), AudioChunk)
    await bus.submit(request("c2"))
    assert await bus.read_requests("w1", 1, 100)

    redis_server.kill()
    redis_server.start(fresh=True)  # same port, nothing in it
    with redis_server.client() as raw:
        assert raw.dbsize() == 0
    assert await bus.ping()
    # The first read finds no group (NOGROUP) and creates it again; the request lost with the
    # data is gone, a new one flows.
    assert await bus.read_requests("w1", 1, 100) == []
    again = request("c2")
    await bus.submit(again)
    [d] = await bus.read_requests("w1", 1, 500)
    assert d.request == again
    await bus.ack(d.id)
    # The old subscription receives what is published to the re-created stream (its ids are
    # later than the cursor kept from before the loss).
    await bus.publish(chunk("c2", "u2", 0))
    m = await sub.get(5)
    assert isinstance(m, AudioChunk) and m.utterance_id == "u2"
    with redis_server.client() as raw:
        ttl = raw.pttl(bus.audio_stream("c2"))
        assert 0 < ttl <= 600_000  # the re-created stream has its TTL too
    await sub.close()


async def test_a_hung_redis_is_found_out_in_seconds_not_socket_timeouts(
    bus: RedisBus, redis_server: PrivateRedis
) -> None:
    # SIGSTOP: the server keeps its sockets open and answers nothing, like a network that
    # drops packets without a reset. No connection error will ever come.
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(BusError, match="timed out"):
            await bus.submit(request())  # in flight when it hung: bounded, not 3 x 5 s
        first = time.monotonic() - t0
        assert 1.5 < first < 3.5, first
        assert not bus.health.up
        t0 = time.monotonic()
        with pytest.raises(BusError, match="unavailable"):
            await bus.submit(request())
        assert time.monotonic() - t0 < 0.01  # known now: refused at once
        t0 = time.monotonic()
        assert not await bus.ping()  # the readiness probe gives up on its own too
        assert time.monotonic() - t0 < 2.0
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert await bus.ping()
    assert bus.health.up
    await bus.submit(request())
