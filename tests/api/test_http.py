"""Every JSON endpoint and every error status, with exact bodies."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.call.control import Conflict, Unavailable
from tests.api.conftest import ClientFactory, FakeControl, error

Client = TestClient[Any, Any]


def call_json(control: FakeControl, call_id: str) -> dict[str, Any]:
    return control.calls[call_id].to_json()


async def test_healthz(client: Client) -> None:
    resp = await client.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}


async def test_list_calls(client: Client, control: FakeControl) -> None:
    resp = await client.get("/api/calls")
    assert resp.status == 200
    body = await resp.json()
    assert body == {"calls": [call_json(control, "c1"), call_json(control, "c2")]}
    assert [c["id"] for c in body["calls"]] == ["c1", "c2"]


async def test_get_call(client: Client, control: FakeControl) -> None:
    resp = await client.get("/api/calls/c1")
    assert resp.status == 200
    assert await resp.json() == {
        "id": "c1",
        "leg": "sip",
        "direction": "inbound",
        "state": "answered",
        "remote": "sip:c1@example.com",
        "local": "sip:agent@127.0.0.1",
        "started_at": 1000.0,
        "answered_at": 1001.0,
        "ended_at": None,
        "end_reason": None,
        "codec": "PCMU",
        "speaking": False,
        "agent": "ivr",
        "transcript": [],
    }


async def test_get_unknown_call(client: Client) -> None:
    resp = await client.get("/api/calls/nope")
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_originate(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls", json={"to": "sip:bob@example.com"})
    assert resp.status == 201
    assert await resp.json() == call_json(control, "out1")
    assert resp.headers["Location"] == "/api/calls/out1"
    assert control.originated == [("sip:bob@example.com", None)]


async def test_originate_with_an_agent_passes_it_on(client: Client, control: FakeControl) -> None:
    agent = {"kind": "llm", "system_prompt": "Be brief.", "vars": {"name": "Ann"}}
    resp = await client.post("/api/calls", json={"to": "sip:bob@example.com", "agent": agent})
    assert resp.status == 201
    assert control.agents == [agent]
    resp = await client.post("/api/calls", json={"to": "sip:bob@example.com", "agent": "llm"})
    assert resp.status == 422
    assert (await resp.json())["error"]["message"] == "'agent' must be an object, got string"


async def test_originate_with_from(client: Client, control: FakeControl) -> None:
    resp = await client.post(
        "/api/calls", json={"to": "SIPS:bob@example.com", "from": "sip:agent@example.com"}
    )
    assert resp.status == 201
    assert control.originated == [("SIPS:bob@example.com", "sip:agent@example.com")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing field 'to'"),
        ({"to": 5}, "field 'to' must be a string, got number"),
        ({"to": None}, "field 'to' must be a string, got null"),
        ({"to": "tel:+15551234"}, "field 'to' must be a sip: or sips: URI, got 'tel:+15551234'"),
        (
            {"to": "bob@example.com"},
            "field 'to' must be a sip: or sips: URI, got 'bob@example.com'",
        ),
        ({"to": "sip:"}, "field 'to' must be a sip: or sips: URI, got 'sip:'"),
        (
            {"to": "sip:bob@example.com\r\nX-Evil: 1"},
            "field 'to' must not contain whitespace or control characters",
        ),
        (
            {"to": "sip:bob@example.com", "from": "http://x"},
            "field 'from' must be a sip: or sips: URI, got 'http://x'",
        ),
        ({"to": "sip:bob@example.com", "from": ["x"]}, "field 'from' must be a string, got array"),
        ({"to": "sip:bob@example.com", "callee": "x"}, "unknown field 'callee'"),
        ([1, 2], "request body must be a JSON object, got array"),
        ("sip:bob", "request body must be a JSON object, got string"),
    ],
)
async def test_originate_bad_request(
    client: Client, control: FakeControl, body: object, message: str
) -> None:
    resp = await client.post("/api/calls", json=body)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", message)
    assert control.originated == []


async def test_invalid_json(client: Client) -> None:
    resp = await client.post(
        "/api/calls", data=b'{"to": ', headers={"Content-Type": "application/json"}
    )
    assert resp.status == 422
    assert await resp.json() == error(
        "bad_request",
        "request body is not valid JSON: Expecting value: line 1 column 8 (char 7)",
    )


async def test_empty_json_body(client: Client) -> None:
    resp = await client.post("/api/calls", headers={"Content-Type": "application/json"})
    assert resp.status == 422
    assert await resp.json() == error(
        "bad_request", "request body is empty; expected a JSON object"
    )


async def test_json_endpoints_need_json_content_type(client: Client) -> None:
    # A browser page can POST text/plain cross-origin without a preflight; JSON it cannot.
    resp = await client.post("/api/calls", data=b'{"to": "sip:bob@example.com"}')
    assert resp.status == 415
    assert await resp.json() == error(
        "unsupported_media_type",
        "expected Content-Type: application/json, got application/octet-stream",
    )


async def test_originate_unavailable(client: Client, control: FakeControl) -> None:
    control.fail_with = Unavailable("call limit reached (4)")
    resp = await client.post("/api/calls", json={"to": "sip:bob@example.com"})
    assert resp.status == 503
    assert await resp.json() == error("unavailable", "call limit reached (4)")


async def test_body_too_large(make_client: ClientFactory) -> None:
    client = await make_client(max_body_bytes=1024)
    resp = await client.post("/api/calls", json={"to": "sip:" + "x" * 2000})
    assert resp.status == 413
    assert await resp.json() == error("body_too_large", "Maximum request body size 1024 exceeded.")


async def test_say(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/say", json={"text": "Hello there."})
    assert resp.status == 202
    assert await resp.json() == {"utterance_id": "u1"}
    resp = await client.post("/api/calls/c1/say", json={"text": "Stop.", "interrupt": True})
    assert await resp.json() == {"utterance_id": "u2"}
    assert control.said == [("c1", "Hello there.", False), ("c1", "Stop.", True)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "missing field 'text'"),
        ({"text": 1}, "field 'text' must be a string, got number"),
        ({"text": "   "}, "field 'text' must not be empty"),
        ({"text": "hi", "interrupt": "yes"}, "field 'interrupt' must be a boolean, got string"),
        ({"text": "hi", "interrupt": 1}, "field 'interrupt' must be a boolean, got number"),
        ({"text": "hi", "voice": "x"}, "unknown field 'voice'"),
    ],
)
async def test_say_bad_request(
    client: Client, control: FakeControl, body: object, message: str
) -> None:
    resp = await client.post("/api/calls/c1/say", json=body)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", message)
    assert control.said == []


async def test_say_too_long(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/say", json={"text": "é" * 51})
    assert resp.status == 413
    assert await resp.json() == error("text_too_long", "text is 51 characters; the limit is 50")
    assert control.said == []
    resp = await client.post("/api/calls/c1/say", json={"text": "é" * 50})
    assert resp.status == 202


async def test_say_unknown_call(client: Client) -> None:
    resp = await client.post("/api/calls/nope/say", json={"text": "hi"})
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_say_conflict(client: Client, control: FakeControl) -> None:
    control.add_call("gone", state="ended")
    resp = await client.post("/api/calls/gone/say", json={"text": "hi"})
    assert resp.status == 409
    assert await resp.json() == error("conflict", "call 'gone' has ended")


async def test_say_other_content_type(client: Client) -> None:
    resp = await client.post(
        "/api/calls/c1/say",
        data=b"text=hi",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert resp.status == 415
    assert await resp.json() == error(
        "unsupported_media_type",
        "expected Content-Type: application/json, got application/x-www-form-urlencoded",
    )


async def test_dtmf(client: Client, control: FakeControl) -> None:
    resp = await client.post("/api/calls/c1/dtmf", json={"digits": "0123456789*#ABCD"})
    assert resp.status == 202
    assert await resp.json() == {"digits": "0123456789*#ABCD"}
    assert control.dtmf == [("c1", "0123456789*#ABCD")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"digits": "12E"}, "field 'digits' must be 1 or more of 0-9 * # A-D, got '12E'"),
        ({"digits": "1a"}, "field 'digits' must be 1 or more of 0-9 * # A-D, got '1a'"),
        ({"digits": ""}, "field 'digits' must be 1 or more of 0-9 * # A-D, got ''"),
        ({"digits": "1 2"}, "field 'digits' must be 1 or more of 0-9 * # A-D, got '1 2'"),
        ({"digits": "1" * 257}, "field 'digits' is limited to 256 digits"),
        ({"digits": 12}, "field 'digits' must be a string, got number"),
        ({}, "missing field 'digits'"),
    ],
)
async def test_dtmf_bad_request(
    client: Client, control: FakeControl, body: object, message: str
) -> None:
    resp = await client.post("/api/calls/c1/dtmf", json=body)
    assert resp.status == 422
    assert await resp.json() == error("bad_request", message)
    assert control.dtmf == []


async def test_dtmf_unknown_call(client: Client) -> None:
    resp = await client.post("/api/calls/nope/dtmf", json={"digits": "1"})
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_hangup(client: Client, control: FakeControl) -> None:
    resp = await client.delete("/api/calls/c1")
    assert resp.status == 204
    assert await resp.read() == b""
    assert control.hung_up == ["c1"]


async def test_hangup_unknown(client: Client) -> None:
    resp = await client.delete("/api/calls/nope")
    assert resp.status == 404
    assert await resp.json() == error("unknown_call", "no call 'nope'")


async def test_hangup_conflict(client: Client, control: FakeControl) -> None:
    control.fail_with = Conflict("call 'c1' is already ending")
    resp = await client.delete("/api/calls/c1")
    assert resp.status == 409
    assert await resp.json() == error("conflict", "call 'c1' is already ending")


async def test_unknown_route(client: Client) -> None:
    resp = await client.get("/nope")
    assert resp.status == 404
    assert await resp.json() == error("not_found", "no such resource: GET /nope")
    resp = await client.get("/api/calls/c1/nope")
    assert resp.status == 404
    assert await resp.json() == error("not_found", "no such resource: GET /api/calls/c1/nope")


async def test_wrong_method(client: Client) -> None:
    resp = await client.put("/api/calls", json={})
    assert resp.status == 405
    assert resp.headers["Allow"] == "GET, POST"
    assert await resp.json() == error(
        "method_not_allowed", "method PUT is not allowed on /api/calls; allowed: GET, POST"
    )
    resp = await client.get("/api/calls/c1/say")
    assert resp.status == 405
    assert await resp.json() == error(
        "method_not_allowed", "method GET is not allowed on /api/calls/c1/say; allowed: POST"
    )


async def test_unexpected_error_is_500_without_details(
    client: Client, control: FakeControl, caplog: pytest.LogCaptureFixture
) -> None:
    control.fail_with = RuntimeError("secret internal detail")
    with caplog.at_level(logging.ERROR, logger="gateway.api.routes"):
        resp = await client.get("/api/calls")
    assert resp.status == 500
    text = await resp.text()
    assert "secret" not in text and "Traceback" not in text
    assert await resp.json() == error("internal_error", "internal error")
    assert any(
        r.exc_info and "secret internal detail" in str(r.exc_info[1]) for r in caplog.records
    )


async def test_extra_routes(make_client: ClientFactory) -> None:
    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": False}, status=503)

    client = await make_client(extra_routes=[web.get("/readyz", readyz)])
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert await resp.json() == {"ready": False}
