"""The control API: HTTP endpoints and a WebSocket event feed over ``CallControl``.

Handlers only parse, validate and translate: every call decision lives behind ``CallControl``
(``gateway.call.calls``), and its ``ControlError``s become JSON errors with their own HTTP status.

Errors are always ``{"error": {"code": ..., "message": ...}}``. JSON bodies must be sent as
``Content-Type: application/json`` (415 otherwise) and are capped at 1 MiB (413); unknown fields
are refused (422) so a typo is not silently ignored.

``POST /api/calls/{id}/say`` takes three bodies: JSON ``{"text", "interrupt"}``; ``text/plain``
(UTF-8, typically chunked), whose pieces go to ``say_stream`` as they arrive; and
``application/x-ndjson`` lines ``{"text": "..."}``, each forwarded when its line is complete.
A stream answers 202 only once the whole body has been read (413 the moment the running total
passes ``max_text_chars``); any failure is also raised inside ``say_stream``'s iterator, so
truncated text is never taken for the whole. Streams have no ``interrupt`` (``say_stream`` has
none).

``POST /api/calls/{id}/transfer`` ``{"target": "sip:...", "mode": "blind"|"attended",
"fallback": "bridge"|"none", "timeout_s"}`` waits for the transfer's outcome and answers it
(``gateway.call.control.TransferOutcome``) with 200, whatever the result.

Authentication: when a token is configured, every ``/api/*`` request needs
``Authorization: Bearer <token>`` (compared in constant time). Browsers cannot set headers on a
WebSocket, so ``GET /api/events`` alone also accepts ``?token=<token>``; the access log redacts
it. ``/healthz`` and routes passed in ``extra_routes`` outside ``/api/`` stay open.

Twilio-compatible hang-up: ``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with the
form ``Status=completed`` (or ``canceled``) hangs up the call voxgate bridged to a bot under that
``callSid`` (``gateway.agents.stream``), so a pipecat bot whose ``TwilioFrameSerializer`` has
``auto_hang_up`` on and ``base_url`` pointing at voxgate ends its calls as it would on Twilio.
Twilio authenticates it with HTTP Basic (account SID and auth token): with a token configured,
the Basic password must be the API token (the user name is not checked; a bearer token works
too); without one it is open on loopback like ``/api/*``. With ``[stream] account_sid`` set,
only that ``AccountSid`` is answered (another gets 20404, as a call of another account would).
Answers and errors are Twilio-shaped JSON (a call resource; ``{"code", "message", "more_info",
"status"}``, 20404 for an unknown call, which pipecat takes as "already ended").

Without a token the API may only listen on loopback (``check_bind_safety``). Loopback is not
enough against a browser on the same machine — any web page can send it simple cross-origin
requests or have a DNS name rebound to 127.0.0.1 — so in that mode ``/api/*`` also refuses (403)
a request whose ``Host`` or ``Origin`` is not a loopback name, and JSON endpoints insist on
``Content-Type: application/json``, which a page cannot send cross-origin without a preflight.

Event feed overflow policy: each WebSocket has a bounded queue; if a client reads so slowly that
it fills, the backlog is discarded, one ``{"type": "overflow", ...}`` message is sent and the
socket is closed with 1013 (try again later). Silently dropping events would leave the client
with a wrong picture of the calls; closing tells it to reconnect and resync from ``/api/calls``.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware

from gateway.agents.twilio_media import call_sid_for, phone_number
from gateway.api.auth import (
    UnsafeBindError,
    bearer_token,
    check_bind_safety,
    is_loopback_host,
    token_matches,
)
from gateway.call.control import (
    BadRequest,
    CallControl,
    CallInfo,
    ControlError,
    Event,
    TextTooLong,
    UnknownCall,
    event_json,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_WS_HEARTBEAT_S",
    "DEFAULT_WS_QUEUE_SIZE",
    "HttpError",
    "UnsafeBindError",
    "check_bind_safety",
    "make_app",
    "start_api",
    "stop_api",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_WS_QUEUE_SIZE: Final = 256
DEFAULT_WS_HEARTBEAT_S: Final = 20.0
MAX_DTMF_DIGITS: Final = 256
# How long a closing WebSocket waits for the client's close reply.
WS_CLOSE_TIMEOUT_S: Final = 2.0

_DTMF_RE: Final = re.compile(r"[0-9*#A-D]+")
_API_PREFIX: Final = "/api"
_EVENTS_PATH: Final = "/api/events"

_TOKEN_KEY: Final[web.AppKey[str | None]] = web.AppKey("voxgate.api_token")
_ACCOUNT_KEY: Final[web.AppKey[str | None]] = web.AppKey("voxgate.twilio_account_sid")
_TWILIO_CALL_PATH: Final = "/2010-04-01/Accounts/{account_sid}/Calls/{call_sid}.json"


class HttpError(Exception):
    """An HTTP-level refusal that is not a call-control matter (auth, media type, upgrade)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


# Codes for the errors aiohttp itself raises (routing, body size, handshake).
_HTTP_CODES: Final = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    status = exc.status
    code = _HTTP_CODES.get(status, exc.reason.lower().replace(" ", "_").replace("-", "_"))
    headers: dict[str, str] = {}
    if status == 404:
        message = f"no such resource: {request.method} {request.path}"
    elif status == 405 and isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"method {request.method} is not allowed on {request.path}; allowed: {allowed}"
        headers["Allow"] = allowed
    else:
        message = exc.text or exc.reason
        if message.startswith(f"{status}: "):  # aiohttp's default text repeats the status
            message = message[len(f"{status}: ") :]
    return error_response(status, code, message, headers)


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes the JSON error shape; unexpected ones are logged, never leaked."""
    try:
        return await handler(request)
    except ControlError as exc:
        return error_response(exc.status, exc.code, exc.message)
    except HttpError as exc:
        return error_response(exc.status, exc.code, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like are not errors
            raise
        return _from_http_exception(request, exc)
    except Exception:
        log.exception("control API: unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error")


def _is_api_request(request: web.Request) -> bool:
    # Decide by the matched route as well as the path, so no spelling of a path that the router
    # resolves to an /api route can dodge the check.
    canonical = (
        request.match_info.route.resource.canonical if request.match_info.route.resource else ""
    )
    return any(
        p == _API_PREFIX or p.startswith(_API_PREFIX + "/") for p in (request.path, canonical)
    )


def _auth_middleware(token: str | None) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if _is_api_request(request):
            if token:
                _check_token(request, token)
            else:
                _check_local_browser(request)
        return await handler(request)

    return middleware


def _check_token(request: web.Request, token: str) -> None:
    presented = bearer_token(request.headers.get("Authorization"))
    if presented is None and request.path == _EVENTS_PATH:
        presented = request.query.get("token") or None  # browsers' WebSocket cannot set headers
    if presented is None:
        raise HttpError(
            401,
            "unauthorized",
            "missing bearer token: send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": 'Bearer realm="voxgate"'},
        )
    if not token_matches(presented, token):
        raise HttpError(
            401,
            "unauthorized",
            "invalid bearer token",
            {"WWW-Authenticate": 'Bearer realm="voxgate", error="invalid_token"'},
        )


def _check_local_browser(request: web.Request) -> None:
    """Tokenless mode: refuse what a browser page on this machine could send us (see module doc)."""
    host_ok = is_loopback_host(_host_of(request.headers.get("Host", "")))
    origin = request.headers.get("Origin")
    origin_ok = origin is None or is_loopback_host(_origin_host(origin))
    if not (host_ok and origin_ok):
        raise HttpError(
            403,
            "forbidden",
            "without an API token only loopback Host and Origin are accepted; "
            "set gateway.api_token to allow other clients",
        )


def _host_of(host_header: str) -> str:
    """The name in a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), parsed strictly:
    anything odd comes back unchanged and so fails the loopback test."""
    value = host_header.strip()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        return name if sep and (not rest or (rest[1:].isdigit() and rest[0] == ":")) else value
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


def _origin_host(origin: str) -> str:
    # "null" (sandboxed frames, file: pages) and anything unparsable give "", never loopback.
    try:
        return urlsplit(origin).hostname or ""
    except ValueError:
        return ""


# ---------------------------------------------------------------------------------------------
# Request bodies


async def json_object(request: web.Request) -> dict[str, object]:
    """The request's JSON object body, with the API's checks (Content-Type, size, shape);
    shared with the routes other modules add (gateway.legs.webrtc)."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        got = request.headers.get("Content-Type", "none")
        raise HttpError(
            415,
            "unsupported_media_type",
            f"expected Content-Type: application/json, got {got}",
        )
    body = await request.read()  # bounded by client_max_size; over it aiohttp raises 413
    if not body.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        value = json.loads(body)
    # JSONDecodeError and UnicodeDecodeError; RecursionError: a few kB of "[" (fuzzing)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"request body must be a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _only(body: dict[str, object], allowed: Iterable[str]) -> None:
    # Unknown fields are refused so a typo ("interupt") is an error, not a silent default.
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}")


def _string(body: dict[str, object], key: str) -> str:
    if key not in body:
        raise BadRequest(f"missing field {key!r}")
    value = body[key]
    if not isinstance(value, str):
        raise BadRequest(f"field {key!r} must be a string, got {_json_type(value)}")
    return value


def _optional_string(body: dict[str, object], key: str) -> str | None:
    if body.get(key) is None:
        return None
    return _string(body, key)


def _boolean(body: dict[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"field {key!r} must be a boolean, got {_json_type(value)}")
    return value


def _sip_uri(key: str, value: str) -> str:
    scheme, sep, rest = value.partition(":")
    if not sep or scheme.lower() not in ("sip", "sips") or not rest:
        raise BadRequest(f"field {key!r} must be a sip: or sips: URI, got {value!r}")
    # The URI ends up in SIP headers: whitespace or control characters could inject headers.
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise BadRequest(f"field {key!r} must not contain whitespace or control characters")
    return value


# A softphone registered to the gateway may be called by its account name alone ("alice"):
# RFC 3261 user characters, less those that would need escaping.
_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~!$&'*+=-]{0,63}")


def _call_target(key: str, value: str) -> str:
    """A sip:/sips: URI, or the name of an account registered here (``gateway.sip.access``;
    an unregistered one is answered 404 by the SIP leg)."""
    if _USER_NAME.fullmatch(value):
        return value
    return _sip_uri(key, value)


def _check_length(text: str, limit: int) -> None:
    if len(text) > limit:
        raise TextTooLong(f"text is {len(text)} characters; the limit is {limit}")


# ---------------------------------------------------------------------------------------------
# Streamed text for say_stream


class _TextPieces:
    """The async iterator handed to ``say_stream``, fed by the request-body reader.

    Unbounded on purpose: the reader stops at ``max_text_chars``, so memory is bounded by the
    limit, and the reader never waits on the consumer. A failed body (too long, bad UTF-8,
    client gone) is raised to the consumer, so truncated text is never spoken as if complete.
    """

    _END: Final = object()

    def __init__(self) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.closed = False

    def feed(self, text: str) -> None:
        self._queue.put_nowait(text)

    def finish(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(self._END)

    def fail(self, exc: BaseException) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(exc)

    def __aiter__(self) -> _TextPieces:
        return self

    async def __anext__(self) -> str:
        item = await self._queue.get()
        if isinstance(item, str):
            return item
        self._queue.put_nowait(item)  # keep answering the same way if called again
        if isinstance(item, BaseException):
            raise item
        raise StopAsyncIteration


class _BodyGone(BadRequest):
    """The client went away (or broke the framing) before the body was complete."""


async def _body_chunks(request: web.Request) -> AsyncGenerator[bytes, None]:
    try:
        async for data in request.content.iter_any():
            yield data
    except (OSError, HttpProcessingError) as exc:
        raise _BodyGone(f"the request body could not be read to its end: {exc}") from None


async def _plain_text(request: web.Request) -> AsyncGenerator[str, None]:
    """UTF-8 text as it arrives; the incremental decoder holds back a split multibyte char."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    received = 0  # body bytes before the chunk being decoded
    try:
        async for data in _body_chunks(request):
            held = len(decoder.getstate()[0])
            text = decoder.decode(data)
            received += len(data)
            if text:
                yield text
        held = len(decoder.getstate()[0])
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        # exc.start indexes the decoder's held-back bytes followed by the failing chunk.
        position = received - held + exc.start
        raise BadRequest(f"request body is not valid UTF-8 (byte {position})") from None
    if tail:
        yield tail


async def _ndjson_text(request: web.Request, max_line_bytes: int) -> AsyncGenerator[str, None]:
    """The ``text`` of each ``{"text": "..."}`` line, yielded as soon as its line is complete."""
    buffer = b""
    line_no = 0

    def parse(line: bytes) -> str | None:
        if not line.strip():
            return None
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:  # too deep a nesting: not JSON for us
            raise BadRequest(f"ndjson line {line_no}: not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise BadRequest(f"ndjson line {line_no}: expected an object, got {_json_type(value)}")
        try:
            _only(value, ("text",))
            return _string(value, "text")
        except BadRequest as exc:
            raise BadRequest(f"ndjson line {line_no}: {exc.message}") from None

    async for data in _body_chunks(request):
        buffer += data
        while True:
            line, sep, rest = buffer.partition(b"\n")
            if not sep:
                break
            buffer = rest
            line_no += 1
            text = parse(line)
            if text:
                yield text
        if len(buffer) > max_line_bytes:
            raise HttpError(
                413, "body_too_large", f"ndjson line {line_no + 1} is over {max_line_bytes} bytes"
            )
    line_no += 1
    text = parse(buffer)
    if text:
        yield text


# ---------------------------------------------------------------------------------------------
# Handlers


class _Api:
    def __init__(
        self,
        control: CallControl,
        *,
        max_text_chars: int,
        max_body_bytes: int,
        ws_queue_size: int,
        ws_heartbeat_s: float,
    ) -> None:
        self.control = control
        self.max_text_chars = max_text_chars
        self.max_body_bytes = max_body_bytes
        self.ws_queue_size = ws_queue_size
        self.ws_heartbeat_s = ws_heartbeat_s
        self.feeds: set[_EventFeed] = set()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def twilio_update_call(self, request: web.Request) -> web.Response:
        return await _twilio_update_call(request, self.control)

    async def list_calls(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": [c.to_json() for c in self.control.list_calls()]})

    async def get_call(self, request: web.Request) -> web.Response:
        return web.json_response(self.control.call_record(request.match_info["id"]))

    async def originate(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        _only(body, ("to", "from", "agent"))
        to = _call_target("to", _string(body, "to"))
        caller = _optional_string(body, "from")
        if caller is not None:
            caller = _sip_uri("from", caller)
        agent = body.get("agent")
        if agent is not None and not isinstance(agent, dict):
            raise BadRequest(f"'agent' must be an object, got {_json_type(agent)}")
        info = await self.control.originate(to, caller=caller, agent=agent)
        return web.json_response(
            info.to_json(), status=201, headers={"Location": f"/api/calls/{info.id}"}
        )

    async def hangup(self, request: web.Request) -> web.Response:
        await self.control.hangup(request.match_info["id"])
        return web.Response(status=204)

    async def transfer(self, request: web.Request) -> web.Response:
        """Answers once the outcome is known (a REFER's final NOTIFY, or the bridged leg's
        answer): 200 with ``{"result", "status", "reason", "bridged_call"}`` whatever the
        result; the steps also go out on /api/events as ``transfer`` events."""
        call_id = request.match_info["id"]
        body = await json_object(request)
        _only(body, ("target", "mode", "fallback", "timeout_s"))
        target = _sip_uri("target", _string(body, "target"))
        mode = _optional_string(body, "mode") or "blind"
        if mode not in ("blind", "attended"):
            raise BadRequest(f"field 'mode' must be blind or attended, got {mode!r}")
        fallback = _optional_string(body, "fallback")
        if fallback not in (None, "none", "bridge"):
            raise BadRequest(f"field 'fallback' must be bridge or none, got {fallback!r}")
        timeout_s = body.get("timeout_s")
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not 0 < timeout_s <= 600
        ):
            raise BadRequest(f"field 'timeout_s' must be a number in (0, 600], got {timeout_s!r}")
        outcome = await self.control.transfer(
            call_id, target, mode=mode, fallback=None if fallback == "none" else fallback,
            timeout_s=None if timeout_s is None else float(timeout_s),
        )  # fmt: skip
        return web.json_response(outcome.to_json())

    async def dtmf(self, request: web.Request) -> web.Response:
        call_id = request.match_info["id"]
        body = await json_object(request)
        _only(body, ("digits",))
        digits = _string(body, "digits")
        if not _DTMF_RE.fullmatch(digits):
            raise BadRequest(f"field 'digits' must be 1 or more of 0-9 * # A-D, got {digits!r}")
        if len(digits) > MAX_DTMF_DIGITS:
            raise BadRequest(f"field 'digits' is limited to {MAX_DTMF_DIGITS} digits")
        await self.control.send_dtmf(call_id, digits)
        return web.json_response({"digits": digits}, status=202)

    async def say(self, request: web.Request) -> web.Response:
        call_id = request.match_info["id"]
        ctype = request.content_type
        if ctype == "text/plain":
            charset = (request.charset or "utf-8").lower()
            if charset not in ("utf-8", "utf8", "us-ascii", "ascii"):
                raise HttpError(415, "unsupported_media_type", f"text must be UTF-8, not {charset}")
            return await self._say_streamed(call_id, _plain_text(request))
        if ctype == "application/x-ndjson":
            return await self._say_streamed(call_id, _ndjson_text(request, self.max_body_bytes))
        body = await json_object(request)
        _only(body, ("text", "interrupt"))
        text = _string(body, "text")
        interrupt = _boolean(body, "interrupt", False)
        if not text.strip():
            raise BadRequest("field 'text' must not be empty")
        _check_length(text, self.max_text_chars)
        utterance_id = await self.control.say(call_id, text, interrupt=interrupt)
        return web.json_response({"utterance_id": utterance_id}, status=202)

    async def _say_streamed(self, call_id: str, source: AsyncGenerator[str, None]) -> web.Response:
        """Forward body text to ``say_stream`` piece by piece while the body is still arriving.

        ``say_stream`` may consume the pieces before returning, or return at once and consume
        them in the background; either way the answer waits until the whole body is read, so
        the 202 means "all the text was accepted", and a failure of either side ends both.
        """
        self.control.get_call(call_id)  # a 404 now, not after a slow body has trickled in
        pieces = _TextPieces()
        say = asyncio.create_task(self.control.say_stream(call_id, pieces))
        say.add_done_callback(_retrieve_quietly)
        pump = asyncio.create_task(self._pump(source, pieces))
        pump.add_done_callback(_retrieve_quietly)  # unawaited if this handler is cancelled
        try:
            await asyncio.wait({say, pump}, return_when=asyncio.FIRST_COMPLETED)
            if not pump.done() and (refused := say.exception()) is not None:
                raise refused  # e.g. unknown call or conflict: stop reading the body
            await pump  # the body's own failure (413, 422) wins over whatever say_stream did
            return web.json_response({"utterance_id": await say}, status=202)
        finally:
            if not pump.done():
                pump.cancel()
            # No-op after finish(); otherwise the consumer learns the text is incomplete.
            pieces.fail(_BodyGone("the request ended before its body was complete"))

    async def _pump(self, source: AsyncGenerator[str, None], pieces: _TextPieces) -> None:
        total = 0
        try:
            async for text in source:
                total += len(text)
                if total > self.max_text_chars:
                    raise TextTooLong(
                        f"streamed text passed {self.max_text_chars} characters, the limit"
                    )
                pieces.feed(text)
            if total == 0:
                raise BadRequest("the request body has no text")
        except Exception as exc:
            # The consumer gets its own exception object: one instance raised in two tasks
            # would have both tracebacks tangled together.
            if isinstance(exc, ControlError):
                pieces.fail(type(exc)(exc.message))
            else:
                pieces.fail(BadRequest(str(exc)))
            raise
        finally:
            await source.aclose()  # stop reading the body now, not whenever GC gets to it
        pieces.finish()

    async def events(self, request: web.Request) -> web.StreamResponse:
        call_filter = request.query.get("call")
        if call_filter is not None:
            self.control.get_call(call_filter)  # 404 for an unknown call, before the upgrade
        ws = web.WebSocketResponse(heartbeat=self.ws_heartbeat_s, timeout=WS_CLOSE_TIMEOUT_S)
        if not ws.can_prepare(request).ok:
            raise HttpError(
                426,
                "upgrade_required",
                "GET /api/events is a WebSocket; connect with a WebSocket client",
                {"Upgrade": "websocket", "Connection": "Upgrade"},
            )
        # Subscribe before the handshake completes: once the client sees the socket open, no
        # event it could expect may be missed.
        feed = _EventFeed(ws, self.control.subscribe_events(), call_filter, self.ws_queue_size)
        self.feeds.add(feed)
        try:
            await feed.run(request)
        finally:
            self.feeds.discard(feed)
        return ws

    async def on_shutdown(self, app: web.Application) -> None:
        # Only asks: each feed sends what it has queued and closes; the runner's shutdown
        # timeout bounds how long that may take.
        for feed in list(self.feeds):
            feed.close(WSCloseCode.GOING_AWAY)


# ---------------------------------------------------------------------------------------------
# Twilio-compatible call update (the hang-up of bots written for Twilio)


def _twilio_error(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """Twilio's REST error shape. ``code`` is Twilio's where one exists (20003 authenticate,
    20404 not found); otherwise the HTTP status."""
    info = f"https://www.twilio.com/docs/errors/{code}" if code > 999 else ""
    body = {"code": code, "message": message, "more_info": info, "status": status}
    return web.json_response(body, status=status, headers=headers)


def _twilio_time(ts: float | None) -> str | None:
    # Twilio's dates are RFC 2822 in UTC: "Tue, 31 Aug 2010 20:36:28 +0000".
    return None if ts is None else time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(ts))


def _twilio_authorized(request: web.Request, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    bearer = bearer_token(header)
    if bearer is not None:
        return token_matches(bearer, token)
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        # RFC 7617: base64 of "user-id:password"; the user id holds no colon.
        _user, sep, password = (
            base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        )
    except (ValueError, UnicodeDecodeError):
        return False
    return bool(sep) and token_matches(password, token)


def _twilio_call(info: CallInfo, call_sid: str, account_sid: str, path: str) -> dict[str, object]:
    """The call as a (partial) Twilio Call resource, after the hang-up."""
    caller, callee = (
        (info.remote, info.local) if info.direction == "inbound" else (info.local, info.remote)
    )
    start = info.answered_at or info.started_at
    end = time.time()
    return {
        "sid": call_sid,
        "account_sid": account_sid,
        "status": "completed",
        "direction": "inbound" if info.direction == "inbound" else "outbound-api",
        "from": phone_number(caller),
        "to": phone_number(callee),
        "date_created": _twilio_time(info.started_at),
        "date_updated": _twilio_time(end),
        "start_time": _twilio_time(start),
        "end_time": _twilio_time(end),
        "duration": str(int(max(0.0, end - start))),
        "api_version": "2010-04-01",
        "uri": path,
    }


async def _twilio_update_call(request: web.Request, control: CallControl) -> web.Response:
    token = request.app[_TOKEN_KEY]
    if token:
        if not _twilio_authorized(request, token):
            challenge = {"WWW-Authenticate": 'Basic realm="voxgate"'}
            return _twilio_error(401, 20003, "Authenticate", challenge)
    else:
        _check_local_browser(request)
    call_sid = request.match_info["call_sid"]
    account_sid = request.match_info["account_sid"]
    form = await request.post()
    status = form.get("Status")
    if status not in ("completed", "canceled"):
        return _twilio_error(
            400, 400, f"Status must be 'completed' or 'canceled' to end the call; got {status!r}"
        )
    account = request.app[_ACCOUNT_KEY]
    found = next((c for c in control.list_calls() if call_sid_for(c.id) == call_sid), None)
    if account is not None and account_sid != account:
        found = None  # not a call of this account
    if found is not None:
        try:
            await control.hangup(found.id)
        except UnknownCall:
            found = None  # it ended meanwhile
    if found is None:
        return _twilio_error(404, 20404, f"The requested resource {request.path} was not found")
    return web.json_response(_twilio_call(found, call_sid, account_sid, request.path))


class _Close:
    """Queued after the events: send ``last`` (if any), then close with ``code``."""

    __slots__ = ("code", "last")

    def __init__(self, code: int, last: str | None = None) -> None:
        self.code = code
        self.last = last


class _EventFeed:
    """One ``/api/events`` socket: a pump from the subscription into a bounded queue, a sender
    from the queue to the socket, and the handler's own loop reading from the socket."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        subscription: AsyncIterator[Event],
        only: str | None,
        queue_size: int,
    ) -> None:
        self.ws = ws
        self.subscription = subscription
        self.only = only
        self.queue_size = queue_size
        # One slot more than events may use: the final _Close always fits.
        self.queue: asyncio.Queue[str | _Close] = asyncio.Queue(queue_size + 1)
        self.closing = False  # the sender is closing the socket (our side spoke first)
        self.pump = asyncio.create_task(self._pump())

    async def run(self, request: web.Request) -> None:
        sender: asyncio.Task[None] | None = None
        try:
            await self.ws.prepare(request)
            sender = asyncio.create_task(self._send())
            # Reading keeps close frames and pongs flowing; the client has nothing to say.
            async for msg in self.ws:
                if msg.type is WSMsgType.ERROR:
                    break
            if self.closing:
                # Our close ended the loop; let the sender finish the closing handshake.
                await asyncio.wait({sender}, timeout=WS_CLOSE_TIMEOUT_S)
        finally:
            # Only synchronous steps are certain to run here: the handler itself may be
            # cancelled (aiohttp's handler_cancellation), so each task cleans up after itself.
            for task in (self.pump, sender):
                if task is not None and not task.done():
                    task.cancel()
        tasks = [t for t in (self.pump, sender) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.ws.prepared and not self.ws.closed:
            await self.ws.close()

    def close(self, code: int, last: str | None = None) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # full: a _Close is already queued
            self.queue.put_nowait(_Close(code, last))

    async def _pump(self) -> None:
        """Move events into the queue without ever waiting, so a slow client cannot slow the
        gateway; on overflow, drop the backlog and close (see the module doc)."""
        try:
            async for event in self.subscription:
                if self.only is not None and event.call_id != self.only:
                    continue
                if self.queue.qsize() >= self.queue_size:
                    dropped = self.queue.qsize() + 1  # the backlog and the event that did not fit
                    while not self.queue.empty():
                        self.queue.get_nowait()
                    self.close(WSCloseCode.TRY_AGAIN_LATER, _overflow_message(dropped))
                    return
                self.queue.put_nowait(event_json(event))
        except Exception:
            log.exception("control API: event subscription failed")
            self.close(WSCloseCode.INTERNAL_ERROR)
            return
        finally:
            # Stop the subscription however this ends (overflow, client gone, cancellation), so
            # the gateway stops producing for a socket that is not listening.
            aclose = getattr(self.subscription, "aclose", None)
            if aclose is not None:
                await aclose()
        self.close(WSCloseCode.GOING_AWAY)  # the subscription ended: the gateway is stopping

    async def _send(self) -> None:
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, _Close):
                    if item.last is not None:
                        await self.ws.send_str(item.last)
                    self.closing = True
                    await self.ws.close(code=item.code)
                    return
                await self.ws.send_str(item)
        except ConnectionError:
            return  # the client is gone; the reading loop sees that too


def _overflow_message(dropped: int) -> str:
    return json.dumps(
        {
            "type": "overflow",
            "dropped": dropped,
            "message": "events arrived faster than this connection read them; "
            "reconnect and resync from GET /api/calls",
        },
        separators=(",", ":"),
    )


def _retrieve_quietly(task: asyncio.Task[Any]) -> None:
    # A failure here is expected and already handled (say_stream saw the body's error, or the
    # client left mid-body); retrieving it keeps asyncio from warning that nobody looked.
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("control API: %s ended with %r", task.get_coro(), exc)


# ---------------------------------------------------------------------------------------------
# Application and runner


class _RedactingAccessLogger(AbstractAccessLogger):
    """Access log without the ``?token=`` a browser's WebSocket puts in the URL."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        url = request.rel_url
        if "token" in url.query:
            url = url.with_query(
                [(k, "REDACTED" if k == "token" else v) for k, v in url.query.items()]
            )
        self.logger.info(
            '%s "%s %s" %d %.1fms',
            request.remote,
            request.method,
            url,
            response.status,
            time * 1000,
        )


def make_app(
    control: CallControl,
    *,
    token: str | None,
    max_text_chars: int,
    extra_routes: Iterable[web.AbstractRouteDef] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ws_queue_size: int = DEFAULT_WS_QUEUE_SIZE,
    ws_heartbeat_s: float = DEFAULT_WS_HEARTBEAT_S,
    twilio_account_sid: str | None = None,
) -> web.Application:
    """The control API as an aiohttp application (see the module doc for the contract).

    ``token`` empty or None: no authentication (loopback only, see ``check_bind_safety``).
    ``extra_routes`` are added as given (e.g. ``web.get("/readyz", ...)``); those under
    ``/api/`` get the same authentication as the built-in ones.
    """
    api = _Api(
        control,
        max_text_chars=max_text_chars,
        max_body_bytes=max_body_bytes,
        ws_queue_size=ws_queue_size,
        ws_heartbeat_s=ws_heartbeat_s,
    )
    app = web.Application(
        middlewares=[_errors_middleware, _auth_middleware(token or None)],
        client_max_size=max_body_bytes,
    )
    app[_TOKEN_KEY] = token or None
    app[_ACCOUNT_KEY] = twilio_account_sid or None
    app.add_routes(
        [
            web.get("/healthz", api.healthz),
            web.get("/api/calls", api.list_calls, allow_head=False),
            web.post("/api/calls", api.originate),
            web.get("/api/calls/{id}", api.get_call, allow_head=False),
            web.delete("/api/calls/{id}", api.hangup),
            web.post("/api/calls/{id}/say", api.say),
            web.post("/api/calls/{id}/dtmf", api.dtmf),
            web.post("/api/calls/{id}/transfer", api.transfer),
            web.get(_EVENTS_PATH, api.events, allow_head=False),
            web.post(_TWILIO_CALL_PATH, api.twilio_update_call),
        ]
    )
    if extra_routes is not None:
        app.add_routes(extra_routes)
    app.on_shutdown.append(api.on_shutdown)
    return app


async def start_api(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on ``host:port``; ``port`` 0 picks a free one (see ``runner.addresses``).

    Checks bind safety itself as well, so no caller can forget it. Stop with ``stop_api``.
    """
    check_bind_safety(host, app.get(_TOKEN_KEY))
    runner = web.AppRunner(
        app, access_log_class=_RedactingAccessLogger, handle_signals=False, shutdown_timeout=5.0
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def stop_api(runner: web.AppRunner) -> None:
    """Close the listener, tell event sockets the server is going away, finish requests."""
    await runner.cleanup()
