"""Pieces both bus implementations share: the queue-backed subscription and entry decoding."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit, urlunsplit

from voxgate.contract.bus.base import Delivery, Subscription
from voxgate.contract.bus.schema import (
    AudioMessage,
    Fields,
    SchemaError,
    SpeakRequest,
    audio_from_fields,
    audio_to_fields,
)

log = logging.getLogger("voxgate.contract.bus")


class _Closed:
    """Sentinel put on a subscription's queue to wake a pending ``get`` at close."""


_CLOSED = _Closed()


class QueueSubscription(Subscription):
    """A subscription fed by the bus through an unbounded asyncio queue.

    Unbounded on purpose: one slow call must never stall the shared reader that feeds every
    other call. The gateway drains its queue continuously (and drops late chunks itself).
    """

    def __init__(self, call_id: str, on_close: Callable[[QueueSubscription], None]) -> None:
        self.call_id = call_id
        self._queue: asyncio.Queue[AudioMessage | _Closed] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def feed(self, message: AudioMessage) -> None:
        """Called by the bus (never blocks)."""
        if not self._closed:
            self._queue.put_nowait(message)

    def qsize(self) -> int:
        return self._queue.qsize()

    async def get(self, timeout: float | None = None) -> AudioMessage | None:
        if self._closed:
            return None
        try:
            if not self._queue.empty():
                item = self._queue.get_nowait()
            elif timeout is None:
                item = await self._queue.get()
            else:
                async with asyncio.timeout(max(timeout, 0.0)):
                    item = await self._queue.get()
        except TimeoutError:
            return None
        if isinstance(item, _Closed):
            # Leave the sentinel for any other task waiting on the same subscription.
            self._queue.put_nowait(item)
            return None
        return item

    async def __aiter__(self) -> AsyncIterator[AudioMessage]:
        while True:
            message = await self.get()
            if message is None:
                return
            yield message

    def close_nowait(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(_CLOSED)
        self._on_close(self)

    async def close(self) -> None:
        self.close_nowait()


def _peek(fields: Fields, key: str) -> str:
    """Best-effort text of one field of a (possibly malformed) entry, for error reporting."""
    for k, v in fields.items():
        name = k.decode(errors="replace") if isinstance(k, bytes) else k
        if name == key:
            return v.decode(errors="replace") if isinstance(v, bytes) else v
    return ""


def delivery_from_fields(entry_id: str, fields: Fields, deliveries: int) -> Delivery:
    """Decode a request entry; a malformed one becomes a Delivery carrying the error.

    The worker must never die on a bad entry: it answers the call with an error (using whatever
    call/utterance ids can be recovered) and acks it, so the entry does not loop through claims.
    """
    try:
        request = SpeakRequest.from_fields(fields)
    except SchemaError as exc:
        error = exc
    except Exception as exc:  # anything else a hostile entry provokes is still a schema problem
        error = SchemaError(f"undecodable request entry: {exc!r}")
    else:
        return Delivery(
            id=entry_id,
            request=request,
            call_id=request.call_id,
            utterance_id=request.utterance_id,
            deliveries=deliveries,
        )
    log.warning("malformed request entry %s: %s", entry_id, error)
    return Delivery(
        id=entry_id,
        request=None,
        error=error,
        call_id=_peek(fields, "call"),
        utterance_id=_peek(fields, "utt"),
        deliveries=deliveries,
    )


def encode_audio(message: AudioMessage) -> dict[str, bytes]:
    """Wire fields of ``message``, refusing (SchemaError) what no reader would accept.

    Checked at the publisher so a bug (odd-length s16le, unknown encoding) fails loudly in the
    worker instead of being skipped with a warning by every gateway reader.
    """
    fields = audio_to_fields(message)
    audio_from_fields(fields)
    return fields


def redact_url(url: str) -> str:
    """``url`` without its password, for error messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
