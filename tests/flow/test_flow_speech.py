"""A speech gather on a real call with the real recogniser (faster-whisper tiny.en and
smart-turn, as the llm agent hears): the caller says a department after the prompt, and the flow
branches on the words heard (``{speech}``, ``branches`` with ``match = "contains"``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.call.control import UtteranceStarted
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.waiting import wait_for
from voxgate.bench.bargein import caller_sentence
from voxgate.bench.localgw import LocalGateway, local_gateway
from voxgate.bench.sipclient import SipClient

pytestmark = pytest.mark.slow

ASK = "Which department would you like? Say sales or support."
FLOW = f"""
[[flows.main]]
[flows.main.gather]
input = ["speech"]
say = "{ASK}"
timeout = 8
match = "contains"
branches = {{ sales = "sales", support = "support", timeout = "main", default = "main" }}

[[flows.sales]]
say = "Connecting you to sales."

[[flows.sales]]
pause = 10

[[flows.support]]
say = "Connecting you to support."

[[flows.support]]
pause = 10
"""


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture
async def speech_gateway(engine: Engine, tmp_path: Path) -> AsyncIterator[LocalGateway]:
    flow = tmp_path / "speech.toml"
    flow.write_text(FLOW)
    overrides = {"agent.kind": "flow", "flow.file": str(flow)}
    async with local_gateway(engine, name="flow-speech", overrides=overrides) as local:
        await local.gw.agents.warm()  # the recogniser loads before calls, as serve does
        yield local


@pytest.mark.parametrize(("words", "answer"), [
    ("Support, please.", "Connecting you to support."),
    ("I would like sales.", "Connecting you to sales."),
])  # fmt: skip
async def test_the_flow_branches_on_what_the_caller_says(
    speech_gateway: LocalGateway, engine: Engine, words: str, answer: str
) -> None:
    speech = caller_sentence(engine, words)
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(speech_gateway.sip, codecs=("PCMU",))
        assert call.status == 200 and call.media is not None
        (gw_call,) = speech_gateway.gw.manager.calls.values()

        def said() -> list[str]:
            return [e.text for e in gw_call.history if isinstance(e, UtteranceStarted)]

        await wait_for(lambda: ASK in said(), timeout=20)
        await wait_for(lambda: not gw_call.info.speaking, timeout=20)  # the prompt has ended
        await asyncio.sleep(0.3)
        call.media.send_audio(speech)
        await wait_for(lambda: len(said()) >= 2, timeout=20)
        assert said()[:2] == [ASK, answer], said()
        # The caller's words are in the call's transcript, as the llm agent's are.
        heard = [t for t in gw_call.transcript if t.get("role") == "caller"]
        assert heard, list(gw_call.transcript)
        assert await call.bye() == 200
    finally:
        client.close()
