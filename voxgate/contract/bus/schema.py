"""Messages that cross the bus, and their wire form (flat string/bytes fields of a stream entry).

Version 1. Every entry carries ``v``; a reader rejects versions it does not know with a
``SchemaError`` rather than guessing. Audio is signed 16-bit little-endian PCM (``s16le``) at the
profile's rate: 8000 Hz narrowband (the gateway G.711-encodes it), 48000/16000 Hz wideband.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

VERSION = 1
PROFILES = ("narrowband", "wideband")
# Output rates a wideband request may ask for (a browser leg asks for its own); narrowband is
# always 8000 Hz.
WIDEBAND_RATES = (16000, 24000, 32000, 44100, 48000)

Profile = Literal["narrowband", "wideband"]
EndReason = Literal["done", "cancelled", "deadline"]

# Stable error codes on UtteranceError (the gateway/agent may branch on them).
ERR_EMPTY_TEXT = "empty_text"
ERR_TEXT_TOO_LONG = "text_too_long"
ERR_UNKNOWN_VOICE = "unknown_voice"
ERR_BAD_REQUEST = "bad_request"
ERR_DEADLINE = "deadline_exceeded"
ERR_ENGINE = "engine_error"

# Mapping is covariant in its value type, so Mapping[str, str] etc. are all accepted.
Fields = Mapping[bytes, bytes | str] | Mapping[str, bytes | str]


class SchemaError(ValueError):
    """A malformed or unsupported bus entry."""


def _decode(fields: Fields) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for k, v in fields.items():
        # Never a UnicodeError out of here (found by fuzzing): a field name that is not UTF-8
        # is no field we know (ignored, as unknown ones are); a str value with lone
        # surrogates keeps them, and reading it as text is then a SchemaError (``_text``).
        key = k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k
        out[key] = v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
    return out


def _text(f: dict[str, bytes], key: str, *, required: bool = True, default: str = "") -> str:
    if key not in f:
        if required:
            raise SchemaError(f"missing field {key!r}")
        return default
    try:
        return f[key].decode()
    except UnicodeDecodeError:
        raise SchemaError(f"field {key!r} is not UTF-8") from None


def _int(f: dict[str, bytes], key: str, *, default: int | None = None) -> int:
    if key not in f and default is not None:
        return default
    raw = _text(f, key)
    try:
        return int(raw)
    except ValueError:
        raise SchemaError(f"field {key!r} is not an integer: {raw!r}") from None


def _float(f: dict[str, bytes], key: str, default: float) -> float:
    if key not in f:
        return default
    raw = _text(f, key)
    try:
        value = float(raw)
    except ValueError:
        raise SchemaError(f"field {key!r} is not a number: {raw!r}") from None
    if not math.isfinite(value):  # "nan"/"inf" parse as floats but are no deadline
        raise SchemaError(f"field {key!r} is not a finite number: {raw!r}")
    return value


def _check_version(f: dict[str, bytes]) -> None:
    v = _int(f, "v", default=VERSION)
    if v != VERSION:
        raise SchemaError(f"unsupported schema version {v} (this build speaks {VERSION})")


@dataclass(frozen=True, slots=True)
class SpeakRequest:
    call_id: str
    utterance_id: str
    text: str
    voice: str = ""  # "" means the worker's default voice
    profile: Profile = "narrowband"
    deadline: float = 0.0  # wall-clock epoch seconds by which first audio is useless; 0: none
    trace_id: str = ""
    # Skip the text normalizer (the caller already sends the spoken form).
    raw: bool = False
    # Output rate the leg plays at; 0: the worker's default for the profile. Optional on the
    # wire (absent = 0), so older gateways and workers still understand each other.
    rate: int = 0

    def __post_init__(self) -> None:
        if not self.call_id:
            raise SchemaError("call_id must not be empty")
        if not self.utterance_id:
            raise SchemaError("utterance_id must not be empty")
        if self.profile not in PROFILES:
            raise SchemaError(
                f"unknown profile {self.profile!r} (expected {' or '.join(PROFILES)})"
            )
        allowed = (8000,) if self.profile == "narrowband" else WIDEBAND_RATES
        if self.rate and self.rate not in allowed:
            raise SchemaError(
                f"rate {self.rate} is not one of {', '.join(map(str, allowed))} for {self.profile}"
            )

    def to_fields(self) -> dict[str, str]:
        fields = {
            "v": str(VERSION),
            "type": "speak",
            "call": self.call_id,
            "utt": self.utterance_id,
            "text": self.text,
            "voice": self.voice,
            "profile": self.profile,
            "deadline": repr(self.deadline),
            "trace": self.trace_id,
            "raw": "1" if self.raw else "0",
        }
        if self.rate:
            fields["rate"] = str(self.rate)
        return fields

    @classmethod
    def from_fields(cls, fields: Fields) -> SpeakRequest:
        f = _decode(fields)
        _check_version(f)
        kind = _text(f, "type", required=False, default="speak")
        if kind != "speak":
            raise SchemaError(f"not a speak request: type {kind!r}")
        profile = _text(f, "profile", required=False, default="narrowband")
        if profile not in PROFILES:
            raise SchemaError(f"unknown profile {profile!r} (expected {' or '.join(PROFILES)})")
        return cls(
            call_id=_text(f, "call"),
            utterance_id=_text(f, "utt"),
            text=_text(f, "text"),
            voice=_text(f, "voice", required=False),
            profile=profile,  # type: ignore[arg-type]
            deadline=_float(f, "deadline", 0.0),
            trace_id=_text(f, "trace", required=False),
            raw=_text(f, "raw", required=False, default="0") == "1",
            rate=_int(f, "rate", default=0),
        )


@dataclass(frozen=True, slots=True)
class Word:
    """A spoken word and its sample span at the chunk's output ``rate``, from utterance start."""

    word: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class AudioChunk:
    call_id: str
    utterance_id: str
    seq: int  # 0, 1, 2, ... per utterance; the gateway plays only the next expected seq
    rate: int
    data: bytes  # s16le mono
    offset: int = 0  # sample index of data[0] within the utterance, at ``rate``
    words: tuple[Word, ...] = field(default_factory=tuple)
    trace_id: str = ""
    encoding: str = "s16le"
    kind: Literal["chunk"] = "chunk"

    @property
    def samples(self) -> int:
        return len(self.data) // 2


@dataclass(frozen=True, slots=True)
class UtteranceEnd:
    call_id: str
    utterance_id: str
    seq: int
    reason: EndReason = "done"
    samples: int = 0  # total samples sent for the utterance
    trace_id: str = ""
    kind: Literal["end"] = "end"


@dataclass(frozen=True, slots=True)
class UtteranceError:
    call_id: str
    utterance_id: str
    seq: int
    code: str
    message: str
    trace_id: str = ""
    kind: Literal["error"] = "error"


AudioMessage = AudioChunk | UtteranceEnd | UtteranceError


def audio_to_fields(msg: AudioMessage) -> dict[str, bytes]:
    base = {
        "v": str(VERSION).encode(),
        "type": msg.kind.encode(),
        "call": msg.call_id.encode(),
        "utt": msg.utterance_id.encode(),
        "seq": str(msg.seq).encode(),
        "trace": msg.trace_id.encode(),
    }
    if isinstance(msg, AudioChunk):
        base.update(
            {
                "rate": str(msg.rate).encode(),
                "enc": msg.encoding.encode(),
                "data": msg.data,
                "offset": str(msg.offset).encode(),
                "words": json.dumps([[w.word, w.start, w.end] for w in msg.words]).encode(),
            }
        )
    elif isinstance(msg, UtteranceEnd):
        base.update({"reason": msg.reason.encode(), "samples": str(msg.samples).encode()})
    else:
        base.update({"code": msg.code.encode(), "message": msg.message.encode()})
    return base


def audio_from_fields(fields: Fields) -> AudioMessage:
    f = _decode(fields)
    _check_version(f)
    kind = _text(f, "type")
    seq = _int(f, "seq")
    if seq < 0:
        raise SchemaError(f"field 'seq' must not be negative: {seq}")
    common = {
        "call_id": _text(f, "call"),
        "utterance_id": _text(f, "utt"),
        "seq": seq,
        "trace_id": _text(f, "trace", required=False),
    }
    if kind == "chunk":
        enc = _text(f, "enc", required=False, default="s16le")
        if enc != "s16le":
            raise SchemaError(f"unsupported audio encoding {enc!r}")
        data = f.get("data", b"")
        if len(data) % 2:
            raise SchemaError("s16le audio with an odd number of bytes")
        try:
            raw_words = json.loads(_text(f, "words", required=False, default="[]"))
            words = tuple(Word(str(w), int(s), int(e)) for w, s, e in raw_words)
        except (ValueError, TypeError) as exc:
            raise SchemaError(f"field 'words' is malformed: {exc}") from None
        rate = _int(f, "rate")
        if rate <= 0:
            raise SchemaError(f"field 'rate' must be positive: {rate}")
        return AudioChunk(
            rate=rate,
            data=data,
            offset=_int(f, "offset", default=0),
            words=words,
            **common,  # type: ignore[arg-type]
        )
    if kind == "end":
        reason = _text(f, "reason", required=False, default="done")
        if reason not in ("done", "cancelled", "deadline"):
            raise SchemaError(f"unknown end reason {reason!r}")
        return UtteranceEnd(
            reason=reason,  # type: ignore[arg-type]
            samples=_int(f, "samples", default=0),
            **common,  # type: ignore[arg-type]
        )
    if kind == "error":
        return UtteranceError(
            code=_text(f, "code"),
            message=_text(f, "message", required=False),
            **common,  # type: ignore[arg-type]
        )
    raise SchemaError(f"unknown audio message type {kind!r}")
