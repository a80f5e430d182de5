"""The bus between gateways and synthesis workers: one interface, two implementations.

``MemoryBus`` joins gateway and worker inside one process (the embedded ``voxgate serve``);
``RedisBus`` joins separate processes over Redis Streams. The same contract test suite runs
against both. Message types and their wire form live in ``voxgate.contract.bus.schema``.

Redis layout (``{p}`` is the configured prefix, schema version in ``schema.VERSION``):
- ``{p}:synth:req``            stream, consumer group ``synth``: SpeakRequest entries.
- ``{p}:synth:audio:{call}``   stream per call, capped (and expiring): AudioChunk, then
                               UtteranceEnd/UtteranceError.
- ``{p}:synth:cancel:{utt}``   key with a TTL; workers check it between chunks. A key, not a stream
                               message, because any worker of the group could pick up a message.
- ``{p}:synth:worker:{name}``  key with a TTL: a ready worker's heartbeat (JSON info).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass

from voxgate.contract.bus.health import BusHealth
from voxgate.contract.bus.schema import AudioMessage, SchemaError, SpeakRequest


@dataclass(frozen=True, slots=True)
class Delivery:
    """A request handed to one worker; ack it once answered (or answered with an error).

    ``request`` is None when the entry was malformed; ``error`` then says why and ``call_id`` /
    ``utterance_id`` hold whatever could be recovered so the worker can still answer the call.
    """

    id: str
    request: SpeakRequest | None
    error: SchemaError | None = None
    call_id: str = ""
    utterance_id: str = ""
    # How many times this entry has been delivered (>1 after a claim from a dead worker).
    deliveries: int = 1


class Subscription(abc.ABC):
    """Audio messages of one call, in order; iterate with ``async for``; ``close()`` to stop."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[AudioMessage]: ...

    @abc.abstractmethod
    async def get(self, timeout: float | None = None) -> AudioMessage | None:
        """Next message, or None after ``timeout`` seconds (or once closed)."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class Bus(abc.ABC):
    """Async bus interface. All methods are coroutine-safe for many concurrent callers.

    ``health`` is the connection's outage bookkeeping (``voxgate.contract.bus.health``): a bus
    that can lose its server reports every operation into it and refuses operations at once
    (``BusError``) while the server is known to be down; the in-process bus never goes down.
    """

    def __init__(self) -> None:
        self.health = BusHealth()

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect and create what is needed (the consumer group). Raises ``BusError`` if down."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def ping(self) -> bool:
        """True while the bus is reachable (readiness)."""

    # --- gateway side -------------------------------------------------------------------
    @abc.abstractmethod
    async def submit(self, request: SpeakRequest) -> None: ...

    @abc.abstractmethod
    async def cancel(self, utterance_id: str) -> None:
        """Ask whichever worker holds ``utterance_id`` to stop it (within one chunk)."""

    @abc.abstractmethod
    async def subscribe(self, call_id: str) -> Subscription:
        """Start receiving the call's audio messages (those published after this call)."""

    @abc.abstractmethod
    async def drop_call(self, call_id: str) -> None:
        """Delete the call's audio stream (at hang-up)."""

    @abc.abstractmethod
    async def ready_workers(self) -> list[dict[str, object]]:
        """Heartbeat info of workers that announced readiness and are still alive."""

    # --- worker side --------------------------------------------------------------------
    @abc.abstractmethod
    async def read_requests(self, consumer: str, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` new requests for ``consumer`` (XREADGROUP ``>``), pending until acked.

        Waits up to ``block_ms`` for the first one; ``block_ms <= 0`` returns at once (unlike
        Redis ``BLOCK 0``, never waits forever). May return ``[]`` before ``block_ms`` has
        passed (RedisBus caps one wait at 4 s). ``Delivery.id`` is a Redis-style ``<ms>-<seq>``
        id whose ms is the wall-clock time of the submit, on either bus.
        """

    @abc.abstractmethod
    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[Delivery]:
        """Take over requests left unacknowledged by a dead consumer (XAUTOCLAIM)."""

    @abc.abstractmethod
    async def touch(self, consumer: str, delivery_ids: list[str]) -> None:
        """Reset the idle time of deliveries ``consumer`` is still working on, so a long
        utterance is not claimed away from a live worker (XCLAIM ... 0 JUSTID)."""

    @abc.abstractmethod
    async def ack(self, delivery_id: str) -> None: ...

    @abc.abstractmethod
    async def is_cancelled(self, utterance_id: str) -> bool: ...

    @abc.abstractmethod
    async def publish(self, message: AudioMessage) -> None: ...

    @abc.abstractmethod
    async def heartbeat(self, worker: str, info: dict[str, object], ttl_s: float) -> None:
        """Announce (or refresh) that ``worker`` is warmed up and serving."""

    @abc.abstractmethod
    async def retire(self, worker: str) -> None:
        """Withdraw the worker's readiness (clean shutdown)."""

    @abc.abstractmethod
    async def pending(self) -> tuple[int, int]:
        """(lag, pending): request entries not yet delivered, and delivered but unacked."""


class BusError(Exception):
    """The bus is unreachable or refused an operation."""


class BusDown(BusError):
    """The bus's server could not be reached, or is known to be down (an outage, not an error
    reply): the same operation may well succeed once it answers again."""
