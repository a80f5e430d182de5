"""Wire form of bus messages: round trips, and what a reader refuses."""

from __future__ import annotations

import pytest

from voxgate.contract.bus.schema import (
    VERSION,
    AudioChunk,
    SchemaError,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
    Word,
    audio_from_fields,
    audio_to_fields,
)


def bytes_fields(fields: dict[str, str]) -> dict[bytes, bytes]:
    """What redis-py hands back: bytes keys and values."""
    return {k.encode(): v.encode() for k, v in fields.items()}


def test_speak_request_round_trip() -> None:
    req = SpeakRequest(
        call_id="c",
        utterance_id="u",
        text="Dr. Smith owes $1,234.56 — ok?",
        voice="joe",
        profile="wideband",
        deadline=1712345678.125,
        trace_id="t",
        raw=True,
        rate=16000,
    )
    assert SpeakRequest.from_fields(req.to_fields()) == req
    assert SpeakRequest.from_fields(bytes_fields(req.to_fields())) == req
    minimal = SpeakRequest(call_id="c", utterance_id="u", text="")
    assert SpeakRequest.from_fields(minimal.to_fields()) == minimal
    # Optional fields may be absent; an entry without "v" is read as the current version.
    assert SpeakRequest.from_fields({"call": "c", "utt": "u", "text": "x"}) == SpeakRequest(
        call_id="c", utterance_id="u", text="x"
    )


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"v": str(VERSION + 1)}, "unsupported schema version"),
        ({"v": "one"}, "not an integer"),
        ({"profile": "hifi"}, "unknown profile"),
        ({"deadline": "soon"}, "not a number"),
        ({"deadline": "nan"}, "not a finite number"),
        ({"type": "chunk"}, "not a speak request"),
        ({"call": ""}, "call_id must not be empty"),
        ({"utt": ""}, "utterance_id must not be empty"),
        ({"rate": "fast"}, "not an integer"),
        ({"rate": "16000"}, "rate 16000 is not one of 8000 for narrowband"),
        ({"rate": "22050", "profile": "wideband"}, "rate 22050 is not one of"),
    ],
)
def test_speak_request_rejects(patch: dict[str, str], message: str) -> None:
    fields = {**SpeakRequest(call_id="c", utterance_id="u", text="x").to_fields(), **patch}
    with pytest.raises(SchemaError, match=message):
        SpeakRequest.from_fields(fields)


def test_speak_request_rejects_missing_and_non_utf8() -> None:
    fields = SpeakRequest(call_id="c", utterance_id="u", text="x").to_fields()
    del fields["text"]
    with pytest.raises(SchemaError, match="missing field 'text'"):
        SpeakRequest.from_fields(fields)
    with pytest.raises(SchemaError, match="not UTF-8"):
        SpeakRequest.from_fields({b"call": b"c", b"utt": b"u", b"text": b"\xff"})


@pytest.mark.parametrize(
    "msg",
    [
        AudioChunk(
            call_id="c",
            utterance_id="u",
            seq=3,
            rate=8000,
            data=bytes(range(256)) * 2,
            offset=480,
            words=(Word("hi", 0, 400), Word("thére", 400, 900)),
            trace_id="t",
        ),
        AudioChunk(call_id="c", utterance_id="u", seq=0, rate=48000, data=b""),
        UtteranceEnd(call_id="c", utterance_id="u", seq=4, reason="deadline", samples=1234),
        UtteranceError(call_id="c", utterance_id="u", seq=0, code="unknown_voice", message="no ü"),
    ],
)
def test_audio_round_trip(msg: AudioChunk | UtteranceEnd | UtteranceError) -> None:
    fields = audio_to_fields(msg)
    assert all(isinstance(v, bytes) for v in fields.values())
    assert audio_from_fields(fields) == msg
    assert audio_from_fields({k.encode(): v for k, v in fields.items()}) == msg


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"v": str(VERSION + 1).encode()}, "unsupported schema version"),
        ({"data": b"\x00\x01\x02"}, "odd number of bytes"),
        ({"enc": b"ulaw"}, "unsupported audio encoding"),
        ({"type": b"video"}, "unknown audio message type"),
        ({"seq": b"-1"}, "must not be negative"),
        ({"rate": b"0"}, "must be positive"),
        ({"words": b"[[1, 2]]"}, "'words' is malformed"),
        ({"words": b"{"}, "'words' is malformed"),
        ({"call": b"\xc3"}, "not UTF-8"),
    ],
)
def test_audio_rejects(patch: dict[str, bytes], message: str) -> None:
    fields = audio_to_fields(
        AudioChunk(call_id="c", utterance_id="u", seq=0, rate=8000, data=b"\x00\x00")
    )
    with pytest.raises(SchemaError, match=message):
        audio_from_fields({**fields, **patch})


def test_end_rejects_unknown_reason() -> None:
    fields = audio_to_fields(UtteranceEnd(call_id="c", utterance_id="u", seq=1))
    with pytest.raises(SchemaError, match="unknown end reason"):
        audio_from_fields({**fields, "reason": b"bored"})


def test_chunk_samples() -> None:
    assert (
        AudioChunk(call_id="c", utterance_id="u", seq=0, rate=8000, data=b"\0" * 320).samples == 160
    )
