"""The Twilio-compatible hang-up, ``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``:
driven by pipecat's own ``TwilioFrameSerializer`` auto hang-up (``base_url`` at voxgate, the API
token as the auth token), and its refusals in Twilio's error shape."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pipecat.frames.frames import EndFrame
from pipecat.serializers.twilio import TwilioFrameSerializer

from gateway.agents.twilio_media import call_sid_for
from gateway.api.routes import make_app
from tests.api.conftest import FakeControl

TOKEN = "s3cret-token"
ACCOUNT = "AC" + "a" * 32
Client = TestClient[Any, Any]
Factory = Callable[[str | None], Awaitable[Client]]


@pytest.fixture
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture
async def client(control: FakeControl) -> AsyncIterator[Factory]:
    made: list[Client] = []

    async def make(token: str | None) -> Client:
        app = make_app(control, token=token, max_text_chars=5000)
        c: Client = TestClient(TestServer(app, host="127.0.0.1"))
        await c.start_server()
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


def basic(user: str, password: str) -> dict[str, str]:
    """HTTP Basic credentials as pipecat sends them (account SID, auth token)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def path(call_id: str, account: str = ACCOUNT) -> str:
    return f"/2010-04-01/Accounts/{account}/Calls/{call_sid_for(call_id)}.json"


async def test_pipecats_auto_hang_up_ends_the_call(control: FakeControl, client: Factory) -> None:
    c = await client(TOKEN)
    serializer = TwilioFrameSerializer(
        "MZ" + "0" * 32, call_sid=call_sid_for("c1"), account_sid=ACCOUNT, auth_token=TOKEN,
        base_url=str(c.make_url("/")),
    )  # fmt: skip
    assert await serializer.serialize(EndFrame()) is None  # pipecat POSTs Status=completed
    assert control.hung_up == ["c1"]


async def test_the_answer_is_a_twilio_call_resource(control: FakeControl, client: Factory) -> None:
    c = await client(TOKEN)
    r = await c.post(path("c1"), data={"Status": "completed"}, headers=basic(ACCOUNT, TOKEN))
    assert r.status == 200
    body = await r.json()
    assert body["sid"] == call_sid_for("c1") and body["account_sid"] == ACCOUNT
    assert body["status"] == "completed" and body["direction"] == "inbound"
    assert body["from"] == "c1" and body["to"] == "agent"
    assert body["start_time"] == "Thu, 01 Jan 1970 00:16:41 +0000"
    assert body["uri"] == path("c1") and body["api_version"] == "2010-04-01"
    # Status=canceled (Twilio's word for a call not yet answered) ends it as well.
    r = await c.post(path("c2"), data={"Status": "canceled"}, headers={"Authorization":
                     f"Bearer {TOKEN}"})  # fmt: skip
    assert r.status == 200 and (await r.json())["direction"] == "outbound-api"
    assert control.hung_up == ["c1", "c2"]


@pytest.mark.parametrize(
    ("auth", "status", "code"),
    [
        ({}, 401, 20003),
        (basic(ACCOUNT, "wrong"), 401, 20003),
        (basic(TOKEN, ""), 401, 20003),  # the token as the user name is not the password
        ({"Authorization": "Basic !!!"}, 401, 20003),
    ],
)
async def test_the_api_token_is_the_basic_auth_password(
    control: FakeControl, client: Factory, auth: dict[str, str], status: int, code: int
) -> None:
    c = await client(TOKEN)
    r = await c.post(path("c1"), data={"Status": "completed"}, headers=auth)
    assert r.status == status and r.headers["WWW-Authenticate"] == 'Basic realm="voxgate"'
    assert (await r.json())["code"] == code
    assert control.hung_up == []


async def test_unknown_calls_and_bad_statuses(control: FakeControl, client: Factory) -> None:
    c = await client(TOKEN)
    auth = basic(ACCOUNT, TOKEN)
    r = await c.post(path("nope"), data={"Status": "completed"}, headers=auth)
    body = await r.json()
    assert r.status == 404 and body["code"] == 20404  # pipecat: "already terminated"
    assert body["more_info"] == "https://www.twilio.com/docs/errors/20404"
    r = await c.post(path("c1"), data={"Status": "in-progress"}, headers=auth)
    assert r.status == 400 and "'completed' or 'canceled'" in (await r.json())["message"]
    r = await c.post(path("c1"), headers=auth)
    assert r.status == 400
    assert control.hung_up == []


async def test_without_a_token_it_is_open_on_loopback_only(
    control: FakeControl, client: Factory
) -> None:
    c = await client(None)
    r = await c.post(path("c1"), data={"Status": "completed"}, headers=basic(ACCOUNT, "x"))
    assert r.status == 200 and control.hung_up == ["c1"]
    # A page in a browser on this machine cannot end calls (as for /api/*).
    r = await c.post(path("c2"), data={"Status": "completed"},
                     headers={"Origin": "https://evil.example"})  # fmt: skip
    assert r.status == 403 and control.hung_up == ["c1"]


async def test_a_configured_account_answers_only_for_itself(control: FakeControl) -> None:
    # [stream] account_sid set: a bot of another account cannot end voxgate's calls.
    app = make_app(control, token=TOKEN, max_text_chars=5000, twilio_account_sid=ACCOUNT)
    c: Client = TestClient(TestServer(app, host="127.0.0.1"))
    await c.start_server()
    try:
        other = "AC" + "f" * 32
        r = await c.post(path("c1", other), data={"Status": "completed"},
                         headers=basic(other, TOKEN))  # fmt: skip
        assert r.status == 404 and (await r.json())["code"] == 20404
        assert control.hung_up == []
        r = await c.post(path("c1"), data={"Status": "completed"}, headers=basic(ACCOUNT, TOKEN))
        assert r.status == 200 and control.hung_up == ["c1"]
    finally:
        await c.close()
