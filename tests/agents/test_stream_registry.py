"""The ``stream`` kind in the registry and the config: a per-call request checked in full
before anybody is dialled (ws:// or wss:// only, string parameters, sizes, no spoofed caller
numbers), ``[stream]`` validated, and ``gateway = stream`` refused with one line without a URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.registry import AgentRegistry
from gateway.agents.stream import StreamAgent
from gateway.call.control import BadRequest, CallInfo
from voxgate.contract.config import Config, ConfigError, load

BOT = "ws://127.0.0.1:8765/ws"
INFO = CallInfo("c1", "sip", "inbound", "answered", "sip:a@x", "sip:b@y", 1.0)


def registry(**stream: Any) -> AgentRegistry:
    cfg = Config()
    for key, value in stream.items():
        setattr(cfg.stream, key, value)
    return AgentRegistry(cfg)


async def test_a_call_may_name_its_bot_and_parameters() -> None:
    reg = registry()
    spec = reg.validate(
        {"kind": "stream", "url": "wss://bots.example.com/twilio?x=1", "parameters": {"a": "1"}}
    )
    assert spec == {
        "kind": "stream", "url": "wss://bots.example.com/twilio?x=1", "parameters": {"a": "1"}
    }  # fmt: skip
    agent = reg.build(INFO, spec)
    assert isinstance(agent, StreamAgent) and agent.kind == "stream"
    assert agent.url == spec["url"] and agent.parameters == {"a": "1"}
    assert agent._ssl is not None and agent._ssl.verify_mode.name == "CERT_REQUIRED"
    assert agent.account_sid == reg.account_sid and reg.account_sid.startswith("AC")
    await reg.close()


async def test_the_configured_bot_is_the_default() -> None:
    reg = registry(url=BOT)
    assert reg.validate({"kind": "stream"}) == {"kind": "stream", "url": BOT, "parameters": {}}
    reg.cfg.agent.kind = "stream"
    agent = reg.default(INFO)
    assert isinstance(agent, StreamAgent) and agent.url == BOT and agent._ssl is None
    await reg.close()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"kind": "stream"}, "give agent.url (ws:// or wss://); this gateway has no [stream] url"),
        ({"kind": "stream", "url": 5}, "agent.url must be a string"),
        ({"kind": "stream", "url": "http://bot/ws"}, "expected a ws:// or wss:// URL with a host"),
        ({"kind": "stream", "url": "ws:///path"}, "expected a ws:// or wss:// URL with a host"),
        ({"kind": "stream", "url": "ws://bot:99999/ws"}, "agent.url: not a URL"),
        ({"kind": "stream", "url": "ws://bot/a b"}, "whitespace or control characters"),
        ({"kind": "stream", "url": "ws://b/" + "x" * 3000}, "the limit is 2048"),
        ({"kind": "stream", "url": BOT, "parameters": ["a"]}, "an object of names to strings"),
        ({"kind": "stream", "url": BOT, "parameters": {"a": 1}}, "agent.parameters.a must be a"),
        ({"kind": "stream", "url": BOT, "parameters": {"a": "x" * 1001}}, "longer than 1000"),
        ({"kind": "stream", "url": BOT, "parameters": {str(i): "" for i in range(51)}},
         "51 entries; the limit is 50"),
        ({"kind": "stream", "url": BOT, "parameters": {"from_number": "+1"}},
         "from_number is set by the gateway"),
        ({"kind": "stream", "url": BOT, "greeting": "hi"}, "unknown field 'greeting'"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_before_dialling(spec: dict[str, object], says: str) -> None:
    with pytest.raises(BadRequest) as info:
        registry().validate(spec)
    assert says in info.value.message


def test_stream_config_is_validated() -> None:
    cfg = load(None, env={}, overrides={"agent.kind": "stream", "stream.url": BOT})
    assert cfg.agent.kind == "stream" and cfg.stream.url == BOT and not cfg.stream.barge_in
    with pytest.raises(ConfigError, match=r"^stream\.url: the stream agent needs the bot's"):
        load(None, env={"VOXGATE_AGENT_KIND": "stream"})
    with pytest.raises(ConfigError, match=r"^stream\.url: expected a ws:// or wss:// URL"):
        load(None, env={}, overrides={"stream.url": "https://bot/ws"})
    with pytest.raises(ConfigError, match=r"^stream\.ca_file: no such file"):
        load(None, env={}, overrides={"stream.ca_file": "/no/such/ca.pem"})
    with pytest.raises(ConfigError, match=r"^stream\.connect_timeout_s"):
        load(None, env={}, overrides={"stream.connect_timeout_s": "0"})
    cfg = load(None, env={"VOXGATE_STREAM_ECHO_GATE": "true", "VOXGATE_STREAM_FALLBACK": ""})
    assert cfg.stream.echo_gate and cfg.stream.fallback == ""


def test_cli_refuses_a_stream_gateway_without_a_bot(tmp_path: Path) -> None:
    voxgate = Path(sys.executable).with_name("voxgate")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    out = subprocess.run(
        [str(voxgate), "gateway", "--agent-kind", "stream"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("voxgate: config error: stream.url: "), lines[0]
