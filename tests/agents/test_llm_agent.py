"""The llm agent against the real scripted model server (``voxgate mock-llm`` on 127.0.0.1)
with a recording ``CallHandle``: the caller is heard through the agent's own ear (voiced sound
in the call's tap, a recogniser that answers with the test's words), the reply is spoken in
the chunker's pieces, and the playout's ends (done, or interrupted with the words heard) are
played back to the agent as the call would.

Covered: the greeting (config, per-call vars); what the model is sent (system, greeting, the
caller, and only the words the caller heard of earlier answers); barge-in cutting the
history and the running generation; the tools (hangup, end_call_after_reply, send_dtmf,
transfer, malformed arguments, an unknown tool); model failures (status, garbage, timeout,
refused connection) each reported and answered with the fallback line, the call going on; the
history's bound; ``heard_text``."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.agents.llm import Ears, LlmAgent, heard_text
from gateway.agents.registry import AgentRegistry
from gateway.call.control import (
    AgentError,
    AgentTurn,
    BargeIn,
    Transcript,
    TransferOutcome,
    UtteranceFinished,
)
from gateway.llm.client import ChatClient
from tests.agents.audio import silence, voiced
from tests.agents.fakes import FakeCall, FakeStt
from tests.waiting import wait_for
from voxgate.bench.mock_llm import MockLlm, Script
from voxgate.contract.chunker import chunk_text
from voxgate.contract.config import TurnConfig, load

SYSTEM = "You are the test agent of a call center."
GREETING = "Hello, thank you for calling. How can I help?"
FALLBACK = "Sorry, could you say that again?"
HOURS = "Sure, we are open Monday to Friday from eight to six. On Saturdays we open at nine."
Message = dict[str, Any]


class Rig:
    """One agent on one fake call, its model server, and the test's hands on both."""

    def __init__(self, mock: MockLlm, url: str, disconnects: list[str]) -> None:
        self.mock = mock
        self.url = url
        self.disconnects = disconnects
        self.stt = FakeStt()
        self.call = FakeCall()
        self.clients: list[ChatClient] = []
        self.agent: LlmAgent | None = None
        self.finished: set[str] = set()

    def client(self, url: str | None = None, *, timeout_s: float = 5.0) -> ChatClient:
        c = ChatClient(
            url or self.url, "test-model", api_key=None, temperature=0.3, max_tokens=200,
            timeout_s=timeout_s,
        )  # fmt: skip
        self.clients.append(c)
        return c

    async def ears(self) -> Ears:
        return Ears(self.stt, None)

    async def start(
        self, *, greeting: str = "", max_history: int = 40, timeout_s: float = 5.0
    ) -> LlmAgent:
        self.agent = LlmAgent(
            client=self.client(timeout_s=timeout_s), ears=self.ears, turn=TurnConfig(),
            system_prompt=SYSTEM, greeting=greeting, fallback=FALLBACK, max_history=max_history,
        )  # fmt: skip
        await self.agent.on_start(self.call)
        return self.agent

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.mock.requests

    def messages(self, i: int = -1) -> list[Message]:
        return list(self.requests[i]["messages"])

    async def caller_says(self, text: str, *, request: bool = True) -> None:
        """The caller speaks (half a second, then a pause that ends the turn); waits until
        the agent has the turn (and, with ``request``, until the model has been asked)."""
        before = len(self.requests)
        heard = len(self.caller_lines())
        self.stt.text = text
        (tap,) = self.call.taps
        tap.push(voiced(0.5), agent_audible=False)
        tap.push(silence(0.5), agent_audible=False)
        await wait_for(lambda: len(self.caller_lines()) > heard, timeout=5)
        assert self.caller_lines()[-1] == text
        if request:
            await wait_for(lambda: len(self.requests) > before, timeout=5)

    def caller_lines(self) -> list[str]:
        return [
            e.text for e in self.call.events
            if isinstance(e, Transcript) and e.role == "caller" and e.final
        ]  # fmt: skip

    def agent_lines(self) -> list[str]:
        return [e.text for e in self.call.events if isinstance(e, Transcript) and e.role == "agent"]

    def errors(self) -> list[AgentError]:
        return [e for e in self.call.events if isinstance(e, AgentError)]

    async def said(self, *texts: str, timeout: float = 5.0) -> list[str]:
        """Waits until ``texts`` are the latest pieces said; returns their ids."""
        n = len(texts)
        await wait_for(lambda: self.call.texts[-n:] == list(texts), timeout=timeout)
        return self.call.ids[-n:]

    async def said_reply(self, *replies: str, timeout: float = 5.0) -> list[str]:
        """Waits until the pieces of ``replies`` (as the chunker cuts each) are the latest
        said; returns their ids."""
        return await self.said(*[p for text in replies for p in chunk_text(text)], timeout=timeout)

    async def finish(self, utt: str, outcome: str = "done", heard: str | None = None) -> None:
        """The playout's end of one utterance, as the call reports it."""
        assert self.agent is not None
        text = self.call.said[utt]
        if heard is None:
            heard = " ".join(w.strip(",.?!") for w in text.split()) if outcome == "done" else ""
        self.finished.add(utt)
        await self.agent.on_event(self.call, UtteranceFinished(
            self.call.id, utterance_id=utt, outcome=outcome, heard=heard, text=text,
        ))  # fmt: skip

    async def finish_all(self) -> None:
        for utt in self.call.ids:
            if utt not in self.finished:
                await self.finish(utt)

    async def close(self) -> None:
        self.call.close()
        if self.agent is not None:
            await asyncio.wait_for(self.agent.on_end(self.call), 5)
        for c in self.clients:
            await c.close()


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def rig() -> AsyncIterator[RigFactory]:
    made: list[tuple[Rig, TestServer]] = []

    async def make(*turns: dict[str, Any], default: str = "I am the default answer.") -> Rig:
        mock = MockLlm(Script({"turns": list(turns), "default": {"reply": default}}))
        disconnects: list[str] = []

        @web.middleware
        async def watch(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                resp: web.StreamResponse = await handler(request)
                return resp
            except (ConnectionResetError, asyncio.CancelledError) as exc:
                disconnects.append(type(exc).__name__)  # the client went away mid-answer
                raise

        app = mock.app()
        app.middlewares.append(watch)
        srv = TestServer(app, host="127.0.0.1")
        await srv.start_server()
        r = Rig(mock, str(srv.make_url("/v1")), disconnects)
        made.append((r, srv))
        return r

    yield make
    for r, srv in made:
        await r.close()
        await srv.close()


def closed_port_url() -> str:
    with socket.socket() as s:  # free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


def check_tool_pairs(messages: list[Message]) -> None:
    """What an OpenAI-compatible server insists on: every assistant tool call is answered by
    a tool message right after it, and no tool message answers nothing."""
    open_ids: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_ids, messages
            open_ids.discard(m["tool_call_id"])
            continue
        assert not open_ids, f"tool calls without results: {open_ids}: {messages}"
        if m["role"] == "assistant" and m.get("tool_calls"):
            open_ids = {c["id"] for c in m["tool_calls"]}
    assert not open_ids, f"tool calls without results: {open_ids}: {messages}"


# -- greeting and one exchange ---------------------------------------------------------------


async def test_greeting_then_a_turn_streamed_in_pieces(rig: RigFactory) -> None:
    r = await rig({"match": "opening hours", "reply": HOURS + " Anything else?"})
    agent = await r.start(greeting=GREETING)
    assert r.call.texts == [GREETING]
    assert agent.history == [{"role": "assistant", "content": ""}]  # nothing heard yet
    await r.finish_all()
    assert agent.history == [{"role": "assistant", "content": GREETING}]
    assert r.agent_lines() == [GREETING]

    await r.caller_says("What are your opening hours?")
    req = r.requests[-1]
    assert req["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": "What are your opening hours?"},
    ]
    assert req["stream"] is True and req["model"] == "test-model"
    assert tool_names(req) == {"hangup", "send_dtmf", "transfer", "end_call_after_reply"}

    pieces = chunk_text(HOURS + " Anything else?")
    assert len(pieces) == 4
    ids = await r.said(*pieces)
    assert r.call.texts == [GREETING, *pieces]
    (turn,) = [e for e in r.call.events if isinstance(e, AgentTurn)]
    assert turn.utterance_id == ids[0] and turn.text == "What are your opening hours?"
    assert turn.reason == "silence" and turn.first_token_at is not None
    assert turn.first_say_at is not None and turn.first_say_at >= turn.first_token_at

    # The agent's transcript line comes once every piece has played, with all of them.
    for utt in ids[:-1]:
        await r.finish(utt)
    assert r.agent_lines() == [GREETING]
    await r.finish(ids[-1])
    assert r.agent_lines() == [GREETING, " ".join(pieces)]
    assert agent.history[-1] == {"role": "assistant", "content": " ".join(pieces)}
    assert r.errors() == []


async def test_no_greeting_says_nothing_until_the_caller_speaks(rig: RigFactory) -> None:
    r = await rig({"match": "hello", "reply": "Hi there."})
    agent = await r.start(greeting="  ")
    await asyncio.sleep(0.1)
    assert r.call.texts == [] and agent.history == []
    await r.caller_says("Hello?")
    assert r.messages() == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello?"},
    ]
    await r.said("Hi there.")


async def test_greeting_from_the_calls_vars(rig: RigFactory) -> None:
    r = await rig({"match": "balance", "reply": "It is forty dollars."})
    cfg = load(None, env={}, overrides={
        "agent.kind": "llm", "llm.base_url": r.url,
        "llm.greeting": "Hello {name}, this is {company}. How can I help?",
        "llm.system_prompt": "You help {name} with account {account}.",
    })  # fmt: skip
    registry = AgentRegistry(cfg, ears_loader=lambda _cfg: Ears(r.stt, None))
    try:
        spec = registry.validate({"kind": "llm", "vars": {"name": "Ada", "account": 42}})
        agent = registry.build(r.call.info, spec)
        assert isinstance(agent, LlmAgent)
        r.agent = agent
        await agent.on_start(r.call)
        # Known names filled, unknown ones left as written.
        filled = "Hello Ada, this is {company}. How can I help?"
        assert r.call.texts == [filled]
        await r.finish_all()
        assert agent.history == [{"role": "assistant", "content": filled}]
        await r.caller_says("What is my balance?")
        assert r.messages() == [
            {"role": "system", "content": "You help Ada with account 42."},
            {"role": "assistant", "content": filled},
            {"role": "user", "content": "What is my balance?"},
        ]
        await r.said("It is forty dollars.")

        # A "greeting" var replaces the configured greeting (filled from the vars too).
        call2 = FakeCall("call-2")
        spec = registry.validate(
            {"kind": "llm", "vars": {"name": "Bob", "greeting": "Hi {name}, calling back."}}
        )
        agent2 = registry.build(call2.info, spec)
        await agent2.on_start(call2)
        assert call2.texts == ["Hi Bob, calling back."]
        call2.close()
        await agent2.on_end(call2)
    finally:
        await registry.close()


# -- barge-in --------------------------------------------------------------------------------


async def test_barge_in_keeps_only_the_words_heard(rig: RigFactory) -> None:
    reply = "Sure thing. We are open Monday to Friday, from eight to six. On Saturdays at nine."
    r = await rig(
        {"match": "open", "reply": reply},
        {"match": "sunday", "reply": "On Sundays we are closed."},
    )
    agent = await r.start()
    await r.caller_says("When are you open?")
    pieces = chunk_text(reply)
    assert pieces[:2] == ["Sure thing.", "We are open Monday to Friday, from eight to six."]
    ids = await r.said(*pieces)
    await r.finish(ids[0])
    await agent.on_event(r.call, BargeIn(r.call.id, utterance_id=ids[1]))
    await r.finish(ids[1], "interrupted", heard="We are open")
    await r.finish(ids[2], "cancelled")
    assert r.agent_lines() == ["Sure thing. We are open"]

    await r.caller_says("And on Sunday?")
    assert r.messages() == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "When are you open?"},
        {"role": "assistant", "content": "Sure thing. We are open"},
        {"role": "user", "content": "And on Sunday?"},
    ]
    assert "Saturdays" not in json.dumps(r.requests)
    await r.said("On Sundays we are closed.")


async def test_punctuation_of_the_heard_prefix_is_kept(rig: RigFactory) -> None:
    reply = "Well, your balance, as of today, is forty dollars and ten cents."
    r = await rig({"match": "balance", "reply": reply}, {"match": "what", "reply": "Forty."})
    await r.start()
    await r.caller_says("What is my balance?")
    pieces = chunk_text(reply)
    ids = await r.said(*pieces)
    assert pieces[0] == "Well,"
    await r.finish(ids[0])
    await r.finish(ids[1], "interrupted", heard="your balance as of")
    for utt in ids[2:]:
        await r.finish(utt, "cancelled")
    await r.caller_says("Sorry, what?")
    assert r.messages()[-2] == {"role": "assistant", "content": "Well, your balance, as of"}


async def test_barge_in_closes_the_generation_still_streaming(rig: RigFactory) -> None:
    sentences = " ".join(f"Payment number {n} was made on time." for n in range(2, 30))
    reply = "Okay, let me read them. " + sentences
    r = await rig(
        {"match": "payments", "reply": reply, "chunk_words": 1, "gap_ms": 60},
        {"match": "stop", "reply": "Of course."},
    )
    agent = await r.start()
    await r.caller_says("Read me my payments.")
    await wait_for(lambda: len(r.call.said) >= 2, timeout=5)
    ids = r.call.ids
    await agent.on_event(r.call, BargeIn(r.call.id, utterance_id=ids[0]))
    n = len(r.call.said)
    # The HTTP stream is closed: the server's next write finds the client gone.
    await wait_for(lambda: bool(r.disconnects), timeout=3)
    await asyncio.sleep(0.5)
    assert len(r.call.said) == n  # nothing more was said
    assert "Payment number 29" not in " ".join(r.call.texts)
    await r.finish(ids[0], "interrupted", heard="Okay")
    for utt in r.call.ids[1:]:
        await r.finish(utt, "cancelled")

    await r.caller_says("Stop, please.")
    assert r.messages()[-2:] == [
        {"role": "assistant", "content": "Okay,"},
        {"role": "user", "content": "Stop, please."},
    ]
    await r.said("Of course.")


async def test_a_new_turn_supersedes_the_answer_being_written(rig: RigFactory) -> None:
    slow = " ".join(f"Item {n} is on the list." for n in range(2, 40))
    r = await rig(
        {"match": "list", "reply": "Here is the list. " + slow, "chunk_words": 1, "gap_ms": 60},
        {"match": "actually", "reply": "No problem."},
    )
    await r.start()
    await r.caller_says("Read me the list.")
    await wait_for(lambda: len(r.call.said) >= 1, timeout=5)
    r.call.speaking = True
    await r.finish_all()  # what was said so far has played
    await r.caller_says("Actually, never mind.")
    assert r.call.interrupts == 1  # the agent stopped talking for the caller
    r.call.speaking = False
    await r.said("No problem.")
    await wait_for(lambda: bool(r.disconnects), timeout=3)
    assert not any("Item 39" in t for t in r.call.texts)


# -- tools -----------------------------------------------------------------------------------


async def test_hangup_after_the_words_before_it(rig: RigFactory) -> None:
    r = await rig({
        "match": "goodbye", "reply": "Thank you for calling, goodbye.",
        "tool_calls": [{"name": "hangup", "arguments": {"reason": "caller is done"}}],
    })  # fmt: skip
    await r.start()
    await r.caller_says("That's all, goodbye.")
    ids = await r.said("Thank you for calling,", "goodbye.")
    await asyncio.sleep(0.2)
    assert r.call.hangups == []  # the goodbye is still playing
    await r.finish(ids[0])
    await asyncio.sleep(0.1)
    assert r.call.hangups == []
    await r.finish(ids[1])
    await wait_for(lambda: r.call.hangups == ["agent"], timeout=3)
    assert len(r.requests) == 1  # hangup needs no second answer


async def test_end_call_after_reply_without_words_asks_for_them(rig: RigFactory) -> None:
    r = await rig(
        {"match": "bye", "tool_calls": [{"name": "end_call_after_reply", "arguments": {}}]},
        {"match": "bye", "reply": "Goodbye, have a nice day."},
    )
    agent = await r.start()
    await r.caller_says("Okay bye.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    follow = r.messages(1)
    assistant, tool = follow[-2:]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "end_call_after_reply"
    assert tool["role"] == "tool" and tool["tool_call_id"] == call["id"]
    assert json.loads(tool["content"])["ok"] is True
    check_tool_pairs(follow)
    ids = await r.said("Goodbye,", "have a nice day.")
    await asyncio.sleep(0.1)
    assert r.call.hangups == []
    await r.finish(ids[0])
    await r.finish(ids[1])
    await wait_for(lambda: r.call.hangups == ["agent"], timeout=3)
    assert agent.history[-1] == {"role": "assistant", "content": "Goodbye, have a nice day."}


async def test_end_call_after_reply_with_words_hangs_up_after_them(rig: RigFactory) -> None:
    r = await rig({
        "match": "bye", "reply": "Goodbye.",
        "tool_calls": [{"name": "end_call_after_reply", "arguments": {}}],
    })  # fmt: skip
    await r.start()
    await r.caller_says("Bye now.")
    ids = await r.said("Goodbye.")
    await asyncio.sleep(0.2)
    assert r.call.hangups == [] and len(r.requests) == 1
    await r.finish(ids[0])
    await wait_for(lambda: r.call.hangups == ["agent"], timeout=3)
    assert len(r.requests) == 1


async def test_send_dtmf_then_the_model_hears_the_result(rig: RigFactory) -> None:
    r = await rig(
        {"match": "menu", "reply": "Pressing one for you.",
         "tool_calls": [{"name": "send_dtmf", "arguments": {"digits": "1"}}]},
        {"match": "menu", "reply": "Done, the menu should answer now."},
    )  # fmt: skip
    agent = await r.start()
    await r.caller_says("Please choose one in the menu.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    assert r.call.dtmf == ["1"]
    follow = r.messages(1)
    assert follow[:2] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Please choose one in the menu."},
    ]
    assistant, tool = follow[2:]
    assert assistant["role"] == "assistant"
    (call,) = assistant["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "send_dtmf"
    assert json.loads(call["function"]["arguments"]) == {"digits": "1"}
    assert tool == {
        "role": "tool", "tool_call_id": call["id"], "content": json.dumps({"ok": True, "sent": "1"})
    }  # fmt: skip
    await r.said_reply("Pressing one for you.", "Done, the menu should answer now.")
    await r.finish_all()
    # Once played, the tool-call message holds the words heard of it.
    tool_msg = next(m for m in agent.history if m.get("tool_calls"))
    assert tool_msg["content"] == "Pressing one for you."
    assert r.errors() == []


async def test_send_dtmf_with_bad_digits_is_refused_to_the_model(rig: RigFactory) -> None:
    r = await rig(
        {"match": "press", "tool_calls": [{"name": "send_dtmf", "arguments": {"digits": "1x"}}]},
        {"match": "press", "reply": "Which key was it?"},
    )
    await r.start()
    await r.caller_says("Press one x.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    assert r.call.dtmf == []
    tool = r.messages(1)[-1]
    assert tool["role"] == "tool"
    assert json.loads(tool["content"]) == {"ok": False, "error": "digits must be 0-9 * # A-D"}
    await r.said("Which key was it?")


async def test_a_refused_transfer_is_told_to_the_model_which_answers_the_caller(
    rig: RigFactory,
) -> None:
    r = await rig(
        {"match": "person", "reply": "Putting you through.",
         "tool_calls": [{"name": "transfer", "arguments": {"to": "2000"}}]},
        {"match": "person", "reply": "Sorry, nobody is free. I can help you myself."},
    )  # fmt: skip
    r.call.transfer_outcome = TransferOutcome("refused", 603, "Decline")
    await r.start()
    await r.caller_says("Put me through to a person.")
    ids = await r.said("Putting you through.")
    await asyncio.sleep(0.2)
    assert r.call.transfers == []  # the caller hears "putting you through" first
    await r.finish(ids[0])
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    # A number goes to the far end's host; a refused REFER may still become a bridged call.
    assert r.call.transfers == [("sip:2000@example.com", "blind", "bridge")]
    follow = r.messages(1)
    check_tool_pairs(follow)
    result = json.loads(follow[-1]["content"])
    assert result["ok"] is False and result["result"] == "refused" and result["status"] == 603
    await r.said_reply("Sorry, nobody is free. I can help you myself.")
    assert r.call.hangups == [] and r.errors() == []


async def test_a_completed_transfer_ends_the_agents_part(rig: RigFactory) -> None:
    r = await rig(
        {"match": "person", "reply": "Putting you through.",
         "tool_calls": [{"name": "transfer", "arguments": {"to": "sip:desk@example.com"}}]},
    )  # fmt: skip
    await r.start()
    await r.caller_says("Put me through to a person.")
    await r.finish((await r.said("Putting you through."))[0])
    await wait_for(lambda: r.call.transfers != [], timeout=5)
    await asyncio.sleep(0.3)
    assert r.call.transfers == [("sip:desk@example.com", "blind", "bridge")]
    assert len(r.requests) == 1  # the model is not asked again: the call is the person's now
    assert r.call.hangups == [] and r.errors() == []
    assert "Putting you through." in r.call.texts


async def test_malformed_tool_arguments(rig: RigFactory) -> None:
    r = await rig(
        {"match": "press", "tool_calls": [{"name": "send_dtmf", "arguments": "{oops"}]},
        {"match": "press", "reply": "Sorry, which key should I press?"},
    )
    await r.start()
    await r.caller_says("Press the key.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    (err,) = r.errors()
    assert err.kind == "tool" and err.message.startswith("send_dtmf: ")
    assert r.call.dtmf == []
    follow = r.messages(1)
    check_tool_pairs(follow)
    result = json.loads(follow[-1]["content"])
    assert result["ok"] is False and result["error"].startswith("bad arguments: ")
    await r.said_reply("Sorry, which key should I press?")


async def test_malformed_tool_arguments_are_not_replayed(rig: RigFactory) -> None:
    r = await rig(
        {"match": "press", "tool_calls": [{"name": "send_dtmf", "arguments": "{oops"}]},
        {"match": "press", "reply": "Sorry, which key should I press?"},
    )
    await r.start()
    await r.caller_says("Press the key.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    for m in r.messages(1):
        for c in m.get("tool_calls") or []:
            json.loads(c["function"]["arguments"])  # a JSON object, as servers expect


async def test_an_unknown_tool(rig: RigFactory) -> None:
    r = await rig(
        {"match": "flight", "tool_calls": [{"name": "book_flight", "arguments": {"to": "Oslo"}}]},
        {"match": "flight", "reply": "I cannot book flights."},
    )
    await r.start()
    await r.caller_says("Book me a flight.")
    await wait_for(lambda: len(r.requests) == 2, timeout=5)
    (err,) = r.errors()
    assert err.kind == "tool" and "book_flight" in err.message
    result = json.loads(r.messages(1)[-1]["content"])
    assert result == {"ok": False, "error": "unknown tool 'book_flight'"}
    await r.said("I cannot book flights.")


async def test_a_model_that_keeps_calling_tools_is_cut_off(rig: RigFactory) -> None:
    again = {"match": "loop", "tool_calls": [{"name": "send_dtmf", "arguments": {"digits": "x"}}]}
    r = await rig(*[dict(again) for _ in range(6)], {"match": "next", "reply": "Hello again."})
    agent = await r.start()
    await r.caller_says("loop forever")
    await wait_for(lambda: len(r.requests) == 3, timeout=5)
    await asyncio.sleep(0.3)
    assert len(r.requests) == 3  # MAX_TOOL_ROUNDS
    await r.caller_says("next please")
    check_tool_pairs(r.messages())
    await r.said("Hello again.")
    assert agent.history[-2]["role"] == "user"


async def test_a_tool_call_cancelled_midway_still_gets_a_result(rig: RigFactory) -> None:
    r = await rig(
        {"match": "menu", "reply": "Pressing one.",
         "tool_calls": [{"name": "send_dtmf", "arguments": {"digits": "1"}}]},
        {"match": "menu", "reply": "Done."},
        {"match": "else", "reply": "Sure."},
    )  # fmt: skip
    agent = await r.start()
    r.call.dtmf_gate = asyncio.Event()  # the far end is slow to take the keys
    await r.caller_says("Choose one in the menu.")
    ids = await r.said("Pressing one.")
    await asyncio.wait_for(r.call.dtmf_started.wait(), 5)
    await agent.on_event(r.call, BargeIn(r.call.id, utterance_id=ids[0]))
    await r.finish(ids[0], "interrupted", heard="Pressing")
    await r.caller_says("Something else.")
    check_tool_pairs(r.messages())


# -- model failures --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        ({"status": 500}, "llm_status"),
        ({"garbage": True}, "llm_malformed"),
        ({"delay_ms": 1500, "reply": "Too late."}, "llm_timeout"),
        (None, "llm_unreachable"),
    ],
)
async def test_model_failures_fall_back_and_the_call_goes_on(
    rig: RigFactory, failure: dict[str, Any] | None, kind: str
) -> None:
    turns: list[dict[str, Any]] = [{"match": "again", "reply": "Yes, I hear you now."}]
    if failure is not None:
        turns.insert(0, {"match": "first", **failure})
    r = await rig(*turns)
    agent = await r.start(timeout_s=0.3)
    working = agent.client
    if failure is None:
        agent.client = r.client(closed_port_url(), timeout_s=0.3)
    await r.caller_says("The first question.", request=failure is not None)
    ids = await r.said(FALLBACK)
    (err,) = r.errors()
    assert err.kind == kind
    if kind == "llm_status":
        assert "500" in err.message
    await r.finish(ids[0])
    assert agent.history[-1] == {"role": "assistant", "content": FALLBACK}

    agent.client = working
    await r.caller_says("Can you hear me again?")
    assert r.messages()[-3:] == [
        {"role": "user", "content": "The first question."},
        {"role": "assistant", "content": FALLBACK},
        {"role": "user", "content": "Can you hear me again?"},
    ]
    await r.said_reply("Yes, I hear you now.")
    assert len(r.errors()) == 1


async def test_a_slow_stream_within_the_deadline_is_no_failure(rig: RigFactory) -> None:
    r = await rig(
        {"match": "slow", "reply": "Let me see. " + "word " * 40, "chunk_words": 3,
         "gap_ms": 100},
    )  # fmt: skip
    agent = await r.start(timeout_s=0.3)
    # Every gap is under the deadline: the answer is complete and nothing failed.
    await r.caller_says("A slow answer.")
    await r.said("Let me see.")
    await wait_for(lambda: "word" in r.call.texts[-1], timeout=10)
    await asyncio.sleep(0.3)
    assert r.errors() == [] and FALLBACK not in r.call.texts
    assert agent.history[-2]["role"] == "user"


async def test_a_stream_stalling_after_words_adds_no_fallback(rig: RigFactory) -> None:
    r = await rig(
        {"match": "stall", "reply": "Let me see. I am looking it up now.", "chunk_words": 3,
         "gap_ms": 700},
        {"match": "there", "reply": "Yes, I am here."},
    )  # fmt: skip
    agent = await r.start(timeout_s=0.3)
    await r.caller_says("This one will stall.")
    ids = await r.said("Let me see.")
    await wait_for(lambda: bool(r.errors()), timeout=5)
    (err,) = r.errors()
    assert err.kind == "llm_timeout" and "mid-stream" in err.message
    await asyncio.sleep(0.2)
    assert r.call.texts == ["Let me see."]  # words were said: no fallback on top of them
    await r.finish(ids[0])
    await r.caller_says("Are you there?")
    assert r.messages()[-2] == {"role": "assistant", "content": "Let me see."}
    await r.said_reply("Yes, I am here.")
    assert agent.history[-2]["role"] == "user"


# -- history ---------------------------------------------------------------------------------


async def test_history_is_bounded_and_never_starts_with_a_tool_result(rig: RigFactory) -> None:
    turns: list[dict[str, Any]] = []
    for n in range(12):
        if n % 3 == 1:
            turns.append(
                {
                    "match": f"question {n}.",
                    "reply": f"Pressing {n}.",
                    "tool_calls": [{"name": "send_dtmf", "arguments": {"digits": "1"}}],
                }
            )
            turns.append({"match": f"question {n}.", "reply": f"Sent for {n}."})
        else:
            turns.append({"match": f"question {n}.", "reply": f"Answer {n}."})  # fmt: skip
    r = await rig(*turns)
    agent = await r.start(greeting=GREETING, max_history=4)
    await r.finish_all()
    seen = 0
    for n in range(12):
        await r.caller_says(f"This is question {n}.")
        want = [f"Pressing {n}.", f"Sent for {n}."] if n % 3 == 1 else [f"Answer {n}."]
        await r.said(*want)
        await r.finish_all()
        await wait_for(lambda: bool(agent._reply and agent._reply.done()), timeout=5)
        for req in r.requests[seen:]:
            messages = req["messages"]
            assert messages[0]["role"] == "system"
            assert messages[1]["role"] != "tool", messages
            check_tool_pairs(messages)
            # A turn's first request: at most max_history messages of conversation; a
            # tool round's follow-up adds the tool call and its result.
            assert len(messages) - 1 <= 4 + 2, messages
        seen = len(r.requests)
        assert len(agent.history) <= 4 + 3
        assert agent.history[0]["role"] != "tool"
    first_requests = [q for q in r.requests if q["messages"][-1]["role"] == "user"]
    assert all(len(q["messages"]) <= 1 + 4 for q in first_requests)
    # The latest exchanges are the ones kept.
    assert r.messages()[-1]["content"] == "This is question 11."
    assert GREETING not in json.dumps(r.requests[-1])


# -- what the caller heard -------------------------------------------------------------------


def finished(outcome: str, heard: str, text: str) -> UtteranceFinished:
    return UtteranceFinished("c", utterance_id="u", outcome=outcome, heard=heard, text=text)


@pytest.mark.parametrize(
    ("outcome", "heard", "text", "want"),
    [
        # Played to the end: the text as written.
        ("done", "Sure we are open", "Sure, we are open!", "Sure, we are open!"),
        ("done", "It costs five dollars", "", "It costs five dollars"),
        ("done", "", "", ""),
        # Cut short: the written words up to the cut, punctuation kept.
        ("interrupted", "We are open", "We are open Monday to Friday.", "We are open"),
        ("interrupted", "Well your balance", "Well, your balance, today, is $40.",
         "Well, your balance,"),
        ("interrupted", "well YOUR", "Well, your balance.", "Well, your"),
        ("interrupted", "Don't worry", "Don't worry, it's fine.", "Don't worry,"),
        ("interrupted", "Sure we are open Monday", "Sure, we are open Monday.",
         "Sure, we are open Monday."),
        # Spoken form differs from the written one (a number): the spoken words.
        ("interrupted", "It costs five dollars", "It costs $5 today.", "It costs five dollars"),
        ("interrupted", "One two three four", "One two three", "One two three four"),
        ("interrupted", "We are", "", "We are"),
        # Never heard.
        ("interrupted", "", "We are open.", ""),
        ("cancelled", "", "We are open.", ""),
        ("error", "We are", "We are open.", ""),
    ],
)  # fmt: skip
def test_heard_text(outcome: str, heard: str, text: str, want: str) -> None:
    assert heard_text(finished(outcome, heard, text)) == want


async def test_a_turn_made_of_the_agents_own_recent_words_is_its_echo(rig: RigFactory) -> None:
    """A line that loops the agent's voice back louder than the echo gate expects (sipp
    -rtp_echo: 0 dB) makes the recogniser hear the agent: such a turn is dropped, never sent
    to the model; the caller's own words right after are answered."""
    r = await rig({"match": "balance", "reply": "Forty dollars."})
    agent = await r.start(greeting=GREETING)
    await r.finish_all()
    r.stt.text = "thank you for calling"
    (tap,) = r.call.taps
    tap.push(voiced(0.5), agent_audible=False)
    tap.push(silence(0.5), agent_audible=False)
    await wait_for(lambda: agent.echo_turns == 1, timeout=5)
    assert r.requests == [] and r.caller_lines() == []
    await r.caller_says("What is my balance?")
    await r.said("Forty dollars.")
    assert r.messages()[-1] == {"role": "user", "content": "What is my balance?"}
