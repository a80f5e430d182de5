"""The ``flow`` kind in the agent registry: the gateway's default (``[agent] kind = "flow"``)
and a call's own (``POST /api/calls {"agent": {"kind": "flow", ...}}``), checked before anybody
is dialled; a flow file that needs speech-to-text loads it at start, or refuses to start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.agents.llm import Ears
from gateway.agents.registry import AgentRegistry
from gateway.call.control import BadRequest, CallInfo
from gateway.flow.engine import FlowAgent
from tests.agents.fakes import FakeStt
from tests.flow.conftest import ACCOUNT_FLOW
from voxgate.contract.config import Config, ConfigError, load

INFO = CallInfo("c1", "sip", "outbound", "ringing", "sip:bob@example.com", "sip:voxgate@gw",
                1000.0)  # fmt: skip


def registry(**overrides: object) -> AgentRegistry:
    return AgentRegistry(load(None, env={}, overrides=overrides))


async def test_the_default_agent_is_the_flow_file() -> None:
    reg = registry(**{"agent.kind": "flow", "flow.file": str(ACCOUNT_FLOW)})
    agent = reg.default(INFO)
    assert isinstance(agent, FlowAgent) and agent.flow is None and agent.url is None
    assert agent.services.book is not None and agent.services.book.start == "main"
    assert agent.vars == {"company": "Acme Bank"}  # the file's vars
    await reg.close()
    reg = registry(**{"agent.kind": "flow", "flow.file": str(ACCOUNT_FLOW), "flow.start": "menu"})
    assert reg.flows.book is not None and reg.flows.book.start == "menu"
    await reg.close()


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"kind": "flow", "flow": "nope"}, "agent.flow: no flow named 'nope' (flows: account,"),
        ({"kind": "flow", "flow": 3}, "agent.flow must be a string"),
        ({"kind": "flow", "flow": "menu", "url": "https://x/y"}, "give flow (a name) or url"),
        ({"kind": "flow", "url": "ftp://x/y"}, "agent.url: expected a http:// or https:// URL"),
        ({"kind": "flow", "url": "https://x/" + "y" * 3000}, "the limit is 2048"),
        ({"kind": "flow", "vars": {"a": [1]}}, "agent.vars.a must be a string or a number"),
        ({"kind": "flow", "verbs": []}, "agent: unknown field 'verbs' for kind 'flow'"),
    ],
)
async def test_a_calls_flow_is_checked_before_dialling(
    spec: dict[str, object], reason: str
) -> None:
    reg = registry(**{"flow.file": str(ACCOUNT_FLOW)})
    with pytest.raises(BadRequest) as exc:
        reg.validate(spec)
    assert reason in exc.value.message, exc.value.message
    await reg.close()


async def test_a_calls_flow_is_built_from_its_spec() -> None:
    reg = registry(**{"flow.file": str(ACCOUNT_FLOW)})
    spec = reg.validate({"kind": "flow", "flow": "menu", "vars": {"account": 1234}})
    assert spec == {"kind": "flow", "flow": "menu", "url": None, "vars": {"account": "1234"}}
    agent = reg.build(INFO, spec)
    assert isinstance(agent, FlowAgent)
    assert (agent.flow, agent.url, agent.vars["account"]) == ("menu", None, "1234")
    hooked = reg.build(INFO, reg.validate({"kind": "flow", "url": "https://hooks.example/c"}))
    assert isinstance(hooked, FlowAgent) and hooked.url == "https://hooks.example/c"
    await reg.close()
    # Without a file or a webhook the gateway has the built-in flow (the IVR menu).
    bare = registry()
    assert bare.validate({"kind": "flow"})["flow"] is None
    assert bare.validate({"kind": "flow", "flow": "main"})["flow"] == "main"
    with pytest.raises(BadRequest, match=r"no flow named 'sales'"):
        bare.validate({"kind": "flow", "flow": "sales"})
    assert bare.validate({"kind": "flow", "url": "http://127.0.0.1:9/x"})["url"]
    await bare.close()


def speech_file(tmp_path: Path) -> Path:
    f = tmp_path / "speech.json"
    f.write_text(json.dumps({"flows": {"main": [
        {"say": "Hello"},
        {"gather": {"input": ["speech"], "say": "What can I do for you?"}},
    ]}}))  # fmt: skip
    return f


async def test_a_speech_flow_loads_the_recogniser_at_start(tmp_path: Path) -> None:
    loads: list[int] = []

    def ears(cfg: Config) -> Ears:
        loads.append(1)
        return Ears(FakeStt(), None)

    cfg = load(
        None, env={}, overrides={"agent.kind": "flow", "flow.file": str(speech_file(tmp_path))}
    )
    reg = AgentRegistry(cfg, ears_loader=ears)
    await reg.warm()
    assert loads == [1]
    await reg.close()


async def test_a_speech_flow_without_a_recogniser_stops_the_start(tmp_path: Path) -> None:
    def broken(cfg: Config) -> Ears:
        raise RuntimeError("whisper model not found")

    path = speech_file(tmp_path)
    reg = AgentRegistry(load(None, env={}, overrides={"flow.file": str(path)}), ears_loader=broken)
    with pytest.raises(ConfigError) as exc:
        await reg.warm()
    assert str(exc.value) == (
        f"flow.file: {path}: flows.main[1].gather listens for speech, but speech-to-text "
        "cannot load: whisper model not found"
    )
    await reg.close()
