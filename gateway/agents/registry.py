"""Agents by kind: the gateway's default (``[agent] kind``) and the one a call asks for
(``POST /api/calls {"to": ..., "agent": {"kind": "llm", "system_prompt": ..., "vars": {...}}}``).

A per-call request is checked in full before anybody is dialled (unknown kinds and fields,
wrong types, over-long texts, an llm agent on a gateway without ``[llm] base_url``: a 422 with
the reason). What llm calls share is built once: the recogniser and the end-of-turn model
(loaded in a thread on first use, or at start when ``llm`` is the default) and one HTTP
connection pool to the model's endpoint.

A ``stream`` agent (``{"kind": "stream", "url": "wss://...", "parameters": {...}}``) bridges the
call to a bot's WebSocket (``gateway.agents.stream``); ``url`` defaults to ``[stream] url`` and
``parameters`` (strings) reach the bot as the ``start`` message's ``customParameters``. Stream
calls share one WebSocket client session without a connection limit (each call holds its
socket for the whole call) and one TLS context (``[stream] ca_file``).

A ``flow`` agent (``{"kind": "flow", "flow": "sales", "vars": {...}}`` or ``{"kind": "flow",
"url": "https://..."}``) runs a call flow (``gateway.flow``): a named flow of ``[flow] file``
(read and checked once, at start: a bad file stops the start), or a webhook's verbs. Flow calls
share the webhook client (signed, bounded) and, for speech gathers, the recogniser.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Callable

import aiohttp

from gateway.agents.base import Agent
from gateway.agents.ivr import IvrAgent
from gateway.agents.llm import Ears, LlmAgent, fill
from gateway.agents.stream import StreamAgent
from gateway.agents.twilio_media import new_sid
from gateway.call.control import BadRequest, CallInfo
from gateway.flow.engine import FlowAgent, FlowServices
from gateway.flow.source import DEFAULT_FLOW_FILE, Webhook, WebhookSettings, load_flow_file
from gateway.flow.verbs import FlowError, Limits, check_url
from gateway.llm.client import ChatClient
from gateway.stt.base import SpeechToText
from voxgate.contract.config import AGENT_KINDS, Config, ConfigError, check_stream_url

log = logging.getLogger("voxgate.agents")

# Limits of a per-call agent request.
MAX_PROMPT_CHARS = 20000
MAX_VARS = 50
MAX_VAR_CHARS = 1000
MAX_URL_CHARS = 2048
# customParameters voxgate fills itself: a request may not pass itself off as the caller.
RESERVED_PARAMETERS = ("from_number", "to_number")
AGENT_FIELDS: dict[str, tuple[str, ...]] = {
    "ivr": ("kind",),
    "llm": ("kind", "system_prompt", "greeting", "vars", "model", "temperature", "max_tokens"),
    "stream": ("kind", "url", "parameters"),
    "flow": ("kind", "flow", "url", "vars"),
}


def load_ears(cfg: Config) -> Ears:
    """The bundled recogniser and end-of-turn model (blocking: ~1-2 s; run it in a thread)."""
    from gateway.stt.turn import SmartTurn
    from gateway.stt.whisper import WhisperStt

    stt = WhisperStt(threads=cfg.turn.stt_threads)
    model = SmartTurn(threads=1) if cfg.turn.smart_turn else None
    return Ears(stt, model)


class AgentRegistry:
    def __init__(
        self,
        cfg: Config,
        *,
        ears_loader: Callable[[Config], Ears] = load_ears,
        api_key: str | None = None,
    ) -> None:
        self.cfg = cfg
        self._ears_loader = ears_loader
        self._ears: Ears | None = None
        self._ears_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._api_key = api_key
        self._stream_session: aiohttp.ClientSession | None = None
        self._stream_ssl: ssl.SSLContext | None = None
        # The accountSid stream calls are given: one per gateway, as Twilio's is per account.
        self.account_sid = cfg.stream.account_sid or new_sid("AC")
        self._flow_session: aiohttp.ClientSession | None = None
        self.flows = self._flow_services()  # the flow file is read and checked here, at start

    # --- AgentChooser --------------------------------------------------------------------
    def validate(self, spec: object) -> dict[str, object]:
        if not isinstance(spec, dict):
            raise BadRequest("'agent' must be an object")
        kind = spec.get("kind")
        if kind not in AGENT_KINDS:
            raise BadRequest(f"agent.kind must be one of {', '.join(AGENT_KINDS)}; got {kind!r}")
        unknown = sorted(set(spec) - set(AGENT_FIELDS[str(kind)]))
        if unknown:
            raise BadRequest(f"agent: unknown field {unknown[0]!r} for kind {kind!r}")
        if kind == "llm":
            if not self.cfg.llm.base_url:
                raise BadRequest(
                    "the llm agent needs an OpenAI-compatible endpoint: this gateway has no "
                    "[llm] base_url"
                )
            for key, limit in (("system_prompt", MAX_PROMPT_CHARS),
                               ("greeting", self.cfg.synth.max_text_chars),
                               ("model", 200)):  # fmt: skip
                value = spec.get(key)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise BadRequest(f"agent.{key} must be a string")
                if len(value) > limit:
                    raise BadRequest(
                        f"agent.{key} is {len(value)} characters; the limit is {limit}"
                    )
            temperature = spec.get("temperature")
            if temperature is not None and (
                isinstance(temperature, bool)
                or not isinstance(temperature, int | float)
                or not 0 <= temperature <= 2
            ):
                raise BadRequest("agent.temperature must be a number from 0 to 2")
            max_tokens = spec.get("max_tokens")
            if max_tokens is not None and (
                isinstance(max_tokens, bool)
                or not isinstance(max_tokens, int)
                or not 1 <= max_tokens <= 4096
            ):
                raise BadRequest("agent.max_tokens must be an integer from 1 to 4096")
            values = self._vars(spec.get("vars"))
            # What will be said, as it will be said: filled from the vars.
            greeting = fill(
                str(spec.get("greeting") or values.get("greeting") or self.cfg.llm.greeting),
                values,
            )
            limit = self.cfg.synth.max_text_chars
            if len(greeting) > limit:
                raise BadRequest(
                    f"agent.greeting is {len(greeting)} characters with agent.vars filled in; "
                    f"the limit is {limit}"
                )
            spec = {**spec, "vars": values}
        if kind == "stream":
            spec = {**spec, **self._stream_spec(spec)}
        if kind == "flow":
            spec = {**spec, **self._flow_spec(spec)}
        return dict(spec)

    def _stream_spec(self, spec: dict[str, object]) -> dict[str, object]:
        url = spec.get("url")
        if url is None:
            if not self.cfg.stream.url:
                raise BadRequest(
                    "the stream agent needs the bot's WebSocket: give agent.url (ws:// or "
                    "wss://); this gateway has no [stream] url"
                )
            url = self.cfg.stream.url
        if not isinstance(url, str):
            raise BadRequest("agent.url must be a string")
        if len(url) > MAX_URL_CHARS:
            raise BadRequest(f"agent.url is {len(url)} characters; the limit is {MAX_URL_CHARS}")
        try:
            check_stream_url("agent.url", url)
        except ConfigError as exc:
            raise BadRequest(str(exc)) from None
        params = spec.get("parameters")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadRequest("agent.parameters must be an object of names to strings")
        if len(params) > MAX_VARS:
            raise BadRequest(f"agent.parameters has {len(params)} entries; the limit is {MAX_VARS}")
        for k, v in params.items():
            if not k or len(k) > 100:
                raise BadRequest("agent.parameters: names must be 1 to 100 characters")
            if k in RESERVED_PARAMETERS:
                raise BadRequest(f"agent.parameters.{k} is set by the gateway (the call's own)")
            if not isinstance(v, str):
                raise BadRequest(f"agent.parameters.{k} must be a string")
            if len(v) > MAX_VAR_CHARS:
                raise BadRequest(f"agent.parameters.{k} is longer than {MAX_VAR_CHARS} characters")
        return {"url": url, "parameters": dict(params)}

    def build(self, info: CallInfo, spec: dict[str, object] | None) -> Agent:
        kind = spec.get("kind") if spec is not None else self.cfg.agent.kind
        if kind == "llm":
            return self._llm(spec or {})
        if kind == "stream":
            return self._stream(spec or {})
        if kind == "flow":
            return self._flow(spec or {})
        return IvrAgent(self.cfg.ivr)

    def default(self, info: CallInfo) -> Agent:
        return self.build(info, None)

    # --- llm -----------------------------------------------------------------------------
    def _llm(self, spec: dict[str, object]) -> LlmAgent:
        llm = self.cfg.llm
        variables = spec.get("vars")
        values: dict[str, str] = dict(variables) if isinstance(variables, dict) else {}
        system_prompt = str(spec.get("system_prompt") or llm.system_prompt)
        greeting = str(spec.get("greeting") or values.get("greeting") or llm.greeting)
        temperature = spec.get("temperature")
        max_tokens = spec.get("max_tokens")
        client = ChatClient(
            llm.base_url,
            str(spec.get("model") or llm.model),
            api_key=self._api_key,
            temperature=float(temperature)
            if isinstance(temperature, int | float)
            else (llm.temperature),
            max_tokens=max_tokens if isinstance(max_tokens, int) else llm.max_tokens,
            timeout_s=llm.timeout_s,
            session=self._http(),
        )
        return LlmAgent(
            client=client,
            ears=self.ears,
            turn=self.cfg.turn,
            system_prompt=fill(system_prompt, values),
            greeting=fill(greeting, values),
            fallback=llm.fallback,
            max_history=llm.max_history,
        )

    # --- stream --------------------------------------------------------------------------
    def _stream(self, spec: dict[str, object]) -> StreamAgent:
        url = spec.get("url")
        params = spec.get("parameters")
        return StreamAgent(
            url=url if isinstance(url, str) else self.cfg.stream.url,
            parameters=dict(params) if isinstance(params, dict) else {},
            settings=self.cfg.stream,
            session=self._stream_http,
            ssl_context=self._tls() if str(url or self.cfg.stream.url).startswith("wss:") else None,
            account_sid=self.account_sid,
        )

    def _tls(self) -> ssl.SSLContext:
        """Certificates verified, against ``[stream] ca_file`` alone when set."""
        if self._stream_ssl is None:
            self._stream_ssl = ssl.create_default_context(cafile=self.cfg.stream.ca_file or None)
        return self._stream_ssl

    def _stream_http(self) -> aiohttp.ClientSession:
        if self._stream_session is None or self._stream_session.closed:
            # limit=0: every stream call holds its socket for the whole call; a pool limit
            # would make call N+1 wait for a hang-up.
            self._stream_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), headers={"User-Agent": "voxgate"}
            )
        return self._stream_session

    async def ears(self) -> Ears:
        """The shared recogniser and end-of-turn model, loaded on first use (in a thread)."""
        async with self._ears_lock:
            if self._ears is None:
                loop = asyncio.get_running_loop()
                self._ears = await loop.run_in_executor(None, self._ears_loader, self.cfg)
            return self._ears

    @property
    def stt(self) -> SpeechToText | None:
        """The recogniser if it is loaded (never loads it): AMD's word rule uses it when there."""
        return self._ears.stt if self._ears is not None else None

    async def warm(self) -> None:
        """Load what the default agent needs before the first call arrives (and the
        recogniser when the flow file has a speech gather: a missing model stops the start)."""
        if self.cfg.agent.kind == "llm":
            await self.ears()
        book = self.flows.book
        where = book.speech_at() if book is not None else None
        if book is not None and where is not None:
            try:
                await self.ears()
            except Exception as exc:  # the recogniser's model is missing or broken
                raise ConfigError(
                    f"flow.file: {book.origin}: {where} listens for speech, but speech-to-text "
                    f"cannot load: {exc}"
                ) from None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._flow_session is not None:
            await self._flow_session.close()
        if self._session is not None:
            await self._session.close()
        if self._stream_session is not None:
            await self._stream_session.close()

    # --- flow ----------------------------------------------------------------------------
    def _flow_services(self) -> FlowServices:
        cfg = self.cfg
        f = cfg.flow
        limits = Limits(
            llm=bool(cfg.llm.base_url), stream_url=bool(cfg.stream.url),
            max_text_chars=cfg.synth.max_text_chars,
        )  # fmt: skip
        # Neither a file nor a webhook: the built-in flow (the IVR menu, as `make serve` runs).
        file = f.file or ("" if f.url else str(DEFAULT_FLOW_FILE))
        book = load_flow_file(file, limits) if file else None
        if book is not None and f.start:
            if f.start not in book.flows:
                raise ConfigError(f"flow.start: {f.file} has no flow named {f.start!r} "
                                  f"(flows: {', '.join(sorted(book.flows))})")  # fmt: skip
            book = dataclasses.replace(book, start=f.start)
        settings = WebhookSettings(
            timeout_s=f.timeout_s, retries=f.retries, max_response_bytes=f.max_response_bytes,
            secret=f.secret(),
        )  # fmt: skip
        return FlowServices(
            webhook=Webhook(settings, self._flow_http),
            book=book,
            url=f.url,
            fallback=f.fallback,
            # A webhook's verbs: flows named must be the file's; files are the file's alone.
            limits=dataclasses.replace(
                limits, flows=frozenset(book.flows) if book is not None else frozenset()
            ),
            turn=cfg.turn,
            ears=self.ears,
            llm=self._llm if cfg.llm.base_url else None,
            stream=self._stream,
        )

    def _flow_spec(self, spec: dict[str, object]) -> dict[str, object]:
        flow, url = spec.get("flow"), spec.get("url")
        book = self.flows.book
        if flow is not None and url is not None:
            raise BadRequest("agent: give flow (a name) or url (a webhook), not both")
        if flow is not None:
            if not isinstance(flow, str):
                raise BadRequest("agent.flow must be a string")
            if book is None:
                raise BadRequest("agent.flow: this gateway has no [flow] file; give agent.url")
            if flow not in book.flows:
                raise BadRequest(
                    f"agent.flow: no flow named {flow[:100]!r} "
                    f"(flows: {', '.join(sorted(book.flows))})"
                )
        elif url is not None:
            if not isinstance(url, str):
                raise BadRequest("agent.url must be a string")
            if len(url) > MAX_URL_CHARS:
                raise BadRequest(
                    f"agent.url is {len(url)} characters; the limit is {MAX_URL_CHARS}"
                )
            try:
                check_url("agent.url", url)
            except FlowError as exc:
                raise BadRequest(str(exc)) from None
        elif book is None and not self.flows.url:
            raise BadRequest(
                "the flow agent needs flows: give agent.flow or agent.url; this gateway has no "
                "[flow] file or url"
            )
        return {"flow": flow, "url": url, "vars": self._vars(spec.get("vars"))}

    def _flow(self, spec: dict[str, object]) -> FlowAgent:
        flow, url, variables = spec.get("flow"), spec.get("url"), spec.get("vars")
        return FlowAgent(
            self.flows,
            flow=flow if isinstance(flow, str) else None,
            url=url if isinstance(url, str) else None,
            variables={str(k): str(v) for k, v in variables.items()}
            if isinstance(variables, dict) else None,
        )  # fmt: skip

    def _flow_http(self) -> aiohttp.ClientSession:
        if self._flow_session is None or self._flow_session.closed:
            self._flow_session = aiohttp.ClientSession()
        return self._flow_session

    @staticmethod
    def _vars(value: object) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise BadRequest("agent.vars must be an object of names to values")
        if len(value) > MAX_VARS:
            raise BadRequest(f"agent.vars has {len(value)} entries; the limit is {MAX_VARS}")
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise BadRequest(f"agent.vars.{k} must be a string or a number")
            text = str(v)
            if len(text) > MAX_VAR_CHARS:
                raise BadRequest(f"agent.vars.{k} is longer than {MAX_VAR_CHARS} characters")
            out[str(k)] = text
        return out
