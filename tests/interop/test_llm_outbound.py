"""Per-call agents on outbound calls, against a real ``voxgate serve`` process and sipp as the
callee: ``POST /api/calls {"to", "agent": {"kind": "llm", ...}}`` on a gateway whose default
agent is the IVR. The callee says nothing, so the model is never asked anything.

(With sipp ``-rtp_echo`` the agent's voice comes back at 0 dB, louder than the barge-in
detector's G.168 prior of at least 6 dB echo return loss: the greeting may be cut by its own
echo in the first second, and the llm agent drops caller turns made of its own recent words —
see ``LlmAgent._is_echo``.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.interop.conftest import EventFeed, GatewayFactory, GatewayProc, Sipp, free_port
from voxgate.bench.mock_llm import MockLlm, Script

pytestmark = [pytest.mark.slow, pytest.mark.interop]


async def api(gw: GatewayProc, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """Status and JSON body (errors included)."""
    async with aiohttp.ClientSession() as s, s.request(method, gw.http + path, json=body) as r:
        text = await r.text()
        return r.status, json.loads(text) if text else None


@pytest.fixture
async def mock_llm() -> AsyncIterator[TestServer]:
    srv = TestServer(MockLlm(Script({"default": {"reply": "Hello."}})).app(), host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


async def test_an_outbound_call_with_its_own_llm_agent(
    gateway_factory: GatewayFactory, sipp: Sipp, mock_llm: TestServer
) -> None:
    gw = gateway_factory("--llm-base-url", f"http://127.0.0.1:{mock_llm.port}/v1")
    # Refused before anybody is dialled.
    status, body = await api(gw, "POST", "/api/calls", {
        "to": "sip:bob@127.0.0.1:9", "agent": {"kind": "llm", "vars": {"name": ["x"]}},
    })  # fmt: skip
    assert status == 422 and body["error"]["message"] == (
        "agent.vars.name must be a string or a number"
    ), body
    status, body = await api(gw, "POST", "/api/calls", {
        "to": "sip:bob@127.0.0.1:9", "agent": {"kind": "robot"},
    })  # fmt: skip
    assert status == 422
    assert "agent.kind must be one of ivr, llm, stream, flow" in body["error"]["message"]
    assert await gw.acalls() == []

    port = free_port()
    uas = await sipp.start("-uas", target=None, sip_port=port, args=["-m", "1"])
    await asyncio.sleep(0.5)  # sipp binds its socket
    agent = {
        "kind": "llm",
        "greeting": "Hello {name}, this is a reminder about your appointment.",
        "system_prompt": "You remind {name} of an appointment.",
        "vars": {"name": "Ann"},
    }
    async with EventFeed(gw.http) as feed:
        status, info = await api(gw, "POST", "/api/calls", {
            "to": f"sip:ann@127.0.0.1:{port}", "agent": agent,
        })  # fmt: skip
        assert status == 201, info
        cid = info["id"]
        await feed.wait_for("call.state", call_id=cid, state="answered", timeout=20)
        started = await feed.wait_for("utterance.started", call_id=cid, timeout=20)
        assert started["text"] == "Hello Ann, this is a reminder about your appointment."
        await feed.wait_for("utterance.finished", call_id=cid, timeout=30)
        await asyncio.sleep(1.0)
        record = gw.get(f"/api/calls/{cid}")
        assert record["agent"] == "llm" and record["state"] == "answered", record
        status, _ = await api(gw, "DELETE", f"/api/calls/{cid}")
        assert status == 204
        await feed.wait_for("call.state", call_id=cid, state="ended")
        assert feed.of("agent.turn", cid) == [], feed.of("transcript", cid)
    (await sipp.wait(uas)).assert_ok()
    record = gw.get(f"/api/calls/{cid}")
    assert record["state"] == "ended" and record["transcript"] == [
        {"role": "agent", "text": started["text"], "ts": record["transcript"][0]["ts"]}
    ], record
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{mock_llm.port}/requests") as r,
    ):
        assert await r.json() == []
    with contextlib.suppress(Exception):
        await gw.wait_no_calls()
