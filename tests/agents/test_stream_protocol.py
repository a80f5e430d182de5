"""The Twilio Media Streams core (``gateway.agents.twilio_media``) against pipecat's own parser
and serializer: what voxgate sends is what ``parse_telephony_websocket`` and
``TwilioFrameSerializer.deserialize`` read (InputAudioRawFrame, InputDTMFFrame), and what the
serializer sends (audio, interruptions) is what voxgate reads back. Plus the shapes Twilio
documents, the refusals, and the mark bookkeeping."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import numpy as np
import pytest
from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.frames.frames import (
    InputAudioRawFrame,
    InputDTMFFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
)
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer

from dsp.g711 import ulaw_decode, ulaw_encode
from gateway.agents.twilio_media import (
    MAX_MESSAGE_BYTES,
    BotClear,
    BotMark,
    BotMedia,
    BotOther,
    MarkBook,
    MediaStream,
    StreamProtocolError,
    call_sid_for,
    new_sid,
    phone_number,
)

SID = "MZ" + "0" * 32


def stream(**params: str) -> MediaStream:
    return MediaStream(
        stream_sid=SID, call_sid=call_sid_for("abc123"), account_sid="AC" + "1" * 32,
        parameters={"from_number": "+15550100", "to_number": "+15550199", **params},
    )  # fmt: skip


async def serializer(rate: int = 8000) -> TwilioFrameSerializer:
    ser = TwilioFrameSerializer(
        stream_sid=SID, params=TwilioFrameSerializer.InputParams(auto_hang_up=False)
    )
    await ser.setup(SimpleNamespace(audio_in_sample_rate=rate))  # type: ignore[arg-type]
    return ser


def tone(n: int, hz: float = 440.0, level: float = 8000.0, rate: int = 8000) -> np.ndarray:
    t = np.arange(n) / rate
    return np.round(level * np.sin(2 * np.pi * hz * t)).astype(np.int16)


class _Socket:
    """What ``parse_telephony_websocket`` reads from a FastAPI WebSocket: ``iter_text``."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    async def iter_text(self) -> AsyncIterator[str]:
        for t in self.texts:
            yield t


# --- voxgate → bot, read by pipecat -----------------------------------------------------------
async def test_pipecat_detects_twilio_and_reads_the_call_data() -> None:
    s = stream(customer="42")
    socket = _Socket([s.connected(), s.start()])
    transport, data = await parse_telephony_websocket(socket)  # type: ignore[arg-type]
    assert transport == "twilio"
    assert data["stream_id"] == SID and data["call_id"] == s.call_sid
    assert data["body"] == {"from_number": "+15550100", "to_number": "+15550199", "customer": "42"}
    assert data.from_number == "+15550100" and data.to_number == "+15550199"


def test_messages_have_twilios_shapes() -> None:
    s = stream()
    connected = json.loads(s.connected())
    assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    start = json.loads(s.start())
    assert start["sequenceNumber"] == "1" and start["streamSid"] == SID
    assert start["start"] == {
        "accountSid": "AC" + "1" * 32, "streamSid": SID, "callSid": s.call_sid,
        "tracks": ["inbound"],
        "customParameters": {"from_number": "+15550100", "to_number": "+15550199"},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }  # fmt: skip
    media = [json.loads(s.media(tone(160))) for _ in range(3)]
    assert [m["sequenceNumber"] for m in media] == ["2", "3", "4"]
    assert [m["media"]["chunk"] for m in media] == ["1", "2", "3"]
    assert [m["media"]["timestamp"] for m in media] == ["0", "20", "40"]
    assert all(m["media"]["track"] == "inbound" and m["streamSid"] == SID for m in media)
    assert len(base64.b64decode(media[0]["media"]["payload"])) == 160
    dtmf = json.loads(s.dtmf("5"))
    assert dtmf == {"event": "dtmf", "streamSid": SID, "sequenceNumber": "5",
                    "dtmf": {"track": "inbound_track", "digit": "5"}}  # fmt: skip
    mark = json.loads(s.mark("greeting-end"))
    assert mark == {"event": "mark", "sequenceNumber": "6", "streamSid": SID,
                    "mark": {"name": "greeting-end"}}  # fmt: skip
    stop = json.loads(s.stop())
    assert stop == {"event": "stop", "sequenceNumber": "7", "streamSid": SID,
                    "stop": {"accountSid": "AC" + "1" * 32, "callSid": s.call_sid}}  # fmt: skip


def test_timestamps_follow_the_wall_clock_across_held_back_frames() -> None:
    s = stream()
    ts = [json.loads(s.media(tone(160), e))["media"]["timestamp"] for e in (3, 22, 300, 301, 302)]
    # +20 ms per frame, jumping forward over a gap (frames the echo gate held back), never back.
    assert ts == ["3", "23", "300", "320", "340"]


async def test_pipecat_reads_our_media_as_the_callers_audio() -> None:
    ser = await serializer(8000)
    pcm = tone(160)
    frame = await ser.deserialize(stream().media(pcm))
    assert isinstance(frame, InputAudioRawFrame)
    assert frame.sample_rate == 8000 and frame.num_channels == 1
    assert frame.audio == ulaw_decode(ulaw_encode(pcm)).tobytes()


async def test_pipecat_resamples_our_media_to_its_pipeline_rate() -> None:
    ser = await serializer(16000)
    s = stream()
    out = [await ser.deserialize(s.media(tone(160, 1000))) for _ in range(50)]
    frames = [f for f in out if f is not None]
    assert frames and all(isinstance(f, InputAudioRawFrame) for f in frames)
    assert all(isinstance(f, InputAudioRawFrame) and f.sample_rate == 16000 for f in frames)
    total = sum(len(f.audio) for f in frames if isinstance(f, InputAudioRawFrame)) // 2
    # 1 s at 16 kHz, less what soxr holds back (it works in ~100 ms blocks).
    assert 14000 <= total <= 16000


@pytest.mark.parametrize("digit", list("0123456789*#"))
async def test_pipecat_reads_our_dtmf_as_input_dtmf_frames(digit: str) -> None:
    frame = await (await serializer()).deserialize(stream().dtmf(digit))
    assert isinstance(frame, InputDTMFFrame) and frame.button == KeypadEntry(digit)


# --- bot → voxgate, written by pipecat --------------------------------------------------------
async def test_we_read_pipecats_audio_of_any_length() -> None:
    ser = await serializer()
    s = stream()
    for n in (80, 320, 4000):
        pcm = tone(n)
        out = await ser.serialize(OutputAudioRawFrame(pcm.tobytes(), 8000, 1))
        assert isinstance(out, str)
        msg = s.parse(out)
        assert isinstance(msg, BotMedia) and len(msg.pcm) == n
        # μ-law quantisation only.
        assert np.max(np.abs(msg.pcm.astype(int) - pcm.astype(int))) <= 256


async def test_we_read_pipecats_interruption_as_clear() -> None:
    out = await (await serializer()).serialize(InterruptionFrame())
    assert isinstance(out, str) and isinstance(stream().parse(out), BotClear)


def test_marks_unknown_events_and_binary_frames() -> None:
    s = stream()
    assert s.parse(json.dumps({"event": "mark", "streamSid": SID, "mark": {"name": "m1"}})) == (
        BotMark("m1")
    )
    assert s.parse(b'{"event": "clear"}') == BotClear()  # no streamSid: accepted
    assert s.parse('{"event": "transcript", "text": "hi"}') == BotOther("transcript")


@pytest.mark.parametrize(
    ("data", "kind", "says"),
    [
        ("{not json", "malformed", "not JSON"),
        (b"\xff\xfe{}", "malformed", "not JSON"),
        ("[1, 2]", "malformed", "not a JSON object: array"),
        ('{"media": {}}', "malformed", "no 'event'"),
        ('{"event": "media"}', "malformed", "'media' must be an object"),
        ('{"event": "media", "media": {"payload": 5}}', "malformed", "'media.payload' must be"),
        ('{"event": "media", "media": {"payload": "@@@"}}', "malformed", "not base64"),
        ('{"event": "mark", "mark": {}}', "malformed", "'mark.name' must be a string"),
        ('{"event": "mark", "mark": {"name": "' + "x" * 300 + '"}}', "malformed", "limit is 256"),
        ('{"event": "clear", "streamSid": "MZother"}', "malformed", "is not this stream's"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "too_big", "limit is 65536"),
    ],
)
def test_refusals_name_what_was_wrong(data: str | bytes, kind: str, says: str) -> None:
    with pytest.raises(StreamProtocolError) as info:
        stream().parse(data)
    assert info.value.kind == kind and says in info.value.message


# --- identifiers -----------------------------------------------------------------------------
def test_sids_are_twilio_shaped() -> None:
    for prefix in ("MZ", "AC"):
        sid = new_sid(prefix)
        assert sid.startswith(prefix) and len(sid) == 34 and int(sid[2:], 16) >= 0
    sid = call_sid_for("abc123")
    assert sid.startswith("CA") and len(sid) == 34 and int(sid[2:], 16) >= 0
    assert sid == call_sid_for("abc123") != call_sid_for("abc124")


@pytest.mark.parametrize(
    ("uri", "number"),
    [
        ("sip:+15550100@example.com", "+15550100"),
        ("<sips:alice@example.com;transport=tls>", "alice"),
        ("sip:%2B4930123@gw", "+4930123"),
        ("tel:+15550199;phone-context=x", "+15550199"),
        ("sip:example.com", "sip:example.com"),
        ("192.0.2.7:5004", "192.0.2.7:5004"),
    ],
)
def test_phone_numbers_from_call_addresses(uri: str, number: str) -> None:
    assert phone_number(uri) == number


# --- mark bookkeeping ------------------------------------------------------------------------
def book() -> MarkBook:
    ids = iter(f"s{i}" for i in range(1, 100))
    return MarkBook(new_id=lambda: next(ids), max_marks=3)


def test_a_mark_waits_for_the_audio_before_it() -> None:
    b = book()
    assert b.audio() == ("s1", True) and b.audio() == ("s1", False)
    assert b.mark("a") == ("s1", [])  # ends s1, waits for it
    assert b.audio() == ("s2", True)
    assert b.mark("b") == ("s2", [])
    assert b.mark("c") == (None, [])  # nothing new since b: waits on s2 as well
    assert b.finished("s1") == ["a"]
    assert b.finished("s2") == ["b", "c"]
    assert b.queued == 0 and b.pending_marks == 0
    assert b.mark("d") == (None, ["d"])  # nothing queued: echoed at once


def test_marks_are_echoed_when_a_clear_drops_their_audio() -> None:
    b = book()
    b.audio()
    b.mark("a")
    b.audio()
    assert b.close() == "s2"  # the clear ends the open segment; the interrupt drops both
    assert b.finished("s1") == ["a"] and b.finished("s2") == []
    assert b.audio() == ("s3", True)


def test_an_interrupted_open_segment_stays_open_until_the_bot_pauses() -> None:
    b = book()
    b.audio()
    assert b.finished("s1") == []  # voxgate's barge-in cut it
    assert b.audio() == ("s1", False) and b.queued == 0  # the rest is dropped by the playout
    assert b.close() == "s1"
    assert b.audio() == ("s2", True)


def test_too_many_waiting_marks_is_a_flood() -> None:
    b = book()
    b.audio()
    for name in "abc":
        b.mark(name)
    with pytest.raises(StreamProtocolError) as info:
        b.mark("d")
    assert info.value.kind == "flood"
    assert b.drain() == ["a", "b", "c"] and b.queued == 0
