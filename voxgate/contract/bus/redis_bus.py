"""The bus over Redis Streams: gateways and workers in separate processes (layout in ``base``).

Audio fan-out: one background task per bus reads *all* subscribed per-call streams with a single
``XREAD BLOCK`` on its own connection and feeds per-subscription asyncio queues, so a few hundred
calls cost one connection and one round trip per batch, not one blocked connection each. Cursors
(the last id seen per stream) live in this process; after a dropped connection the reader
re-issues XREAD from them, which is what makes a reconnect lossless and duplicate-free.

A new subscription must join the reader's next XREAD without waiting out the current BLOCK: the
reader also reads a private "wake" stream, and ``subscribe`` XADDs to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxgate.contract.bus._common import (
    QueueSubscription,
    delivery_from_fields,
    encode_audio,
    redact_url,
)
from voxgate.contract.bus.base import Bus, BusDown, BusError, Delivery, Subscription
from voxgate.contract.bus.schema import AudioMessage, SchemaError, SpeakRequest, audio_from_fields

log = logging.getLogger("voxgate.contract.bus.redis")

GROUP = "synth"
# The command connection pool's size: commands in flight at once beyond it wait (at most
# call_timeout_s) for a connection. Redis answers in well under a millisecond, so 16 serve
# hundreds of calls; redis-py's default pool kept a burst's connections open for good and
# failed the 101st command in flight as if Redis were down (see _client_for).
COMMAND_POOL_MAX = 16
# A worker's message for a call the gateway has dropped (the UtteranceEnd "cancelled" it sends
# on seeing the cancel, a chunk that was in flight at the hang-up) would re-create the call's
# audio stream, and the stream would then stay audio_ttl_s (600 s) with nobody reading it
# (`voxgate bench soak`: one such stream after a settle of 60 s). drop_call leaves a "gone"
# marker living cancel_ttl_s; this script writes nothing while it exists, atomically, so no
# late write slips between a check and the XADD. KEYS: stream, gone marker; ARGV: maxlen,
# ttl ms, then field, value pairs.
_PUBLISH_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
StreamId = tuple[int, int]
_ZERO: StreamId = (0, 0)


def parse_id(raw: bytes | str) -> StreamId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def _glob_escape(text: str) -> str:
    """Escape SCAN MATCH glob metacharacters so a prefix matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _stream_entries(resp: Any) -> list[tuple[bytes, list[tuple[bytes | None, Any]]]]:
    """XREAD/XREADGROUP reply as [(key, [(id, fields)])] whatever protocol shape redis-py used."""
    if not resp:
        return []
    if isinstance(resp, Mapping):  # RESP3: {key: [entries]}
        out = []
        for key, value in resp.items():
            entries = value[0] if value and isinstance(value[0], list) else value
            out.append((key, list(entries)))
        return out
    return [(key, list(entries or [])) for key, entries in resp]


@dataclass(slots=True)
class _Tail:
    """Reader state of one audio stream: where we are, and who wants entries after which id."""

    cursor: StreamId
    subs: dict[QueueSubscription, StreamId] = field(default_factory=dict)
    broken: bool = False  # the key holds something that is not a stream (excluded from XREAD)


class RedisBus(Bus):
    def __init__(
        self,
        url: str,
        prefix: str = "voxgate",
        audio_maxlen: int = 2000,
        cancel_ttl_s: float = 120.0,
        *,
        req_maxlen: int = 100_000,
        audio_ttl_s: float = 600.0,
        reader_block_ms: int = 1000,
        reader_count: int = 64,
    ) -> None:
        super().__init__()
        self.url = url
        self.prefix = prefix
        self._safe_url = redact_url(url)
        self._audio_maxlen = audio_maxlen
        self._cancel_ttl_ms = max(1, int(cancel_ttl_s * 1000))
        self._req_maxlen = req_maxlen
        self._audio_ttl_ms = max(1, int(audio_ttl_s * 1000))
        self._reader_block_ms = reader_block_ms
        self._reader_count = reader_count
        # Commands on the shared connection time out after 5 s (a dead peer without RST); blocking
        # reads are capped below that so a long block never looks like a dead connection.
        self._socket_timeout = 5.0
        self._max_block_ms = 4000
        # A Redis that hangs (stopped, or a network that drops packets without a reset) closes
        # nothing: the readiness ping gives up after ping_timeout_s and marks the outage, and
        # what a caller waits on (a say's submit) after call_timeout_s, instead of the socket
        # timeout times redis-py's retries (15 s).
        self._ping_timeout_s = 1.0
        self._call_timeout_s = 2.0
        self.request_stream = f"{prefix}:synth:req"
        self._wake_key = f"{prefix}:synth:wake:{uuid.uuid4().hex}"
        self._wake_cursor: StreamId = _ZERO
        self.reader_name = re.sub(r"\s", "_", f"{prefix}:synth:reader:{uuid.uuid4().hex[:8]}")
        self._r: Redis | None = None
        self._reader_r: Redis | None = None
        self._publish_script: AsyncScript | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._tails: dict[str, _Tail] = {}
        self._closed = False
        # False while the reader is failing to reach Redis (then it sits in a backoff sleep,
        # where a plain cancel works, and a wake would only wait on a dead server).
        self._reader_healthy = True

    # --- keys -------------------------------------------------------------------------------
    def audio_stream(self, call_id: str) -> str:
        return f"{self.prefix}:synth:audio:{call_id}"

    def cancel_key(self, utterance_id: str) -> str:
        return f"{self.prefix}:synth:cancel:{utterance_id}"

    def gone_key(self, call_id: str) -> str:
        return f"{self.prefix}:synth:gone:{call_id}"

    def worker_key(self, worker: str) -> str:
        return f"{self.prefix}:synth:worker:{worker}"

    # --- plumbing ---------------------------------------------------------------------------
    def _client_for(
        self, *, name: str | None, socket_timeout: float, pool_max: int | None = None
    ) -> Redis:
        # pool_max: a bounded pool that waits (up to call_timeout_s) for a free connection.
        # redis-py's default pool opens one connection per command in flight, keeps every one
        # it ever opened (in `voxgate bench soak`, 10 calls hung up at once left 13 idle
        # connections open for the rest of the gateway's life), and past 100 in flight raises
        # MaxConnectionsError, a ConnectionError: read as "lost Redis", a false outage.
        pool_cls: type[ConnectionPool] = ConnectionPool
        bounded: dict[str, Any] = {}
        if pool_max is not None:
            pool_cls = BlockingConnectionPool
            bounded = {"max_connections": pool_max, "timeout": self._call_timeout_s}
        try:
            pool = pool_cls.from_url(
                self.url,
                **bounded,
                protocol=2,  # reply shapes below are the RESP2 ones
                socket_timeout=socket_timeout,
                socket_connect_timeout=2.0,
                # Two quick retries ride over a stale pooled connection (server restarted); more
                # would only delay the BusError the caller needs to see.
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
                client_name=name,
                health_check_interval=30,
            )
        except ValueError as exc:
            raise BusError(f"bad Redis URL {self._safe_url}: {exc}") from exc
        r = Redis(connection_pool=pool)
        r.auto_close_connection_pool = True  # aclose() closes the pool, as from_url's client
        return r

    @property
    def _redis(self) -> Redis:
        if self._r is None:
            raise BusError("RedisBus is not started (or already closed)")
        return self._r

    @contextlib.contextmanager
    def _errors(self, what: str, *, probe: bool = True) -> Iterator[None]:
        """Run one operation: refused at once while Redis is known to be down and no attempt
        is due (``health``), its outcome reported, any Redis failure raised as ``BusError``.

        ``probe=False``: refused all through an outage, even when an attempt is due. For what a
        caller waits on (a say's submit): the audio reader and the readiness ping make the
        attempts that find Redis back, so a say never pays a connect attempt's retries."""
        now = time.monotonic()
        health = self.health
        if not (health.allow(now) if probe else health.up):
            # Fail fast: a caller (a say, a publish) learns in microseconds what the next
            # connect attempt would tell it after its timeouts; attempts follow the backoff.
            raise BusDown(
                f"{what}: Redis at {self._safe_url} unavailable for {health.down_for(now):.1f} s "
                f"({health.last_error}); next attempt in {health.retry_in(now):.2f} s"
            )
        try:
            yield
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._lost(exc)
            raise BusDown(f"{what} on Redis at {self._safe_url} failed: {_why(exc)}") from exc
        except RedisError as exc:
            self._answered()  # an error reply (NOGROUP, WRONGTYPE) is an answer: Redis is up
            raise BusError(f"{what} on Redis at {self._safe_url} failed: {exc}") from exc
        self._answered()

    def _lost(self, exc: BaseException) -> None:
        """An operation could not reach Redis; the first of an outage is logged, not the rest."""
        if self.health.failed(time.monotonic(), _why(exc)):
            log.warning(
                "lost Redis at %s (%s): bus operations fail fast until it answers; reconnecting "
                "with backoff (up to %.1f s apart)",
                self._safe_url,
                _why(exc),
                self.health.cap_s,
            )

    def _answered(self) -> None:
        lasted = self.health.succeeded(time.monotonic())
        if lasted is not None:
            log.warning("Redis at %s is back after an outage of %.2f s", self._safe_url, lasted)

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise BusError("RedisBus is closed")
        if self._r is not None:
            return
        r = self._client_for(
            name=None, socket_timeout=self._socket_timeout, pool_max=COMMAND_POOL_MAX
        )
        try:
            await r.ping()
            await self._ensure_group(r)
        except (RedisError, OSError) as exc:
            await r.aclose()
            raise BusError(f"cannot reach Redis at {self._safe_url}: {exc}") from exc
        self._r = r
        # EVALSHA, loaded again by redis-py on NOSCRIPT (a Redis restarted empty).
        self._publish_script = r.register_script(_PUBLISH_LUA)
        # The reader's blocking XREAD needs its own connection; its socket timeout sits above the
        # BLOCK time so only a genuinely dead connection times out.
        self._reader_r = self._client_for(
            name=self.reader_name, socket_timeout=self._reader_block_ms / 1000 + 5.0
        )
        self._reader_task = asyncio.create_task(self._read_loop(), name=self.reader_name)

    async def _ensure_group(self, r: Redis) -> None:
        # Start the group at 0, not $: if the stream (and with it the group) was deleted and a
        # gateway re-created the stream by XADD, the requests it added since are still served.
        try:
            await r.xgroup_create(self.request_stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # BUSYGROUP: the group exists, which is the goal
                raise

    async def close(self) -> None:
        self._closed = True
        task = self._reader_task
        if task is not None:
            await self._stop_reader(task)
            self._reader_task = None
        for tail in list(self._tails.values()):
            for sub in list(tail.subs):
                sub.close_nowait()
        self._tails.clear()
        r, self._r = self._r, None
        reader, self._reader_r = self._reader_r, None
        if r is not None:
            with contextlib.suppress(RedisError, OSError):
                await r.delete(self._wake_key)
            await r.aclose()
        if reader is not None:
            await reader.aclose()

    async def _stop_reader(self, task: asyncio.Task[None]) -> None:
        # Ask first: the wake entry ends the reader's XREAD and it sees ``_closed``. Cancelling
        # alone is not enough: redis-py 8.1 swallows a CancelledError that lands during its
        # connection handshake, and the reader would then block on until its next BLOCK ends.
        if self._reader_healthy:
            await self._wake()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=self._reader_block_ms / 1000 + 1.0)
        if not done:
            log.warning("audio reader did not stop in time; abandoning it")
        elif not task.cancelled() and task.exception() is not None:
            log.error("audio reader had failed: %r", task.exception())

    async def ping(self) -> bool:
        # Never refused while down: readiness pings are the probes that end an outage.
        if self._r is None:
            return False
        try:
            async with asyncio.timeout(self._ping_timeout_s):
                answer = bool(await self._r.ping())
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:  # TimeoutError too
            self._lost(exc)
            return False
        except RedisError:
            self._answered()  # it answered (NOAUTH, say): reachable, but not usable
            return False
        self._answered()
        return answer

    # --- gateway side -----------------------------------------------------------------------
    async def submit(self, request: SpeakRequest) -> None:
        with self._errors("submit", probe=False):
            # Approximate MAXLEN (~) lets Redis trim whole radix-tree nodes only: cheap, and the
            # stream may briefly hold a little more than req_maxlen entries.
            async with asyncio.timeout(self._call_timeout_s):  # TimeoutError is an OSError
                await self._redis.xadd(
                    self.request_stream,
                    request.to_fields(),  # type: ignore[arg-type]
                    maxlen=self._req_maxlen,
                    approximate=True,
                )

    async def cancel(self, utterance_id: str) -> None:
        with self._errors("cancel", probe=False):
            async with asyncio.timeout(self._call_timeout_s):
                await self._redis.set(self.cancel_key(utterance_id), b"1", px=self._cancel_ttl_ms)

    async def subscribe(self, call_id: str) -> Subscription:
        key = self.audio_stream(call_id)
        with self._errors("subscribe", probe=False):
            # Pin the start at the stream's current last entry now, not "$" at the reader's next
            # XREAD: "$" would lose whatever is published between this call and that XREAD.
            # No stream yet: from 0-0, so the XADD that creates it is delivered.
            async with self._redis.pipeline(transaction=False) as pipe:
                # A call id subscribed again (a pipecat service restarted under its id) is live
                # again: its audio must not be dropped as a dropped call's.
                pipe.delete(self.gone_key(call_id))
                pipe.xrevrange(key, "+", "-", count=1)
                _, last = await pipe.execute()
        start = parse_id(last[0][0]) if last and last[0][0] is not None else _ZERO
        if self._closed:  # closed while we waited for XREVRANGE
            raise BusError("RedisBus is closed")
        sub = QueueSubscription(call_id, self._unsubscribe)
        tail = self._tails.get(key)
        if tail is None:
            tail = self._tails[key] = _Tail(cursor=start)
        tail.subs[sub] = start
        await self._wake()
        return sub

    def _unsubscribe(self, sub: QueueSubscription) -> None:
        key = self.audio_stream(sub.call_id)
        tail = self._tails.get(key)
        if tail is not None:
            tail.subs.pop(sub, None)
            if not tail.subs:
                del self._tails[key]

    async def _wake(self) -> None:
        """Make the reader's current XREAD return so its next one includes new streams."""
        if self._reader_task is None:
            return
        try:
            with self._errors("wake"):
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.xadd(self._wake_key, {b"w": b"1"}, maxlen=1, approximate=False)
                    # No leak if this process dies: gone with (or before) its calls' audio.
                    pipe.pexpire(self._wake_key, min(60_000, self._audio_ttl_ms))
                    await pipe.execute()
        except BusError as exc:
            # Not fatal: the reader picks the stream up when its BLOCK times out.
            log.debug("could not wake the audio reader: %s", exc)

    async def drop_call(self, call_id: str) -> None:
        with self._errors("drop_call"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.audio_stream(call_id))
                # Late messages of the call are dropped until it expires (_PUBLISH_LUA).
                pipe.set(self.gone_key(call_id), b"1", px=self._cancel_ttl_ms)
                await pipe.execute()

    async def ready_workers(self) -> list[dict[str, object]]:
        pattern = _glob_escape(self.worker_key("")) + "*"
        out: list[dict[str, object]] = []
        with self._errors("ready_workers"):
            keys = [k async for k in self._redis.scan_iter(match=pattern, count=500)]
            for i in range(0, len(keys), 500):
                values = await self._redis.mget(keys[i : i + 500])
                for key, value in zip(keys[i : i + 500], values, strict=True):
                    if value is None:  # expired between SCAN and MGET
                        continue
                    try:
                        info = json.loads(value)
                    except ValueError:
                        log.warning("ignoring malformed worker heartbeat %r", key)
                        continue
                    if isinstance(info, dict):
                        out.append(info)
        return out

    # --- worker side ------------------------------------------------------------------------
    async def read_requests(self, consumer: str, count: int, block_ms: int) -> list[Delivery]:
        block = min(block_ms, self._max_block_ms) if block_ms > 0 else None
        with self._errors("read_requests"):
            try:
                resp = await self._redis.xreadgroup(
                    GROUP, consumer, {self.request_stream: ">"}, count=max(count, 1), block=block
                )
            except ResponseError as exc:
                # NOGROUP: the stream key was deleted (and the group with it). Redis 7 also
                # unblocks a blocked XREADGROUP with an error when its key is deleted.
                if "NOGROUP" not in str(exc) and "no longer exists" not in str(exc):
                    raise
                log.warning("request group missing (%s); re-creating it", exc)
                await self._ensure_group(self._redis)
                return []
        out: list[Delivery] = []
        for _key, entries in _stream_entries(resp):
            for entry_id, fields in entries:
                if entry_id is None:
                    continue
                out.append(delivery_from_fields(entry_id.decode(), fields or {}, 1))
        return out

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[Delivery]:
        r = self._redis
        claimed: list[tuple[str, Any]] = []
        cursor = "0-0"
        with self._errors("claim_stale"):
            # XAUTOCLAIM inspects at most COUNT*10 PEL entries per call and returns a cursor; a
            # few rounds find idle entries behind a long run of busy ones. Claiming resets the
            # entry's idle time, so two workers claiming at once never both get it.
            for _ in range(8):
                try:
                    resp = await r.xautoclaim(
                        self.request_stream,
                        GROUP,
                        consumer,
                        max(min_idle_ms, 0),
                        start_id=cursor,
                        count=max(count - len(claimed), 1),
                    )
                except ResponseError as exc:
                    if "NOGROUP" not in str(exc):
                        raise
                    await self._ensure_group(r)
                    return []
                cursor = resp[0].decode() if isinstance(resp[0], bytes) else str(resp[0])
                for entry_id, fields in resp[1]:
                    if entry_id is not None and fields is not None:
                        claimed.append((entry_id.decode(), fields))
                if len(resp) > 2 and resp[2]:
                    # Redis ≥7: ids that were pending but already trimmed away (MAXLEN); Redis
                    # drops them from the PEL. Those requests are lost: say so.
                    log.warning(
                        "pending requests trimmed before they were served: %s",
                        [d.decode() if isinstance(d, bytes) else d for d in resp[2]],
                    )
                if cursor == "0-0" or len(claimed) >= count:
                    break
            if not claimed:
                return []
            # The delivery counter (incremented by the claim) is only reported by XPENDING.
            async with r.pipeline(transaction=False) as pipe:
                for entry_id, _ in claimed:
                    pipe.xpending_range(self.request_stream, GROUP, entry_id, entry_id, 1)
                counts = await pipe.execute()
        out = []
        for (entry_id, fields), info in zip(claimed, counts, strict=True):
            deliveries = int(info[0]["times_delivered"]) if info else 2
            out.append(delivery_from_fields(entry_id, fields, deliveries))
        return out

    async def touch(self, consumer: str, delivery_ids: list[str]) -> None:
        if not delivery_ids:
            return
        with self._errors("touch"):
            # XCLAIM with min-idle 0 and JUSTID resets the idle time without counting a new
            # delivery: the entry stays ours while we are still rendering it.
            ids: list[int | bytes | str | memoryview[int]] = list(delivery_ids)
            await self._redis.xclaim(self.request_stream, GROUP, consumer, 0, ids, justid=True)

    async def ack(self, delivery_id: str) -> None:
        with self._errors("ack"):
            await self._redis.xack(self.request_stream, GROUP, delivery_id)

    async def is_cancelled(self, utterance_id: str) -> bool:
        with self._errors("is_cancelled"):
            return bool(await self._redis.exists(self.cancel_key(utterance_id)))

    async def publish(self, message: AudioMessage) -> None:
        fields = encode_audio(message)  # SchemaError for what no reader would accept
        key = self.audio_stream(message.call_id)
        args: list[bytes | int] = [self._audio_maxlen, self._audio_ttl_ms]
        for name, value in fields.items():
            args += [name.encode() if isinstance(name, str) else name, value]
        with self._errors("publish"):
            # One script, atomic: nothing for a dropped call (its "gone" marker), and the XADD
            # always with its TTL, so a crashed or forgetful gateway cannot leak the stream. The
            # TTL is refreshed on every chunk: it runs out ``audio_ttl_s`` after the last audio.
            if self._publish_script is None or self._r is None:
                raise BusError("RedisBus is not started (or already closed)")
            await self._publish_script(keys=[key, self.gone_key(message.call_id)], args=args)

    async def heartbeat(self, worker: str, info: dict[str, object], ttl_s: float) -> None:
        payload = json.dumps({"worker": worker, **info})
        with self._errors("heartbeat"):
            await self._redis.set(self.worker_key(worker), payload, px=max(1, int(ttl_s * 1000)))

    async def retire(self, worker: str) -> None:
        with self._errors("retire"):
            await self._redis.delete(self.worker_key(worker))

    async def pending(self) -> tuple[int, int]:
        r = self._redis
        with self._errors("pending"):
            try:
                groups = await r.xinfo_groups(self.request_stream)
            except ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return 0, 0
                raise
            group = next((g for g in groups if _text(g.get("name")) == GROUP), None)
            if group is None:
                return 0, 0
            pending = int(group.get("pending", 0))
            lag = group.get("lag")  # Redis ≥7; None there when it cannot be known exactly
            if lag is not None:
                return int(lag), pending
            return await self._count_after(_text(group.get("last-delivered-id")) or "0-0"), pending

    async def _count_after(self, last_delivered: str, limit: int = 100_000) -> int:
        """Entries after the group's last-delivered-id (exclusive range, Redis ≥6.2), capped."""
        r = self._redis
        n, start = 0, f"({last_delivered}"
        while n < limit:
            page = await r.xrange(self.request_stream, min=start, max="+", count=1000)
            if not page:
                break
            n += len(page)
            start = f"({_text(page[-1][0])}"
        return min(n, limit)

    # --- the audio reader -------------------------------------------------------------------
    async def _read_loop(self) -> None:
        backoff = 0.05
        while not self._closed:
            reader = self._reader_r
            if reader is None:
                return
            wait = self.health.retry_in(time.monotonic())
            if wait > 0:
                # Redis is down and the next attempt is not due: the reader keeps the shared
                # backoff schedule (one outage, one log line, attempts spaced for everyone).
                self._reader_healthy = False
                await asyncio.sleep(self.health.pause_s(time.monotonic()))
                continue
            tails = [(k, t) for k, t in self._tails.items() if not t.broken]
            streams: dict[str, str] = {self._wake_key: format_id(self._wake_cursor)}
            streams.update((k, format_id(t.cursor)) for k, t in tails)
            try:
                resp = await reader.xread(
                    streams,  # type: ignore[arg-type]
                    count=self._reader_count,
                    block=self._reader_block_ms,
                )
            except asyncio.CancelledError:
                raise
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                # The cursors are untouched: the next XREAD resumes exactly where this one was
                # (after a restart that lost the data too: new entries get later ids).
                self._reader_healthy = False
                self._lost(exc)  # logged once per outage; the top of the loop waits it out
                continue
            except ResponseError as exc:
                self._answered()
                log.error("audio reader: XREAD refused: %s", exc)
                await self._quarantine([k for k, _ in tails])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception:
                log.exception("audio reader: unexpected error; retrying")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            self._reader_healthy = True
            self._answered()
            if self._closed:
                return
            try:
                self._dispatch(_stream_entries(resp))
            except Exception:  # a bug in fan-out must not stop audio for every other call
                log.exception("audio reader: dispatch failed")

    def _dispatch(
        self, batches: Sequence[tuple[bytes, Sequence[tuple[bytes | None, Any]]]]
    ) -> None:
        for raw_key, entries in batches:
            key = _text(raw_key)
            if key == self._wake_key:
                for entry_id, _ in entries:
                    if entry_id is not None:
                        self._wake_cursor = max(self._wake_cursor, parse_id(entry_id))
                continue
            for entry_id, fields in entries:
                if entry_id is None:
                    continue
                sid = parse_id(entry_id)
                # Re-read each time: a subscription may have closed (or the tail been re-created
                # by a new subscribe) while the XREAD was in flight.
                tail = self._tails.get(key)
                if tail is None:
                    break
                if sid <= tail.cursor:
                    continue  # a re-created tail starts later than this batch
                tail.cursor = sid
                try:
                    message = audio_from_fields(fields or {})
                except SchemaError as exc:
                    log.warning(
                        "skipping malformed audio entry %s on %s: %s", format_id(sid), key, exc
                    )
                    continue
                except Exception as exc:
                    log.warning(
                        "skipping undecodable audio entry %s on %s: %r", format_id(sid), key, exc
                    )
                    continue
                for sub, after in list(tail.subs.items()):
                    if sid > after:
                        sub.feed(message)

    async def _quarantine(self, keys: list[str]) -> None:
        """After XREAD is refused (WRONGTYPE), exclude the keys that are not streams."""
        r = self._redis if self._r is not None else None
        if r is None or not keys:
            return
        try:
            async with r.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.type(k)
                types = await pipe.execute()
        except (RedisError, OSError):
            return
        for k, t in zip(keys, types, strict=True):
            if _text(t) not in ("stream", "none") and k in self._tails:
                log.error(
                    "key %s is a %s, not a stream: its subscriptions get no audio", k, _text(t)
                )
                self._tails[k].broken = True


def _why(exc: BaseException) -> str:
    """What went wrong, never empty (asyncio's TimeoutError has no message)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "no answer in time (timed out)"
    return str(exc) or type(exc).__name__


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)
