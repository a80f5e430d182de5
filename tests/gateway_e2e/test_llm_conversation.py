"""A whole conversation with the llm agent over a real SIP call: the caller's speech goes out
as RTP from the project's client, the gateway hears it (webrtcvad, faster-whisper tiny.en,
smart-turn), asks the scripted OpenAI-compatible server and speaks the answer in the warmed-up
voice; the answer the caller receives is checked with the speech-to-text itself.

Greeting → a question → the answer heard → a question whose long answer the caller cuts short
(barge-in) → the next model request carries the assistant turn only up to the words heard →
a tool call that hangs up."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from gateway.call.control import AgentError, AgentTurn, BargeIn, Transcript
from gateway.stt.base import SpeechToText, to_stt_rate
from gateway.stt.wer import words
from synth.engines.base import Engine
from tests.gateway_e2e.test_bargein import caller_speech
from voxgate.bench.localgw import local_gateway
from voxgate.bench.mock_llm import MockLlm, Script
from voxgate.bench.sipclient import ClientCall, SipClient

pytestmark = pytest.mark.slow

HOURS = (
    "We are open Monday to Friday from eight in the morning until six in the evening. "
    "On Saturdays we open at nine and close at one in the afternoon. On Sundays and public "
    "holidays the office is closed, but our website and the automated line are always open."
)
SCRIPT = {
    "turns": [
        {"match": "balance", "reply": "Your balance is forty two dollars."},
        {"match": "hours", "reply": HOURS, "chunk_words": 2, "gap_ms": 20},
        {
            "match": "hang up",
            "reply": "Goodbye.",
            "tool_calls": [{"name": "hangup", "arguments": {"reason": "caller asked"}}],
        },
    ],
    "default": {"reply": "Sorry, could you repeat that?"},
}


@pytest.fixture
async def mock_llm() -> AsyncIterator[TestServer]:
    srv = TestServer(MockLlm(Script(SCRIPT)).app(), host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


async def requests_of(srv: TestServer) -> list[dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{srv.port}/requests") as r:
        body = await r.json()
    return list(body["requests"] if isinstance(body, dict) else body)


async def transcribe(stt: SpeechToText, pcm: np.ndarray) -> str:
    """What the caller received, as the STT hears it (off the loop the call's media runs on)."""
    loop = asyncio.get_running_loop()
    return (await loop.run_in_executor(None, stt.transcribe, to_stt_rate(pcm, 8000))).text


def say(call: ClientCall, speech: np.ndarray) -> float:
    """Send the caller's speech; returns (about) when its last packet goes out."""
    call.media.send_audio(speech)
    return time.time() + len(speech) / 8000 - 0.2


async def reply_audio(call: ClientCall, after: float) -> np.ndarray:
    """The agent's answer as the caller received it, from its first audible packet to 0.8 s
    of quiet."""
    first = await call.media.wait_for_audio(after=after, timeout=15)
    await call.media.wait_for_quiet(quiet_s=0.8, timeout=30)
    _, pcm = call.media.frames(since=first.arrival)
    return np.concatenate(pcm)


async def test_a_whole_conversation(mock_llm: TestServer, engine: Engine) -> None:
    balance = caller_speech(engine, "Hi, I would like to check the balance on my account.")
    hours = caller_speech(engine, "And what are your opening hours?")
    stop = caller_speech(engine, "Sorry, please hang up now.")
    overrides = {
        "agent.kind": "llm",
        "llm.base_url": f"http://127.0.0.1:{mock_llm.port}/v1",
        "llm.greeting": "Hello, you are speaking with the voxgate assistant.",
    }
    async with local_gateway(engine, name="llm", overrides=overrides) as local:
        gw = local.gw
        ears = await gw.agents.ears()
        client = await SipClient.open("127.0.0.1")
        try:
            call = await client.invite(local.sip, codecs=("PCMU",))
            assert call.status == 200 and call.media is not None
            (gw_call,) = gw.manager.calls.values()
            # 1. The greeting.
            greeting = await reply_audio(call, 0.0)
            heard = await transcribe(ears.stt, greeting)
            assert "assistant" in words(heard), heard

            # 2. A question, and the answer heard on the line.
            answer = await reply_audio(call, say(call, balance))
            heard = await transcribe(ears.stt, answer)
            # Whisper writes numbers as digits: "your balance is $42."
            assert "balance" in words(heard) and ("42" in heard or "forty" in words(heard)), heard

            # 3. A question with a long answer, cut short by the caller.
            await call.media.wait_for_audio(after=say(call, hours), timeout=15)
            await asyncio.sleep(2.0)  # a few words of the answer
            call.media.send_audio(stop)
            for _ in range(100):
                if gw_call.bargeins:
                    break
                await asyncio.sleep(0.1)
            assert gw_call.bargeins, "the caller's speech did not stop the answer"

            # 4. The stop request ends in a hangup tool call: the caller gets a BYE.
            await asyncio.wait_for(call.remote_bye.wait(), 30)
        finally:
            client.close()

        requests = await requests_of(mock_llm)
        assert len(requests) == 3, json.dumps([r["messages"] for r in requests])
        last = requests[-1]["messages"]
        assert isinstance(last, list)
        roles = [m["role"] for m in last]
        assert roles[0] == "system"
        # The caller's turns as the STT heard them.
        users = [m["content"] for m in last if m["role"] == "user"]
        assert "balance" in words(users[0]) and "hours" in words(users[1]), users
        assert "hang" in words(users[2]), users
        # The assistant's hours answer only up to what the caller heard before cutting in.
        assistant = [m["content"] for m in last if m["role"] == "assistant"]
        assert assistant[1] == "Your balance is forty two dollars.", assistant
        cut = assistant[2]
        assert cut and HOURS.startswith(cut) and len(cut) < len(HOURS) * 0.8, cut
        # The model was offered the tools.
        tools = requests[-1]["tools"]
        assert isinstance(tools, list)
        assert {t["function"]["name"] for t in tools} >= {"hangup", "send_dtmf", "transfer"}

        # The call's record and events tell the same story.
        record = gw.manager.call_record(gw_call.id)
        assert record["state"] == "ended" and record["end_reason"] == "agent"
        lines = record["transcript"]
        assert isinstance(lines, list)
        caller_lines = [x["text"] for x in lines if x["role"] == "caller"]
        agent_lines = [x["text"] for x in lines if x["role"] == "agent"]
        assert len(caller_lines) == 3 and "Goodbye." in agent_lines, json.dumps(lines)
        assert any(isinstance(e, BargeIn) for e in gw_call.history)
        turns = [e for e in gw_call.history if isinstance(e, AgentTurn)]
        assert len(turns) == 3 and all(t.first_token_at for t in turns)
        partial = [e for e in gw_call.history if isinstance(e, Transcript) and not e.final]
        assert all(p.role == "caller" for p in partial)


BROKEN_SCRIPT = {
    "turns": [
        {"match": "subscription", "status": 500},
        {"match": "balance", "reply": "Your balance is forty two dollars."},
        {"match": "hours", "reply": "We are open until six."},
    ],
    "default": {"reply": "Sorry, could you repeat that?"},
}


async def test_a_failing_model_gets_the_fallback_and_the_neighbour_call_is_untouched(
    engine: Engine,
) -> None:
    """One call's model request fails (HTTP 500) while another call's succeeds: the first
    caller hears the fallback line and can go on talking; the second hears its answer."""
    cancel = caller_speech(engine, "I want to cancel my subscription today.")
    balance = caller_speech(engine, "Hi, I would like to check the balance on my account.")
    hours = caller_speech(engine, "And what are your opening hours?")
    srv = TestServer(MockLlm(Script(BROKEN_SCRIPT)).app(), host="127.0.0.1")
    await srv.start_server()
    overrides = {
        "agent.kind": "llm",
        "llm.base_url": f"http://127.0.0.1:{srv.port}/v1",
        "llm.greeting": "Hello.",
        "llm.fallback": "Sorry, our assistant is not available right now.",
    }
    try:
        async with local_gateway(engine, name="llm2", overrides=overrides) as local:
            ears = await local.gw.agents.ears()
            client = await SipClient.open("127.0.0.1")
            try:
                a = await client.invite(local.sip, codecs=("PCMU",))
                b = await client.invite(local.sip, codecs=("PCMU",))
                await asyncio.gather(reply_audio(a, 0.0), reply_audio(b, 0.0))
                heard_a, heard_b = await asyncio.gather(
                    reply_audio(a, say(a, cancel)), reply_audio(b, say(b, balance))
                )
                text_a = await transcribe(ears.stt, heard_a)
                text_b = await transcribe(ears.stt, heard_b)
                assert "available" in words(text_a), text_a
                assert "balance" in words(text_b), text_b
                # The failed call goes on: its next question is answered.
                text_a = await transcribe(ears.stt, await reply_audio(a, say(a, hours)))
                assert "open" in words(text_a), text_a
                assert not a.ended and not b.ended
            finally:
                client.close()
            errors = [e for c in local.gw.manager.calls.values() for e in c.history
                      if isinstance(e, AgentError)]  # fmt: skip
            assert [(e.kind, "500" in e.message) for e in errors] == [("llm_status", True)]
    finally:
        await srv.close()
