"""The sample account flow (deploy/flows/account.toml) on a real gateway (memory bus, the onnx
worker) with the project's SIP UAC: the caller keys four digits and # by RFC 4733, and the flow
branches on them (which prompt follows is read from the call's ``utterance.started`` events and
its record). Prints the key → next prompt's first audio time."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator

import pytest

from gateway.call.calls import Call
from gateway.call.control import DtmfReceived, UtteranceStarted
from gateway.flow.engine import FlowAgent
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.flow.conftest import ACCOUNT_FLOW
from tests.waiting import wait_for
from voxgate.bench.localgw import LocalGateway, local_gateway
from voxgate.bench.sipclient import SipClient

pytestmark = pytest.mark.slow

ASK = "Please enter your four digit account number, followed by the pound key."
PREMIUM = "Thank you. As a premium customer, you have a dedicated advisor."
STANDARD = "Thank you."


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture
async def flow_gateway(engine: Engine) -> AsyncIterator[LocalGateway]:
    overrides = {"agent.kind": "flow", "flow.file": str(ACCOUNT_FLOW)}
    async with local_gateway(engine, name="flow", overrides=overrides) as local:
        yield local


def keys(call: Call) -> list[DtmfReceived]:
    return [e for e in call.history if isinstance(e, DtmfReceived)]


def started(call: Call) -> list[UtteranceStarted]:
    return [e for e in call.history if isinstance(e, UtteranceStarted)]


async def key_in(local: LocalGateway, digits: str) -> tuple[Call, list[str], float]:
    """Call, wait for the account prompt to play, key ``digits``; the gateway's call, the
    prompts started after the last key, and the last key → next prompt's first audio (s)."""
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(local.sip, codecs=("PCMU",))
        assert call.status == 200 and call.media is not None
        (gw_call,) = local.gw.manager.calls.values()
        await wait_for(lambda: gw_call.agent is not None, timeout=5)  # it starts on the ACK
        assert isinstance(gw_call.agent, FlowAgent)
        await wait_for(lambda: any(e.text == ASK for e in started(gw_call)), timeout=20)
        for d in digits:
            await call.media.send_dtmf(d, duration_ms=80)
            await asyncio.sleep(0.12)
        await wait_for(lambda: len(keys(gw_call)) == len(digits), timeout=10)
        last_key = keys(gw_call)[-1]
        await wait_for(lambda: any(e.ts > last_key.ts for e in started(gw_call)), timeout=20)
        latency = next(e.ts for e in started(gw_call) if e.ts > last_key.ts) - last_key.ts
        # The menu after the branch, with the account filled in.
        await wait_for(lambda: any("press 1" in e.text for e in started(gw_call)), timeout=20)
        after = [e.text for e in started(gw_call) if e.ts > last_key.ts]
        assert await call.bye() == 200
        return gw_call, after, latency
    finally:
        client.close()


async def test_four_digits_and_pound_branch_the_flow(flow_gateway: LocalGateway) -> None:
    latencies = []
    gw_call, after, latency = await key_in(flow_gateway, "9123#")
    latencies.append(latency)
    assert after[:2] == [PREMIUM, "For the balance of account 9123, press 1. To speak with an "
                                  "agent, press 0."], after  # fmt: skip
    digits = [e.digit for e in keys(gw_call)]
    assert digits == list("9123#")
    record = flow_gateway.gw.manager.call_record(gw_call.id)
    assert record["agent"] == "flow"
    heard = [line["text"] for line in record["transcript"]]  # type: ignore[attr-defined]
    assert "Welcome to Acme Bank." in heard and PREMIUM in heard, heard

    gw_call, after, latency = await key_in(flow_gateway, "1234#")
    latencies.append(latency)
    assert after[:2] == [STANDARD, "For the balance of account 1234, press 1. To speak with an "
                                   "agent, press 0."], after  # fmt: skip
    print(
        f"\n# key '#' -> next prompt's first audio: {[round(x * 1000) for x in latencies]} ms "
        f"(median {statistics.median(latencies) * 1000:.0f} ms, onnx worker, 2-core CPU)"
    )
