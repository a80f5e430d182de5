"""The verbs of a call flow, and the schema every flow is checked against before it runs.

A flow is a list of verbs run in order. Each verb is a table with one key, the verb's name,
holding its fields (``{"gather": {"num_digits": 4}}``; in TOML ``[[flows.main]]`` then
``gather = {num_digits = 4}``); jambonz's flat form (``{"verb": "gather", "num_digits": 4}``)
is read the same. Any verb may carry a time-of-day condition beside its name
(``{"if": {"time": "09:00-17:00", "days": "mon-fri", "tz": "Europe/London"}, "redirect":
"open"}``): it runs only then, and is skipped otherwise.

Everything is checked at load (a flow file at start, a webhook's answer on arrival): unknown
verbs and fields, wrong types, values out of range, flows that are named but do not exist. A
problem is a ``FlowError`` whose message is the path to the value and the reason, e.g.
``flows.main[3].gather.num_digits: must be an integer from 1 to 64, got 'four'``.

The verbs, with their nearest jambonz verb and TwiML noun (docs/flows.md has the fields):

============  ====================  =================================  ==========================
voxgate       jambonz               TwiML                              notes
============  ====================  =================================  ==========================
say           say                   <Say>                              ``{vars}`` in ``text``;
                                                                       ``barge_in`` dtmf/speech
play          play                  <Play>                             WAV by ``url`` or ``file``
pause         pause                 <Pause length>                     ``length`` seconds
gather        gather                <Gather>                           dtmf and/or speech;
                                                                       ``branches`` per result
transfer      sip:refer             <Dial><Sip>/<Refer>                blind (REFER); attended:
                                                                       "not supported"
dial          dial                  <Dial>                             same as ``transfer``
record        config record /       <Record>/<Start><Recording>        start/stop, consent line
              listen
hangup        hangup                <Hangup>
redirect      redirect              <Redirect>                         a flow name or a URL
llm           llm                   <Connect><ConversationRelay>       hands the call to the
                                                                       conversational agent
stream        listen (bidi)         <Connect><Stream>                  a bot's WebSocket
set           config/tag            (action parameters)                variables
``if``        (app logic)           (app logic)                        time of day, day of week
============  ====================  =================================  ==========================

Where a verb has a result (gather, transfer/dial, llm, stream) it can say what comes next:
``action`` (a webhook URL: the result is POSTed there and its answer's verbs replace the rest,
as jambonz's ``actionHook`` and TwiML's ``action``), ``next`` (a flow name), or ``branches``
(result → flow name or URL, with ``default``; for gather ``match`` is ``exact``, ``prefix`` or
``contains``). Without any of them the flow goes on with the next verb.
"""

from __future__ import annotations

import dataclasses
import re
import wave
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import numpy.typing as npt

from voxgate.contract.dtmf import DTMF_KEYS, is_dtmf_key

VERBS = (
    "say", "play", "pause", "gather", "transfer", "dial", "record", "hangup", "redirect",
    "llm", "stream", "set",
)  # fmt: skip
INPUTS = ("dtmf", "speech")
# Limits of what a flow may ask for.
MAX_DIGITS = 64
MAX_LOOP = 10
MAX_PAUSE_S = 300.0
MAX_TIMEOUT_S = 3600.0
MAX_URL_CHARS = 2048
MAX_NAME_CHARS = 64
MAX_PROMPT_CHARS = 20000
MAX_VARS = 50
MAX_VAR_CHARS = 1000
MAX_BRANCHES = 100
MAX_FLOWS = 500
MAX_STEPS = 2000  # verbs in one flow (or one webhook answer)
MAX_PLAY_S = 600.0
# Variables the call itself fills: a flow reads them, ``set`` may not overwrite them.
CALL_FACTS = (
    "call_id", "caller", "callee", "caller_uri", "callee_uri", "direction", "leg",
)  # fmt: skip
# What each verb with a result can branch on (besides "default").
RESULTS: dict[str, tuple[str, ...]] = {
    "transfer": ("completed", "refused", "failed", "not_supported"),
    "llm": ("hangup", "transfer", "return", "error"),
    "stream": ("closed", "error"),
}
# Gather branch keys with a meaning of their own (besides the digits or words heard).
GATHER_OUTCOMES = ("timeout", "invalid", "error")
MATCHES = ("exact", "prefix", "contains")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_NUMBER = re.compile(r"\+?[0-9*#]{1,32}")


class FlowError(ValueError):
    """A flow that does not fit the schema: ``path`` to the value and ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# --- the verbs --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Condition:
    """Local time of day (``start`` ≤ t < ``end`` minutes; past midnight when start > end) and
    days of the week (0 = Monday), both in ``tz``; the day is the local date of the moment."""

    start: int | None
    end: int | None
    days: frozenset[int] | None
    tz: ZoneInfo

    def holds(self, now: datetime) -> bool:
        local = now.astimezone(self.tz)
        if self.days is not None and local.weekday() not in self.days:
            return False
        if self.start is None or self.end is None:
            return True
        minute = local.hour * 60 + local.minute
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


@dataclass(frozen=True, slots=True)
class Route:
    """Where a verb's result leads: ``action`` (webhook), ``next`` (flow), or ``branches``."""

    action: str | None = None
    next: str | None = None
    branches: tuple[tuple[str, str], ...] = ()
    match: str = "exact"

    @property
    def empty(self) -> bool:
        return self.action is None and self.next is None and not self.branches

    def choose(self, value: str, outcome: str | None = None, *, fold: bool = False) -> str | None:
        """The branch target for a result: ``outcome`` (timeout, invalid, error) by its own
        key when one is given, else ``value`` by ``match`` (``fold``: keys compared in lower
        case, for words heard), else ``default``; None: no branch."""
        table = dict(self.branches)
        if outcome is not None:
            return table.get(outcome, table.get("default"))
        keys = [k for k in table if k != "default" and k not in GATHER_OUTCOMES]
        found = [k for k in keys if _matches(self.match, k.lower() if fold else k, value)]
        if found:
            return table[max(found, key=len)]  # the most specific (longest) key wins
        return table.get("default")


def _matches(mode: str, key: str, value: str) -> bool:
    if mode == "exact":
        return key == value
    if mode == "prefix":
        return value.startswith(key)
    return f" {key} " in f" {value} "  # contains: whole words (speech)


@dataclass(frozen=True, slots=True)
class Clip:
    """A WAV file's audio, read at load: int16 mono at ``rate``."""

    pcm: npt.NDArray[np.int16] = field(compare=False, repr=False)
    rate: int


@dataclass(frozen=True, slots=True)
class Say:
    text: str
    barge_in: frozenset[str] = frozenset(INPUTS)
    loop: int = 1


@dataclass(frozen=True, slots=True)
class Play:
    url: str | None = None
    file: str | None = None
    clip: Clip | None = None  # a file's audio, read at load
    barge_in: frozenset[str] = frozenset(INPUTS)
    loop: int = 1


@dataclass(frozen=True, slots=True)
class Pause:
    length: float


@dataclass(frozen=True, slots=True)
class Gather:
    input: frozenset[str] = frozenset({"dtmf"})
    num_digits: int | None = None
    finish_on_key: str = "#"
    min_digits: int = 1
    max_digits: int = MAX_DIGITS
    timeout: float = 5.0
    inter_digit_timeout: float = 5.0
    prompt: Say | Play | None = None
    route: Route = Route()


@dataclass(frozen=True, slots=True)
class Transfer:
    target: str
    mode: str = "blind"
    # A refused or failed REFER becomes a call the gateway places and bridges (B2BUA).
    bridge: bool = False
    fallback: tuple[Step, ...] = ()
    route: Route = Route()
    name: str = "transfer"  # or "dial"


@dataclass(frozen=True, slots=True)
class Record:
    action: str = "start"
    channels: str = "both"
    consent: str = ""
    fallback: tuple[Step, ...] = ()


@dataclass(frozen=True, slots=True)
class Hangup:
    reason: str = "flow"


@dataclass(frozen=True, slots=True)
class Redirect:
    flow: str | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Llm:
    system_prompt: str | None = None
    greeting: str | None = None
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    route: Route = Route()


@dataclass(frozen=True, slots=True)
class Stream:
    url: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    route: Route = Route()


@dataclass(frozen=True, slots=True)
class SetVars:
    values: tuple[tuple[str, str], ...]


Verb = Say | Play | Pause | Gather | Transfer | Record | Hangup | Redirect | Llm | Stream | SetVars


@dataclass(frozen=True, slots=True)
class Step:
    """One verb where it stands (``path``, for errors), with its condition."""

    verb: Verb
    path: str
    when: Condition | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """What the gateway can do, for checks that depend on it: flows named by a webhook must
    exist, llm needs ``[llm] base_url``, stream a URL, files only from a file."""

    flows: frozenset[str] | None = None  # None: checked by the document itself
    llm: bool = True
    stream_url: bool = True
    files: Path | None = None  # where ``play.file`` paths start; None: not allowed
    max_text_chars: int = 5000


@dataclass(frozen=True, slots=True)
class FlowBook:
    """Named flows (a file's), where calls start, and the variables every call starts with."""

    flows: Mapping[str, tuple[Step, ...]]
    start: str = "main"
    vars: Mapping[str, str] = field(default_factory=dict)
    origin: str = ""

    def speech_at(self) -> str | None:
        """The path of the first gather that listens for speech (None: none does)."""
        for steps in self.flows.values():
            for step in walk(steps):
                if isinstance(step.verb, Gather) and "speech" in step.verb.input:
                    return step.path
        return None

    def map_steps(self, fn: Callable[[Step], Step]) -> FlowBook:
        """A copy with every step (fallbacks included) replaced by ``fn(step)`` (tests)."""

        def each(steps: tuple[Step, ...]) -> tuple[Step, ...]:
            out = []
            for s in steps:
                v = s.verb
                if isinstance(v, Transfer | Record) and v.fallback:
                    s = dataclasses.replace(
                        s, verb=dataclasses.replace(v, fallback=each(v.fallback))
                    )
                out.append(fn(s))
            return tuple(out)

        return dataclasses.replace(self, flows={k: each(v) for k, v in self.flows.items()})


def walk(steps: Iterable[Step]) -> Iterable[Step]:
    """Every step, with the steps of fallbacks inside them."""
    for step in steps:
        yield step
        if isinstance(step.verb, Transfer | Record):
            yield from walk(step.verb.fallback)


# --- the checks -------------------------------------------------------------------------------
def parse_book(data: object, *, limits: Limits, origin: str = "") -> FlowBook:
    """A whole flow document (``start``, ``vars``, ``flows``), checked, names resolved."""
    if not isinstance(data, dict):
        raise FlowError("(document)", f"expected a table of flows, got {_show(data)}")
    unknown = sorted(set(data) - {"start", "vars", "flows"})
    if unknown:
        raise FlowError(unknown[0], "unknown key (a flow file has start, vars and flows)")
    flows = data.get("flows")
    if not isinstance(flows, dict) or not flows:
        raise FlowError("flows", "expected a table of named flows, each a list of verbs")
    if len(flows) > MAX_FLOWS:
        raise FlowError("flows", f"{len(flows)} flows; the limit is {MAX_FLOWS}")
    for name in flows:
        _check_name(f"flows.{name}", name)
    limits = dataclasses.replace(limits, flows=frozenset(flows))
    book = {name: parse_steps(steps, f"flows.{name}", limits) for name, steps in flows.items()}
    start = data.get("start", "main")
    if not isinstance(start, str) or start not in book:
        raise FlowError("start", f"names no flow of this file: {_show(start)} "
                        f"(flows: {', '.join(sorted(book))})")  # fmt: skip
    return FlowBook(book, start, parse_vars(data.get("vars"), "vars"), origin)


def parse_steps(data: object, path: str, limits: Limits) -> tuple[Step, ...]:
    """A list of verbs (a flow, a webhook's answer, a fallback)."""
    if not isinstance(data, list):
        raise FlowError(path, f"expected a list of verbs, got {_show(data)}")
    if len(data) > MAX_STEPS:
        raise FlowError(path, f"{len(data)} verbs; the limit is {MAX_STEPS}")
    return tuple(parse_step(item, f"{path}[{i}]", limits) for i, item in enumerate(data))


def parse_step(data: object, path: str, limits: Limits) -> Step:
    if not isinstance(data, dict):
        raise FlowError(path, f"expected a verb (a table such as {{say = ...}}), got {_show(data)}")
    data = dict(data)
    when = data.pop("if", None)
    if "verb" in data:  # jambonz's flat form: {"verb": "say", "text": ...}
        name = data.pop("verb")
        if not isinstance(name, str):
            raise FlowError(f"{path}.verb", f"expected a verb name, got {_show(name)}")
        body: object = data
    else:
        names = list(data)
        if len(names) != 1:
            what = ", ".join(map(repr, names)) if names else "nothing"
            raise FlowError(path, f"expected one verb (and an optional 'if'), got {what}")
        name = names[0]
        body = data[name]
    if name not in VERBS:
        raise FlowError(f"{path}.{name}", f"unknown verb (verbs: {', '.join(VERBS)})")
    vpath = f"{path}.{name}"
    condition = parse_condition(when, f"{path}.if") if when is not None else None
    if name == "redirect" and isinstance(body, str):
        body = {"url": body} if is_url(body) else {"flow": body}
    return Step(_VERB_PARSERS[name](_Fields(body, vpath, name, SHORTHAND.get(name)), limits),
                vpath, condition)  # fmt: skip


def parse_condition(data: object, path: str) -> Condition:
    f = _Fields(data, path, "if")
    span = f.string("time", None)
    days_text = f.string("days", None)
    tz_name = f.string("tz", "UTC") or "UTC"
    f.done()
    if span is None and days_text is None:
        raise FlowError(path, "give time ('09:00-17:00') and/or days ('mon-fri')")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise FlowError(f"{path}.tz", f"unknown time zone {tz_name!r}") from None
    start = end = None
    if span is not None:
        parts = span.split("-")
        if len(parts) != 2:
            raise FlowError(f"{path}.time", f"expected HH:MM-HH:MM, got {span!r}")
        start, end = (_minute(f"{path}.time", p.strip()) for p in parts)
        if start == end:
            raise FlowError(f"{path}.time", f"an empty span: {span!r}")
    days = _days(f"{path}.days", days_text) if days_text is not None else None
    return Condition(start, end, days, tz)


def _minute(path: str, text: str) -> int:
    m = _CLOCK.fullmatch(text)
    minute = int(m.group(1)) * 60 + int(m.group(2)) if m is not None else -1
    if m is None or int(m.group(2)) > 59 or not 0 <= minute <= 24 * 60:
        raise FlowError(path, f"expected a time HH:MM from 00:00 to 24:00, got {text!r}")
    return minute


def _days(path: str, text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.lower().replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        if lo not in DAYS or (hi and hi not in DAYS):
            raise FlowError(path, f"expected days such as 'mon-fri' or 'sat,sun', got {text!r}")
        a, b = DAYS.index(lo), DAYS.index(hi or lo)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(out)


def parse_vars(data: object, path: str, *, settable: bool = False) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FlowError(path, f"expected a table of names to values, got {_show(data)}")
    if len(data) > MAX_VARS:
        raise FlowError(path, f"{len(data)} variables; the limit is {MAX_VARS}")
    out: dict[str, str] = {}
    for k, v in data.items():
        if not isinstance(k, str) or not _VAR.fullmatch(k) or len(k) > MAX_NAME_CHARS:
            raise FlowError(f"{path}.{k}", "a variable name is letters, digits and _")
        if settable and k in CALL_FACTS:
            raise FlowError(f"{path}.{k}", "is a fact of the call; it cannot be set")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise FlowError(f"{path}.{k}", f"expected a string or a number, got {_show(v)}")
        text = str(v)
        if len(text) > MAX_VAR_CHARS:
            raise FlowError(f"{path}.{k}", f"longer than {MAX_VAR_CHARS} characters")
        out[k] = text
    return out


class _Fields:
    """One verb's table, read field by field; ``done`` refuses what was not read."""

    def __init__(self, data: object, path: str, verb: str, shorthand: str | None = None) -> None:
        if shorthand is not None and not isinstance(data, dict):
            data = {shorthand: data}
        if data is None or data is True:
            data = {}
        if not isinstance(data, dict):
            raise FlowError(path, f"expected a table of fields, got {_show(data)}")
        self.data: dict[str, object] = dict(data)
        self.path = path
        self.verb = verb

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def raw(self, key: str) -> object:
        return self.data.pop(key, None)

    def string(self, key: str, default: str | None, *, limit: int = MAX_VAR_CHARS) -> str | None:
        v = self.data.pop(key, None)
        if v is None:
            return default
        if not isinstance(v, str):
            raise FlowError(self.at(key), f"expected a string, got {_show(v)}")
        if len(v) > limit:
            raise FlowError(self.at(key), f"is {len(v)} characters; the limit is {limit}")
        return v

    def text(self, key: str, limit: int) -> str:
        v = self.string(key, None, limit=limit)
        if v is None or not v.strip():
            raise FlowError(self.at(key), "required: the words to say")
        return v

    def boolean(self, key: str, default: bool) -> bool:
        v = self.data.pop(key, None)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise FlowError(self.at(key), f"expected true or false, got {_show(v)}")
        return v

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        v = self.string(key, default)
        if v not in allowed:
            raise FlowError(self.at(key), f"expected one of {', '.join(allowed)}, got {v!r}")
        return v

    def integer(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        v = self.data.pop(key, None)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise FlowError(self.at(key), f"must be an integer from {lo} to {hi}, got {_show(v)}")
        return v

    def number(self, key: str, default: float | None, lo: float, hi: float) -> float | None:
        v = self.data.pop(key, None)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise FlowError(self.at(key), f"must be a number from {lo:g} to {hi:g}, got {_show(v)}")
        return float(v)

    def inputs(self, key: str, default: frozenset[str]) -> frozenset[str]:
        v = self.data.pop(key, None)
        if v is None:
            return default
        if isinstance(v, bool):
            return frozenset(INPUTS) if v else frozenset()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) and x in INPUTS for x in v):
            raise FlowError(
                self.at(key), f"expected a list of 'dtmf' and/or 'speech', got {_show(v)}"
            )
        return frozenset(v)

    def url(self, key: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
        v = self.string(key, None, limit=MAX_URL_CHARS)
        if v is not None:
            check_url(self.at(key), v, schemes)
        return v

    def done(self) -> None:
        if self.data:
            key = sorted(self.data)[0]
            raise FlowError(self.at(key), f"unknown field of {self.verb}")


def check_url(path: str, url: str, schemes: tuple[str, ...] = ("http", "https")) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise FlowError(path, f"not a URL: {url!r} ({exc})") from None
    if parts.scheme not in schemes or not parts.hostname:
        want = " or ".join(f"{s}://" for s in schemes)
        raise FlowError(path, f"expected a {want} URL with a host, got {url!r}")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise FlowError(path, "must not contain whitespace or control characters")


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _check_name(path: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise FlowError(path, f"a flow name is letters, digits, _ and -, got {_show(name)}")
    return name


def _target(path: str, value: object, limits: Limits) -> str:
    """A branch's target: a flow of this document (or of the gateway's file) or a URL."""
    if not isinstance(value, str):
        raise FlowError(path, f"expected a flow name or a URL, got {_show(value)}")
    if is_url(value):
        check_url(path, value)
        return value
    return _flow_ref(path, value, limits)


def _flow_ref(path: str, name: str, limits: Limits) -> str:
    _check_name(path, name)
    if limits.flows is not None and name not in limits.flows:
        known = ", ".join(sorted(limits.flows)) or "none"
        raise FlowError(path, f"no flow named {name!r} (flows: {known})")
    return name


def _route(f: _Fields, limits: Limits, outcomes: tuple[str, ...] | None) -> Route:
    """``action`` | ``next`` | ``branches`` (+ ``match`` for gather); ``outcomes``: the keys a
    verb's branches may have (None: any, the digits or words heard)."""
    action = f.url("action")
    nxt = f.string("next", None)
    branches_raw = f.raw("branches")
    given = [k for k, v in (("action", action), ("next", nxt), ("branches", branches_raw))
             if v is not None]  # fmt: skip
    if len(given) > 1:
        raise FlowError(
            f.at(given[1]), f"give one of action, next and branches, not {given[0]} too"
        )
    match = f.choice("match", "exact", MATCHES) if outcomes is None else "exact"
    if nxt is not None:
        nxt = _target(f.at("next"), nxt, limits)
    branches: list[tuple[str, str]] = []
    if branches_raw is not None:
        bpath = f.at("branches")
        if not isinstance(branches_raw, dict) or not branches_raw:
            raise FlowError(
                bpath, f"expected a table of results to flows, got {_show(branches_raw)}"
            )
        if len(branches_raw) > MAX_BRANCHES:
            raise FlowError(bpath, f"{len(branches_raw)} branches; the limit is {MAX_BRANCHES}")
        for key, target in branches_raw.items():
            kpath = f"{bpath}.{key}"
            if outcomes is not None and key != "default" and key not in outcomes:
                raise FlowError(kpath, f"not a result of {f.verb} "
                                f"(results: {', '.join(outcomes)}, default)")  # fmt: skip
            if outcomes is None and not 0 < len(key) <= MAX_DIGITS:
                raise FlowError(kpath, f"a result is 1 to {MAX_DIGITS} characters")
            branches.append((key, _target(kpath, target, limits)))
    return Route(action, nxt, tuple(branches), match)


def _barge_in(f: _Fields) -> frozenset[str]:
    return f.inputs("barge_in", frozenset(INPUTS))


def _say(f: _Fields, limits: Limits) -> Say:
    text = f.text("text", limits.max_text_chars)
    barge = _barge_in(f)
    loop = f.integer("loop", 1, 1, MAX_LOOP)
    if "voice" in f.data:
        raise FlowError(f.at("voice"), "one voice per gateway ([synth] voice); not per verb")
    f.done()
    return Say(text, barge, loop or 1)


def _play(f: _Fields, limits: Limits) -> Play:
    url = f.url("url")
    file = f.string("file", None, limit=1024)
    barge = _barge_in(f)
    loop = f.integer("loop", 1, 1, MAX_LOOP) or 1
    f.done()
    if (url is None) == (file is None):
        raise FlowError(f.path, "give url (http or https) or file (a WAV), one of them")
    clip = None
    if file is not None:
        if limits.files is None:
            raise FlowError(f.at("file"), "files play only from a flow file; a webhook gives url")
        path = limits.files / file
        try:
            clip = read_wav(path.read_bytes())
        except OSError as exc:
            raise FlowError(f.at("file"), f"cannot read {str(path)!r}: {exc.strerror}") from None
        except ValueError as exc:
            raise FlowError(f.at("file"), f"{str(path)!r}: {exc}") from None
    return Play(url, file, clip, barge, loop)


def _pause(f: _Fields, limits: Limits) -> Pause:
    length = f.number("length", None, 0.0, MAX_PAUSE_S)
    f.done()
    if length is None or length <= 0:
        raise FlowError(f.at("length"), f"required: seconds, more than 0 and up to {MAX_PAUSE_S:g}")
    return Pause(length)


def _prompt(f: _Fields, limits: Limits) -> Say | Play | None:
    say, play = f.raw("say"), f.raw("play")
    if say is not None and play is not None:
        raise FlowError(f.at("play"), "a gather has one prompt: say or play")
    if say is not None:
        return _say(_Fields(say, f.at("say"), "say", shorthand="text"), limits)
    if play is not None:
        return _play(_Fields(play, f.at("play"), "play", shorthand="url"), limits)
    return None


def _gather(f: _Fields, limits: Limits) -> Gather:
    inputs = f.inputs("input", frozenset({"dtmf"}))
    if not inputs:
        raise FlowError(f.at("input"), "listen for 'dtmf', 'speech' or both")
    num = f.integer("num_digits", None, 1, MAX_DIGITS)
    finish = f.string("finish_on_key", "#")
    if finish is None or (finish != "" and not is_dtmf_key(finish)):
        raise FlowError(f.at("finish_on_key"), f"one key of {DTMF_KEYS}, or '' for none")
    lo = f.integer("min_digits", 1, 1, MAX_DIGITS) or 1
    hi = f.integer("max_digits", MAX_DIGITS, 1, MAX_DIGITS) or MAX_DIGITS
    if lo > hi:
        raise FlowError(f.at("min_digits"), f"more than max_digits ({hi})")
    if num is not None and not lo <= num <= hi:
        raise FlowError(f.at("num_digits"), f"outside min_digits..max_digits ({lo}..{hi})")
    timeout = f.number("timeout", 5.0, 0.0, MAX_TIMEOUT_S)
    assert timeout is not None
    inter = f.number("inter_digit_timeout", timeout if timeout > 0 else 5.0, 0.1, 60.0)
    assert inter is not None
    prompt = _prompt(f, limits)
    route = _route(f, limits, None)
    f.done()
    if "speech" not in inputs and route.match == "contains":
        raise FlowError(f.at("match"), "'contains' matches words: for speech input")
    return Gather(inputs, num, finish, lo, hi, timeout, inter, prompt, route)


def _transfer(f: _Fields, limits: Limits) -> Transfer:
    target = f.string("target", None, limit=MAX_URL_CHARS)
    if target is None or not target.strip():
        raise FlowError(f.at("target"), "required: a SIP URI (sip:...) or a number")
    if "{" not in target:
        check_target(f.at("target"), target)
    mode = f.choice("mode", "blind", ("blind", "attended"))
    bridge = f.boolean("bridge", f.verb == "dial")
    fallback = _fallback(f, limits)
    route = _route(f, limits, RESULTS["transfer"])
    f.done()
    if fallback and not route.empty:
        raise FlowError(f.at("fallback"), "give fallback or action/next/branches, not both")
    return Transfer(target, mode, bridge, fallback, route, f.verb)


def check_target(path: str, target: str) -> None:
    """A transfer target: a ``sip:``/``sips:``/``tel:`` URI or a number (digits, + * #)."""
    low = target.lower()
    if low.startswith(("sip:", "sips:")):
        rest = target.split(":", 1)[1]
        if not rest or any(c.isspace() or c in '<>"' for c in rest):
            raise FlowError(path, f"not a SIP URI: {target!r}")
        return
    if low.startswith("tel:"):
        target = target[4:]
    if not _NUMBER.fullmatch(target):
        raise FlowError(path, f"expected a SIP URI (sip:...) or a number, got {target!r}")


def _fallback(f: _Fields, limits: Limits) -> tuple[Step, ...]:
    raw = f.raw("fallback")
    if raw is None:
        return ()
    return parse_steps(raw, f.at("fallback"), limits)


def _record(f: _Fields, limits: Limits) -> Record:
    action = f.choice("action", "start", ("start", "stop"))
    channels = f.choice("channels", "both", ("both", "caller"))
    consent = f.string("consent", "", limit=limits.max_text_chars) or ""
    fallback = _fallback(f, limits)
    f.done()
    if action == "stop" and consent:
        raise FlowError(f.at("consent"), "a consent line goes with action 'start'")
    return Record(action, channels, consent, fallback)


def _hangup(f: _Fields, limits: Limits) -> Hangup:
    reason = f.string("reason", "flow", limit=64) or "flow"
    f.done()
    return Hangup(reason)


def _redirect(f: _Fields, limits: Limits) -> Redirect:
    flow = f.string("flow", None, limit=MAX_NAME_CHARS)
    url = f.url("url")
    f.done()
    if (flow is None) == (url is None):
        raise FlowError(f.path, "give flow (a name) or url (a webhook), one of them")
    if flow is not None:
        flow = _flow_ref(f.at("flow"), flow, limits)
    return Redirect(flow, url)


def _llm(f: _Fields, limits: Limits) -> Llm:
    if not limits.llm:
        raise FlowError(f.path, "the llm verb needs an OpenAI-compatible endpoint: this gateway "
                        "has no [llm] base_url")  # fmt: skip
    system = f.string("system_prompt", None, limit=MAX_PROMPT_CHARS)
    greeting = f.string("greeting", None, limit=limits.max_text_chars)
    model = f.string("model", None, limit=200)
    temperature = f.number("temperature", None, 0.0, 2.0)
    max_tokens = f.integer("max_tokens", None, 1, 4096)
    route = _route(f, limits, RESULTS["llm"])
    f.done()
    return Llm(system, greeting, model, temperature, max_tokens, route)


def _stream(f: _Fields, limits: Limits) -> Stream:
    url = f.url("url", schemes=("ws", "wss"))
    if url is None and not limits.stream_url:
        raise FlowError(f.at("url"), "required: the bot's ws:// or wss:// URL (this gateway "
                        "has no [stream] url)")  # fmt: skip
    params = parse_vars(f.raw("parameters"), f.at("parameters"))
    for reserved in ("from_number", "to_number"):
        if reserved in params:
            raise FlowError(
                f.at(f"parameters.{reserved}"), "is set by the gateway (the call's own)"
            )
    route = _route(f, limits, RESULTS["stream"])
    f.done()
    return Stream(url, tuple(params.items()), route)


def _set(f: _Fields, limits: Limits) -> SetVars:
    values = parse_vars(f.data, f.path, settable=True)
    f.data.clear()
    if not values:
        raise FlowError(f.path, "nothing to set")
    return SetVars(tuple(values.items()))


# The field a verb's bare value stands for (``say = "Hello"``, ``pause = 2``).
SHORTHAND = {"say": "text", "play": "url", "pause": "length"}

_VERB_PARSERS: dict[str, Callable[[_Fields, Limits], Verb]] = {
    "say": _say,
    "play": _play,
    "pause": _pause,
    "gather": _gather,
    "transfer": _transfer,
    "dial": _transfer,
    "record": _record,
    "hangup": _hangup,
    "redirect": _redirect,
    "llm": _llm,
    "stream": _stream,
    "set": _set,
}


# --- WAV --------------------------------------------------------------------------------------
def read_wav(data: bytes) -> Clip:
    """A PCM WAV (8 or 16 bit, mono or stereo, 8-48 kHz) as int16 mono; ``ValueError`` says
    what is wrong with any other."""
    import io

    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            rate, width, channels, n = (
                w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            )  # fmt: skip
            if not 8000 <= rate <= 48000:
                raise ValueError(f"sample rate {rate} Hz; 8000 to 48000 are played")
            if channels not in (1, 2):
                raise ValueError(f"{channels} channels; mono or stereo are played")
            if n / rate > MAX_PLAY_S:
                raise ValueError(f"{n / rate:.0f} s long; the limit is {MAX_PLAY_S:g} s")
            raw = w.readframes(n)
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a PCM WAV file ({exc})") from None
    if width == 2:
        pcm = np.frombuffer(raw, dtype="<i2").astype(np.int32)
    elif width == 1:
        pcm = (np.frombuffer(raw, dtype=np.uint8).astype(np.int32) - 128) << 8
    else:
        raise ValueError(f"{8 * width}-bit samples; 8 or 16-bit PCM is played")
    if channels == 2:
        pcm = pcm[: pcm.size // 2 * 2].reshape(-1, 2).mean(axis=1).astype(np.int32)
    return Clip(pcm.astype(np.int16), rate)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
