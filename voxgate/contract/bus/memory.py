"""In-process bus for the embedded ``voxgate serve``: the Redis contract on asyncio dicts/queues.

It models one consumer group (``synth``) the way Redis Streams does: each request goes to
exactly one consumer, stays pending until acked, and can be claimed by another consumer once
it has been idle for ``min_idle_ms``. Requests are stored in wire form (``to_fields``) so that
validation, malformed entries and the test hook behave exactly as on Redis. Audio messages are
handed over as the (immutable) objects themselves, after the same publish-time check.

Single event loop only: not thread-safe (nothing here awaits inside a critical section, which is
what makes it coroutine-safe).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from voxgate.contract.bus._common import QueueSubscription, delivery_from_fields, encode_audio
from voxgate.contract.bus.base import Bus, BusError, Delivery, Subscription
from voxgate.contract.bus.schema import AudioMessage, SpeakRequest


@dataclass(slots=True)
class _Pending:
    fields: Mapping[str, str | bytes]
    consumer: str
    delivered_at: float  # time.monotonic() of the last delivery (XPENDING "idle" is now - this)
    deliveries: int


class MemoryBus(Bus):
    def __init__(self, cancel_ttl_s: float = 120.0) -> None:
        super().__init__()
        self._cancel_ttl_s = cancel_ttl_s
        self._last_id = (0, 0)
        # Entries not yet delivered to any consumer (the group's "lag"), in id order.
        self._undelivered: OrderedDict[str, Mapping[str, str | bytes]] = OrderedDict()
        # The group's PEL: delivered, not yet acked; insertion order is id order.
        self._pel: dict[str, _Pending] = {}
        self._req_waiters: set[asyncio.Future[None]] = set()
        self._subs: dict[str, set[QueueSubscription]] = {}
        self._cancels: dict[str, float] = {}  # utterance id -> monotonic expiry
        self._workers: dict[str, tuple[dict[str, object], float]] = {}
        self._started = False
        self._closed = False

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise BusError("memory bus is closed")
        self._started = True

    async def close(self) -> None:
        self._closed = True
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.close_nowait()
        self._subs.clear()
        self._wake_readers()

    async def ping(self) -> bool:
        return self._started and not self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise BusError("memory bus is closed")

    # --- gateway side -----------------------------------------------------------------------
    async def submit(self, request: SpeakRequest) -> None:
        self._check_open()
        self.add_raw_request(request.to_fields())

    def add_raw_request(self, fields: Mapping[str, str | bytes]) -> str:
        """Append an entry as-is (the XADD equivalent); tests use it to inject malformed ones."""
        entry_id = self._next_id()
        self._undelivered[entry_id] = dict(fields)
        self._wake_readers()
        return entry_id

    async def inject_raw_request(self, fields: Mapping[str, str | bytes]) -> str:
        """Awaitable spelling of ``add_raw_request`` (test hook)."""
        return self.add_raw_request(fields)

    def _next_id(self) -> str:
        # Ids look like XADD's "<ms>-<seq>": wall-clock milliseconds of the submit, so a worker
        # can age a request by its id on either bus. Like Redis, never go backwards in time.
        ms = time.time_ns() // 1_000_000
        last_ms, last_seq = self._last_id
        self._last_id = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        return f"{self._last_id[0]}-{self._last_id[1]}"

    def _wake_readers(self) -> None:
        for fut in self._req_waiters:
            if not fut.done():
                fut.set_result(None)

    async def cancel(self, utterance_id: str) -> None:
        self._check_open()
        now = time.monotonic()
        if len(self._cancels) >= 1024:
            # Markers of utterances nobody checks again would pile up (Redis expires them itself).
            for utt in [u for u, exp in self._cancels.items() if exp <= now]:
                del self._cancels[utt]
        self._cancels[utterance_id] = now + self._cancel_ttl_s

    async def subscribe(self, call_id: str) -> Subscription:
        self._check_open()
        sub = QueueSubscription(call_id, self._unsubscribe)
        self._subs.setdefault(call_id, set()).add(sub)
        return sub

    def _unsubscribe(self, sub: QueueSubscription) -> None:
        subs = self._subs.get(sub.call_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.call_id]

    async def drop_call(self, call_id: str) -> None:
        # Nothing is stored per call: audio goes straight to the live subscriptions, which is
        # what a Redis reader positioned at the stream's end sees too.
        self._check_open()

    async def ready_workers(self) -> list[dict[str, object]]:
        self._check_open()
        now = time.monotonic()
        for name in [n for n, (_, exp) in self._workers.items() if exp <= now]:
            del self._workers[name]
        return [dict(info) for info, _ in self._workers.values()]

    # --- worker side ------------------------------------------------------------------------
    async def read_requests(self, consumer: str, count: int, block_ms: int) -> list[Delivery]:
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_ms / 1000
        while True:
            out = self._take(consumer, count)
            if out or block_ms <= 0 or self._closed:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            fut: asyncio.Future[None] = loop.create_future()
            self._req_waiters.add(fut)
            try:
                async with asyncio.timeout(remaining):
                    await fut
            except TimeoutError:
                return self._take(consumer, count)
            finally:
                self._req_waiters.discard(fut)

    def _take(self, consumer: str, count: int) -> list[Delivery]:
        out: list[Delivery] = []
        now = time.monotonic()
        while self._undelivered and len(out) < max(count, 1):
            entry_id, fields = self._undelivered.popitem(last=False)
            self._pel[entry_id] = _Pending(fields, consumer, now, 1)
            out.append(delivery_from_fields(entry_id, fields, 1))
        return out

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[Delivery]:
        self._check_open()
        now = time.monotonic()
        out: list[Delivery] = []
        for entry_id, p in self._pel.items():
            if len(out) >= max(count, 1):
                break
            if (now - p.delivered_at) * 1000 >= min_idle_ms:
                # Like XAUTOCLAIM: new owner, idle reset, delivery counter incremented.
                p.consumer, p.delivered_at, p.deliveries = consumer, now, p.deliveries + 1
                out.append(delivery_from_fields(entry_id, p.fields, p.deliveries))
        return out

    async def touch(self, consumer: str, delivery_ids: list[str]) -> None:
        self._check_open()
        now = time.monotonic()
        for entry_id in delivery_ids:
            p = self._pel.get(entry_id)
            if p is not None:
                # Like XCLAIM ... 0 JUSTID: owner set, idle reset, delivery count unchanged.
                p.consumer, p.delivered_at = consumer, now

    async def ack(self, delivery_id: str) -> None:
        self._check_open()
        self._pel.pop(delivery_id, None)

    async def is_cancelled(self, utterance_id: str) -> bool:
        self._check_open()
        expiry = self._cancels.get(utterance_id)
        if expiry is None:
            return False
        if expiry <= time.monotonic():
            del self._cancels[utterance_id]
            return False
        return True

    async def publish(self, message: AudioMessage) -> None:
        self._check_open()
        encode_audio(message)  # same refusal as on Redis (SchemaError)
        for sub in list(self._subs.get(message.call_id, ())):
            sub.feed(message)

    async def heartbeat(self, worker: str, info: dict[str, object], ttl_s: float) -> None:
        self._check_open()
        # Through JSON, as on Redis: a worker that heartbeats fine here must not fail there.
        record = json.loads(json.dumps({"worker": worker, **info}))
        self._workers[worker] = (record, time.monotonic() + ttl_s)

    async def retire(self, worker: str) -> None:
        self._check_open()
        self._workers.pop(worker, None)

    async def pending(self) -> tuple[int, int]:
        self._check_open()
        return len(self._undelivered), len(self._pel)
