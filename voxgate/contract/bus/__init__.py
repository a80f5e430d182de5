"""The gateway↔worker bus: ``make_bus`` picks the in-process or the Redis implementation."""

from __future__ import annotations

from voxgate.contract.bus.base import Bus, BusDown, BusError, Delivery, Subscription
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.redis_bus import RedisBus
from voxgate.contract.bus.schema import (
    AudioChunk,
    AudioMessage,
    SchemaError,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)

__all__ = [
    "AudioChunk",
    "AudioMessage",
    "Bus",
    "BusDown",
    "BusError",
    "Delivery",
    "MemoryBus",
    "RedisBus",
    "SchemaError",
    "SpeakRequest",
    "Subscription",
    "UtteranceEnd",
    "UtteranceError",
    "make_bus",
]


def make_bus(
    kind: str,
    redis_url: str = "redis://127.0.0.1:6379/0",
    prefix: str = "voxgate",
    audio_maxlen: int = 2000,
    cancel_ttl_s: float = 120.0,
    audio_ttl_s: float = 600.0,
) -> Bus:
    """``kind`` is ``"memory"`` (one process, embedded) or ``"redis"``; not yet started."""
    if kind == "memory":
        return MemoryBus(cancel_ttl_s=cancel_ttl_s)
    if kind == "redis":
        return RedisBus(
            redis_url, prefix=prefix, audio_maxlen=audio_maxlen, cancel_ttl_s=cancel_ttl_s,
            audio_ttl_s=audio_ttl_s,
        )  # fmt: skip
    raise ValueError(f"unknown bus kind {kind!r} (expected 'memory' or 'redis')")
