"""``POST /api/calls/{id}/transfer``: the body it takes, what it hands ``CallControl.transfer``,
the outcome it answers, its errors, and the token it needs."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.call.control import Conflict
from tests.api.conftest import ClientFactory, FakeControl, error

Client = TestClient[Any, Any]


async def test_transfer_answers_the_outcome(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/transfer", json={"target": "sip:agent@pbx.test"})
    assert resp.status == 200
    assert await resp.json() == {
        "result": "refused",
        "status": 603,
        "reason": "Decline",
        "bridged_call": None,
    }
    assert control.transferred == [("c1", "sip:agent@pbx.test", "blind", None, None)]


async def test_transfer_with_every_field(client: Client, control: FakeControl) -> None:
    body = {
        "target": "sips:agent@pbx.test",
        "mode": "attended",
        "fallback": "bridge",
        "timeout_s": 7,
    }
    resp = await client.post("/api/calls/c1/transfer", json=body)
    assert resp.status == 200
    assert control.transferred == [("c1", "sips:agent@pbx.test", "attended", "bridge", 7.0)]
    resp = await client.post(
        "/api/calls/c1/transfer", json={"target": "sip:a@b", "fallback": "none"}
    )
    assert resp.status == 200
    assert control.transferred[-1] == ("c1", "sip:a@b", "blind", None, None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing field 'target'"),
        (
            {"target": "tel:+15551234"},
            "field 'target' must be a sip: or sips: URI, got 'tel:+15551234'",
        ),
        (
            {"target": "sip:a@b\r\nX: y"},
            "field 'target' must not contain whitespace or control characters",
        ),
        (
            {"target": "sip:a@b", "mode": "warm"},
            "field 'mode' must be blind or attended, got 'warm'",
        ),
        (
            {"target": "sip:a@b", "fallback": "voicemail"},
            "field 'fallback' must be bridge or none, got 'voicemail'",
        ),
        (
            {"target": "sip:a@b", "timeout_s": 0},
            "field 'timeout_s' must be a number in (0, 600], got 0",
        ),
        (
            {"target": "sip:a@b", "timeout_s": True},
            "field 'timeout_s' must be a number in (0, 600], got True",
        ),
        ({"target": "sip:a@b", "to": "sip:c@d"}, "unknown field 'to'"),
    ],
)
async def test_transfer_bad_request(
    client: Client, control: FakeControl, body: object, message: str
) -> None:
    resp = await client.post("/api/calls/c1/transfer", json=body)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", message)
    assert control.transferred == []


async def test_transfer_unknown_call_and_conflict(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/nope/transfer", json={"target": "sip:a@b"})
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")
    control.fail_with = Conflict("call 'c1' has a transfer under way")
    resp = await client.post("/api/calls/c1/transfer", json={"target": "sip:a@b"})
    assert resp.status == 409
    assert await resp.json() == error("conflict", "call 'c1' has a transfer under way")


async def test_transfer_needs_the_token(make_client: ClientFactory, control: FakeControl) -> None:
    client = await make_client(token="s3cret")
    resp = await client.post("/api/calls/c1/transfer", json={"target": "sip:a@b"})
    assert resp.status == 401
    resp = await client.post(
        "/api/calls/c1/transfer",
        json={"target": "sip:a@b"},
        headers={"Authorization": "Bearer s3cret"},
    )
    assert resp.status == 200
    assert len(control.transferred) == 1
