"""The campaign service and its REST API, on the real parts around an injected dial: a real
``CallManager`` (events), the real agent registry (agent validation), real stores (SQLite in
``tmp_path``, the real Redis), the real control API app with its token check and ``/metrics``.

The dial is a fake (these tests isolate the service from SIP; the calls themselves are
tests/campaign/test_restart_sipp.py's): it records who was called and can hold a call open
until the test releases it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from gateway.agents.registry import AgentRegistry
from gateway.api.campaigns import campaign_routes
from gateway.api.routes import make_app
from gateway.call.control import CampaignEvent, Event
from gateway.call.manager import CallManager
from gateway.campaign.outcomes import Outcome
from gateway.campaign.runner import Dial, DialResult, Emit
from gateway.campaign.service import CampaignService, amd_config
from gateway.campaign.spec import CampaignSpec
from gateway.campaign.store import INTERRUPTED, Claim
from gateway.metrics import GatewayMetrics
from tests.campaign.conftest import REDIS_URL
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import Config, ConfigError, load

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not await _value(cond()):
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        await asyncio.sleep(0.02)


async def _value(v: Any) -> Any:
    return await v if asyncio.iscoroutine(v) else v


@dataclass
class FakeDial:
    """Answers ``outcome`` after ``hold_s``; with ``gate`` set, holds every call until the
    test sets it. Counts calls per ``to`` across every campaign and service using it."""

    outcome: Outcome = Outcome.HUMAN
    hold_s: float = 0.01
    gate: asyncio.Event | None = None
    calls: Counter[str] = field(default_factory=Counter)
    by_owner: Counter[str] = field(default_factory=Counter)
    live: int = 0

    def factory(self, owner: str) -> Callable[[str, CampaignSpec, Emit], Dial]:
        def make(campaign_id: str, spec: CampaignSpec, emit: Emit) -> Dial:
            async def dial(claim: Claim) -> DialResult:
                self.calls[claim.contact.to] += 1
                self.by_owner[owner] += 1
                self.live += 1
                try:
                    if self.gate is not None:
                        await self.gate.wait()
                    await asyncio.sleep(self.hold_s)
                finally:
                    self.live -= 1
                return DialResult(self.outcome, 200)

            return dial

        return make


def _config(tmp_path: Path, backend: str, prefix: str, **over: object) -> Config:
    overrides: dict[str, object] = {
        "campaign.db": str(tmp_path / "campaigns.sqlite"),
        "campaign.scan_s": 0.2,
        "campaign.lease_s": 30.0,
        "bus.prefix": prefix,
    }
    if backend == "redis":
        overrides |= {"bus.kind": "redis", "bus.redis_url": REDIS_URL}
    overrides |= over
    return load(None, env={}, overrides=overrides)


@dataclass
class Gw:
    """One gateway's worth of the parts: manager, service, metrics, API client."""

    manager: CallManager
    service: CampaignService
    metrics: GatewayMetrics
    client: TestClient[Any, Any]
    events: list[Event]
    consumer: asyncio.Task[None]

    def campaign_events(self, kind: str) -> list[CampaignEvent]:
        return [e for e in self.events if isinstance(e, CampaignEvent) and e.type == kind]


class Harness:
    def __init__(self, tmp_path: Path, backend: str) -> None:
        self.tmp_path = tmp_path
        self.backend = backend
        self.prefix = f"vgtest:{uuid.uuid4().hex[:12]}"
        self.bus = MemoryBus()
        self.gateways: list[Gw] = []

    async def gateway(self, dial: FakeDial, owner: str = "gw-a", **over: Any) -> Gw:
        cfg = _config(self.tmp_path, self.backend, self.prefix, **{"campaign.owner": owner, **over})
        manager = CallManager(self.bus, None)
        manager.agents = AgentRegistry(cfg)
        service = CampaignService(cfg, manager, dial_factory=dial.factory(owner), runner_poll_s=0.1)
        metrics = GatewayMetrics(manager, self.bus)
        metrics.watch_campaigns(service.in_flight)
        metrics.start()
        events: list[Event] = []
        sub = manager.subscribe_events()

        async def consume() -> None:
            async for e in sub:
                events.append(e)

        consumer = asyncio.create_task(consume())
        await service.start(sip_port=5060)
        app = make_app(
            manager,
            token=TOKEN,
            max_text_chars=5000,
            extra_routes=[*campaign_routes(service)],
        )
        app.router.add_get("/metrics", metrics.handle)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        gw = Gw(manager, service, metrics, client, events, consumer)
        self.gateways.append(gw)
        return gw

    async def stop(self, gw: Gw) -> None:
        await gw.client.close()
        await gw.service.close()
        await gw.metrics.close()
        gw.consumer.cancel()
        await asyncio.gather(gw.consumer, return_exceptions=True)
        self.gateways.remove(gw)

    async def close(self) -> None:
        for gw in list(self.gateways):
            await self.stop(gw)
        if self.backend == "redis":
            r = Redis.from_url(REDIS_URL)
            keys = [k async for k in r.scan_iter(match=f"{self.prefix}:*", count=1000)]
            if keys:
                await r.delete(*keys)
            await r.aclose()


@pytest.fixture(params=["sqlite", "redis"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    if request.param == "redis":
        probe = Redis.from_url(REDIS_URL, socket_connect_timeout=1.0)
        try:
            await probe.ping()
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
        finally:
            await probe.aclose()
    h = Harness(tmp_path, request.param)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, "sqlite")
    try:
        yield h
    finally:
        await h.close()


def _body(n: int, **over: object) -> dict[str, Any]:
    contacts = [{"to": f"+1555{i:07d}", "vars": {"name": f"n{i}"}} for i in range(n)]
    return {"agent": {"kind": "ivr"}, "cps": 50, "max_concurrent": 5, "contacts": contacts, **over}


async def _get(gw: Gw, cid: str) -> dict[str, Any]:
    resp = await gw.client.get(f"/api/campaigns/{cid}", headers=AUTH)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def _state_is(gw: Gw, cid: str, state: str) -> bool:
    return bool((await _get(gw, cid))["state"] == state)


# --- create, run, read back ------------------------------------------------------------------


async def test_create_runs_every_contact_once_with_events_and_metrics(harness: Harness) -> None:
    dial = FakeDial()
    gw = await harness.gateway(dial)
    resp = await gw.client.post("/api/campaigns", json=_body(6, id="c-1"), headers=AUTH)
    assert resp.status == 201, await resp.text()
    created = await resp.json()
    assert created["id"] == "c-1" and created["state"] == "running"
    assert resp.headers["Location"] == "/api/campaigns/c-1"
    assert created["totals"]["contacts"] == 6

    await _until(lambda: _state_is(gw, "c-1", "done"), what="campaign done")
    body = await _get(gw, "c-1")
    assert body["totals"]["outcomes"] == {"human": 6}
    assert [c["outcome"] for c in body["contacts"]] == ["human"] * 6
    assert all(len(c["attempts"]) == 1 for c in body["contacts"])
    assert body["contacts"][2]["vars"] == {"name": "n2"}
    assert sorted(dial.calls.values()) == [1] * 6

    page = await (await gw.client.get("/api/campaigns/c-1?offset=2&limit=2", headers=AUTH)).json()
    assert [c["index"] for c in page["contacts"]] == [2, 3]
    totals_only = await (await gw.client.get("/api/campaigns/c-1?limit=0", headers=AUTH)).json()
    assert "contacts" not in totals_only and totals_only["totals"] == body["totals"]
    resp = await gw.client.get("/api/campaigns/c-1?limit=-1", headers=AUTH)
    assert resp.status == 400

    listing = await (await gw.client.get("/api/campaigns", headers=AUTH)).json()
    assert [c["id"] for c in listing["campaigns"]] == ["c-1"]
    assert "contacts" not in listing["campaigns"][0]  # totals only

    await _until(lambda: gw.campaign_events("campaign.finished"), what="finished event")
    assert [e.campaign for e in gw.campaign_events("campaign.created")] == ["c-1"]
    assert len(gw.campaign_events("campaign.dial")) == 6
    attempts = gw.campaign_events("campaign.attempt")
    assert sorted(e.to or "" for e in attempts) == sorted(c["to"] for c in body["contacts"])
    assert {e.outcome for e in attempts} == {"human"}
    assert gw.campaign_events("campaign.finished")[0].state == "done"

    scrape = await (await gw.client.get("/metrics")).text()
    assert "voxgate_campaign_dialled_total 6.0" in scrape
    assert "voxgate_campaign_answered_total 6.0" in scrape
    assert 'voxgate_campaign_outcome_total{outcome="human"} 6.0' in scrape
    assert 'voxgate_campaign_outcome_total{outcome="busy"} 0.0' in scrape
    assert "voxgate_campaign_in_flight 0.0" in scrape


async def test_the_api_asks_for_the_token(sqlite: Harness) -> None:
    gw = await sqlite.gateway(FakeDial())
    resp = await gw.client.post("/api/campaigns", json=_body(1))
    assert resp.status == 401
    resp = await gw.client.get("/api/campaigns", headers={"Authorization": "Bearer nope"})
    assert resp.status == 401
    assert (await (await gw.client.get("/api/campaigns", headers=AUTH)).json()) == {"campaigns": []}


# --- refusals ------------------------------------------------------------------------------


async def test_a_bad_spec_is_400_naming_the_field(sqlite: Harness) -> None:
    gw = await sqlite.gateway(FakeDial())
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cps": 0}, "cps"),
        ({"window": {"start": "09:00", "end": "17:00", "tz": "Mars/Base"}}, "window.tz"),
        ({"retries": {"human": {"max": 1}}}, "retries.human"),
        ({"agent": {"kind": "telepathy"}}, "agent"),  # refused by the gateway's registry
        ({"agent": {"kind": "ivr", "bogus": 1}}, "agent"),
        ({"id": "../etc"}, "id"),
        ({"colour": "red"}, "colour"),
    ]
    for over, field_name in cases:
        resp = await gw.client.post("/api/campaigns", json=_body(2, **over), headers=AUTH)
        assert resp.status == 400, (over, await resp.text())
        body = await resp.json()
        assert body["field"] == field_name, body
        assert body["error"]["code"] == "invalid_spec" and body["error"]["message"]
    no_contacts = {k: v for k, v in _body(1).items() if k != "contacts"}
    resp = await gw.client.post("/api/campaigns", json=no_contacts, headers=AUTH)
    assert (resp.status, (await resp.json())["field"]) == (400, "contacts")
    resp = await gw.client.post("/api/campaigns", data=b"[1, 2]", headers=AUTH | _JSON)
    assert resp.status == 400
    resp = await gw.client.post("/api/campaigns", data=b"{nope", headers=AUTH | _JSON)
    assert resp.status == 400
    resp = await gw.client.post("/api/campaigns", data=b"{}", headers=AUTH)
    assert resp.status == 415
    assert (await (await gw.client.get("/api/campaigns", headers=AUTH)).json())["campaigns"] == []


_JSON = {"Content-Type": "application/json"}


async def test_bad_contacts_are_400_with_every_bad_row_and_nothing_created(
    sqlite: Harness,
) -> None:
    gw = await sqlite.gateway(FakeDial())
    body = _body(0)
    body["contacts"] = [
        {"to": "+15550000001"},
        {"to": "555-1234"},  # not E.164
        {"to": "sip:bob@example.com"},
        {"to": "+1 555 000 0001"},  # the first one again, after normalising
        {"to": "sip:bob@EXAMPLE.com", "vars": {"a": 1}},  # the host compares case-insensitively
        {"vars": {}},
    ]
    resp = await gw.client.post("/api/campaigns", json=body, headers=AUTH)
    assert resp.status == 400, await resp.text()
    refused = await resp.json()
    assert refused["error"]["code"] == "invalid_contacts"
    assert [r["row"] for r in refused["rows"]] == [1, 3, 4, 5]
    assert all(r["reason"] for r in refused["rows"])
    body["contacts"] = {"to": "+15550000001"}
    resp = await gw.client.post("/api/campaigns", json=body, headers=AUTH)
    assert resp.status == 400 and (await resp.json())["rows"][0]["row"] is None
    body["contacts"] = []
    resp = await gw.client.post("/api/campaigns", json=body, headers=AUTH)
    assert resp.status == 400 and (await resp.json())["rows"][0]["row"] is None
    assert (await (await gw.client.get("/api/campaigns", headers=AUTH)).json())["campaigns"] == []


async def test_over_the_size_and_contact_limits(sqlite: Harness) -> None:
    limits: dict[str, Any] = {"campaign.max_request_bytes": 4096, "campaign.max_contacts": 3}
    gw = await sqlite.gateway(FakeDial(), **limits)
    big = _body(200)  # ~9 kB
    resp = await gw.client.post("/api/campaigns", json=big, headers=AUTH)
    assert resp.status == 413, await resp.text()
    assert (await resp.json())["error"]["code"] == "body_too_large"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
        import json

        data = json.dumps(big).encode()
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    resp = await gw.client.post("/api/campaigns", data=chunks(), headers=AUTH | _JSON)
    assert resp.status == 413, await resp.text()
    resp = await gw.client.post("/api/campaigns", json=_body(4), headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["rows"][0]["row"] is None  # too many contacts: the input as a whole
    assert (await (await gw.client.get("/api/campaigns", headers=AUTH)).json())["campaigns"] == []


async def test_a_duplicate_id_is_409(sqlite: Harness) -> None:
    gw = await sqlite.gateway(FakeDial())
    assert (
        await gw.client.post("/api/campaigns", json=_body(1, id="x"), headers=AUTH)
    ).status == 201
    resp = await gw.client.post("/api/campaigns", json=_body(1, id="x"), headers=AUTH)
    assert resp.status == 409


# --- control ----------------------------------------------------------------------------------


async def test_pause_resume_cancel_and_their_refusals(harness: Harness) -> None:
    dial = FakeDial(gate=asyncio.Event())
    gw = await harness.gateway(dial)
    body = _body(4, id="pr", max_concurrent=1)
    assert (await gw.client.post("/api/campaigns", json=body, headers=AUTH)).status == 201
    await _until(lambda: dial.live == 1, what="first call up")

    resp = await gw.client.post("/api/campaigns/pr/pause", headers=AUTH)
    assert resp.status == 200 and (await resp.json())["state"] == "paused"
    assert (await gw.client.post("/api/campaigns/pr/pause", headers=AUTH)).status == 200  # no-op
    scrape = await (await gw.client.get("/metrics")).text()
    assert "voxgate_campaign_in_flight 1.0" in scrape
    dial.gate.set()  # type: ignore[union-attr]  # the live call ends; paused: nothing new
    await _until(lambda: sum(dial.calls.values()) == 1 and dial.live == 0)
    await asyncio.sleep(0.5)  # several runner polls
    assert sum(dial.calls.values()) == 1
    assert (await _get(gw, "pr"))["totals"]["pending"] == 3

    dial.gate.clear()  # type: ignore[union-attr]
    resp = await gw.client.post("/api/campaigns/pr/resume", headers=AUTH)
    assert resp.status == 200 and (await resp.json())["state"] == "running"
    await _until(lambda: dial.live == 1 and sum(dial.calls.values()) == 2, what="second call")

    resp = await gw.client.delete("/api/campaigns/pr", headers=AUTH)
    assert resp.status == 200 and (await resp.json())["state"] == "cancelled"
    dial.gate.set()  # type: ignore[union-attr]  # the live call finishes and keeps its outcome
    await _until(lambda: gw.campaign_events("campaign.finished"), what="runner finished")
    done = await _get(gw, "pr")
    assert done["state"] == "cancelled"
    assert [c["outcome"] for c in done["contacts"]] == ["human", "human", "cancelled", "cancelled"]
    assert sum(dial.calls.values()) == 2
    states = [e.state for e in gw.campaign_events("campaign.state")]
    assert states == ["paused", "running", "cancelled"]

    for path in ("/api/campaigns/pr/resume", "/api/campaigns/pr/pause"):
        resp = await gw.client.post(path, headers=AUTH)
        assert resp.status == 409, path
        assert (await resp.json())["error"]["code"] == "conflict"
    assert (await gw.client.delete("/api/campaigns/pr", headers=AUTH)).status == 200  # no-op
    for method, path in (
        ("GET", "/api/campaigns/nope"),
        ("POST", "/api/campaigns/nope/pause"),
        ("POST", "/api/campaigns/nope/resume"),
        ("DELETE", "/api/campaigns/nope"),
    ):
        resp = await gw.client.request(method, path, headers=AUTH)
        assert resp.status == 404, (method, path)
        assert (await resp.json())["error"]["code"] == "unknown_campaign"


# --- restarts and several gateways ---------------------------------------------------------------


async def test_a_restarted_service_resumes_without_calling_anybody_twice(
    harness: Harness,
) -> None:
    dial = FakeDial(gate=asyncio.Event())
    gw = await harness.gateway(dial, owner="gw-a")
    body = _body(8, id="rs", max_concurrent=2)
    assert (await gw.client.post("/api/campaigns", json=body, headers=AUTH)).status == 201
    await _until(lambda: dial.live == 2, what="two calls up")
    first = set(dial.calls)
    # The gateway goes away with two calls up: their attempts started, no outcome recorded.
    await harness.stop(gw)

    dial.gate.set()  # type: ignore[union-attr]
    gw2 = await harness.gateway(dial, owner="gw-a")  # the same owner: recovered at once
    await _until(lambda: _state_is(gw2, "rs", "done"), what="campaign done after restart")
    done = await _get(gw2, "rs")
    assert max(dial.calls.values()) == 1, dial.calls  # nobody was called twice
    assert len(dial.calls) == 8
    for c in done["contacts"]:
        if c["to"] in first:
            assert c["outcome"] == "failed"
            assert [(a["outcome"], a["reason"]) for a in c["attempts"]] == [("failed", INTERRUPTED)]
        else:
            assert c["outcome"] == "human" and len(c["attempts"]) == 1
    assert done["totals"]["outcomes"] == {"failed": 2, "human": 6}


async def test_a_second_gateway_picks_up_a_campaign_made_on_the_first(harness: Harness) -> None:
    """b learns of the campaign from the shared store alone (its scan), and after a dies with
    two calls up, settles a's claims once their lease runs out and dials everybody else."""
    dial = FakeDial(gate=asyncio.Event())
    a = await harness.gateway(dial, owner="gw-a", **{"campaign.lease_s": 5.0})
    b = await harness.gateway(dial, owner="gw-b", **{"campaign.lease_s": 5.0})
    body = _body(12, id="two", cps=50, max_concurrent=2)
    assert (await a.client.post("/api/campaigns", json=body, headers=AUTH)).status == 201
    await _until(lambda: dial.live == 2, what="two calls up")
    await _until(lambda: "two" in b.service.runners, what="b runs the campaign")
    by_a = set(dial.calls)
    await harness.stop(a)  # gone with two calls up (no outcome recorded)
    dial.gate.set()  # type: ignore[union-attr]
    await _until(lambda: _state_is(b, "two", "done"), what="campaign done")
    assert len(dial.calls) == 12 and max(dial.calls.values()) == 1, dial.calls
    assert dial.by_owner["gw-b"] == 10, dial.by_owner
    done = await _get(b, "two")
    for c in done["contacts"]:
        assert c["claimed_by"] is None  # every claim settled
        want = ("failed", INTERRUPTED) if c["to"] in by_a else ("human", None)
        assert [(x["outcome"], x["reason"]) for x in c["attempts"]] == [want]


async def test_two_gateways_share_the_dialling(harness: Harness) -> None:
    """Both gateways dial (neither wakes late at the shared cps gate and loses every race),
    and nobody is called twice."""
    dial = FakeDial(hold_s=0.2)
    a = await harness.gateway(dial, owner="gw-a")
    b = await harness.gateway(dial, owner="gw-b")
    body = _body(20, id="share", cps=8, max_concurrent=4)
    assert (await a.client.post("/api/campaigns", json=body, headers=AUTH)).status == 201
    await _until(lambda: _state_is(b, "share", "done"), what="campaign done")
    assert len(dial.calls) == 20 and max(dial.calls.values()) == 1, dial.calls
    assert dial.by_owner["gw-a"] >= 1 and dial.by_owner["gw-b"] >= 1, dial.by_owner


def test_amd_settings_from_the_config() -> None:
    assert amd_config({"greeting": "1200", "beep_min_hz": "500"}).greeting == 1200
    for bad in ({"nope": "1"}, {"greeting": "long"}, {"greeting": "-5"}, {"phrases": "a"}):
        with pytest.raises(ConfigError, match=r"campaign\.amd"):
            amd_config(bad)
