"""Where flows come from: a file read and checked at start, and a webhook asked during calls.

**The file** (``[flow] file``, TOML or JSON by its suffix): ``start`` (the flow calls begin
with, default ``main``), ``vars`` (what every call's variables start as) and ``flows`` (named
lists of verbs). It is checked whole before the gateway takes a call; anything wrong stops the
start with one line naming the file, the verb's path and the reason (``voxgate: config error:
flow.file: flows.toml: flows.main[3].gather.num_digits: must be ...``).

**The webhook** (``[flow] url``, or a verb's ``action``/``redirect`` URL): voxgate POSTs JSON
(the call's facts, its variables, and the verb's result) and the answer is a JSON array of
verbs that replaces what was left of the flow, as jambonz's ``actionHook`` and TwiML's
``action`` do; an empty answer (204, or a 2xx with no body) lets the flow go on. Every request
is signed when ``[flow] secret_env`` names a secret::

    X-Voxgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + raw body)>

(the scheme Stripe uses: the receiver recomputes the MAC over the exact bytes it received and
refuses old timestamps against replays; :func:`verify_signature` is that check). Each attempt
must finish within ``timeout_s``; connection failures and 5xx answers are retried up to
``retries`` times (with a short backoff: 0.2 s, 0.4 s, ...), a timeout or a 4xx is not (a
slow server asked again only makes the caller wait longer); answers over
``max_response_bytes`` are cut off. A failure is a ``WebhookError`` whose ``kind`` (timeout,
unreachable, status, too_large, malformed, invalid) becomes the ``flow_webhook_<kind>``
AgentError the engine reports before it says ``[flow] fallback`` and ends the call.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.flow.verbs import FlowBook, FlowError, Limits, Step, parse_book, parse_steps
from voxgate.contract.config import ConfigError

SIGNATURE_HEADER = "X-Voxgate-Signature"
# The built-in flow: today's IVR menu ([agent] kind = "flow" with neither file nor url).
DEFAULT_FLOW_FILE = Path(__file__).with_name("default.toml")
# A flow file larger than this is not a flow file.
MAX_FILE_BYTES = 4 * 1024 * 1024
# The longest a retry waits before trying again.
MAX_BACKOFF_S = 2.0


def load_flow_file(path: str | Path, limits: Limits) -> FlowBook:
    """The file's flows, checked; ``ConfigError`` (``flow.file: ...``) on any problem."""
    p = Path(path)
    shown = str(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"flow.file: cannot read {shown!r}: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"flow.file: {shown}: larger than {MAX_FILE_BYTES} bytes")
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data: object = tomllib.loads(raw.decode("utf-8"))
        elif suffix == ".json":
            data = json.loads(raw)
        else:
            raise ConfigError(f"flow.file: {shown}: expected a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        kind = "TOML" if suffix == ".toml" else "JSON"
        raise ConfigError(f"flow.file: {shown}: invalid {kind}: {exc}") from None
    try:
        return parse_book(data, limits=Limits(
            llm=limits.llm, stream_url=limits.stream_url, files=p.parent,
            max_text_chars=limits.max_text_chars,
        ), origin=shown)  # fmt: skip
    except FlowError as exc:
        raise ConfigError(f"flow.file: {shown}: {exc}") from None


# --- signatures -------------------------------------------------------------------------------
def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The ``X-Voxgate-Signature`` value for ``body`` sent at ``timestamp`` (unix seconds)."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_signature(
    secret: bytes, header: str, body: bytes, *, now: float | None = None, tolerance_s: float = 300
) -> bool:
    """A receiver's check: the MAC matches ``body`` and the timestamp is within
    ``tolerance_s`` of ``now`` (a replayed request is refused)."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        ts = int(fields.get("t", ""))
    except ValueError:
        return False
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance_s:
        return False
    expected = sign(secret, body, ts).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


# --- the webhook ------------------------------------------------------------------------------
class WebhookError(Exception):
    """The webhook gave no usable answer; ``kind``: timeout | unreachable | status |
    too_large | malformed | invalid."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    timeout_s: float = 5.0
    retries: int = 2
    max_response_bytes: int = 256 * 1024
    secret: bytes | None = None
    backoff_s: float = 0.2


class Webhook:
    """Signed, bounded HTTP for flows (see the module doc); one per gateway."""

    def __init__(
        self,
        settings: WebhookSettings,
        session: Callable[[], aiohttp.ClientSession],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._session = session
        self._clock = clock
        self.requests = 0  # attempts made (tests, logs)

    async def verbs(
        self, url: str, payload: dict[str, object], limits: Limits
    ) -> tuple[Step, ...] | None:
        """POST ``payload``; the answer's verbs (checked), or None for an empty answer."""
        body = await self.request("POST", url, json.dumps(payload, separators=(",", ":")).encode())
        if not body.strip():
            return None
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise WebhookError("malformed", f"{url}: not JSON: {exc}") from None
        if not isinstance(data, list):
            raise WebhookError("malformed", f"{url}: expected a JSON array of verbs, got "
                               f"{type(data).__name__}")  # fmt: skip
        try:
            return parse_steps(data, "webhook", limits)
        except FlowError as exc:
            raise WebhookError("invalid", f"{url}: {exc}") from None

    async def request(
        self, method: str, url: str, body: bytes = b"", *, max_bytes: int | None = None
    ) -> bytes:
        """One request, retried on connection failures and 5xx; the answer's body (at most
        ``max_bytes``, default ``max_response_bytes``)."""
        s = self.settings
        limit = s.max_response_bytes if max_bytes is None else max_bytes
        attempt = 0
        while True:
            try:
                return await self._attempt(method, url, body, limit)
            except _Retryable as exc:
                if attempt >= s.retries:
                    raise WebhookError(exc.kind, f"{url}: {exc.message} "
                                       f"(after {attempt + 1} attempts)") from None  # fmt: skip
            await asyncio.sleep(min(s.backoff_s * 2**attempt, MAX_BACKOFF_S))
            attempt += 1

    async def _attempt(self, method: str, url: str, body: bytes, limit: int) -> bytes:
        s = self.settings
        headers = {"User-Agent": "voxgate"}
        if method == "POST":
            headers["Content-Type"] = "application/json"
        if s.secret is not None:
            headers[SIGNATURE_HEADER] = sign(s.secret, body, int(self._clock()))
        self.requests += 1
        try:
            async with asyncio.timeout(s.timeout_s):
                async with self._session().request(
                    method, url, data=body if method == "POST" else None, headers=headers,
                    allow_redirects=False,
                ) as resp:  # fmt: skip
                    if resp.status >= 500:
                        raise _Retryable("status", f"answered {resp.status}")
                    if not 200 <= resp.status < 300:
                        raise WebhookError("status", f"{url}: answered {resp.status}")
                    return await _read_bounded(resp, url, limit)
        except TimeoutError:
            raise WebhookError("timeout", f"{url}: no answer within {s.timeout_s:g} s") from None
        except aiohttp.ClientConnectionError as exc:
            raise _Retryable("unreachable", f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientError as exc:
            raise WebhookError("malformed", f"{url}: {type(exc).__name__}: {exc}") from None


async def _read_bounded(resp: aiohttp.ClientResponse, url: str, limit: int) -> bytes:
    if resp.content_length is not None and resp.content_length > limit:
        raise WebhookError("too_large", f"{url}: answer of {resp.content_length} bytes; "
                           f"the limit is {limit}")  # fmt: skip
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            raise WebhookError("too_large", f"{url}: answer over the limit of {limit} bytes")
    return bytes(buf)


class _Retryable(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
