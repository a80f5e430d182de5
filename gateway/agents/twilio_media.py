"""Twilio Media Streams, sans-I/O: the messages voxgate sends a bot and the ones it accepts back.

A bot written for Twilio (``<Connect><Stream url=...>``) speaks this protocol over one
WebSocket; voxgate plays Twilio's part, so the bot runs unmodified. The shapes follow Twilio's
"Media Streams - WebSocket Messages" reference and what pipecat's ``TwilioFrameSerializer``
(``pipecat/serializers/twilio.py``) and ``parse_telephony_websocket``
(``pipecat/runner/utils.py``) read:

- voxgate → bot: ``connected`` (no sequence number), ``start`` (``streamSid`` "MZ…",
  ``callSid`` "CA…", ``accountSid`` "AC…", ``tracks``, ``mediaFormat`` μ-law 8000 Hz mono,
  ``customParameters``), then ``media`` every 20 ms (``track`` "inbound", ``chunk`` counting
  from 1, ``timestamp`` in ms since the stream started, ``payload`` base64 μ-law), ``dtmf``
  (``track`` "inbound_track", ``digit``), ``mark`` (the echo of a bot's mark once the audio
  before it has played) and ``stop``. Every message but ``connected`` carries a
  ``sequenceNumber``, and Twilio writes the numbers as strings ("1", not 1); so does this module.
- bot → voxgate: ``media`` (``media.payload``: base64 μ-law 8 kHz of any length), ``mark``
  (``mark.name``) and ``clear``. Other events are reported as :class:`BotOther` (ignored, for
  forward compatibility); anything malformed (not JSON, not an object, a wrong field type,
  bad base64, another stream's ``streamSid``, over :data:`MAX_MESSAGE_BYTES`) raises
  :class:`StreamProtocolError` with a message naming what was wrong.

:class:`MarkBook` is the bookkeeping between the bot's audio and the call's playout: which
playout segment the bot's audio goes to, and which marks wait for which segment to finish.

No sockets, clocks or tasks here: ``gateway.agents.stream`` runs it on asyncio.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode

Int16Array = npt.NDArray[np.int16]

RATE = 8000  # Twilio Media Streams carry 8 kHz μ-law, both ways
FRAME_MS = 20  # one inbound media message per 20 ms, as Twilio sends
FRAME = RATE * FRAME_MS // 1000
# Largest message accepted from a bot: ~6 s of μ-law after base64 and JSON. Twilio documents
# no limit; pipecat sends 40 ms per message (~0.5 KB). A bigger message is a protocol error.
MAX_MESSAGE_BYTES = 64 * 1024
MAX_MARK_NAME = 256
# Marks waiting for their audio to play; a bot past this is flooding (its marks would pile up
# for ever behind audio that plays in real time).
MAX_PENDING_MARKS = 1000
PROTOCOL_VERSION = "1.0.0"


class StreamProtocolError(ValueError):
    """A message from the bot that breaks the protocol. ``kind``: malformed | too_big | flood
    (the agent reports it as ``AgentError`` kind ``stream_<kind>``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def new_sid(prefix: str) -> str:
    """A Twilio-shaped SID: two letters and 32 hex digits (``MZ…`` streams, ``AC…`` accounts)."""
    return prefix + uuid.uuid4().hex


def call_sid_for(call_id: str) -> str:
    """The ``callSid`` voxgate gives a call: ``CA`` + 32 hex digits, derived from the call's
    id, so the Twilio-compatible REST route (``POST /2010-04-01/Accounts/{AccountSid}/Calls/
    {CallSid}.json``) finds the call without any shared registry."""
    return "CA" + hashlib.sha256(b"voxgate-call:" + call_id.encode()).hexdigest()[:32]


def phone_number(uri: str) -> str:
    """What a bot expects in ``from_number``/``to_number``: the user part of a SIP URI
    (``sip:+15550100@host`` → ``+15550100``), the number of a ``tel:`` URI, or the address as
    given (a browser leg's).  Twilio sends E.164 numbers there; a SIP call has what its URI has."""
    text = uri.strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    scheme, sep, rest = text.partition(":")
    scheme = scheme.lower()
    if not sep or scheme not in ("sip", "sips", "tel"):
        return text
    rest = rest.split(";", 1)[0].split("?", 1)[0]
    if scheme != "tel":
        user, at, _host = rest.partition("@")
        if not at or not user:
            return text
        rest = user
    return unquote(rest)


# --- messages from the bot ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BotMedia:
    """Audio for the caller: μ-law decoded to int16 at 8 kHz (any length)."""

    pcm: Int16Array


@dataclass(frozen=True, slots=True)
class BotMark:
    """Echo ``name`` back once the audio sent before it has played (or was cleared)."""

    name: str


@dataclass(frozen=True, slots=True)
class BotClear:
    """Drop the audio queued for the caller (the bot was interrupted)."""


@dataclass(frozen=True, slots=True)
class BotOther:
    """An event this bridge does not act on (ignored, counted)."""

    event: str


BotMessage = BotMedia | BotMark | BotClear | BotOther


def _json(msg: Mapping[str, object]) -> str:
    return json.dumps(msg, separators=(",", ":"))


class MediaStream:
    """One Media Stream: the messages voxgate sends (numbered in order) and the parsing of what
    the bot sends back."""

    def __init__(
        self,
        *,
        stream_sid: str,
        call_sid: str,
        account_sid: str,
        parameters: Mapping[str, str] | None = None,
    ) -> None:
        self.stream_sid = stream_sid
        self.call_sid = call_sid
        self.account_sid = account_sid
        self.parameters = dict(parameters or {})
        self.sequence = 0  # sequenceNumber of the last message built
        self.chunk = 0  # chunk of the last media message built
        self.timestamp = -FRAME_MS  # timestamp (ms) of the last media message built

    def _next(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    # -- voxgate → bot --------------------------------------------------------------------
    def connected(self) -> str:
        """The first message of every stream (Twilio: no sequence number, no streamSid)."""
        return _json({"event": "connected", "protocol": "Call", "version": PROTOCOL_VERSION})

    def start(self) -> str:
        """The stream's metadata; pipecat detects Twilio by ``start.streamSid`` and
        ``start.callSid`` and reads ``customParameters`` as the call's ``body``."""
        return _json({
            "event": "start",
            "sequenceNumber": self._next(),
            "start": {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "customParameters": self.parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1},
            },
            "streamSid": self.stream_sid,
        })  # fmt: skip

    def media(self, pcm: Int16Array, elapsed_ms: int | None = None) -> str:
        """One frame of the caller's audio (int16 at 8 kHz). ``timestamp`` is the media time in
        ms since the stream started: 20 ms after the previous frame, or ``elapsed_ms`` (the
        wall clock since the start) when that is later, so frames held back (the echo gate)
        show as the gap they are; it never goes backwards."""
        self.chunk += 1
        ts = self.timestamp + FRAME_MS
        if elapsed_ms is not None and elapsed_ms > ts:
            ts = elapsed_ms
        self.timestamp = ts
        payload = base64.b64encode(ulaw_encode(pcm)).decode("ascii")
        return _json({
            "event": "media",
            "sequenceNumber": self._next(),
            "media": {"track": "inbound", "chunk": str(self.chunk), "timestamp": str(ts),
                      "payload": payload},
            "streamSid": self.stream_sid,
        })  # fmt: skip

    def dtmf(self, digit: str) -> str:
        """A key the caller pressed (RFC 4733, SIP INFO or a browser's keypad alike)."""
        return _json({
            "event": "dtmf",
            "streamSid": self.stream_sid,
            "sequenceNumber": self._next(),
            "dtmf": {"track": "inbound_track", "digit": digit},
        })  # fmt: skip

    def mark(self, name: str) -> str:
        """The echo of the bot's mark ``name``: the audio before it has played (or was
        cleared)."""
        return _json({
            "event": "mark",
            "sequenceNumber": self._next(),
            "streamSid": self.stream_sid,
            "mark": {"name": name},
        })  # fmt: skip

    def stop(self) -> str:
        """The stream is over (the call ended); the socket closes after it."""
        return _json({
            "event": "stop",
            "sequenceNumber": self._next(),
            "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
            "streamSid": self.stream_sid,
        })  # fmt: skip

    # -- bot → voxgate --------------------------------------------------------------------
    def parse(self, data: str | bytes) -> BotMessage:
        """One WebSocket message from the bot (text, or UTF-8 JSON in a binary frame)."""
        if len(data) > MAX_MESSAGE_BYTES:
            raise StreamProtocolError(
                "too_big", f"a {len(data)}-byte message; the limit is {MAX_MESSAGE_BYTES}"
            )
        try:
            msg = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise StreamProtocolError("malformed", f"not JSON: {exc}") from None
        if not isinstance(msg, dict):
            raise StreamProtocolError("malformed", f"not a JSON object: {_kind(msg)}")
        event = msg.get("event")
        if not isinstance(event, str):
            raise StreamProtocolError("malformed", "no 'event' string in the message")
        sid = msg.get("streamSid")
        if sid is not None and sid != self.stream_sid:
            raise StreamProtocolError(
                "malformed", f"{event}: streamSid {sid!r} is not this stream's"
            )
        if event == "media":
            media = _object(msg, "media", event)
            payload = media.get("payload")
            if not isinstance(payload, str):
                raise StreamProtocolError("malformed", "media: 'media.payload' must be a string")
            try:
                raw = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise StreamProtocolError("malformed", "media: payload is not base64") from None
            return BotMedia(ulaw_decode(raw))
        if event == "mark":
            name = _object(msg, "mark", event).get("name")
            if not isinstance(name, str):
                raise StreamProtocolError("malformed", "mark: 'mark.name' must be a string")
            if len(name) > MAX_MARK_NAME:
                raise StreamProtocolError(
                    "malformed", f"mark: a {len(name)}-character name; the limit is "
                    f"{MAX_MARK_NAME}"
                )  # fmt: skip
            return BotMark(name)
        if event == "clear":
            return BotClear()
        return BotOther(event[:64])


def _object(msg: Mapping[str, object], key: str, event: str) -> Mapping[str, object]:
    value = msg.get(key)
    if not isinstance(value, dict):
        raise StreamProtocolError("malformed", f"{event}: {key!r} must be an object")
    return value


def _kind(value: object) -> str:
    return "array" if isinstance(value, list) else type(value).__name__


# --- the bot's audio and its marks ----------------------------------------------------------
class MarkBook:
    """Which playout segment the bot's audio goes to, and which marks wait on which segment.

    The bot's audio is played as segments (utterances of the call's playout): one is *open*
    while the bot keeps sending; it ends at a mark, a clear, or when the bot pauses. A mark
    is echoed when the last segment queued before it has finished playing (done, or dropped
    by a clear): the playout plays segments in order, so every audio sent before the mark has
    then played. With nothing queued, it is echoed at once (Twilio does the same)."""

    def __init__(
        self,
        *,
        max_marks: int = MAX_PENDING_MARKS,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.open: str | None = None
        # Segments queued and not finished, oldest first, with the marks waiting on each.
        self._queued: OrderedDict[str, list[str]] = OrderedDict()
        self._max = max_marks
        self._new_id = new_id
        self.pending_marks = 0

    @property
    def queued(self) -> int:
        """Segments queued (open or ended) that have not finished playing."""
        return len(self._queued)

    def audio(self) -> tuple[str, bool]:
        """The segment the bot's next audio goes to, and whether it is a new one."""
        if self.open is not None:
            return self.open, False
        self.open = self._new_id()
        self._queued[self.open] = []
        return self.open, True

    def close(self) -> str | None:
        """End the open segment (the bot paused, sent a mark or a clear; the call ends):
        returns it, for the playout to be told no more audio follows."""
        seg, self.open = self.open, None
        return seg

    def mark(self, name: str) -> tuple[str | None, list[str]]:
        """A mark from the bot: (the segment it ends, to be ended on the playout; the names to
        echo now)."""
        ended = self.close()
        if not self._queued:
            return ended, [name]
        if self.pending_marks >= self._max:
            raise StreamProtocolError(
                "flood", f"more than {self._max} marks waiting for their audio to play"
            )
        self._queued[next(reversed(self._queued))].append(name)
        self.pending_marks += 1
        return ended, []

    def finished(self, segment: str) -> list[str]:
        """A segment finished playing (done, interrupted or cancelled): the marks to echo now.
        An interrupted open segment stays open (what the bot still sends for it is dropped
        by the playout) until the bot pauses or sends a mark or clear."""
        names = self._queued.pop(segment, None) or []
        self.pending_marks -= len(names)
        return names

    def drain(self) -> list[str]:
        """The call is over: every mark still waiting, in order (to echo before ``stop``)."""
        names = [n for marks in self._queued.values() for n in marks]
        self._queued.clear()
        self.open = None
        self.pending_marks = 0
        return names
