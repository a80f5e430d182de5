"""The flow interpreter on a simulated call (``tests.flow.callsim``): verbs in order, variables,
gather (num_digits, finish_on_key, timeout after the prompt, inter-digit timeout, type-ahead,
invalid lengths, speech through the agent's ear), time-of-day, transfer and record through the
call's methods (and their absence), the llm and stream hand-overs and their way back, the loop
guard, and the call ending under a verb."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from gateway.agents.base import CallHandle
from gateway.agents.llm import Ears, LlmAgent
from gateway.call.control import AgentError, DtmfReceived, Event, Transcript, TransferOutcome
from gateway.flow.engine import FlowAgent, FlowServices
from gateway.flow.verbs import Clip, FlowBook
from gateway.llm.client import ChatClient
from tests.agents.audio import silence, voiced
from tests.agents.fakes import FakeStt
from tests.flow.callsim import AudioSimCall, SimCall
from tests.flow.conftest import MakeServices, book_of
from tests.waiting import wait_for
from voxgate.bench.mock_llm import MockLlm, Script
from voxgate.contract.config import TurnConfig


async def started(services: FlowServices, *, audio: bool = False, **kw: Any) -> SimCall:
    agent = FlowAgent(services, **kw)
    call = (AudioSimCall if audio else SimCall)(agent)
    await call.start()
    await call.settle()
    return call


def agent_of(call: SimCall) -> FlowAgent:
    assert isinstance(call.agent, FlowAgent)
    return call.agent


def errors(call: SimCall) -> list[AgentError]:
    return [e for e in call.events if isinstance(e, AgentError)]


async def ended(call: SimCall) -> None:
    await wait_for(lambda: call.ended, timeout=5)
    await call.close_call()


# --- speaking -----------------------------------------------------------------------------------
async def test_says_queue_back_to_back_and_the_flow_ends_after_the_words(
    make_services: MakeServices,
) -> None:
    book = book_of("""
        [vars]
        company = "Acme"
        [[flows.main]]
        say = { text = "Welcome to {company}, {caller}.", loop = 2 }
        [[flows.main]]
        say = "Call {call_id} from {caller_uri}; {unknown} stays."
    """)
    call = await started(make_services(book))
    # All three are queued at once: no gap for synthesis between them.
    assert call.texts == ["Welcome to Acme, caller.", "Welcome to Acme, caller.",
                          "Call call-1 from sip:caller@example.com; {unknown} stays."]  # fmt: skip
    await call.finish()
    await call.finish()
    assert call.hangups == []  # the last words are still playing
    await call.finish()
    await wait_for(lambda: call.hangups == ["flow"], timeout=3)
    await call.close_call()
    lines = [e.text for e in call.events if isinstance(e, Transcript) and e.role == "agent"]
    assert lines == call.texts  # what the caller heard is in the call's record


async def test_pause_and_hangup_wait_for_the_words_before_them(make_services: MakeServices) -> None:
    book = book_of("""
        [[flows.main]]
        say = "One"
        [[flows.main]]
        pause = 0.2
        [[flows.main]]
        say = "Two"
        [[flows.main]]
        hangup = { reason = "done" }
        [[flows.main]]
        say = "Never"
    """)
    call = await started(make_services(book))
    assert call.texts == ["One"]
    await asyncio.sleep(0.4)
    assert call.texts == ["One"]  # the pause starts once "One" has been heard
    await call.finish()
    await wait_for(lambda: call.texts == ["One", "Two"], timeout=3)
    await call.finish()
    await wait_for(lambda: call.hangups == ["done"], timeout=3)
    await call.close_call()
    assert call.texts == ["One", "Two"]


async def test_play_needs_a_call_that_plays_audio(make_services: MakeServices) -> None:
    tone = (np.sin(np.arange(1600) * 0.2) * 4000).astype(np.int16)
    text = """
        [[flows.main]]
        play = { url = "http://127.0.0.1:9/hold.wav", barge_in = ["dtmf"] }
        [[flows.main]]
        say = "After the music."
    """
    book = book_of(text)
    services = make_services(book, clips={"http://127.0.0.1:9/hold.wav": Clip(tone, 16000)})
    call = await started(services, audio=True)
    assert isinstance(call, AudioSimCall)
    (utt, samples, rate) = call.played[0]
    assert (samples, rate) == (1600, 16000) and call.keys_cut[utt] is True
    assert call.texts[-1] == "After the music."
    await call.close_call()
    # A call without play_audio: reported, and the flow goes on.
    plain = await started(make_services(book))
    assert [e.kind for e in errors(plain)] == ["flow_play"]
    assert plain.texts == ["After the music."]
    await plain.close_call()


# --- gather -------------------------------------------------------------------------------------
MENU = """
    [[flows.main]]
    [flows.main.gather]
    say = "Enter your account number."
    {fields}
    branches = {{ "9" = "premium", default = "standard", timeout = "silent", invalid = "invalid" }}
    match = "prefix"

    [[flows.main]]
    say = "No branch taken: {{digits}} {{gather_reason}}."

    [[flows.premium]]
    say = "Premium {{digits}} by {{gather_reason}}."
    [[flows.standard]]
    say = "Standard {{digits}} by {{gather_reason}}."
    [[flows.silent]]
    say = "Nothing pressed."
    [[flows.invalid]]
    say = "Invalid: {{digits}}."
"""


def menu(fields: str) -> FlowBook:
    return book_of(MENU.format(fields=fields))


async def test_gather_num_digits(make_services: MakeServices) -> None:
    call = await started(make_services(menu("num_digits = 4")))
    await call.keys("912")
    assert call.texts == ["Enter your account number."]
    assert call.outcomes[call.ids[0]] == "interrupted"  # the first key cut the prompt
    await call.key("3")
    assert call.texts[-1] == "Premium 9123 by num_digits."
    assert agent_of(call).vars["digits"] == "9123"
    await call.close_call()


async def test_gather_finish_on_key_and_leftover_keys_are_dropped(
    make_services: MakeServices,
) -> None:
    text = (
        MENU.format(fields='finish_on_key = "#"')
        + """
    [[flows.standard]]
    [flows.standard.gather]
    num_digits = 1
    timeout = 0.2
    branches = { timeout = "silent", default = "invalid" }
    """
    )
    call = await started(make_services(book_of(text)))
    await call.keys("1234#")
    assert call.texts[-1] == "Standard 1234 by finish_key."
    await call.finish()
    # The next gather starts empty, its timeout runs, and it times out.
    await wait_for(lambda: call.texts[-1] == "Nothing pressed.", timeout=3)
    await call.close_call()
    # Keys past the gather's end that came with it (one packet burst) are dropped, not taken
    # by the next gather as typed ahead.
    call = await started(make_services(book_of(
        MENU.format(fields="num_digits = 4").replace(
            '[[flows.standard]]\n    say = "Standard {digits} by {gather_reason}."',
            '[[flows.standard]]\n    say = "Standard {digits} by {gather_reason}."\n'
            '    [[flows.standard]]\n    [flows.standard.gather]\n    timeout = 0.2\n'
            '    branches = { timeout = "silent", default = "invalid" }')
    )))  # fmt: skip
    for d in "1234#":
        call.tell(DtmfReceived(call.id, digit=d))
    await call.settle()
    assert call.texts[-1] == "Standard 1234 by num_digits."
    await call.finish()
    await wait_for(lambda: call.texts[-1] == "Nothing pressed.", timeout=3)
    await call.close_call()


async def test_gather_timeout_runs_from_the_end_of_the_prompt(make_services: MakeServices) -> None:
    call = await started(make_services(menu("timeout = 0.1")))
    await asyncio.sleep(0.4)
    assert call.texts == ["Enter your account number."]  # still playing: no timeout yet
    await call.finish()
    await wait_for(lambda: call.texts[-1] == "Nothing pressed.", timeout=3)
    assert agent_of(call).vars["gather_reason"] == "timeout"
    await call.close_call()


async def test_gather_inter_digit_timeout(make_services: MakeServices) -> None:
    call = await started(make_services(menu("timeout = 30\ninter_digit_timeout = 0.2")))
    await call.keys("12")
    await wait_for(lambda: len(call.texts) == 2, timeout=3)
    assert call.texts[-1] == "Standard 12 by inter_digit_timeout."
    await call.close_call()


async def test_gather_lengths_outside_min_max_are_invalid(make_services: MakeServices) -> None:
    call = await started(make_services(menu('finish_on_key = "#"\nmin_digits = 4\nmax_digits = 4')))
    await call.keys("91#")
    assert call.texts[-1] == "Invalid: 91."
    await call.close_call()
    call = await started(make_services(menu('finish_on_key = "#"\nmin_digits = 4\nmax_digits = 4')))
    await call.keys("#")
    assert call.texts[-1] == "Invalid: ."
    await call.close_call()


async def test_keys_typed_ahead_skip_the_prompt(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        say = "Welcome to the bank."
        [[flows.main]]
        gather = { say = "Enter four digits.", num_digits = 4 }
        [[flows.main]]
        say = "You entered {digits}."
    """
    call = await started(make_services(book_of(text)))
    assert call.texts == ["Welcome to the bank.", "Enter four digits."]
    await call.close_call()
    # A caller who knows the menu types during the welcome: the gather's prompt is not said.
    text = text.replace('say = "Welcome to the bank."', 'say = "Welcome to the bank."\n'
                        '        [[flows.main]]\n        pause = 0.3')  # fmt: skip
    call = await started(make_services(book_of(text)))
    await call.keys("12")  # the first cuts the welcome; the pause runs, then the gather
    await wait_for(lambda: agent_of(call).path[-1] == "flows.main[2].gather", timeout=3)
    await call.keys("34")
    await wait_for(lambda: call.texts[-1] == "You entered 1234.", timeout=3)
    assert "Enter four digits." not in call.texts
    await call.close_call()


async def test_the_prompt_is_cut_when_the_gather_ends(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        gather = { say = { text = "Press a key.", barge_in = [] }, num_digits = 1 }
        [[flows.main]]
        say = "Got {digits}."
    """
    call = await started(make_services(book_of(text)))
    await call.key("5")  # does not cut the prompt by itself (no dtmf barge-in)...
    assert call.outcomes[call.ids[0]] == "interrupted"  # ...the gather's end does
    assert call.texts == ["Press a key.", "Got 5."]
    await call.close_call()


async def test_speech_gather_hears_the_caller(make_services: MakeServices) -> None:
    stt = FakeStt("I would like sales, please.")

    async def ears() -> Ears:
        return Ears(stt, None)

    text = """
        [[flows.main]]
        [flows.main.gather]
        input = ["dtmf", "speech"]
        say = "Say sales or support."
        timeout = 5
        match = "contains"
        branches = { sales = "sales", support = "support" }
        [[flows.support]]
        say = "Support."
        [[flows.sales]]
        say = "Sales: {speech}"
    """
    call = await started(make_services(book_of(text), ears=ears, turn=TurnConfig()))
    await wait_for(lambda: len(call.taps) == 1, timeout=3)
    (tap,) = call.taps
    tap.push(voiced(0.5), agent_audible=False)
    tap.push(silence(1.0), agent_audible=False)
    await wait_for(lambda: call.texts[-1].startswith("Sales"), timeout=5)
    assert call.texts[-1] == "Sales: I would like sales, please."
    assert tap.closed  # the ear ends with the gather
    heard = [e.text for e in call.events if isinstance(e, Transcript) and e.role == "caller"]
    assert heard == ["I would like sales, please."]
    await call.close_call()


async def test_a_speech_gather_without_speech_to_text(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        gather = { input = ["speech"], say = "Say something." }
        [[flows.both]]
        gather = { input = ["speech", "dtmf"], say = "Say or press.", num_digits = 1 }
        [[flows.both]]
        say = "Pressed {digits}."
    """
    services = make_services(book_of(text), fallback="Sorry, goodbye.")
    call = await started(services)
    assert [e.kind for e in errors(call)] == ["flow_stt"]
    assert call.texts == ["Sorry, goodbye."]
    await call.finish()
    await wait_for(lambda: call.hangups == ["flow error"], timeout=3)
    await call.close_call()
    call = await started(services, flow="both")  # keys still work
    await call.key("4")
    assert call.texts[-1] == "Pressed 4." and [e.kind for e in errors(call)] == ["flow_stt"]
    await call.close_call()


# --- time of day --------------------------------------------------------------------------------
async def test_time_of_day_picks_the_branch(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        if = { time = "09:00-17:00", days = "mon-fri", tz = "Europe/Paris" }
        redirect = "open"
        [[flows.main]]
        say = "We are closed."
        [[flows.open]]
        say = "We are open."
    """
    book = book_of(text)
    monday_10_paris = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    sunday = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    evening = datetime(2026, 3, 2, 16, 30, tzinfo=UTC)  # 17:30 in Paris
    for now, said in ((monday_10_paris, "We are open."), (sunday, "We are closed."),
                      (evening, "We are closed.")):  # fmt: skip
        call = await started(make_services(book, clock=lambda now=now: now))
        assert call.texts == [said], now
        await call.close_call()


# --- transfer and record ------------------------------------------------------------------------
TRANSFER = """
    [[flows.main]]
    say = "Connecting you."
    [[flows.main]]
    {verb} = {{ target = "{target}", {fields} }}
    [[flows.main]]
    say = "After: {{transfer_result}} {{transfer_status}}."
    [[flows.sorry]]
    say = "Sorry, {{transfer_reason}}."
"""


def transfer_book(target: str = "sip:agents@pbx.example.com", fields: str = "",
                  verb: str = "transfer") -> FlowBook:  # fmt: skip
    fields = fields or 'fallback = [{ say = "Nobody is free." }]'
    return book_of(TRANSFER.format(verb=verb, target=target, fields=fields))


async def test_a_completed_transfer_ends_the_flow(make_services: MakeServices) -> None:
    call = await started(make_services(transfer_book()))
    assert call.transfers == []  # the words before it are heard first
    await call.finish()
    await wait_for(lambda: bool(call.transfers), timeout=3)
    assert call.transfers == [("sip:agents@pbx.example.com", "blind", None)]
    await call.settle()
    assert call.texts == ["Connecting you."] and call.hangups == []  # the call's side ends it
    assert agent_of(call).vars["transfer_result"] == "completed"
    await call.close_call()


async def test_a_refused_transfer_runs_the_fallback(make_services: MakeServices) -> None:
    services = make_services(transfer_book(target="+15550100", verb="dial"))
    agent = FlowAgent(services)
    call = SimCall(agent)
    call.transfer_outcome = TransferOutcome("refused", 603, "Decline")
    await call.start()
    await call.finish()
    # The fallback's verbs run in place, then the flow goes on.
    await wait_for(lambda: call.texts[-2:] == ["Nobody is free.", "After: refused 603."], 3)
    # A number goes to the far end's host as a SIP URI; dial bridges when REFER is refused.
    assert call.transfers == [("sip:+15550100@example.com", "blind", "bridge")]
    await call.close_call()


async def test_transfer_results_branch(make_services: MakeServices) -> None:
    book = transfer_book(fields='branches = { refused = "sorry", failed = "sorry" }')
    agent = FlowAgent(make_services(book))
    call = SimCall(agent)
    call.transfer_outcome = TransferOutcome("failed", 486, "the agent is busy")
    await call.start()
    await call.finish()
    await wait_for(lambda: call.texts[-1] == "Sorry, the agent is busy.", timeout=3)
    await call.close_call()


async def test_attended_and_unsupported_transfers(make_services: MakeServices) -> None:
    call = await started(make_services(transfer_book(
        fields='mode = "attended", fallback = [{ say = "Nobody is free." }]')))  # fmt: skip
    await call.finish()
    await wait_for(lambda: "Nobody is free." in call.texts, timeout=3)
    assert call.transfers == []  # never asked: attended is answered here
    (err,) = errors(call)
    assert err.kind == "flow_transfer" and "attended transfer" in err.message
    assert agent_of(call).vars["transfer_result"] == "not_supported"
    await call.close_call()

    class NoTransfer(SimCall):
        transfer = None  # type: ignore[assignment]

    agent = FlowAgent(make_services(transfer_book()))
    plain = NoTransfer(agent)
    await plain.start()
    await plain.finish()
    await wait_for(lambda: "Nobody is free." in plain.texts, timeout=3)
    (err,) = errors(plain)
    assert err.message == "flows.main[1].transfer: transfer is not supported on this call"
    await plain.close_call()


async def test_record_with_consent(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        record = { channels = "caller", consent = "This call is recorded." }
        [[flows.main]]
        say = "Recording {recording_id}."
        [[flows.main]]
        record = { action = "stop" }
        [[flows.main]]
        say = "Stopped."
    """
    call = await started(make_services(book_of(text)))
    assert call.texts == ["This call is recorded."] and call.recordings == []
    assert call.keys_cut[call.ids[0]] is False  # the consent line is not cut by a key
    await call.finish()
    await wait_for(lambda: call.texts[-1] == "Recording r1.", timeout=3)
    assert call.recordings == ["caller"] and call.recording
    await call.finish()
    await wait_for(lambda: call.texts[-1] == "Stopped.", timeout=3)
    assert not call.recording
    await call.close_call()

    class NoRecording(SimCall):
        start_recording = None  # type: ignore[assignment]

    text = """
        [[flows.main]]
        record = { fallback = [{ say = "Not recorded." }] }
    """
    plain = NoRecording(FlowAgent(make_services(book_of(text))))
    await plain.start()
    await plain.settle()
    assert plain.texts == ["Not recorded."]
    assert [e.message for e in errors(plain)] == [
        "flows.main[0].record: recording is not supported on this call"]  # fmt: skip
    await plain.close_call()


# --- hand-overs ---------------------------------------------------------------------------------
class EchoBot:
    """A stand-in for the stream agent: greets, repeats the keys it gets, and hangs up (its
    bot closing the socket) on "#"."""

    kind = "stream"

    def __init__(self, spec: dict[str, object]) -> None:
        self.spec = spec
        self.events: list[Event] = []
        self.ended = False
        self.error = None

    async def on_start(self, call: CallHandle) -> None:
        await call.say(f"Bot for {self.spec['parameters']}.")

    async def on_event(self, call: CallHandle, event: Event) -> None:
        self.events.append(event)
        from gateway.call.control import DtmfReceived

        if isinstance(event, DtmfReceived):
            if event.digit == "#":
                await call.hangup("stream closed")
            else:
                await call.say(f"Bot heard {event.digit}.")

    async def on_end(self, call: CallHandle) -> None:
        self.ended = True


async def test_stream_hands_the_call_back_when_the_bot_closes(make_services: MakeServices) -> None:
    bots: list[EchoBot] = []

    def build(spec: dict[str, object]) -> EchoBot:
        bots.append(EchoBot(spec))
        return bots[-1]

    text = """
        [[flows.main]]
        stream = { url = "ws://127.0.0.1:9/bot", parameters = { account = "{caller}" } }
        [[flows.main]]
        say = "Back in the flow: {stream_result}."
    """
    call = await started(make_services(book_of(text), stream=build), audio=True)
    assert call.texts == ["Bot for {'account': 'caller'}."]
    assert bots[0].spec["url"] == "ws://127.0.0.1:9/bot"
    await call.key("1")  # the bot has the call: it gets the keys
    assert call.texts[-1] == "Bot heard 1."
    await call.key("#")
    await wait_for(lambda: call.texts[-1] == "Back in the flow: closed.", timeout=3)
    assert bots[0].ended
    await call.close_call()


@pytest.fixture
async def llm_server() -> AsyncIterator[tuple[str, MockLlm]]:
    mock = MockLlm(Script({"turns": [
        {"match": "person", "reply": "Of course, one moment.",
         "tool_calls": [{"name": "transfer", "arguments": {"to": "+15550100"}}]},
    ], "default": {"reply": "How else can I help?"}}))  # fmt: skip
    srv = TestServer(mock.app(), host="127.0.0.1")
    await srv.start_server()
    yield str(srv.make_url("/v1")), mock
    await srv.close()


async def test_llm_comes_back_on_its_transfer_tool(
    make_services: MakeServices, llm_server: tuple[str, MockLlm]
) -> None:
    url, mock = llm_server
    stt = FakeStt("Can I talk to a person?")
    clients: list[ChatClient] = []

    async def ears() -> Ears:
        return Ears(stt, None)

    def build(spec: dict[str, object]) -> LlmAgent:
        clients.append(ChatClient(url, "m", api_key=None, temperature=0.3, max_tokens=200,
                                  timeout_s=5))  # fmt: skip
        return LlmAgent(client=clients[-1], ears=ears, turn=TurnConfig(),
                        system_prompt="You help.", greeting=str(spec["greeting"]),
                        fallback="Sorry?")  # fmt: skip

    text = """
        [[flows.main]]
        llm = { greeting = "Hello, how can I help?", branches = { transfer = "human" } }
        [[flows.main]]
        say = "The assistant ended: {llm_result}."
        [[flows.human]]
        say = "Transferring you to {llm_target}."
    """
    call = await started(make_services(book_of(text), llm=build))
    assert call.texts == ["Hello, how can I help?"]
    await call.finish()
    (tap,) = call.taps
    tap.push(voiced(0.5), agent_audible=False)
    tap.push(silence(1.0), agent_audible=False)
    await wait_for(lambda: "one moment." in call.texts, timeout=5)
    # The model was offered the way back to the flow.
    tools = {t["function"]["name"] for t in mock.requests[0]["tools"]}
    assert {"transfer", "return_to_flow", "hangup"} <= tools
    while call.playing is not None:
        await call.finish()
    await wait_for(lambda: call.texts[-1] == "Transferring you to +15550100.", timeout=5)
    assert agent_of(call).vars["llm_result"] == "transfer"
    assert tap.closed  # the assistant's ear ended with its turn
    await call.close_call()
    for c in clients:
        await c.close()


async def test_an_llm_verb_without_a_model_reports_and_goes_on(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        llm = { greeting = "Hi", branches = { error = "menu" } }
        [[flows.menu]]
        say = "The menu."
    """
    call = await started(make_services(book_of(text)))
    assert call.texts == ["The menu."]
    assert [e.kind for e in errors(call)] == ["flow_llm"]
    await call.close_call()


# --- failures and endings -----------------------------------------------------------------------
async def test_a_loop_that_never_waits_is_stopped(make_services: MakeServices) -> None:
    text = """
        [[flows.main]]
        set = { n = "1" }
        [[flows.main]]
        redirect = "main"
    """
    call = await started(make_services(book_of(text), fallback="Sorry, goodbye."))
    (err,) = errors(call)
    assert err.kind == "flow_loop" and "200 verbs in a row" in err.message
    assert call.texts == ["Sorry, goodbye."]
    assert call.keys_cut[call.ids[0]] is False  # the fallback is heard whole
    await call.finish()
    await wait_for(lambda: call.hangups == ["flow error"], timeout=3)
    await call.close_call()


async def test_the_call_ending_mid_gather_stops_the_flow(make_services: MakeServices) -> None:
    call = await started(make_services(menu("timeout = 30")))
    agent = agent_of(call)
    await call.close_call()
    assert agent.task is not None and agent.task.done()
    assert call.hangups == [] and errors(call) == []
