"""The ``stream`` agent: the call bridged to a bot's WebSocket, as Twilio's
``<Connect><Stream url=...>`` bridges it, so a bot written for Twilio Media Streams (pipecat's
``FastAPIWebsocketTransport`` + ``TwilioFrameSerializer``) takes voxgate calls unmodified.

On answer the agent dials the bot (``ws://`` or ``wss://`` with certificate verification) and
plays Twilio's part of the protocol (:mod:`gateway.agents.twilio_media`): ``connected``,
``start``, then the caller's audio as 20 ms ``media`` messages (μ-law 8 kHz from
``caller_audio(8000)``, echo-gated with ``[stream] echo_gate``: while the bot's own voice may be
echoing back, the caller's audio is sent 30 dB down, so the stream stays unbroken), a ``dtmf``
message for every key (RFC 4733, SIP INFO or a browser's keypad), and ``stop`` when the call
ends.

The bot's ``media`` (any length) is queued on the call's playout (``Call.play_audio``), so the
media ticker paces it onto the call's 20 ms clock (resampled for a 48 kHz browser leg); a bot
that sends faster than real time (pipecat 1.14 paces at real time, with a little lead; a bot
may also send a whole answer at once) is buffered up to ``max_buffer_s``, beyond which the
oldest audio is dropped and counted. ``clear`` is ``call.interrupt()`` (the 10 ms cosine
fade); a ``mark`` is echoed once the audio before it has played, or when a ``clear`` dropped
it.

Hang-up: the bot closing its socket ends the call once its queued audio has played; the call
ending (either side) sends ``stop`` and closes the socket. Errors (unreachable, a failed
handshake, TLS, malformed or oversized messages, a flood, a lost connection) are reported as
``AgentError`` (kind ``stream_<what>``); the caller hears ``[stream] fallback`` and the call is
hung up. Every socket read and write runs on this agent's own tasks, behind bounded queues: a
slow or stuck bot never holds up the media ticker, only its own call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import WSCloseCode, WSMsgType

from gateway.agents.base import AudioCallHandle, CallHandle
from gateway.agents.twilio_media import (
    MAX_MESSAGE_BYTES,
    RATE,
    BotClear,
    BotMark,
    BotMedia,
    BotMessage,
    MarkBook,
    MediaStream,
    StreamProtocolError,
    call_sid_for,
    new_sid,
    phone_number,
)
from gateway.call.control import (
    AgentError,
    ControlError,
    DtmfReceived,
    Event,
    UtteranceFinished,
)
from gateway.media.tap import CallerAudioTap
from voxgate.contract.config import StreamConfig

log = logging.getLogger("voxgate.agents")

# Caller frames waiting for this agent's reader (1 s); older ones are dropped by the tap.
TAP_FRAMES = 50
# Caller frames waiting for the socket (1 s) when the bot reads slowly; older ones are dropped.
OUTBOX_MEDIA = 50
# Other messages waiting for the socket (keys, mark echoes): a bot this far behind has stopped
# reading, and the bridge gives up on it.
OUTBOX_CONTROL = 1000
# The bot's audio is played as segments; one ends when the bot has sent nothing for this long
# (so the call is not "speaking" between the bot's turns).
SEGMENT_IDLE_S = 0.1
# The bot's audio queued for the caller (a bot may send a whole answer at once, far ahead
# of real time); past this the oldest is dropped.
MAX_BUFFER_S = 60.0
# The reader lets the event loop run (the media ticker) after this many messages in a row.
YIELD_EVERY = 16
# Hang-up: time to deliver ``stop`` and close the socket.
STOP_WAIT_S = 1.0
# How long the fallback line may take before the call is hung up anyway.
FALLBACK_WAIT_S = 30.0


@dataclass
class StreamStats:
    """What crossed the bridge (for logs and tests)."""

    media_sent: int = 0  # caller frames sent to the bot
    media_dropped: int = 0  # caller frames dropped because the bot did not read them in time
    dtmf_sent: int = 0
    media_received: int = 0  # media messages from the bot
    samples_received: int = 0  # the bot's audio, 8 kHz samples
    samples_dropped: int = 0  # the bot's audio dropped over the buffer cap (call-rate samples)
    clears: int = 0
    marks_received: int = 0
    marks_echoed: int = 0
    ignored: int = 0  # events this bridge does not act on


class _Failure(Exception):
    """The bridge cannot go on; ``kind`` becomes ``stream_<kind>`` on the AgentError."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Outbox:
    """Messages for the bot, in order, for one sender task. Bounded: caller audio beyond
    ``max_media`` drops the oldest frame (a late frame is worth less than a current one);
    other messages beyond ``max_control`` are refused (the bot has stopped reading)."""

    def __init__(self, max_media: int = OUTBOX_MEDIA, max_control: int = OUTBOX_CONTROL) -> None:
        self._items: deque[tuple[bool, str]] = deque()  # (is media, text)
        self._media = 0
        self._max_media = max_media
        self._max_control = max_control
        self._wake = asyncio.Event()
        self.closed = False

    def put(self, text: str) -> bool:
        if self.closed:
            return True
        if len(self._items) - self._media >= self._max_control:
            return False
        self._items.append((False, text))
        self._wake.set()
        return True

    def put_media(self, text: str) -> bool:
        """False when an older frame had to be dropped for this one."""
        if self.closed:
            return True
        dropped = False
        if self._media >= self._max_media:
            for i, (is_media, _) in enumerate(self._items):
                if is_media:
                    del self._items[i]
                    self._media -= 1
                    dropped = True
                    break
        self._items.append((True, text))
        self._media += 1
        self._wake.set()
        return not dropped

    def close(self) -> None:
        """Nothing more will be put; the sender sends what is queued and stops."""
        self.closed = True
        self._wake.set()

    async def get(self) -> str | None:
        while not self._items:
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        is_media, text = self._items.popleft()
        self._media -= is_media
        return text


def redact(url: str) -> str:
    """The URL without its query or credentials (a bot's URL may carry a token): for logs and
    events."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<bad url>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


class StreamAgent:
    """One call bridged to a bot's WebSocket (see the module doc)."""

    kind = "stream"

    def __init__(
        self,
        *,
        url: str,
        parameters: Mapping[str, str],
        settings: StreamConfig,
        session: Callable[[], aiohttp.ClientSession],
        account_sid: str,
        ssl_context: ssl.SSLContext | None = None,
        max_buffer_s: float = MAX_BUFFER_S,
        segment_idle_s: float = SEGMENT_IDLE_S,
    ) -> None:
        self.url = url
        self.parameters = dict(parameters)
        self.settings = settings
        self._session = session
        self.account_sid = account_sid
        self._ssl = ssl_context
        self.max_buffer_s = max_buffer_s
        self.segment_idle_s = segment_idle_s
        self.stats = StreamStats()
        self.book = MarkBook()
        self.stream: MediaStream | None = None
        self.error: AgentError | None = None  # the failure that ended the bridge, if any
        self.connected = asyncio.Event()  # the bot's socket is open (tests, benchmarks)
        self.closed_by: str | None = None  # "bot" | "call" | "error": who ended the bridge
        self._call: AudioCallHandle | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._outbox = _Outbox()
        self._tap: CallerAudioTap | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.TimerHandle | None = None
        self._t0 = 0.0
        self._ended = False  # the call has ended
        self._failing = False
        self._overflowed = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._fallback_id: str | None = None
        self._fallback_done = asyncio.Event()
        self._finished: deque[str] = deque(maxlen=32)

    # --- Agent ---------------------------------------------------------------------------
    async def on_start(self, call: CallHandle) -> None:
        if not isinstance(call, AudioCallHandle):
            raise TypeError("the stream agent needs a call that plays raw audio (play_audio)")
        self._call = call
        info = call.info
        caller, callee = (
            (info.remote, info.local) if info.direction == "inbound" else (info.local, info.remote)
        )
        stream = self.stream = MediaStream(
            stream_sid=new_sid("MZ"),
            call_sid=call_sid_for(call.id),
            account_sid=self.account_sid,
            parameters={
                **self.parameters,
                "from_number": phone_number(caller),
                "to_number": phone_number(callee),
            },
        )
        # First in the outbox, whatever happens while the socket opens (a key press).
        self._outbox.put(stream.connected())
        self._outbox.put(stream.start())
        self._spawn(self._run(call), "stream")

    async def on_event(self, call: CallHandle, event: Event) -> None:
        if isinstance(event, DtmfReceived):
            if self.stream is not None and not self._failing:
                self._put(self.stream.dtmf(event.digit))
                self.stats.dtmf_sent += 1
        elif isinstance(event, UtteranceFinished):
            self._finished.append(event.utterance_id)
            if event.utterance_id == self._fallback_id:
                self._fallback_done.set()
            for name in self.book.finished(event.utterance_id):
                self._echo(name)
            if not self.book.queued:
                self._drained.set()

    async def on_end(self, call: CallHandle) -> None:
        self._ended = True
        if self.closed_by is None:
            self.closed_by = "call"
        self._cancel_idle()
        ws = self._ws
        if ws is not None and not ws.closed and self.stream is not None and not self._failing:
            # Twilio: "stop", then the socket closes.
            self._outbox.put(self.stream.stop())
            self._outbox.close()
            sender = next((t for t in self._tasks if t.get_name() == "stream-send"), None)
            if sender is not None:
                await asyncio.wait({sender}, timeout=STOP_WAIT_S)
        self._outbox.close()
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), STOP_WAIT_S)
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
        log.info("call %s: stream bridge ended (%s): %s", call.id, self.closed_by,
                 asdict(self.stats))  # fmt: skip

    # --- the bridge ----------------------------------------------------------------------
    async def _run(self, call: AudioCallHandle) -> None:
        try:
            ws = await self._connect()
        except _Failure as exc:
            await self._fail(call, exc.kind, exc.message)
            return
        if self._ended:
            await ws.close()
            return
        self._ws = ws
        self._t0 = asyncio.get_running_loop().time()
        self._spawn(self._send(ws), "stream-send")
        # Listening starts with the stream, as on Twilio (no backlog from before it).
        self._tap = tap = call.caller_audio(
            RATE, echo_gate=self.settings.echo_gate, max_frames=TAP_FRAMES
        )
        # Twilio sends a media message every 20 ms: the bot's VAD and timestamps expect an
        # unbroken stream, so a gated frame is sent ducked rather than left out.
        tap.fill_gated = True
        self._spawn(self._pump(tap), "stream-pump")
        self.connected.set()
        log.info("call %s: bridged to %s (stream %s)", call.id, redact(self.url),
                 self.stream.stream_sid if self.stream else "")  # fmt: skip
        try:
            await self._receive(call, ws)
        except StreamProtocolError as exc:
            code = WSCloseCode.POLICY_VIOLATION if exc.kind == "flood" else WSCloseCode.INVALID_TEXT
            await self._fail(call, exc.kind, exc.message, close_code=code)
            return
        except _Failure as exc:
            await self._fail(call, exc.kind, exc.message)
            return
        except Exception as exc:  # a bug here must still end the call cleanly
            log.exception("call %s: stream bridge failed", call.id)
            await self._fail(call, "internal", f"{type(exc).__name__}: {exc}")
            return
        if self._ended or self._failing:
            return
        # The bot closed its socket: the call ends once what it sent has been heard.
        self.closed_by = "bot"
        log.info("call %s: the bot closed the stream (code %s)", call.id, ws.close_code)
        self._end_segment(call)
        self._outbox.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), self.max_buffer_s + 2.0)
        if not self._ended:
            await asyncio.shield(call.hangup("stream closed"))

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        shown = redact(self.url)
        timeout = self.settings.connect_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self._session().ws_connect(
                    self.url,
                    ssl=self._ssl if self._ssl is not None else True,
                    max_msg_size=MAX_MESSAGE_BYTES,
                    timeout=aiohttp.ClientWSTimeout(ws_close=STOP_WAIT_S),
                )
        except TimeoutError:
            raise _Failure(
                "timeout", f"no WebSocket handshake with {shown} within {timeout:g} s"
            ) from None
        except aiohttp.WSServerHandshakeError as exc:
            raise _Failure(
                "handshake",
                f"{shown} refused the WebSocket handshake: {exc.status} {exc.message}",
            ) from None
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            raise _Failure("tls", f"TLS with {shown} failed: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _Failure("unreachable", f"cannot reach {shown}: {exc}") from None

    async def _receive(self, call: AudioCallHandle, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Read the bot until its socket closes; raises on a protocol error."""
        assert self.stream is not None
        n = 0
        while True:
            msg = await ws.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self._on_bot(call, self.stream.parse(msg.data))
                n += 1
                if n % YIELD_EVERY == 0:
                    # Messages already buffered are returned without suspending: a bot
                    # flooding small messages must not keep the media ticker waiting.
                    await asyncio.sleep(0)
                continue
            if self._ended or self._failing:
                return  # our own close
            if msg.type is WSMsgType.ERROR:
                exc = msg.data
                if isinstance(exc, aiohttp.WebSocketError) and (
                    exc.code == WSCloseCode.MESSAGE_TOO_BIG
                ):
                    raise StreamProtocolError(
                        "too_big", f"a message over {MAX_MESSAGE_BYTES} bytes"
                    )
                raise _Failure("lost", f"the bot's WebSocket failed: {exc}")
            # CLOSE / CLOSING / CLOSED: a close frame from the bot ends the call normally; a
            # connection that dropped without one (1006) is a failure.
            if ws.close_code in (None, WSCloseCode.ABNORMAL_CLOSURE):
                raise _Failure("lost", "the bot's connection dropped without a close")
            return

    def _on_bot(self, call: AudioCallHandle, msg: BotMessage) -> None:
        if isinstance(msg, BotMedia):
            self.stats.media_received += 1
            self.stats.samples_received += len(msg.pcm)
            segment, _ = self.book.audio()
            if self.book.queued:  # (not for a segment already cut by voxgate's barge-in)
                self._drained.clear()
            dropped = call.play_audio(
                segment, msg.pcm, rate=RATE, barge_in=self.settings.barge_in,
                dtmf_interrupts=False, max_queued_s=self.max_buffer_s,
            )  # fmt: skip
            if dropped:
                self.stats.samples_dropped += dropped
                if not self._overflowed:
                    self._overflowed = True  # reported once; counted throughout
                    call.emit(AgentError(
                        call.id, kind="stream_overflow",
                        message=f"the bot sent audio more than {self.max_buffer_s:g} s ahead "
                        "of real time; the oldest was dropped",
                    ))  # fmt: skip
            self._arm_idle(call)
        elif isinstance(msg, BotMark):
            self.stats.marks_received += 1
            self._cancel_idle()
            ended, now = self.book.mark(msg.name)
            if ended is not None:
                call.end_audio(ended)
            for name in now:
                self._echo(name)
        elif isinstance(msg, BotClear):
            self.stats.clears += 1
            self._cancel_idle()
            self.book.close()
            # The fade; the segments it drops come back as UtteranceFinished, whose marks
            # are then echoed (on_event).
            call.interrupt()
        else:
            self.stats.ignored += 1
            if self.stats.ignored == 1:
                log.info("call %s: ignoring the bot's %r messages", call.id, msg.event)

    async def _send(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            while (text := await self._outbox.get()) is not None:
                await ws.send_str(text)
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            return  # the socket is closing; the reader sees why

    async def _pump(self, tap: CallerAudioTap) -> None:
        assert self.stream is not None
        loop = asyncio.get_running_loop()
        async for frame in tap:
            elapsed_ms = int((loop.time() - self._t0) * 1000)
            if self._outbox.put_media(self.stream.media(frame, elapsed_ms)):
                self.stats.media_sent += 1
            else:
                self.stats.media_dropped += 1

    # --- failure -------------------------------------------------------------------------
    async def _fail(
        self, call: AudioCallHandle, kind: str, message: str, *, close_code: int | None = None
    ) -> None:
        """Report, drop the bot, say the fallback line, hang up."""
        if self._failing or self._ended:
            return
        self._failing = True
        self.closed_by = "error"
        self.error = AgentError(call.id, kind=f"stream_{kind}", message=message)
        log.warning("call %s: stream_%s: %s", call.id, kind, message)
        call.emit(self.error)
        self._cancel_idle()
        self.book.close()
        self._outbox.close()
        if self._tap is not None:
            self._tap.close()
        ws = self._ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    ws.close(code=close_code or WSCloseCode.GOING_AWAY), STOP_WAIT_S
                )
        if self._ended:
            return
        call.interrupt()
        fallback = self.settings.fallback.strip()
        if fallback:
            try:
                utt = await call.say(fallback, barge_in=False, dtmf_interrupts=False)
            except ControlError as exc:
                log.warning("call %s: fallback not said: %s", call.id, exc.message)
            else:
                self._fallback_id = utt
                if utt in self._finished:
                    self._fallback_done.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._fallback_done.wait(), FALLBACK_WAIT_S)
        if not self._ended:
            await asyncio.shield(call.hangup("stream error"))

    # --- helpers -------------------------------------------------------------------------
    def _put(self, text: str) -> None:
        if not self._outbox.put(text) and self._call is not None:
            self._spawn(
                self._fail(self._call, "stalled", "the bot stopped reading its WebSocket"),
                "stream-fail",
            )

    def _echo(self, name: str) -> None:
        if self.stream is not None and not self._ended and not self._failing:
            self._put(self.stream.mark(name))
            self.stats.marks_echoed += 1

    def _arm_idle(self, call: AudioCallHandle) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self.segment_idle_s, self._end_segment, call)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _end_segment(self, call: AudioCallHandle) -> None:
        self._idle = None
        segment = self.book.close()
        if segment is not None:
            call.end_audio(segment)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("stream bridge task %s failed", task.get_name(), exc_info=exc)
