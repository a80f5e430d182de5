"""The default flow file (gateway/flow/default.toml) is today's IVR menu: the same key presses,
played through ``IvrAgent`` and through ``FlowAgent`` on the same simulated call, make callers
hear the same prompts in the same order and end the call at the same point."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import pytest

from gateway.agents.base import Agent
from gateway.agents.ivr import IvrAgent
from gateway.flow.engine import FlowAgent
from gateway.flow.source import load_flow_file
from gateway.flow.verbs import FlowBook, Gather, Limits, SetVars, Step
from tests.flow.callsim import SimCall
from tests.flow.conftest import DEFAULT_FLOW, MakeServices
from voxgate.contract.config import IvrConfig

IDLE_S = 0.2  # the idle timeout of both, short for the test


def default_book(idle_s: float = IDLE_S) -> FlowBook:
    book = load_flow_file(DEFAULT_FLOW, Limits())

    def shorter(step: Step) -> Step:
        v = step.verb
        if isinstance(v, Gather):
            return dataclasses.replace(step, verb=dataclasses.replace(v, timeout=idle_s))
        return step

    return book.map_steps(shorter)


Action = Callable[[SimCall], Awaitable[None]]


def key(d: str) -> Action:
    async def act(call: SimCall) -> None:
        await call.key(d)

    return act


async def finish(call: SimCall) -> None:
    if call.playing is not None:
        await call.finish()


async def idle(call: SimCall) -> None:
    await asyncio.sleep(IDLE_S * 2.5)  # past the idle timeout: both say goodbye
    await call.settle()


SCRIPTS: dict[str, list[Action]] = {
    "every option": [finish, key("1"), finish, key("2"), finish, key("9"), finish, key("0"),
                     finish],
    "keys cut the prompts": [key("1"), key("2"), key("9"), key("1"), finish, key("0"), finish],
    "invalid keys": [finish, key("5"), finish, key("#"), key("*"), finish, key("2"), finish,
                     key("0"), finish],
    "idle after the greeting": [finish, idle, finish],
    "idle after a choice": [key("2"), finish, idle, finish],
    "idle after an invalid key": [key("7"), finish, idle, finish],
}  # fmt: skip


async def run(agent: Agent, script: list[Action]) -> tuple[list[str], int, list[str]]:
    """What the caller heard (each utterance's text, in order), how many hang-ups, and how
    each utterance ended."""
    call = SimCall(agent)
    await call.start()
    await call.settle()
    for act in script:
        await act(call)
    hangups = len(call.hangups)
    outcomes = [call.outcomes.get(u, "playing") for u in call.ids]
    await call.close_call()
    return call.texts, hangups, outcomes


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_the_default_flow_sounds_like_the_ivr(name: str, make_services: MakeServices) -> None:
    script = SCRIPTS[name]
    ivr = await run(IvrAgent(IvrConfig(idle_timeout_s=IDLE_S)), script)
    flow = await run(FlowAgent(make_services(default_book())), script)
    assert flow == ivr
    assert ivr[0][0].startswith("Thank you for calling voxgate.")
    assert ivr[1] == 1  # every script ends the call


def test_the_default_flow_carries_the_ivr_defaults() -> None:
    """The file's texts are [ivr]'s defaults (a change to one must be made to the other)."""
    cfg = IvrConfig()
    book = load_flow_file(DEFAULT_FLOW, Limits())
    prompt = {
        name: dict(v.values)["prompt"]
        for name, steps in book.flows.items()
        for v in [steps[0].verb]
        if isinstance(v, SetVars)
    }
    assert prompt == {"main": cfg.greeting, "hours": cfg.menu["1"], "balance": cfg.menu["2"],
                      "invalid": cfg.invalid}  # fmt: skip
    said = {name: steps[0].verb.text for name, steps in book.flows.items()  # type: ignore[union-attr]
            if name in ("goodbye", "idle")}  # fmt: skip
    assert said == {"goodbye": cfg.menu["0"], "idle": cfg.goodbye}
    (menu,) = book.flows["menu"]
    assert isinstance(menu.verb, Gather) and menu.verb.timeout == cfg.idle_timeout_s
    branches = dict(menu.verb.route.branches)
    assert branches[cfg.repeat_digit] == "main" and branches[cfg.hangup_digits] == "goodbye"
