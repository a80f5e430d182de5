"""The WebSocket event feed: delivery, the call filter, overflow, heartbeat, shutdown."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient

from gateway.api.routes import make_app, start_api, stop_api
from gateway.call.control import (
    CallStateChanged,
    DtmfReceived,
    SpeechStarted,
    UtteranceFinished,
    event_json,
)
from tests.api.conftest import ClientFactory, FakeControl, error

Client = TestClient[Any, Any]


async def test_events_in_order(client: Client, control: FakeControl) -> None:
    events = [
        CallStateChanged(call_id="c1", ts=1.0, state="answered"),
        DtmfReceived(call_id="c1", ts=2.0, digit="5", duration_ms=120),
        UtteranceFinished(
            call_id="c2", ts=3.0, utterance_id="u1", outcome="interrupted", heard="Hi"
        ),
    ]
    async with client.ws_connect("/api/events") as ws:
        # Subscribed before the handshake completed: nothing published from now on is missed.
        assert len(control.subscribers) == 1
        for event in events:
            control.publish(event)
        received = [await ws.receive_str(timeout=2) for _ in events]
    assert received == [event_json(e) for e in events]
    assert json.loads(received[1]) == {
        "call_id": "c1",
        "ts": 2.0,
        "type": "dtmf",
        "digit": "5",
        "duration_ms": 120,
        "source": "rfc4733",
    }
    await control.wait_subscribers(0)  # the subscription is released when the client leaves


async def test_call_filter(client: Client, control: FakeControl) -> None:
    async with client.ws_connect("/api/events?call=c2") as ws:
        control.publish(SpeechStarted(call_id="c1", ts=1.0))
        control.publish(SpeechStarted(call_id="c2", ts=2.0))
        control.publish(DtmfReceived(call_id="c1", ts=3.0, digit="1"))
        control.publish(DtmfReceived(call_id="c2", ts=4.0, digit="2"))
        first = json.loads(await ws.receive_str(timeout=2))
        second = json.loads(await ws.receive_str(timeout=2))
    assert (first["call_id"], first["type"]) == ("c2", "speech.started")
    assert (second["call_id"], second["digit"]) == ("c2", "2")


async def test_call_filter_unknown_call(client: Client) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await client.ws_connect("/api/events?call=nope")
    assert info.value.status == 404
    resp = await client.get("/api/events?call=nope")  # same check, readable body
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_plain_get_needs_upgrade(client: Client) -> None:
    resp = await client.get("/api/events")
    assert resp.status == 426
    assert resp.headers["Upgrade"] == "websocket"
    assert await resp.json() == error(
        "upgrade_required", "GET /api/events is a WebSocket; connect with a WebSocket client"
    )


async def test_overflow_sends_a_message_and_closes_1013(
    make_client: ClientFactory, control: FakeControl
) -> None:
    client = await make_client(ws_queue_size=4)
    async with client.ws_connect("/api/events") as ws:
        # A burst larger than the queue, published without yielding: exactly a client that
        # cannot keep up. Publishing never waits on the socket.
        for i in range(10):
            control.publish(DtmfReceived(call_id="c1", ts=float(i), digit="1"))
        msg = await ws.receive(timeout=2)
        assert msg.type is WSMsgType.TEXT
        assert json.loads(msg.data) == {
            "type": "overflow",
            "dropped": 5,
            "message": "events arrived faster than this connection read them; "
            "reconnect and resync from GET /api/calls",
        }
        msg = await ws.receive(timeout=2)
        assert msg.type is WSMsgType.CLOSE
        assert msg.data == 1013
    await control.wait_subscribers(0)


async def test_queue_keeps_up_below_the_limit(
    make_client: ClientFactory, control: FakeControl
) -> None:
    client = await make_client(ws_queue_size=4)
    async with client.ws_connect("/api/events") as ws:
        for round_ in range(5):
            for i in range(4):
                control.publish(DtmfReceived(call_id="c1", ts=float(round_ * 4 + i), digit="1"))
            got = [json.loads(await ws.receive_str(timeout=2))["ts"] for _ in range(4)]
            assert got == [float(round_ * 4 + i) for i in range(4)]


async def test_subscription_end_closes_1001(client: Client, control: FakeControl) -> None:
    async with client.ws_connect("/api/events") as ws:
        control.end_subscriptions()
        msg = await ws.receive(timeout=2)
        assert msg.type is WSMsgType.CLOSE
        assert msg.data == 1001


async def test_heartbeat_drops_a_dead_client(
    make_client: ClientFactory, control: FakeControl
) -> None:
    client = await make_client(ws_heartbeat_s=0.2)
    # autoping off: this client never answers the server's pings, like a vanished peer.
    async with client.ws_connect("/api/events", autoping=False) as ws:
        types = []
        while True:
            msg = await ws.receive(timeout=3)
            types.append(msg.type)
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
    assert WSMsgType.PING in types
    await control.wait_subscribers(0)


async def test_live_client_survives_heartbeats(
    make_client: ClientFactory, control: FakeControl
) -> None:
    client = await make_client(ws_heartbeat_s=0.1)
    async with client.ws_connect("/api/events") as ws:
        # A client that keeps reading answers the pings (aiohttp replies inside receive()).
        first = asyncio.create_task(ws.receive_str(timeout=3))
        await asyncio.sleep(0.35)  # several heartbeat periods
        control.publish(SpeechStarted(call_id="c1", ts=1.0))
        assert json.loads(await first)["type"] == "speech.started"


async def test_stop_api_closes_sockets_going_away(control: FakeControl) -> None:
    runner = await start_api(make_app(control, token=None, max_text_chars=50), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://{host}:{port}/api/events") as ws,
    ):
        await control.wait_subscribers(1)
        await stop_api(runner)
        msg = await ws.receive(timeout=3)
        assert msg.type is WSMsgType.CLOSE
        assert msg.data == 1001
    await control.wait_subscribers(0)
