"""Agents by kind: a per-call agent request (``POST /api/calls {"agent": {...}}``) is checked in
full before anybody is dialled, each refusal naming its reason; ``build`` makes the IVR or the
llm agent from the config and the request; the shared ear is loaded once. The config's side:
the llm agent without ``[llm] base_url``, the API key named by ``llm.api_key_env``, and the CLI
refusing ``voxgate gateway --agent-kind llm`` with one line."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.agents.ivr import IvrAgent
from gateway.agents.llm import Ears, LlmAgent, fill
from gateway.agents.registry import MAX_PROMPT_CHARS, MAX_VAR_CHARS, MAX_VARS, AgentRegistry
from gateway.call.control import BadRequest, CallInfo, ControlError
from tests.agents.fakes import FakeCall, FakeStt
from voxgate.contract.config import Config, ConfigError, load

BASE_URL = "http://127.0.0.1:9/v1"  # never contacted here
INFO = CallInfo("c1", "sip", "outbound", "ringing", "sip:bob@example.com", "sip:gw@x", 1000.0)


@pytest.fixture(autouse=True)
def no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``load(None)`` reads ./voxgate.toml when there is one: run where there is none."""
    monkeypatch.chdir(tmp_path)
    yield


def config(**overrides: object) -> Config:
    return load(None, env={}, overrides={k.replace("__", "."): v for k, v in overrides.items()})


class Loader:
    def __init__(self) -> None:
        self.loads = 0

    def __call__(self, cfg: Config) -> Ears:
        self.loads += 1
        return Ears(FakeStt("hi"), None)


def registry(cfg: Config | None = None, **kw: Any) -> AgentRegistry:
    return AgentRegistry(
        cfg or config(llm__base_url=BASE_URL, synth__max_text_chars=300), ears_loader=Loader(), **kw
    )


# -- validate ---------------------------------------------------------------------------------

LONG_PROMPT = "x" * (MAX_PROMPT_CHARS + 1)
TEMPERATURE = "agent.temperature must be a number from 0 to 2"
MAX_TOKENS = "agent.max_tokens must be an integer from 1 to 4096"
NOT_A_VALUE = "must be a string or a number"
TOO_MANY_VARS = {f"v{i}": "x" for i in range(MAX_VARS + 1)}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("llm", "'agent' must be an object"),
        (["llm"], "'agent' must be an object"),
        ({}, "agent.kind must be one of ivr, llm, stream, flow; got None"),
        ({"kind": "robot"}, "agent.kind must be one of ivr, llm, stream, flow; got 'robot'"),
        ({"kind": "LLM"}, "agent.kind must be one of ivr, llm, stream, flow; got 'LLM'"),
        ({"kind": 1}, "agent.kind must be one of ivr, llm, stream, flow; got 1"),
        ({"kind": "ivr", "system_prompt": "hi"},
         "agent: unknown field 'system_prompt' for kind 'ivr'"),
        ({"kind": "llm", "voice": "x", "zeta": 1}, "agent: unknown field 'voice' for kind 'llm'"),
        ({"kind": "llm", "system_prompt": 5}, "agent.system_prompt must be a string"),
        ({"kind": "llm", "greeting": ["hi"]}, "agent.greeting must be a string"),
        ({"kind": "llm", "model": {"name": "x"}}, "agent.model must be a string"),
        ({"kind": "llm", "system_prompt": LONG_PROMPT},
         f"agent.system_prompt is {MAX_PROMPT_CHARS + 1} characters; "
         f"the limit is {MAX_PROMPT_CHARS}"),
        ({"kind": "llm", "greeting": "g" * 301},
         "agent.greeting is 301 characters; the limit is 300"),
        ({"kind": "llm", "model": "m" * 201}, "agent.model is 201 characters; the limit is 200"),
        ({"kind": "llm", "vars": "name=Ada"}, "agent.vars must be an object of names to values"),
        ({"kind": "llm", "vars": ["Ada"]}, "agent.vars must be an object of names to values"),
        ({"kind": "llm", "vars": {"name": ["Ada"]}}, f"agent.vars.name {NOT_A_VALUE}"),
        ({"kind": "llm", "vars": {"name": None}}, f"agent.vars.name {NOT_A_VALUE}"),
        ({"kind": "llm", "vars": {"vip": True}}, f"agent.vars.vip {NOT_A_VALUE}"),
        ({"kind": "llm", "vars": {"a": {"b": 1}}}, f"agent.vars.a {NOT_A_VALUE}"),
        ({"kind": "llm", "vars": TOO_MANY_VARS},
         f"agent.vars has {MAX_VARS + 1} entries; the limit is {MAX_VARS}"),
        ({"kind": "llm", "vars": {"bio": "b" * (MAX_VAR_CHARS + 1)}},
         f"agent.vars.bio is longer than {MAX_VAR_CHARS} characters"),
        ({"kind": "llm", "temperature": -0.1}, TEMPERATURE),
        ({"kind": "llm", "temperature": 2.01}, TEMPERATURE),
        ({"kind": "llm", "temperature": "1"}, TEMPERATURE),
        ({"kind": "llm", "temperature": True}, TEMPERATURE),
        ({"kind": "llm", "temperature": float("nan")}, TEMPERATURE),
        ({"kind": "llm", "max_tokens": 0}, MAX_TOKENS),
        ({"kind": "llm", "max_tokens": 4097}, MAX_TOKENS),
        ({"kind": "llm", "max_tokens": 1.5}, MAX_TOKENS),
        ({"kind": "llm", "max_tokens": "100"}, MAX_TOKENS),
        ({"kind": "llm", "max_tokens": False}, MAX_TOKENS),
    ],
)  # fmt: skip
def test_validate_refuses_with_the_reason(spec: object, message: str) -> None:
    with pytest.raises(BadRequest) as exc:
        registry().validate(spec)
    assert exc.value.message == message
    assert exc.value.status == 422 and exc.value.code == "bad_request"


def test_validate_refuses_llm_on_a_gateway_without_a_model() -> None:
    reg = AgentRegistry(config(), ears_loader=Loader())
    with pytest.raises(BadRequest, match=re.escape("this gateway has no [llm] base_url")):
        reg.validate({"kind": "llm", "system_prompt": "You sell hats."})
    assert reg.validate({"kind": "ivr"}) == {"kind": "ivr"}  # the IVR needs no model


def test_validate_accepts_and_normalises() -> None:
    reg = registry()
    assert reg.validate({"kind": "ivr"}) == {"kind": "ivr"}
    spec = {
        "kind": "llm", "system_prompt": "p" * MAX_PROMPT_CHARS, "greeting": "g" * 300,
        "model": "m" * 200, "temperature": 0, "max_tokens": 4096,
        "vars": {"name": "Ada", "account": 42, "balance": 12.5},
    }  # fmt: skip
    out = reg.validate(spec)
    assert out["vars"] == {"name": "Ada", "account": "42", "balance": "12.5"}
    assert {k: v for k, v in out.items() if k != "vars"} == {
        k: v for k, v in spec.items() if k != "vars"
    }
    assert spec["vars"] == {"name": "Ada", "account": 42, "balance": 12.5}  # not modified
    assert reg.validate({"kind": "llm"}) == {"kind": "llm", "vars": {}}
    assert reg.validate({"kind": "llm", "temperature": 2, "max_tokens": 1})["max_tokens"] == 1
    many = {f"v{i}": "x" * MAX_VAR_CHARS for i in range(MAX_VARS)}
    assert reg.validate({"kind": "llm", "vars": many})["vars"] == many


def test_validation_errors_are_control_errors() -> None:
    # The API answers every ControlError with its status: a 422 here, not a 500.
    with pytest.raises(ControlError):
        registry().validate({"kind": "llm", "vars": 3})


async def test_a_validated_request_never_builds_a_greeting_too_long_to_say() -> None:
    reg = registry()  # synth.max_text_chars = 300
    try:
        for spec in (
            {"kind": "llm", "greeting": "Hi {a}{a}", "vars": {"a": "x" * 200}},
            {"kind": "llm", "greeting": "Hi {a:>400}", "vars": {"a": "x"}},
            {"kind": "llm", "vars": {"greeting": "y" * 301}},
        ):
            try:
                checked = reg.validate(spec)
            except BadRequest as exc:
                assert exc.message.startswith("agent.greeting"), exc.message
                continue
            agent = reg.build(INFO, checked)
            assert isinstance(agent, LlmAgent)
            assert len(agent.greeting) <= 300, (spec, len(agent.greeting))
    finally:
        await reg.close()


async def test_a_greeting_the_call_refuses_does_not_end_the_call() -> None:
    reg = registry()
    # Built without validate (a config greeting, or a check that missed): the call refuses it.
    agent = reg.build(INFO, {"kind": "llm", "greeting": "Hi {a}{a}", "vars": {"a": "x" * 200}})
    call = FakeCall(max_text_chars=300)
    try:
        await agent.on_start(call)
    finally:
        call.close()
        await agent.on_end(call)
        await reg.close()


def test_fill_never_raises() -> None:
    assert fill("Hello {caller.name}!", {"name": "Ada"}) == "Hello {caller.name}!"


def test_fill() -> None:
    assert fill("Hello {name}, about {topic}.", {"name": "Ada"}) == "Hello Ada, about {topic}."
    assert fill("No placeholders.", {"name": "Ada"}) == "No placeholders."
    assert fill("Stray { brace", {"name": "Ada"}) == "Stray { brace"  # as written
    assert fill("", {}) == ""


# -- build ------------------------------------------------------------------------------------


async def test_build_by_kind() -> None:
    reg = registry()
    try:
        assert isinstance(reg.build(INFO, None), IvrAgent)  # the default kind is ivr
        assert isinstance(reg.default(INFO), IvrAgent)
        assert isinstance(reg.build(INFO, reg.validate({"kind": "ivr"})), IvrAgent)
        agent = reg.build(INFO, reg.validate({"kind": "llm"}))
        assert isinstance(agent, LlmAgent)
        llm = reg.cfg.llm
        assert agent.system_prompt == llm.system_prompt and agent.greeting == llm.greeting
        assert agent.fallback == llm.fallback and agent.max_history == llm.max_history
        assert agent.turn == reg.cfg.turn
        c = agent.client
        assert c.url == BASE_URL + "/chat/completions" and c.model == llm.model
        assert (c.temperature, c.max_tokens, c.timeout_s) == (
            llm.temperature, llm.max_tokens, llm.timeout_s,
        )  # fmt: skip
    finally:
        await reg.close()


async def test_build_from_a_calls_request() -> None:
    reg = registry(api_key="sk-test")
    try:
        spec = reg.validate({
            "kind": "llm", "system_prompt": "You sell hats to {name}.", "greeting": "Hi {name}!",
            "model": "hat-model", "temperature": 0, "max_tokens": 50, "vars": {"name": "Ada"},
        })  # fmt: skip
        agent = reg.build(INFO, spec)
        assert isinstance(agent, LlmAgent)
        assert agent.system_prompt == "You sell hats to Ada."
        assert agent.greeting == "Hi Ada!"
        c = agent.client
        assert (c.model, c.temperature, c.max_tokens) == ("hat-model", 0.0, 50)
        assert c._headers() == {"Authorization": "Bearer sk-test"}
        assert "sk-test" not in repr(c)
        # Two llm calls share one connection pool.
        other = reg.build(INFO, reg.validate({"kind": "llm"}))
        assert isinstance(other, LlmAgent)
        assert other.client._session is c._session is not None
    finally:
        await reg.close()


async def test_an_llm_gateway_builds_llm_agents_by_default() -> None:
    reg = registry(config(agent__kind="llm", llm__base_url=BASE_URL))
    try:
        assert isinstance(reg.default(INFO), LlmAgent)
        assert isinstance(reg.build(INFO, {"kind": "ivr"}), IvrAgent)
    finally:
        await reg.close()


async def test_the_ear_is_loaded_once() -> None:
    loader = Loader()
    reg = AgentRegistry(config(llm__base_url=BASE_URL), ears_loader=loader)
    await reg.warm()  # the default is the IVR: nothing to load
    assert loader.loads == 0
    ears = await asyncio.gather(*(reg.ears() for _ in range(5)))
    assert loader.loads == 1 and all(e is ears[0] for e in ears)

    loader = Loader()
    reg = AgentRegistry(config(agent__kind="llm", llm__base_url=BASE_URL), ears_loader=loader)
    await reg.warm()
    assert loader.loads == 1
    await reg.ears()
    assert loader.loads == 1


# -- config -----------------------------------------------------------------------------------


def test_llm_agent_needs_a_base_url() -> None:
    with pytest.raises(ConfigError) as exc:
        load(None, env={}, overrides={"agent.kind": "llm"})
    assert str(exc.value).startswith("llm.base_url:")
    with pytest.raises(ConfigError, match=r"^llm\.base_url:"):
        load(None, env={"VOXGATE_AGENT_KIND": "llm"})
    cfg = load(None, env={"VOXGATE_AGENT_KIND": "llm", "VOXGATE_LLM_BASE_URL": BASE_URL})
    assert cfg.agent.kind == "llm" and cfg.llm.base_url == BASE_URL
    with pytest.raises(ConfigError, match=r"^llm\.base_url: expected an http\(s\) URL"):
        load(None, env={}, overrides={"llm.base_url": "ftp://example.com/v1"})
    with pytest.raises(ConfigError, match=r"^agent\.kind"):
        load(None, env={}, overrides={"agent.kind": "robot"})


def test_api_key_comes_from_the_named_variable() -> None:
    cfg = load(None, env={}, overrides={"llm.base_url": BASE_URL, "llm.api_key_env": "MY_LLM_KEY"})
    with pytest.raises(ConfigError) as exc:
        cfg.llm.api_key(env={})
    assert str(exc.value) == "llm.api_key_env: the environment variable MY_LLM_KEY is not set"
    with pytest.raises(ConfigError, match="MY_LLM_KEY is not set"):
        cfg.llm.api_key(env={"MY_LLM_KEY": ""})
    assert cfg.llm.api_key(env={"MY_LLM_KEY": "sk-123"}) == "sk-123"
    assert config(llm__base_url=BASE_URL).llm.api_key(env={"MY_LLM_KEY": "sk"}) is None
    # A key pasted where its variable's name belongs is refused, not used.
    with pytest.raises(ConfigError, match=r"^llm\.api_key_env: the NAME"):
        load(None, env={}, overrides={"llm.api_key_env": "sk-live-0123456789"})


def test_cli_refuses_an_llm_gateway_without_a_model(tmp_path: Path) -> None:
    voxgate = Path(sys.executable).with_name("voxgate")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    out = subprocess.run(
        [str(voxgate), "gateway", "--agent-kind", "llm"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("voxgate: config error: llm.base_url: "), lines[0]
    assert out.stdout == ""
