"""The flow schema: every verb's fields checked at load, each problem named by its path and a
reason; a bad flow file stops the gateway's start (the registry, and the CLI with one line);
time-of-day conditions and branch matching."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.agents.registry import AgentRegistry
from gateway.flow.source import load_flow_file
from gateway.flow.verbs import (
    Condition,
    FlowError,
    Gather,
    Limits,
    Play,
    Redirect,
    Route,
    Say,
    SetVars,
    Transfer,
    parse_book,
    parse_condition,
    parse_steps,
    read_wav,
)
from tests.flow.conftest import ACCOUNT_FLOW, DEFAULT_FLOW, book_of
from voxgate.contract.config import ConfigError, load


def one(verb: dict[str, Any], **limits: Any) -> Any:
    (step,) = parse_steps([verb], "flows.main", Limits(flows=frozenset({"main", "sales"}),
                                                       **limits))  # fmt: skip
    return step


# (verb, path, reason fragment): every verb's bad fields.
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"sya": "hi"}, "flows.main[0].sya", "unknown verb"),
    ({"say": "hi", "play": {"url": "http://x/a.wav"}}, "flows.main[0]", "expected one verb"),
    ({}, "flows.main[0]", "got nothing"),
    ({"verb": 3}, "flows.main[0].verb", "expected a verb name"),
    ({"say": {"text": ""}}, "flows.main[0].say.text", "required"),
    ({"say": {"text": 5}}, "flows.main[0].say.text", "expected a string"),
    ({"say": {"text": "hi", "loop": 0}}, "flows.main[0].say.loop", "from 1 to 10"),
    ({"say": {"text": "hi", "barge_in": ["keys"]}}, "flows.main[0].say.barge_in", "'dtmf'"),
    ({"say": {"text": "hi", "voice": "amy"}}, "flows.main[0].say.voice", "one voice per gateway"),
    ({"say": {"text": "hi", "colour": "red"}}, "flows.main[0].say.colour", "unknown field of say"),
    ({"say": {"text": "x" * 6000}}, "flows.main[0].say.text", "the limit is 5000"),
    ({"play": {}}, "flows.main[0].play", "give url (http or https) or file"),
    ({"play": "ftp://x/a.wav"}, "flows.main[0].play.url", "expected a http:// or https:// URL"),
    ({"play": {"file": "a.wav"}}, "flows.main[0].play.file", "files play only from a flow file"),
    ({"pause": 0}, "flows.main[0].pause.length", "required: seconds"),
    ({"pause": {"length": 1000}}, "flows.main[0].pause.length", "from 0 to 300"),
    ({"pause": "long"}, "flows.main[0].pause.length", "must be a number"),
    ({"gather": {"num_digits": "four"}}, "flows.main[0].gather.num_digits",
     "must be an integer from 1 to 64, got 'four'"),
    ({"gather": {"num_digits": 0}}, "flows.main[0].gather.num_digits", "from 1 to 64"),
    ({"gather": {"input": []}}, "flows.main[0].gather.input", "listen for"),
    ({"gather": {"input": ["voice"]}}, "flows.main[0].gather.input", "'dtmf' and/or 'speech'"),
    ({"gather": {"finish_on_key": "##"}}, "flows.main[0].gather.finish_on_key", "one key of"),
    ({"gather": {"timeout": -1}}, "flows.main[0].gather.timeout", "from 0 to 3600"),
    ({"gather": {"inter_digit_timeout": 0}}, "flows.main[0].gather.inter_digit_timeout",
     "from 0.1 to 60"),
    ({"gather": {"min_digits": 5, "max_digits": 4}}, "flows.main[0].gather.min_digits",
     "more than max_digits"),
    ({"gather": {"num_digits": 6, "max_digits": 4}}, "flows.main[0].gather.num_digits",
     "outside min_digits..max_digits"),
    ({"gather": {"say": {"text": "hi"}, "play": "http://x/a.wav"}}, "flows.main[0].gather.play",
     "one prompt"),
    ({"gather": {"say": {"txt": "hi"}}}, "flows.main[0].gather.say.text", "required"),
    ({"gather": {"next": "nowhere"}}, "flows.main[0].gather.next", "no flow named 'nowhere'"),
    ({"gather": {"next": "sales", "action": "http://x/a"}}, "flows.main[0].gather.next",
     "give one of action, next and branches"),
    ({"gather": {"branches": {"1": "nowhere"}}}, "flows.main[0].gather.branches.1",
     "no flow named"),
    ({"gather": {"branches": []}}, "flows.main[0].gather.branches", "expected a table"),
    ({"gather": {"match": "regex"}}, "flows.main[0].gather.match", "exact, prefix, contains"),
    ({"gather": {"match": "contains"}}, "flows.main[0].gather.match", "for speech input"),
    ({"gather": {"action": "mailto:x@y"}}, "flows.main[0].gather.action", "http:// or https://"),
    ({"transfer": {}}, "flows.main[0].transfer.target", "required"),
    ({"transfer": {"target": "agents desk"}}, "flows.main[0].transfer.target",
     "expected a SIP URI (sip:...) or a number"),
    ({"transfer": {"target": "sip:a@b", "mode": "warm"}}, "flows.main[0].transfer.mode",
     "blind, attended"),
    ({"transfer": {"target": "sip:a@b", "bridge": "yes"}}, "flows.main[0].transfer.bridge",
     "true or false"),
    ({"dial": {"target": "sip:a@b", "branches": {"busy": "main"}}},
     "flows.main[0].dial.branches.busy", "not a result of dial"),
    ({"transfer": {"target": "sip:a@b", "fallback": [{"hangup": {}}], "next": "main"}},
     "flows.main[0].transfer.fallback", "not both"),
    ({"transfer": {"target": "sip:a@b", "fallback": [{"say": {}}]}},
     "flows.main[0].transfer.fallback[0].say.text", "required"),
    ({"record": {"action": "pause"}}, "flows.main[0].record.action", "start, stop"),
    ({"record": {"channels": "agent"}}, "flows.main[0].record.channels", "both, caller"),
    ({"record": {"action": "stop", "consent": "hi"}}, "flows.main[0].record.consent",
     "goes with action 'start'"),
    ({"hangup": {"why": "done"}}, "flows.main[0].hangup.why", "unknown field of hangup"),
    ({"hangup": "now"}, "flows.main[0].hangup", "expected a table of fields"),
    ({"redirect": {}}, "flows.main[0].redirect", "give flow (a name) or url"),
    ({"redirect": "nowhere"}, "flows.main[0].redirect.flow", "no flow named 'nowhere'"),
    ({"redirect": {"flow": "a b"}}, "flows.main[0].redirect.flow", "a flow name is"),
    ({"set": {}}, "flows.main[0].set", "nothing to set"),
    ({"set": {"caller": "x"}}, "flows.main[0].set.caller", "a fact of the call"),
    ({"set": {"a-b": "x"}}, "flows.main[0].set.a-b", "a variable name"),
    ({"set": {"x": ["a"]}}, "flows.main[0].set.x", "a string or a number"),
    ({"stream": {"url": "http://bot/ws"}}, "flows.main[0].stream.url", "ws:// or wss://"),
    ({"stream": {"url": "ws://bot/ws", "parameters": {"from_number": "1"}}},
     "flows.main[0].stream.parameters.from_number", "set by the gateway"),
    ({"stream": {"url": "ws://bot/ws", "branches": {"done": "main"}}},
     "flows.main[0].stream.branches.done", "not a result of stream"),
    ({"llm": {"temperature": 3}}, "flows.main[0].llm.temperature", "from 0 to 2"),
    ({"llm": {"max_tokens": 0}}, "flows.main[0].llm.max_tokens", "from 1 to 4096"),
    ({"llm": {"branches": {"transfer": "main", "later": "main"}}},
     "flows.main[0].llm.branches.later", "results: hangup, transfer, return, error"),
    ({"say": "hi", "if": {"time": "9-17"}}, "flows.main[0].if.time", "HH:MM"),
    ({"say": "hi", "if": {"time": "09:00-25:00"}}, "flows.main[0].if.time", "from 00:00 to 24:00"),
    ({"say": "hi", "if": {"time": "09:00-09:00"}}, "flows.main[0].if.time", "an empty span"),
    ({"say": "hi", "if": {"days": "weekdays"}}, "flows.main[0].if.days", "'mon-fri'"),
    ({"say": "hi", "if": {"days": "mon", "tz": "Mars/Olympus"}}, "flows.main[0].if.tz",
     "unknown time zone"),
    ({"say": "hi", "if": {}}, "flows.main[0].if", "give time"),
    ({"say": "hi", "if": {"time": "09:00-17:00", "weekday": 1}}, "flows.main[0].if.weekday",
     "unknown field of if"),
]  # fmt: skip


@pytest.mark.parametrize(("verb", "path", "reason"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_verbs_name_the_path_and_the_reason(
    verb: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(FlowError) as exc:
        one(verb)
    assert exc.value.path == path, str(exc.value)
    assert reason in exc.value.reason, str(exc.value)
    assert str(exc.value) == f"{exc.value.path}: {exc.value.reason}"


def test_the_llm_and_stream_verbs_need_the_gateway_to_have_them() -> None:
    with pytest.raises(FlowError, match=r"^flows\.main\[0\]\.llm: .*no \[llm\] base_url"):
        one({"llm": {}}, llm=False)
    with pytest.raises(FlowError, match=r"^flows\.main\[0\]\.stream\.url: required"):
        one({"stream": {}}, stream_url=False)
    assert one({"stream": {}}).verb.url is None  # [stream] url serves


def test_good_verbs_and_their_defaults() -> None:
    say = one({"say": "Hello {caller}"}).verb
    assert say == Say("Hello {caller}", frozenset({"dtmf", "speech"}), 1)
    flat = one({"verb": "say", "text": "Hi", "loop": 2, "barge_in": False}).verb  # jambonz form
    assert flat == Say("Hi", frozenset(), 2)
    g = one({"gather": {"say": "Press a key", "num_digits": 4}}).verb
    assert isinstance(g, Gather)
    assert (g.input, g.num_digits, g.finish_on_key, g.timeout, g.inter_digit_timeout) == (
        frozenset({"dtmf"}), 4, "#", 5.0, 5.0)  # fmt: skip
    assert g.prompt == Say("Press a key")
    t = one({"dial": {"target": "+15550100"}}).verb
    assert isinstance(t, Transfer) and t.bridge and t.mode == "blind" and t.name == "dial"
    assert not one({"transfer": {"target": "sip:agents@pbx"}}).verb.bridge
    assert one({"redirect": "https://hooks.example/next"}).verb == Redirect(
        url="https://hooks.example/next"
    )
    assert one({"set": {"n": 4, "name": "x"}}).verb == SetVars((("n", "4"), ("name", "x")))
    step = one({"if": {"time": "22:00-06:00", "days": "fri-mon", "tz": "Europe/London"},
                "hangup": {}})  # fmt: skip
    assert step.when is not None and step.when.days == frozenset({4, 5, 6, 0})


def test_a_flow_file_is_checked_whole(tmp_path: Path) -> None:
    bad = tmp_path / "flows.toml"
    bad.write_text('[[flows.main]]\ngather = { num_digits = "four" }\n')
    with pytest.raises(ConfigError) as exc:
        load_flow_file(bad, Limits())
    assert str(exc.value) == (
        f"flow.file: {bad}: flows.main[0].gather.num_digits: must be an integer from 1 to 64, "
        "got 'four'"
    )
    cases = {
        "start.toml": ('start = "open"\n[[flows.main]]\nhangup = {}\n', "start: names no flow"),
        "top.toml": ("flow = 1\n[[flows.main]]\nhangup = {}\n", "flow: unknown key"),
        "empty.toml": ("", "flows: expected a table of named flows"),
        "name.toml": ('[[flows."a b"]]\nhangup = {}\n', "flows.a b: a flow name is"),
        "syntax.toml": ("[[flows.main]\n", "invalid TOML"),
        "list.json": ("[1, 2]", "(document): expected a table of flows"),
        "syntax.json": ("{", "invalid JSON"),
        "flows.yaml": ("flows: {}", "expected a .toml or .json file"),
    }
    for name, (text, reason) in cases.items():
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(ConfigError, match=r"^flow\.file: ") as exc:
            load_flow_file(f, Limits())
        assert reason in str(exc.value), (name, str(exc.value))
    with pytest.raises(ConfigError, match="cannot read"):
        load_flow_file(tmp_path / "missing.toml", Limits())
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"flows": {"main": [{"say": "Hello"}, {"hangup": {}}]}}))
    assert [s.path for s in load_flow_file(good, Limits()).flows["main"]] == [
        "flows.main[0].say", "flows.main[1].hangup"]  # fmt: skip


def test_the_shipped_flows_load() -> None:
    for path in (DEFAULT_FLOW, ACCOUNT_FLOW):
        book = load_flow_file(path, Limits(llm=False, stream_url=False))
        assert book.start == "main" and book.speech_at() is None


def test_play_files_are_read_at_load(tmp_path: Path) -> None:
    tone = (np.sin(np.arange(2205) * 0.3) * 8000).astype(np.int16)
    with wave.open(str(tmp_path / "hold.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(np.repeat(tone, 2).tobytes())
    (tmp_path / "notes.wav").write_text("not audio")
    play = one({"play": {"file": "hold.wav"}}, files=tmp_path).verb
    assert isinstance(play, Play) and play.clip is not None
    assert play.clip.rate == 22050 and np.array_equal(play.clip.pcm, tone)
    with pytest.raises(FlowError, match=r"play\.file: .*not a PCM WAV file"):
        one({"play": {"file": "notes.wav"}}, files=tmp_path)
    with pytest.raises(FlowError, match=r"play\.file: cannot read"):
        one({"play": "x.wav"} | {"play": {"file": "x.wav"}}, files=tmp_path)
    with pytest.raises(ValueError, match="sample rate 96000"):
        with wave.open(str(tmp_path / "hi.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(96000)
            w.writeframes(b"\0\0" * 10)
        read_wav((tmp_path / "hi.wav").read_bytes())


# --- start-up -----------------------------------------------------------------------------------
def test_a_bad_flow_file_stops_the_registry(tmp_path: Path) -> None:
    bad = tmp_path / "flows.toml"
    bad.write_text('[[flows.main]]\nsay = "Hi"\n[[flows.main]]\ntransfer = { target = "x y" }\n')
    cfg = load(None, env={}, overrides={"agent.kind": "flow", "flow.file": str(bad)})
    with pytest.raises(ConfigError, match=r"^flow\.file: .*flows\.main\[1\]\.transfer\.target: "
                       r"expected a SIP URI"):  # fmt: skip
        AgentRegistry(cfg)
    # Neither a file nor a webhook: the built-in flow (today's IVR menu, what make serve runs).
    built_in = AgentRegistry(load(None, env={}, overrides={"agent.kind": "flow"}))
    assert built_in.flows.book is not None and built_in.flows.book.origin.endswith("default.toml")
    with pytest.raises(ConfigError, match=r"^flow\.file: no such file"):
        load(None, env={}, overrides={"flow.file": str(tmp_path / "nope.toml")})
    cfg = load(None, env={}, overrides={"flow.file": str(DEFAULT_FLOW), "flow.start": "sales"})
    with pytest.raises(ConfigError, match=r"^flow\.start: .* no flow named 'sales'"):
        AgentRegistry(cfg)
    cfg = load(None, env={}, overrides={"flow.url": "https://hooks.example/call",
                                        "flow.secret_env": "FLOW_SECRET_X"})  # fmt: skip
    with pytest.raises(ConfigError, match="FLOW_SECRET_X is not set"):
        AgentRegistry(cfg)
    # An llm verb on a gateway without a model is refused at start too.
    llm = tmp_path / "llm.json"
    llm.write_text(json.dumps({"flows": {"main": [{"llm": {"greeting": "Hi"}}]}}))
    cfg = load(None, env={}, overrides={"flow.file": str(llm)})
    with pytest.raises(ConfigError, match=r"flows\.main\[0\]\.llm: .*no \[llm\] base_url"):
        AgentRegistry(cfg)


def test_the_cli_refuses_a_bad_flow_file_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "flows.toml"
    bad.write_text('[[flows.main]]\n[flows.main.gather]\nnum_digits = "four"\n')
    voxgate = Path(sys.executable).with_name("voxgate")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    out = subprocess.run(
        [str(voxgate), "serve", "--agent-kind", "flow", "--flow-file", str(bad),
         "--gateway-http-listen", "127.0.0.1:0", "--gateway-sip-listen", "127.0.0.1:0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert lines == [
        f"voxgate: config error: flow.file: {bad}: flows.main[0].gather.num_digits: must be an "
        "integer from 1 to 64, got 'four'"
    ], out.stderr


# --- conditions and matching --------------------------------------------------------------------
def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_time_of_day_in_the_zone_named() -> None:
    office = parse_condition({"time": "09:00-17:00", "days": "mon-fri", "tz": "Europe/London"},
                             "if")  # fmt: skip
    assert office.holds(at("2026-03-02T09:00:00+00:00"))  # Monday 09:00 GMT
    assert not office.holds(at("2026-03-02T08:59:00+00:00"))
    assert not office.holds(at("2026-03-02T17:00:00+00:00"))  # the end is excluded
    assert not office.holds(at("2026-03-07T12:00:00+00:00"))  # Saturday
    # Summer time: 08:30 UTC is 09:30 in London.
    assert office.holds(at("2026-07-01T08:30:00+00:00"))
    assert not office.holds(at("2026-01-07T08:30:00+00:00"))
    # The same moment seen from New York (UTC-5 in January): 14:00 UTC is 09:00 there.
    ny = parse_condition({"time": "09:00-17:00", "tz": "America/New_York"}, "if")
    assert ny.holds(at("2026-01-07T14:00:00+00:00"))
    assert not ny.holds(at("2026-01-07T13:59:00+00:00"))
    night = parse_condition({"time": "22:00-06:00"}, "if")  # past midnight, UTC
    assert night.holds(at("2026-01-07T23:30:00+00:00"))
    assert night.holds(at("2026-01-07T05:59:00+00:00"))
    assert not night.holds(at("2026-01-07T06:00:00+00:00"))
    weekend = parse_condition({"days": "sat,sun"}, "if")
    assert weekend.holds(at("2026-01-10T03:00:00+00:00"))
    assert not weekend.holds(at("2026-01-09T23:59:00+00:00"))
    assert isinstance(weekend, Condition) and weekend.start is None


def test_branches_match_exact_prefix_and_words() -> None:
    exact = Route(branches=(("1", "a"), ("12", "b"), ("default", "d"), ("timeout", "t")))
    assert exact.choose("1") == "a" and exact.choose("12") == "b" and exact.choose("3") == "d"
    assert exact.choose("", "timeout") == "t" and exact.choose("", "invalid") == "d"
    assert exact.choose("default") == "d"
    prefix = Route(branches=(("9", "premium"), ("99", "vip")), match="prefix")
    assert prefix.choose("9123") == "premium" and prefix.choose("9912") == "vip"
    assert prefix.choose("1234") is None
    words = Route(branches=(("sales", "s"), ("Customer Care", "c")), match="contains")
    assert words.choose("i want sales please", fold=True) == "s"
    assert words.choose("customer care", fold=True) == "c"
    assert words.choose("wholesales", fold=True) is None  # whole words only


def test_a_document_names_its_flows_before_checking_references() -> None:
    book = book_of('[[flows.main]]\nredirect = "later"\n[[flows.later]]\nhangup = {}\n')
    assert set(book.flows) == {"main", "later"}
    with pytest.raises(FlowError, match=r"^flows\.main\[0\]\.redirect\.flow: no flow named"):
        parse_book({"flows": {"main": [{"redirect": "gone"}]}}, limits=Limits())
