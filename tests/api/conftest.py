"""An in-memory ``CallControl`` and a client factory for the HTTP-layer tests.

The fake stands in for ``gateway.call.calls`` only to isolate the HTTP layer: it records what the
API asked of it and raises the ``ControlError``s a real gateway would. The server is real (aiohttp's
``TestServer`` on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.api.routes import make_app
from gateway.call.control import (
    CallInfo,
    Conflict,
    ControlError,
    Event,
    TextTooLong,
    TransferOutcome,
    UnknownCall,
)


class _Subscription:
    """Registers at creation (not on first iteration), as the API expects."""

    def __init__(self, owner: FakeControl) -> None:
        self.owner = owner
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        owner.subscribers.append(self)

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Event:
        event = await self.queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        if self in self.owner.subscribers:
            self.owner.subscribers.remove(self)


class FakeControl:
    def __init__(self) -> None:
        self.calls: dict[str, CallInfo] = {}
        self.said: list[tuple[str, str, bool]] = []
        self.dtmf: list[tuple[str, str]] = []
        self.hung_up: list[str] = []
        self.transferred: list[tuple[str, str, str, str | None, float | None]] = []
        self.originated: list[tuple[str, str | None]] = []
        self.agents: list[dict[str, object] | None] = []
        self.subscribers: list[_Subscription] = []
        # Streamed say: every piece as it arrived, and how the stream ended.
        self.pieces: list[str] = []
        self.piece_arrived = asyncio.Event()
        self.stream_ended: asyncio.Future[BaseException | None] | None = None
        self.stream_in_background = False
        self.stream_refusal: Exception | None = None  # say_stream raises it before reading
        self.fail_with: Exception | None = None  # raised by the next control call
        self._n = 0
        self.add_call("c1")
        self.add_call("c2", state="ringing", direction="outbound")

    def add_call(self, call_id: str, **kw: Any) -> CallInfo:
        fields: dict[str, Any] = {
            "id": call_id,
            "leg": "sip",
            "direction": "inbound",
            "state": "answered",
            "remote": f"sip:{call_id}@example.com",
            "local": "sip:agent@127.0.0.1",
            "started_at": 1000.0,
            "answered_at": 1001.0,
            "codec": "PCMU",
        }
        fields.update(kw)
        info = CallInfo(**fields)
        self.calls[call_id] = info
        return info

    def _maybe_fail(self) -> None:
        if self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            raise exc

    def _call(self, call_id: str) -> CallInfo:
        self._maybe_fail()
        try:
            return self.calls[call_id]
        except KeyError:
            raise UnknownCall(f"no call {call_id!r}") from None

    def list_calls(self) -> list[CallInfo]:
        self._maybe_fail()
        return list(self.calls.values())

    def get_call(self, call_id: str) -> CallInfo:
        return self._call(call_id)

    def call_record(self, call_id: str) -> dict[str, object]:
        return {**self._call(call_id).to_json(), "agent": "ivr", "transcript": []}

    async def originate(
        self, to: str, *, caller: str | None = None, agent: dict[str, object] | None = None
    ) -> CallInfo:
        self._maybe_fail()
        self.originated.append((to, caller))
        self.agents.append(agent)
        return self.add_call(
            "out1", direction="outbound", state="ringing", remote=to, answered_at=None
        )

    async def say(self, call_id: str, text: str, *, interrupt: bool = False) -> str:
        call = self._call(call_id)
        if call.state == "ended":
            raise Conflict(f"call {call_id!r} has ended")
        if len(text) > 1_000_000:
            raise TextTooLong("too long")
        self.said.append((call_id, text, interrupt))
        self._n += 1
        return f"u{self._n}"

    async def say_stream(self, call_id: str, chunks: AsyncIterator[str]) -> str:
        self._call(call_id)
        if self.stream_refusal is not None:
            raise self.stream_refusal
        self.stream_ended = asyncio.get_running_loop().create_future()
        self._n += 1
        if self.stream_in_background:
            asyncio.get_running_loop().create_task(self._consume(chunks))
        else:
            await self._consume(chunks)
            if isinstance(self.stream_ended.result(), ControlError):
                raise self.stream_ended.result()  # type: ignore[misc]
        return f"u{self._n}"

    async def _consume(self, chunks: AsyncIterator[str]) -> None:
        assert self.stream_ended is not None
        try:
            async for piece in chunks:
                self.pieces.append(piece)
                self.piece_arrived.set()
        except Exception as exc:
            self.stream_ended.set_result(exc)
        else:
            self.stream_ended.set_result(None)

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        self._call(call_id)
        self.dtmf.append((call_id, digits))

    async def hangup(self, call_id: str) -> None:
        self._call(call_id)
        self.hung_up.append(call_id)

    async def transfer(
        self,
        call_id: str,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        self._call(call_id)
        self.transferred.append((call_id, target, mode, fallback, timeout_s))
        return TransferOutcome("refused", 603, "Decline")

    def subscribe_events(self) -> AsyncIterator[Event]:
        self._maybe_fail()
        return _Subscription(self)

    def publish(self, event: Event) -> None:
        for sub in list(self.subscribers):
            sub.queue.put_nowait(event)

    def end_subscriptions(self) -> None:
        for sub in list(self.subscribers):
            sub.queue.put_nowait(None)

    async def wait_pieces(self, n: int, timeout: float = 2.0) -> None:
        async def wait() -> None:
            while len(self.pieces) < n:
                self.piece_arrived.clear()
                await self.piece_arrived.wait()

        await asyncio.wait_for(wait(), timeout)

    async def wait_subscribers(self, n: int, timeout: float = 2.0) -> None:
        async def wait() -> None:
            while len(self.subscribers) != n:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(wait(), timeout)


ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture
async def make_client(control: FakeControl) -> AsyncIterator[ClientFactory]:
    clients: list[TestClient[Any, Any]] = []

    async def make(token: str | None = None, **kw: Any) -> TestClient[Any, Any]:
        kw.setdefault("max_text_chars", 50)
        app = make_app(control, token=token, **kw)
        client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient[Any, Any]:
    return await make_client()


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}
