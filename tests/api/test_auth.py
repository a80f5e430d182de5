"""Bearer tokens (HTTP and WebSocket), the tokenless loopback guard, and bind safety."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.api.auth import token_matches
from gateway.api.routes import UnsafeBindError, check_bind_safety, make_app, start_api, stop_api
from gateway.call.control import SpeechStarted
from tests.api.conftest import ClientFactory, FakeControl, error

Client = TestClient[Any, Any]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MISSING = error("unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'")
INVALID = error("unauthorized", "invalid bearer token")

# Every /api route, with a body that would succeed.
API_REQUESTS: list[tuple[str, str, dict[str, Any] | None, int]] = [
    ("GET", "/api/calls", None, 200),
    ("POST", "/api/calls", {"to": "sip:bob@example.com"}, 201),
    ("GET", "/api/calls/c1", None, 200),
    ("POST", "/api/calls/c1/say", {"text": "hi"}, 202),
    ("POST", "/api/calls/c1/dtmf", {"digits": "1"}, 202),
    ("DELETE", "/api/calls/c1", None, 204),
]


@pytest.fixture
async def secured(make_client: ClientFactory) -> Client:
    return await make_client(token=TOKEN)


@pytest.mark.parametrize(("method", "path", "body", "ok"), API_REQUESTS)
async def test_token_required(
    secured: Client, method: str, path: str, body: dict[str, Any] | None, ok: int
) -> None:
    resp = await secured.request(method, path, json=body)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="voxgate"'
    assert await resp.json() == MISSING

    resp = await secured.request(method, path, json=body, headers={"Authorization": "Bearer nope"})
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="voxgate", error="invalid_token"'
    assert await resp.json() == INVALID

    resp = await secured.request(method, path, json=body, headers=AUTH)
    assert resp.status == ok


async def test_token_scheme_and_format(make_client: ClientFactory) -> None:
    client = await make_client(token="abc")
    for value, status in [
        ("Bearer abc", 200),
        ("bearer abc", 200),  # the scheme is case-insensitive
        ("Bearer  abc ", 200),
        ("Basic abc", 401),
        ("abc", 401),
        ("Bearer", 401),
        ("Bearer abcd", 401),
        ("Bearer ab", 401),
    ]:
        resp = await client.get("/api/calls", headers={"Authorization": value})
        assert resp.status == status, value


async def test_token_query_only_on_events(make_client: ClientFactory) -> None:
    client = await make_client(token="abc")
    resp = await client.get("/api/calls?token=abc")
    assert resp.status == 401
    assert await resp.json() == MISSING


async def test_auth_before_routing(secured: Client) -> None:
    # Unknown /api paths and wrong methods do not tell an unauthenticated client anything.
    for method, path in [("GET", "/api/nope"), ("PUT", "/api/calls"), ("GET", "/api")]:
        resp = await secured.request(method, path)
        assert resp.status == 401, path
    resp = await secured.get("/api/nope", headers={"Authorization": "Bearer abc"})
    assert resp.status == 401


async def test_healthz_and_extra_routes_stay_open(make_client: ClientFactory) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    client = await make_client(
        token="abc", extra_routes=[web.get("/readyz", handler), web.get("/api/extra", handler)]
    )
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    resp = await client.get("/api/extra")
    assert resp.status == 401
    resp = await client.get("/api/extra", headers={"Authorization": "Bearer abc"})
    assert resp.status == 200
    # Unknown paths outside /api are plain 404s.
    assert (await client.get("/nope")).status == 404


async def test_websocket_token(make_client: ClientFactory, control: FakeControl) -> None:
    client = await make_client(token="abc")
    for path, headers in [
        ("/api/events", {}),
        ("/api/events?token=bad", {}),
        ("/api/events", {"Authorization": "Bearer bad"}),
    ]:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await client.ws_connect(path, headers=headers)
        assert info.value.status == 401, (path, headers)
    resp = await client.get("/api/events?token=bad")  # what the refusal says
    assert await resp.json() == INVALID

    for path, headers in [
        ("/api/events?token=abc", {}),
        ("/api/events", {"Authorization": "Bearer abc"}),
    ]:
        async with client.ws_connect(path, headers=headers) as ws:
            control.publish(SpeechStarted(call_id="c1", ts=1.0))
            assert (await ws.receive_json(timeout=2))["type"] == "speech.started"


async def test_no_token_means_open_on_loopback(client: Client) -> None:
    assert (await client.get("/api/calls")).status == 200
    async with client.ws_connect("/api/events"):
        pass


async def test_tokenless_refuses_foreign_origin_and_host(client: Client) -> None:
    forbidden = error(
        "forbidden",
        "without an API token only loopback Host and Origin are accepted; "
        "set gateway.api_token to allow other clients",
    )
    for headers in [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},  # sandboxed frames and file: pages
        {"Host": "rebound.example:8080"},  # DNS rebinding: the page's name, our address
        {"Host": "evil.example@127.0.0.1"},
        {"Host": "127.0.0.1.evil.example"},
        {"Origin": "http://127.0.0.1.evil.example"},
        {"Origin": "http://localhost@evil.example"},
    ]:
        resp = await client.post(
            "/api/calls/c1/say", data=b"hi", headers={**headers, "Content-Type": "text/plain"}
        )
        assert resp.status == 403, headers
        assert await resp.json() == forbidden
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await client.ws_connect("/api/events", headers=headers)
        assert info.value.status == 403
    for headers in [
        {"Origin": "http://localhost:3000"},
        {"Origin": "http://127.0.0.1:8080"},
        {"Host": "localhost:8080"},
        {"Host": "[::1]:8080"},
    ]:
        resp = await client.get("/api/calls", headers=headers)
        assert resp.status == 200, headers
    assert (await client.get("/healthz", headers={"Origin": "https://evil.example"})).status == 200


async def test_token_mode_ignores_origin(secured: Client) -> None:
    # With a token, the token is the protection; a dashboard on another origin may use it.
    resp = await secured.get(
        "/api/calls", headers={"Origin": "https://dash.example", "Authorization": "Bearer x"}
    )
    assert resp.status == 401
    resp = await secured.get("/api/calls", headers={"Origin": "https://dash.example", **AUTH})
    assert resp.status == 200


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        "localhost",
        "LOCALHOST",
        "localhost.",
        "::ffff:127.0.0.1",
    ],
)
async def test_bind_safety_loopback_without_token(host: str) -> None:
    check_bind_safety(host, None)
    check_bind_safety(host, "")


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "::",
        "",
        "10.0.0.5",
        "192.168.1.2",
        "2001:db8::1",
        "gateway.example",
        "localhost.example",
    ],
)
async def test_bind_safety_public_needs_token(host: str) -> None:
    for token in (None, ""):
        with pytest.raises(UnsafeBindError) as info:
            check_bind_safety(host, token)
        assert isinstance(info.value, ValueError)
        message = str(info.value)
        assert "gateway.api_token" in message
        assert "VOXGATE_GATEWAY_API_TOKEN" in message
        assert "public address" in message
    check_bind_safety(host, "a-token")


async def test_start_api_checks_bind_safety(control: FakeControl) -> None:
    with pytest.raises(UnsafeBindError):
        await start_api(make_app(control, token=None, max_text_chars=50), "0.0.0.0", 0)


async def test_start_api_serves_and_redacts_query_token(
    control: FakeControl, caplog: pytest.LogCaptureFixture
) -> None:
    runner = await start_api(make_app(control, token="abc", max_text_chars=50), "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        base = f"http://{host}:{port}"
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/healthz") as resp:
                    assert resp.status == 200
                async with session.ws_connect(f"{base}/api/events?token=abc&call=c1"):
                    pass
    finally:
        await stop_api(runner)
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any("/api/events?token=REDACTED&call=c1" in line for line in lines), lines
    assert not any("abc" in line for line in lines)


async def test_non_utf8_and_non_ascii_tokens(make_client: ClientFactory) -> None:
    client = await make_client(token="tøken")
    for raw, status in [
        (b"Bearer t\xc3\xb8ken", b"200"),  # the configured token, as UTF-8 bytes
        (b"Bearer t\xf8ken", b"401"),  # latin-1 bytes: not UTF-8 at all
        (b"Bearer \xff\xfe", b"401"),
    ]:
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            b"GET /api/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Authorization: " + raw + b"\r\n\r\n"
        )
        status_line = await reader.readline()
        writer.close()
        await writer.wait_closed()
        assert status_line.split()[1] == status, raw


def test_token_matches() -> None:
    assert token_matches("tøken", "tøken")
    assert not token_matches("tøken", "token")
    assert not token_matches("t\udcf8ken", "tøken")  # a surrogate-escaped byte
    assert not token_matches("\ud800", "x")  # a lone surrogate cannot even be encoded
