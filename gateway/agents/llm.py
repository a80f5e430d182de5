"""The ``llm`` agent: a phone conversation through any OpenAI-compatible chat endpoint.

The agent hears the caller through :mod:`gateway.agents.hearing` (speech-to-text and
turn-taking on the echo-gated caller audio), sends the conversation to the model when the
caller's turn ends, and speaks the streamed answer through ``say_stream``, so the first clause
is playing while the model is still writing.

What the caller heard is what the model is told it said: every reply's utterances report the
words actually played (``UtteranceFinished.heard``), and the assistant message in the history
is rebuilt from those. A caller who barges in mid-answer cuts the message at the words they
heard, and the generation still running is cancelled (its HTTP stream closed).

Tools (OpenAI function calling): ``hangup`` (after what is being said), ``send_dtmf``,
``transfer`` (a blind transfer, SIP REFER with a bridged second leg when the far end refuses it;
the model is told the outcome: on success the call is no longer its own),
``end_call_after_reply``. Any failure of the model (unreachable, slower than ``timeout_s``, an
error status, a malformed stream or tool arguments) is reported as an ``agent.error`` event
and the caller hears the configured fallback line; the call goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.agents.base import CallHandle
from gateway.agents.hearing import CallerPartial, CallerTurn, Hearing
from gateway.call.control import (
    AgentError,
    AgentTurn,
    BadRequest,
    BargeIn,
    CallStateChanged,
    Conflict,
    ControlError,
    Event,
    TextTooLong,
    Transcript,
    UtteranceFinished,
)
from gateway.flow import actions as flow_actions
from gateway.flow.actions import sip_target
from gateway.llm.client import ChatClient, LlmError
from gateway.llm.sse import TextDelta, ToolCall
from gateway.stt.base import SpeechToText
from gateway.stt.turn import EndOfTurnModel
from voxgate.contract.config import TurnConfig
from voxgate.contract.dtmf import DTMF_KEYS

log = logging.getLogger("voxgate.agents")

# Model → tool → model rounds per caller turn (a model that keeps calling tools is cut off).
MAX_TOOL_ROUNDS = 3
# The caller's audio buffered for the ear (20 ms frames): covers loading the models once.
TAP_FRAMES = 250
# How long a hang-up waits for the words before it to be spoken.
HANGUP_WAIT_S = 30.0
# A caller turn made only of words the agent itself said this recently is its own echo.
ECHO_WINDOW_S = 3.0


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS: list[dict[str, object]] = [
    _tool("hangup", "End the call now, after what you are saying has been spoken.",
          {"reason": {"type": "string"}}, []),
    _tool("send_dtmf", "Send telephone keypad tones to the other end (to work a phone menu).",
          {"digits": {"type": "string", "description": "keys among 0-9 * # A-D"}}, ["digits"]),
    _tool("transfer", "Transfer the caller to a person or another number.",
          {"to": {"type": "string", "description": "a SIP URI or phone number"}}, ["to"]),
    _tool("end_call_after_reply", "Hang up once your reply (say goodbye) has been spoken.",
          {}, []),
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ears:
    """What every llm call shares: the recogniser and the end-of-turn model (loaded once)."""

    stt: SpeechToText
    model: EndOfTurnModel | None


@dataclass(slots=True)
class _Round:
    """One assistant message: the pieces said for it, and what the caller heard of each."""

    msg: dict[str, Any]
    utts: list[str] = field(default_factory=list)
    heard: dict[str, str] = field(default_factory=dict)
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    first_say_at: float | None = None

    def finished(self, utterance_id: str, heard: str) -> bool:
        """Record what the caller heard of one piece; True once every piece has ended."""
        self.heard[utterance_id] = heard
        self.msg["content"] = " ".join(self.heard[u] for u in self.utts if self.heard.get(u))
        if all(u in self.heard for u in self.utts):
            self.settled.set()
            return True
        return False


class _Said(list[str]):
    """The ids ``say_stream`` queues, entered into the round at once (a piece may finish
    playing while the model is still writing) and noting when the first one went out."""

    def __init__(self, rnd: _Round, on_first: Callable[[str], None]) -> None:
        super().__init__()
        self._rnd = rnd
        self._on_first = on_first

    def append(self, utterance_id: str) -> None:
        self._rnd.utts.append(utterance_id)
        if not self:
            self._on_first(utterance_id)
        super().append(utterance_id)


def heard_text(ev: UtteranceFinished) -> str:
    """What the caller heard of an utterance, written as it was given (punctuation kept): all
    of it when it played to the end, the words up to the cut when interrupted, nothing when
    it never played."""
    if ev.outcome == "done":
        return ev.text or ev.heard
    if ev.outcome != "interrupted" or not ev.heard:
        return ""
    n = len(ev.heard.split())
    written = ev.text.split()
    # The playout's words are the text's words minus punctuation; past a mismatch (a
    # normalised number, say) the spoken form is the honest record.
    if len(written) >= n and all(
        _bare(w) == _bare(h) for w, h in zip(written, ev.heard.split(), strict=False)
    ):
        return " ".join(written[:n])
    return ev.heard


def _bare(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum())


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, variables: dict[str, str]) -> str:
    """``{name}`` placeholders from the call's vars; anything else (unknown names, stray
    braces, ``{a.b}``, ``{a:>9}``) stays as written. Not ``str.format``: a request's text must
    not reach attributes or format specs."""
    return _PLACEHOLDER.sub(lambda m: variables.get(m.group(1), m.group(0)), template)


ToolHook = Callable[[str, dict[str, Any]], Awaitable[dict[str, object] | None]]
"""A tool call the agent's owner may take: its result for the model, or None (the agent's
own handling). A handled call hands the call back: the agent hangs up after its reply, and
the owner (``gateway.flow``) sees that hang-up as the end of the agent's turn."""


class LlmAgent:
    kind = "llm"

    def __init__(
        self,
        *,
        client: ChatClient,
        ears: Callable[[], Awaitable[Ears]],
        turn: TurnConfig,
        system_prompt: str,
        greeting: str,
        fallback: str,
        max_history: int = 40,
        tools: list[dict[str, object]] | None = None,
        on_tool: ToolHook | None = None,
    ) -> None:
        self.client = client
        self._ears = ears
        self.turn = turn
        self.system_prompt = system_prompt
        self.greeting = greeting
        self.fallback = fallback
        self.max_history = max_history
        self.tools = TOOLS if tools is None else tools
        # Tools the agent's owner takes over (a call flow's ``llm`` verb): a result from it
        # ends the agent's part once the reply has been said (see ``ToolHook``).
        self.on_tool = on_tool
        self.history: list[dict[str, Any]] = []  # the conversation, without the system prompt
        self._rounds: list[_Round] = []
        self._call: CallHandle | None = None
        self._listen: asyncio.Task[None] | None = None
        self._reply: asyncio.Task[None] | None = None
        self.hearing: Hearing | None = None
        self._ended = False
        self._spoken: list[tuple[float, str]] = []  # (monotonic end, text) of recent pieces
        self.echo_turns = 0

    # --- Agent ---------------------------------------------------------------------------
    async def on_start(self, call: CallHandle) -> None:
        self._call = call
        # Listening starts with the call (the caller may talk over the greeting).
        tap = call.caller_audio(16000, echo_gate=True, max_frames=TAP_FRAMES)
        self._listen = asyncio.get_running_loop().create_task(self._hear(call, tap))
        if self.greeting.strip():
            rnd = self._new_round()
            try:
                rnd.utts.append(await call.say(self.greeting))
            except ControlError as exc:  # ended, or refused (TextTooLong): the call goes on
                log.warning("call %s: greeting not said: %s", call.id, exc.message)
                return

    async def on_event(self, call: CallHandle, event: Event) -> None:
        if isinstance(event, UtteranceFinished):
            self._on_finished(call, event)
        elif isinstance(event, BargeIn):
            # The caller cut the answer short: stop generating the rest of it.
            self._cancel_reply()
        elif isinstance(event, CallStateChanged) and event.state == "ended":
            self._ended = True
            self._cancel_reply()

    async def on_end(self, call: CallHandle) -> None:
        self._ended = True
        self._cancel_reply()
        if self._listen is not None:
            # The tap has ended with the call: the hearing delivers its last turn and stops.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._listen), 2.0)
            self._listen.cancel()
        if self.hearing is not None:
            await self.hearing.aclose()

    # --- hearing -------------------------------------------------------------------------
    async def _hear(self, call: CallHandle, tap: AsyncIterator[Any]) -> None:
        try:
            ears = await self._ears()
        except Exception as exc:
            log.exception("speech-to-text unavailable on call %s", call.id)
            call.emit(AgentError(call.id, kind="stt", message=str(exc)))
            return
        self.hearing = Hearing(tap, ears.stt, ears.model, self.turn)
        async for ev in self.hearing:
            if isinstance(ev, CallerPartial):
                call.emit(Transcript(call.id, role="caller", text=ev.text, final=False))
            elif self._is_echo(ev.text):
                # The line returned the agent's voice loudly enough to pass the echo gate
                # (a callee looping RTP back at 0 dB): answering it would talk to itself.
                self.echo_turns += 1
                log.info("call %s: ignored a caller turn that echoes the agent: %r", call.id,
                         ev.text)  # fmt: skip
            elif not self._ended:
                call.emit(Transcript(call.id, role="caller", text=ev.text))
                await self._on_turn(call, ev)

    async def _on_turn(self, call: CallHandle, turn: CallerTurn) -> None:
        # A new turn supersedes an answer still being written or said (the caller spoke).
        self._cancel_reply()
        if self._reply is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reply
        if call.info.speaking:
            call.interrupt()
        await self._settle(1.0)  # the heard words of what was cut are in the history
        self.history.append({"role": "user", "content": turn.text})
        self._trim()
        self._reply = asyncio.get_running_loop().create_task(self._respond(call, turn))

    # --- answering -----------------------------------------------------------------------
    async def _respond(self, call: CallHandle, turn: CallerTurn) -> None:
        first_token: list[float] = []
        reported: list[bool] = []
        hang_up_after = False
        rnd = self._new_round()
        for _ in range(MAX_TOOL_ROUNDS):
            tool_calls: list[ToolCall] = []

            async def tokens(tool_calls: list[ToolCall] = tool_calls) -> AsyncIterator[str]:
                async for ev in self.client.stream(self.messages(), self.tools):
                    if isinstance(ev, TextDelta) and ev.text:
                        if not first_token:
                            first_token.append(time.time())
                        yield ev.text
                    elif isinstance(ev, ToolCall):
                        tool_calls.append(ev)

            def first(utt: str, r: _Round = rnd) -> None:
                if not reported:
                    reported.append(True)
                    self._report(call, turn, r, utt, first_token)

            try:
                await call.say_stream(tokens(), utterances=_Said(rnd, first))
            except LlmError as exc:
                await self._fail(call, rnd, exc)
                return
            except BadRequest:
                pass  # only tool calls, no words: fine
            except Conflict:
                return  # the call ended
            except TextTooLong as exc:
                # A runaway answer: what was queued is said, the rest is not.
                call.emit(AgentError(call.id, kind="llm_malformed", message=exc.message))
            if not rnd.utts:
                rnd.settled.set()
            if not tool_calls:
                break
            # A server that sent no id still needs one for the result to refer to.
            tool_calls = [
                c if c.id else dataclasses.replace(c, id=f"call_{uuid.uuid4().hex[:12]}")
                for c in tool_calls
            ]
            # Arguments as valid JSON (servers re-parse the history's tool calls: malformed
            # text sent back makes every later request fail); the error is in the result.
            rnd.msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments or {})}}
                for c in tool_calls
            ]  # fmt: skip
            follow_up = False
            results: dict[int, dict[str, object]] = {}
            try:
                for i, c in enumerate(tool_calls):
                    result, again, ends = await self._run_tool(call, c, spoke=bool(rnd.utts))
                    results[i] = result
                    follow_up |= again
                    hang_up_after |= ends
            finally:
                # Every call gets its result, even when the answer is cancelled midway (the
                # caller spoke): a tool call left without one makes servers refuse the history.
                for i, c in enumerate(tool_calls):
                    result = results.get(i, {"ok": False, "error": "cancelled: the caller spoke"})
                    self.history.append(
                        {"role": "tool", "tool_call_id": c.id, "content": json.dumps(result)}
                    )
            if not follow_up:
                break
            rnd = self._new_round()
        if hang_up_after:
            await self._settle(HANGUP_WAIT_S)
            if not self._ended:
                self._ended = True
                await call.hangup("agent")

    def _report(
        self, call: CallHandle, turn: CallerTurn, rnd: _Round, utt: str, first_token: list[float]
    ) -> None:
        """The exchange's timings, when its first words are queued."""
        rnd.first_say_at = time.time()
        call.emit(AgentTurn(
            call.id, text=turn.text, reason=turn.reason, probability=turn.probability,
            speech_end_ms=turn.end_ms, decided_at=turn.decided_at, stt_ms=turn.stt_s * 1000,
            eot_ms=turn.eot_s * 1000, first_token_at=first_token[0] if first_token else None,
            first_say_at=rnd.first_say_at, utterance_id=utt,
        ))  # fmt: skip

    async def _run_tool(
        self, call: CallHandle, c: ToolCall, *, spoke: bool
    ) -> tuple[dict[str, object], bool, bool]:
        """Run one tool call: (result for the model, ask the model again, hang up after)."""
        if c.error is not None or c.arguments is None:
            message = c.error or "arguments are not a JSON object"
            call.emit(AgentError(call.id, kind="tool", message=f"{c.name}: {message}"))
            return {"ok": False, "error": f"bad arguments: {message}"}, True, False
        args = c.arguments
        if self.on_tool is not None:
            handled = await self.on_tool(c.name, args)
            if handled is not None:
                return handled, False, True
        if c.name == "hangup":
            return {"ok": True}, False, True
        if c.name == "end_call_after_reply":
            # Words already said are the reply; otherwise the model is asked for them.
            return {"ok": True, "note": "the call ends after your reply"}, not spoke, True
        if c.name == "send_dtmf":
            digits = str(args.get("digits", ""))
            if not digits or set(digits) - set(DTMF_KEYS):
                return {"ok": False, "error": "digits must be 0-9 * # A-D"}, True, False
            try:
                await call.send_dtmf(digits)
            except (BadRequest, Conflict) as exc:
                return {"ok": False, "error": str(exc)}, True, False
            return {"ok": True, "sent": digits}, True, False
        if c.name == "transfer":
            to = str(args.get("to", "")).strip()
            if not to or any(ch.isspace() for ch in to):
                return {"ok": False, "error": "'to' must be a SIP URI or a number"}, True, False
            # What is being said goes first: the caller hears "I'll put you through" before
            # the REFER (a transferred call ends, taking any later words with it).
            await self._settle(HANGUP_WAIT_S)
            outcome = await flow_actions.transfer(call, sip_target(to, call.info), bridge=True)
            result = {"ok": outcome.result == "completed", **outcome.to_json()}
            if outcome.result != "completed":
                result["note"] = "tell the caller the transfer did not work and offer help"
            # Completed: the call ended (REFER) or is bridged to a person; nothing more to say.
            return result, outcome.result != "completed", False
        call.emit(AgentError(call.id, kind="tool", message=f"unknown tool {c.name!r}"))
        return {"ok": False, "error": f"unknown tool {c.name!r}"}, True, False

    async def _fail(self, call: CallHandle, rnd: _Round, exc: LlmError) -> None:
        log.warning("call %s: llm %s: %s", call.id, exc.kind, exc.message)
        call.emit(AgentError(call.id, kind=f"llm_{exc.kind}", message=exc.message))
        if rnd.utts:
            return  # words of the answer were already said: better than a fallback on top
        with contextlib.suppress(Conflict, BadRequest):
            rnd.utts.append(await call.say(self.fallback))

    # --- the conversation ----------------------------------------------------------------
    def messages(self) -> list[dict[str, Any]]:
        """What the model is sent: the system prompt, then the conversation as the caller
        heard it (assistant messages hold only the words played)."""
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        for m in self.history:
            if m["role"] == "assistant" and not m.get("content") and not m.get("tool_calls"):
                continue  # nothing of it was heard
            if m["role"] == "assistant" and m.get("tool_calls") and not m.get("content"):
                out.append({**m, "content": None})
            else:
                out.append(m)
        return out

    def _new_round(self) -> _Round:
        rnd = _Round({"role": "assistant", "content": ""})
        self._rounds.append(rnd)
        self._rounds = self._rounds[-20:]
        self.history.append(rnd.msg)
        return rnd

    def _is_echo(self, text: str) -> bool:
        """Every word of ``text`` is, in order, among the words the agent said in the last
        ``ECHO_WINDOW_S`` (or is saying now)."""
        said = [t for end, t in self._spoken if time.monotonic() - end <= ECHO_WINDOW_S]
        if self._call is not None and self._call.info.speaking:
            said += [t for r in self._rounds[-2:] for t in [r.msg.get("content") or ""]]
        heard = [_bare(w) for w in text.split() if _bare(w)]
        pool = [_bare(w) for t in said for w in t.split() if _bare(w)]
        if not heard or not pool:
            return False
        i = 0
        for w in pool:
            if i < len(heard) and heard[i] == w:
                i += 1
        return i == len(heard)

    def _on_finished(self, call: CallHandle, ev: UtteranceFinished) -> None:
        if ev.outcome in ("done", "interrupted") and ev.text:
            now = time.monotonic()
            self._spoken = [(t, x) for t, x in self._spoken if now - t <= ECHO_WINDOW_S]
            self._spoken.append((now, ev.text))
        heard = heard_text(ev)
        for rnd in self._rounds:
            if ev.utterance_id in rnd.utts:
                if rnd.finished(ev.utterance_id, heard):
                    text = rnd.msg["content"]
                    if text:
                        call.emit(Transcript(call.id, role="agent", text=text))
                return

    async def _settle(self, timeout: float) -> None:
        """Wait (bounded) until every piece said so far has ended: heard words recorded."""
        pending = [
            asyncio.ensure_future(r.settled.wait())
            for r in self._rounds
            if r.utts and not r.settled.is_set()
        ]
        if pending:
            try:
                await asyncio.wait(pending, timeout=timeout)
            finally:
                for fut in pending:
                    fut.cancel()

    def _cancel_reply(self) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.cancel()

    def _trim(self) -> None:
        if len(self.history) <= self.max_history:
            return
        del self.history[: len(self.history) - self.max_history]
        # Never start on a tool result or a tool request whose results were cut.
        while self.history and (
            self.history[0]["role"] == "tool" or self.history[0].get("tool_calls")
        ):
            self.history.pop(0)
