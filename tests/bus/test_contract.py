"""The bus contract: every test runs against MemoryBus and RedisBus alike."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.bus.conftest import BusFactory, inject_request, speak
from voxgate.contract.bus import AudioChunk, Bus, SchemaError, UtteranceEnd, UtteranceError
from voxgate.contract.bus.schema import AudioMessage, Word


def chunk(call: str, seq: int, data: bytes = b"\x01\x00\x02\x00", utt: str = "u1") -> AudioChunk:
    return AudioChunk(
        call_id=call, utterance_id=utt, seq=seq, rate=8000, data=data, offset=seq * (len(data) // 2)
    )


async def collect(sub: object, n: int, timeout: float = 5.0) -> list[AudioMessage]:
    from voxgate.contract.bus import Subscription

    assert isinstance(sub, Subscription)
    out: list[AudioMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        msg = await sub.get(timeout=max(0.0, deadline - time.monotonic()))
        if msg is None:
            break
        out.append(msg)
    return out


# --- requests ------------------------------------------------------------------------------
async def test_submit_read_ack(bus: Bus) -> None:
    reqs = [
        speak(i, voice="joe", profile="wideband", deadline=1234.5, trace_id=f"t{i}")
        for i in range(3)
    ]
    for r in reqs:
        await bus.submit(r)
    got = await bus.read_requests("w1", count=10, block_ms=100)
    assert [d.request for d in got] == reqs
    assert all(d.error is None and d.deliveries == 1 for d in got)
    assert [(d.call_id, d.utterance_id) for d in got] == [("call-1", f"utt-{i}") for i in range(3)]
    assert await bus.pending() == (0, 3)
    for d in got:
        await bus.ack(d.id)
    assert await bus.pending() == (0, 0)
    assert await bus.read_requests("w1", count=10, block_ms=50) == []


async def test_delivery_ids_are_stream_ids_of_submit_time(bus: Bus) -> None:
    # "<ms>-<seq>" with wall-clock ms, increasing: a worker ages requests by their id.
    before = time.time() * 1000
    for i in range(5):
        await bus.submit(speak(i))
    got = await bus.read_requests("w1", count=10, block_ms=100)
    ids = [tuple(int(x) for x in d.id.split("-")) for d in got]
    assert ids == sorted(set(ids)) and len(ids) == 5
    assert all(before - 1000 <= ms <= time.time() * 1000 + 1000 for ms, _ in ids)


async def test_read_blocks_until_a_request_arrives(bus: Bus) -> None:
    reader = asyncio.create_task(bus.read_requests("w1", count=1, block_ms=3000))
    await asyncio.sleep(0.05)
    assert not reader.done()
    t0 = time.monotonic()
    await bus.submit(speak(1))
    got = await asyncio.wait_for(reader, 2.0)
    assert time.monotonic() - t0 < 1.0
    assert [d.utterance_id for d in got] == ["utt-1"]


async def test_non_blocking_read_returns_at_once(bus: Bus) -> None:
    t0 = time.monotonic()
    assert await bus.read_requests("w1", count=5, block_ms=0) == []
    assert time.monotonic() - t0 < 0.5


async def test_two_consumers_get_disjoint_requests(bus_factory: BusFactory) -> None:
    gateway = await bus_factory()
    # Separate processes (connections) on Redis; the same in-process bus for memory.
    w1, w2 = await bus_factory(peer_of=gateway), await bus_factory(peer_of=gateway)
    for i in range(40):
        await gateway.submit(speak(i))

    async def drain(b: Bus, name: str) -> list[str]:
        seen: list[str] = []
        while batch := await b.read_requests(name, count=3, block_ms=50):
            seen += [d.utterance_id for d in batch]
            await asyncio.sleep(0)
        return seen

    a, b = await asyncio.gather(drain(w1, "w1"), drain(w2, "w2"))
    assert a and b
    assert not set(a) & set(b)
    assert sorted(a + b) == sorted(f"utt-{i}" for i in range(40))
    assert await gateway.pending() == (0, 40)


async def test_claim_from_dead_consumer_after_idle(bus: Bus) -> None:
    for i in range(3):
        await bus.submit(speak(i))
    dead = await bus.read_requests("dead", count=2, block_ms=100)
    assert [d.utterance_id for d in dead] == ["utt-0", "utt-1"]
    assert await bus.claim_stale("alive", min_idle_ms=60_000, count=10) == []
    await asyncio.sleep(0.15)
    claimed = await bus.claim_stale("alive", min_idle_ms=100, count=10)
    assert [d.id for d in claimed] == [d.id for d in dead]
    assert [d.request for d in claimed] == [d.request for d in dead]
    assert all(d.deliveries == 2 for d in claimed)
    # Claiming resets the idle time: a third worker cannot take them straight away.
    assert await bus.claim_stale("other", min_idle_ms=100, count=10) == []
    # The undelivered third request is not "stale": it is still handed out normally.
    rest = await bus.read_requests("alive", count=10, block_ms=100)
    assert [d.utterance_id for d in rest] == ["utt-2"]
    for d in [*claimed, *rest]:
        await bus.ack(d.id)
    assert await bus.pending() == (0, 0)


async def test_claim_respects_count(bus: Bus) -> None:
    for i in range(5):
        await bus.submit(speak(i))
    await bus.read_requests("dead", count=5, block_ms=100)
    await asyncio.sleep(0.05)
    first = await bus.claim_stale("alive", min_idle_ms=20, count=2)
    assert [d.utterance_id for d in first] == ["utt-0", "utt-1"]
    second = await bus.claim_stale("alive2", min_idle_ms=20, count=10)
    assert [d.utterance_id for d in second] == ["utt-2", "utt-3", "utt-4"]


async def test_malformed_request_entries_become_error_deliveries(bus: Bus) -> None:
    bad: list[dict[str, str | bytes]] = [
        {"v": "99", "type": "speak", "call": "c9", "utt": "u9", "text": "hi"},  # future version
        {"v": "1", "type": "speak", "call": "c1", "utt": "u1"},  # no text
        {"v": "1", "type": "speak", "call": "c2", "utt": "u2", "text": b"\xff\xfe"},  # not UTF-8
        {"v": "1", "type": "speak", "call": "c3", "utt": "u3", "text": "x", "profile": "hifi"},
        {"v": "1", "type": "speak", "call": "", "utt": "u4", "text": "x"},  # empty call id
        {"v": "1", "type": "speak", "call": "c5", "utt": "u5", "text": "x", "deadline": "soon"},
        {"v": "1", "type": "chunk", "call": "c6", "utt": "u6", "text": "x"},  # wrong type
        {"garbage": b"\x00\x01"},
    ]
    for fields in bad:
        await inject_request(bus, fields)
    await bus.submit(speak(7, call="good"))
    got = await bus.read_requests("w1", count=20, block_ms=100)
    assert len(got) == len(bad) + 1
    for d, fields in zip(got, bad, strict=False):
        assert d.request is None
        assert isinstance(d.error, SchemaError)
        assert d.call_id == fields.get("call", "")
        assert d.utterance_id == fields.get("utt", "")
    assert "version 99" in str(got[0].error)
    assert "text" in str(got[1].error)
    assert got[-1].request is not None and got[-1].error is None
    # Claimed malformed entries still come back as error deliveries, not exceptions.
    await asyncio.sleep(0.05)
    claimed = await bus.claim_stale("w2", min_idle_ms=20, count=20)
    assert len(claimed) == len(got)
    assert sum(d.error is not None for d in claimed) == len(bad)
    for d in claimed:
        await bus.ack(d.id)
    assert await bus.pending() == (0, 0)


async def test_pending_counts(bus: Bus) -> None:
    assert await bus.pending() == (0, 0)
    for i in range(5):
        await bus.submit(speak(i))
    assert await bus.pending() == (5, 0)
    got = await bus.read_requests("w1", count=2, block_ms=100)
    assert await bus.pending() == (3, 2)
    await bus.ack(got[0].id)
    assert await bus.pending() == (3, 1)
    await bus.ack(got[0].id)  # acking twice is harmless
    assert await bus.pending() == (3, 1)


# --- audio ---------------------------------------------------------------------------------
async def test_many_interleaved_calls_arrive_in_order_without_loss(bus: Bus) -> None:
    calls, chunks = 50, 20
    subs = {f"call-{c}": await bus.subscribe(f"call-{c}") for c in range(calls)}

    async def speak_call(call: str) -> None:
        for seq in range(chunks):
            await bus.publish(chunk(call, seq, data=f"{call}/{seq:04d}".encode().ljust(16, b"\0")))
            await asyncio.sleep(0)  # interleave the calls
        await bus.publish(
            UtteranceEnd(call_id=call, utterance_id="u1", seq=chunks, samples=chunks * 8)
        )

    async def listen(call: str) -> list[AudioMessage]:
        return await collect(subs[call], chunks + 1, timeout=15.0)

    listeners = [asyncio.create_task(listen(c)) for c in subs]
    await asyncio.gather(*(speak_call(c) for c in subs))
    results = await asyncio.gather(*listeners)
    for call, got in zip(subs, results, strict=True):
        assert [m.seq for m in got] == list(range(chunks + 1)), call
        assert all(m.call_id == call for m in got)
        data = [m.data for m in got if isinstance(m, AudioChunk)]
        assert data == [f"{call}/{s:04d}".encode().ljust(16, b"\0") for s in range(chunks)]
        assert isinstance(got[-1], UtteranceEnd)
    for sub in subs.values():
        await sub.close()


async def test_subscription_sees_only_its_call_and_only_later_messages(bus: Bus) -> None:
    await bus.publish(chunk("a", 0))  # before anyone subscribed: not delivered
    sub_a = await bus.subscribe("a")
    await bus.publish(chunk("b", 0))
    await bus.publish(chunk("a", 1))
    await bus.publish(chunk("ab", 2))
    got = await collect(sub_a, 1)
    assert [(m.call_id, m.seq) for m in got] == [("a", 1)]
    assert await sub_a.get(timeout=0.2) is None
    await sub_a.close()


async def test_two_subscriptions_of_one_call_both_receive(bus: Bus) -> None:
    s1 = await bus.subscribe("c")
    await bus.publish(chunk("c", 0))
    s2 = await bus.subscribe("c")
    await bus.publish(chunk("c", 1))
    assert [m.seq for m in await collect(s1, 2)] == [0, 1]
    assert [m.seq for m in await collect(s2, 1)] == [1]
    await s1.close()
    await bus.publish(chunk("c", 2))
    assert [m.seq for m in await collect(s2, 1)] == [2]
    assert await s1.get(timeout=0.05) is None
    await s2.close()


async def test_close_ends_iteration_and_get_times_out(bus: Bus) -> None:
    sub = await bus.subscribe("c")
    t0 = time.monotonic()
    assert await sub.get(timeout=0.1) is None
    assert 0.05 < time.monotonic() - t0 < 1.0
    await bus.publish(chunk("c", 0))
    await bus.publish(chunk("c", 1))
    seen: list[int] = []

    async def iterate() -> None:
        async for msg in sub:
            seen.append(msg.seq)
            if msg.seq == 1:
                await sub.close()

    await asyncio.wait_for(iterate(), 5.0)
    assert seen == [0, 1]
    assert await sub.get(timeout=1.0) is None  # closed: at once


async def test_bus_close_ends_subscriptions(bus_factory: BusFactory) -> None:
    b = await bus_factory()
    sub = await b.subscribe("c")
    waiter = asyncio.create_task(sub.get())
    await asyncio.sleep(0.05)
    await b.close()
    assert await asyncio.wait_for(waiter, 2.0) is None


async def test_large_binary_chunks_and_all_message_kinds(bus: Bus) -> None:
    payload = bytes(range(256)) * 256  # 64 KiB, every byte value incl. NUL
    assert len(payload) == 65536
    sub = await bus.subscribe("big")
    words = (Word("hello", 0, 4000), Word("wörld", 4000, 8000))
    sent: list[AudioMessage] = [
        AudioChunk(
            call_id="big",
            utterance_id="u",
            seq=0,
            rate=8000,
            data=payload,
            words=words,
            trace_id="tr",
        ),
        AudioChunk(
            call_id="big", utterance_id="u", seq=1, rate=48000, data=b"\0\0" * 10, offset=32768
        ),
        AudioChunk(call_id="big", utterance_id="u", seq=2, rate=8000, data=b""),
        UtteranceEnd(call_id="big", utterance_id="u", seq=3, reason="cancelled", samples=32778),
        UtteranceError(
            call_id="big",
            utterance_id="u2",
            seq=0,
            code="engine_error",
            message="boom: ünïcode",
            trace_id="tr2",
        ),
    ]
    for m in sent:
        await bus.publish(m)
    assert await collect(sub, len(sent)) == sent
    await sub.close()


async def test_publish_refuses_what_no_reader_accepts(bus: Bus) -> None:
    with pytest.raises(SchemaError, match="odd"):
        await bus.publish(chunk("c", 0, data=b"\x01\x02\x03"))
    with pytest.raises(SchemaError, match="encoding"):
        await bus.publish(
            AudioChunk(call_id="c", utterance_id="u", seq=0, rate=8000, data=b"", encoding="ulaw")
        )


async def test_drop_call(bus: Bus) -> None:
    sub = await bus.subscribe("c")
    await bus.publish(chunk("c", 0))
    assert [m.seq for m in await collect(sub, 1)] == [0]
    await sub.close()
    await bus.drop_call("c")
    await bus.drop_call("never-existed")
    # The call id can be used again afterwards.
    sub = await bus.subscribe("c")
    await bus.publish(chunk("c", 0, utt="u2"))
    assert [(m.utterance_id, m.seq) for m in await collect(sub, 1)] == [("u2", 0)]
    await sub.close()


# --- cancel markers, heartbeats ---------------------------------------------------------------
async def test_cancel_marker_visible_then_expires(bus_factory: BusFactory) -> None:
    b = await bus_factory(cancel_ttl_s=0.3)
    assert not await b.is_cancelled("u1")
    await b.cancel("u1")
    assert await b.is_cancelled("u1")
    assert not await b.is_cancelled("u2")
    await asyncio.sleep(0.45)
    assert not await b.is_cancelled("u1")


async def test_heartbeat_ready_workers_expiry_and_retire(bus: Bus) -> None:
    assert await bus.ready_workers() == []
    await bus.heartbeat("w-short", {"voice": "joe", "engine": "onnx"}, ttl_s=0.3)
    await bus.heartbeat("w-long", {"voice": "joe", "slots": 4}, ttl_s=30)
    await bus.heartbeat("w-gone", {}, ttl_s=30)
    workers = sorted(await bus.ready_workers(), key=lambda w: str(w["worker"]))
    assert workers == [
        {"worker": "w-gone"},
        {"worker": "w-long", "voice": "joe", "slots": 4},
        {"worker": "w-short", "voice": "joe", "engine": "onnx"},
    ]
    await bus.retire("w-gone")
    await bus.retire("w-never")
    await asyncio.sleep(0.45)
    assert [w["worker"] for w in await bus.ready_workers()] == ["w-long"]
    # A refresh keeps a worker alive past its first TTL.
    await bus.heartbeat("w-long", {"voice": "joe", "slots": 3}, ttl_s=30)
    assert await bus.ready_workers() == [{"worker": "w-long", "voice": "joe", "slots": 3}]


async def test_ping(bus: Bus) -> None:
    assert await bus.ping()


async def test_touch_keeps_a_delivery_from_being_claimed(bus: Bus) -> None:
    await bus.submit(speak(1))
    (d,) = await bus.read_requests("w1", 1, 100)
    await asyncio.sleep(0.15)
    await bus.touch("w1", [d.id])
    # Idle since the touch is < 100 ms: another worker cannot claim it.
    assert await bus.claim_stale("w2", 100, 10) == []
    await asyncio.sleep(0.15)
    (claimed,) = await bus.claim_stale("w2", 100, 10)
    assert claimed.id == d.id and claimed.deliveries == 2
    await bus.touch("w1", [])  # nothing to touch is fine
