"""JSON logs: one call's utterance carries the same trace_id on the gateway and the worker."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.agents.base import CallHandle
from gateway.call.control import Event
from gateway.call.manager import CallManager
from tests.metrics.conftest import MetricsGateway
from voxgate.bench.sipclient import SipClient
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.logs import JsonFormatter, log_context


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("voxgate")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def lines(out: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def test_bound_context_and_extra(json_logs: io.StringIO) -> None:
    log = logging.getLogger("voxgate.test")
    with log_context(call_id="c1", trace_id="t1"):
        log.info("inside")
        log.info("own ids win", extra={"call_id": "c2"})
    log.info("outside")
    got = lines(json_logs)
    assert (got[0]["call_id"], got[0]["trace_id"]) == ("c1", "t1")
    assert (got[1]["call_id"], got[1]["trace_id"]) == ("c2", "t1")
    assert "call_id" not in got[2] and "trace_id" not in got[2]


async def test_one_trace_id_from_gateway_to_worker(
    metrics_gateway: MetricsGateway, json_logs: io.StringIO
) -> None:
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(metrics_gateway.sip, codecs=("PCMU",))
        assert call.status == 200
        (gw_call,) = metrics_gateway.gw.manager.calls.values()
        await call.media.wait_for_audio(after=call.acked_at, threshold=300.0, timeout=5)
        await call.media.wait_for_quiet(quiet_s=0.3, threshold=30.0, timeout=15)
        assert await call.bye() == 200
    finally:
        client.close()
    records = lines(json_logs)
    trace = gw_call.trace_id
    gateway = [r for r in records if r["logger"] == "voxgate.calls"]
    worker = [r for r in records if r["logger"] == "voxgate.worker"]
    mine = [r for r in gateway if r.get("call_id") == gw_call.id]
    assert {r.get("trace_id") for r in mine} == {trace}, gateway
    messages = " | ".join(r["msg"] for r in mine)
    assert "new inbound sip call" in messages and "answered" in messages
    assert "ended (remote hangup)" in messages
    served = [r for r in worker if r.get("trace_id") == trace]
    assert served, f"no worker line with trace_id {trace}: {worker}"
    assert all(r.get("call_id") == gw_call.id for r in served)
    assert all(r.get("worker") == "metrics" for r in served)
    assert any("request for call" in r["msg"] for r in served)
    assert any(" done:" in r["msg"] for r in served)
    # Same utterance id on both of the worker's lines.
    assert len({r["utterance_id"] for r in served}) == 1


async def test_logs_inside_a_calls_tasks_carry_its_ids(json_logs: io.StringIO) -> None:
    agent_log = logging.getLogger("voxgate.agent.test")

    class Agent:
        async def on_start(self, call: CallHandle) -> None:
            agent_log.info("agent started")

        async def on_event(self, call: CallHandle, event: Event) -> None: ...

        async def on_end(self, call: CallHandle) -> None:
            agent_log.info("agent done")

    bus = MemoryBus()
    await bus.start()
    try:
        manager = CallManager(bus, None)
        call = manager.new_call("sip", "inbound", "sip:a@x", "sip:ivr@y")
        other = manager.new_call("sip", "inbound", "sip:b@x", "sip:ivr@y")
        await call.start(Agent())
        await other.start(Agent())
        await asyncio.sleep(0.05)
        await call.ended("api")
        await other.ended("api")
        await asyncio.sleep(0.05)
    finally:
        await bus.close()
    mine = [r for r in lines(json_logs) if r["logger"] == "voxgate.agent.test"]
    assert len(mine) == 4
    for c in (call, other):
        got = [(r["call_id"], r["trace_id"]) for r in mine if r.get("call_id") == c.id]
        assert got == [(c.id, c.trace_id)] * 2
