"""What the llm agent hears: caller frames (16 kHz, 20 ms) in, ``CallerTurn``s out.

With the real recogniser (faster-whisper tiny.en) and the real end-of-turn model (smart-turn
v3.2), on the project's voice through the phone chain (Piper, seeded, G.711 μ-law at 8 kHz,
back to 16 kHz), delivered at twice real time (a cut sentence in real time until its rest is
recognised; silence is counted on the media clock, the recogniser runs on the wall clock): a
sentence is one turn, silence and noise none, two sentences two; a sentence cut mid-phrase (at
a word's last sample, so it keeps the mid-phrase intonation, as in tests/stt/test_turn.py) is
"not finished" to the model and the turn waits for the rest; without the model it is two
turns.

With stand-ins (a recogniser that answers at once, an end-of-turn rule by length): a 30-minute
monologue comes out in ``max_segment_s`` cuts with bounded memory; a failing recogniser or
model costs the utterance, not the hearing; the max-silence clock."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator

import numpy as np
import pytest

from dsp.g711 import ulaw_decode, ulaw_encode
from dsp.pcm import float_to_s16
from dsp.telephone import telephone
from gateway.agents.hearing import CallerPartial, CallerTurn, HeardEvent, Hearing
from gateway.stt.base import FloatArray, SpeechToText, Transcript, to_stt_rate
from gateway.stt.segmenter import RATE
from gateway.stt.turn import EndOfTurnModel, SmartTurn, TurnVerdict
from gateway.stt.whisper import WhisperStt
from synth.engines.onnx_engine import OnnxEngine
from tests.agents.audio import Int16Array, frames_of, paced, silence, voiced
from tests.agents.fakes import FakeStt
from voxgate.contract.config import TurnConfig

SEED = 1
SPEED = 2.0  # times real time
FIRST = "I would like to check the balance on my account."
SECOND = "Can you tell me when my next payment is due?"
# Cut after "... my bill and" (7 words): the clearest unfinished phrase of test_turn.py.
CUT = ("I want to pay my bill and I also need a new card.", 7)


@pytest.fixture(scope="module")
def engine() -> Iterator[OnnxEngine]:
    yield OnnxEngine()


@pytest.fixture(scope="module")
def whisper() -> Iterator[WhisperStt]:
    yield WhisperStt()


@pytest.fixture(scope="module")
def smart_turn() -> Iterator[SmartTurn]:
    yield SmartTurn()


@functools.cache
def _spoken(engine: OnnxEngine, text: str) -> tuple[FloatArray, tuple[int, ...]]:
    audio, marks = engine.synthesize_with_marks(text, seed=SEED)
    return audio, tuple(m.end for m in marks)


def phone(engine: OnnxEngine, audio: FloatArray) -> Int16Array:
    """What the caller's line carries (8 kHz μ-law), at 16 kHz int16 as the agent's tap has it."""
    line = ulaw_decode(ulaw_encode(float_to_s16(telephone(audio, engine.sample_rate))))
    return float_to_s16(to_stt_rate(line, 8000))


def sentence(engine: OnnxEngine, text: str) -> Int16Array:
    return phone(engine, _spoken(engine, text)[0])


def cut_sentence(engine: OnnxEngine, text: str, words: int) -> tuple[Int16Array, Int16Array]:
    """The sentence spoken whole, cut at the end of word ``words``: (before, after)."""
    audio, ends = _spoken(engine, text)
    at = ends[words - 1]
    return phone(engine, audio[:at]), phone(engine, audio[at:])


async def hear(
    x: Int16Array,
    stt: SpeechToText,
    model: EndOfTurnModel | None,
    cfg: TurnConfig | None = None,
    *,
    speed: float = SPEED,
    fast_from_s: float | None = None,
    on_frame: Callable[[Hearing, int], None] | None = None,
) -> tuple[list[HeardEvent], Hearing]:
    """Everything heard of ``x``, delivered at ``speed`` times real time (from
    ``fast_from_s`` of media time on, at 8 times: waiting out a silence on the media clock)."""
    frames = frames_of(x)
    holder: list[Hearing] = []

    def tick(i: int) -> None:
        if on_frame is not None:
            on_frame(holder[0], i)

    fast = None if fast_from_s is None else int(fast_from_s * 50)
    source = paced(frames, speed, tick, fast_from=fast)
    hearing = Hearing(source, stt, model, cfg or TurnConfig())
    holder.append(hearing)
    events = [e async for e in hearing]
    return events, hearing


def turns(events: list[HeardEvent]) -> list[CallerTurn]:
    return [e for e in events if isinstance(e, CallerTurn)]


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


# -- the real recogniser and model --------------------------------------------------------------


@pytest.mark.slow
async def test_a_sentence_then_silence_is_one_turn(
    engine: OnnxEngine, whisper: WhisperStt, smart_turn: SmartTurn
) -> None:
    speech = sentence(engine, FIRST)
    x = np.concatenate([silence(0.3), speech, silence(1.0)])
    events, hearing = await hear(x, whisper, smart_turn)
    (turn,) = turns(events)
    assert {"check", "balance", "account"} <= words(turn.text), turn
    assert turn.reason in ("model", "silence"), turn
    assert turn.probability is not None and turn.stt_s > 0 and turn.eot_s > 0
    # Media times: it starts near the speech (pre-roll) and ends with it.
    assert 0 <= turn.start_ms <= 300
    # (The rendered sentence ends in ~300 ms of the voice's own quiet tail, which is not speech.)
    assert -450 <= turn.end_ms - (300 + speech.size * 1000 / RATE) <= 300
    assert hearing.turns == 1 and hearing.errors == 0
    assert hearing.buffered_samples <= int(0.2 * RATE)  # the pre-roll of silence only


@pytest.mark.slow
@pytest.mark.parametrize("what", ["silence", "noise"])
async def test_silence_and_noise_make_no_turn(
    whisper: WhisperStt, smart_turn: SmartTurn, what: str
) -> None:
    if what == "silence":
        x = silence(10.0)
    else:
        rng = np.random.default_rng(3)
        x = np.clip(rng.standard_normal(5 * RATE) * 1000, -32768, 32767).astype(np.int16)
    events, hearing = await hear(x, whisper, smart_turn, speed=20.0)
    assert events == []
    assert hearing.turns == 0 and hearing.errors == 0


@pytest.mark.slow
async def test_two_sentences_apart_are_two_turns(
    engine: OnnxEngine, whisper: WhisperStt, smart_turn: SmartTurn
) -> None:
    x = np.concatenate([
        silence(0.3), sentence(engine, FIRST), silence(2.0), sentence(engine, SECOND),
        silence(1.0),
    ])  # fmt: skip
    events, _ = await hear(x, whisper, smart_turn)
    first, second = turns(events)
    assert {"balance", "account"} <= words(first.text), first
    assert {"payment", "due"} <= words(second.text), second
    assert first.end_ms < second.start_ms
    assert any(isinstance(e, CallerPartial) for e in events)  # captions while speaking


class Verdicts:
    """The real end-of-turn model, with every verdict it gave kept."""

    name = "recorded"

    def __init__(self, model: EndOfTurnModel) -> None:
        self.model = model
        self.probabilities: list[float] = []

    def predict(self, audio: FloatArray) -> TurnVerdict:
        verdict = self.model.predict(audio)
        self.probabilities.append(verdict.probability)
        return verdict


async def _cut_then_rest(
    engine: OnnxEngine, whisper: WhisperStt, model: EndOfTurnModel | None, cfg: TurnConfig
) -> list[CallerTurn]:
    """The sentence cut after "... my bill and", 0.6 s of pause, the rest, and a silence
    longer than ``max_silence_ms``. In real time until the rest has been recognised (the
    first half is then recognised before the rest is spoken; see
    test_a_lagging_recogniser_still_gives_the_model_the_whole_turn for when it is not), then
    faster: the silence is counted on the media clock."""
    before, after = cut_sentence(engine, *CUT)
    spoken_s = 0.3 + (before.size + after.size) / RATE + 0.6
    tail_s = cfg.max_silence_ms / 1000 + 1.0
    x = np.concatenate([silence(0.3), before, silence(0.6), after, silence(tail_s)])
    events, _ = await hear(x, whisper, model, cfg, speed=1.0, fast_from_s=spoken_s + 1.0)
    return turns(events)


@pytest.mark.slow
async def test_a_cut_sentence_waits_for_the_rest_within_max_silence(
    engine: OnnxEngine, whisper: WhisperStt, smart_turn: SmartTurn
) -> None:
    # max_silence_ms long enough that the clock's bug (below) cannot end the turn early.
    model = Verdicts(smart_turn)
    (turn,) = await _cut_then_rest(engine, whisper, model, TurnConfig(max_silence_ms=3000))
    assert {"bill", "new", "card"} <= words(turn.text), turn
    assert model.probabilities[0] < 0.5  # "I want to pay my bill and": not finished
    # The whole turn, joined, may still sound unfinished to the model (then max_silence_ms
    # ends it); the rest heard alone sounds finished.
    assert turn.reason in ("model", "silence"), turn


@pytest.mark.slow
async def test_a_cut_sentence_is_one_turn(
    engine: OnnxEngine, whisper: WhisperStt, smart_turn: SmartTurn
) -> None:
    model = Verdicts(smart_turn)
    found = await _cut_then_rest(engine, whisper, model, TurnConfig())
    assert model.probabilities[0] < 0.5  # "I want to pay my bill and": not finished
    assert len(found) == 1, found
    assert {"bill", "new", "card"} <= words(found[0].text)
    assert found[0].reason in ("model", "silence")


@pytest.mark.slow
async def test_without_the_model_a_cut_sentence_is_two_turns(
    engine: OnnxEngine, whisper: WhisperStt, smart_turn: SmartTurn
) -> None:
    found = await _cut_then_rest(engine, whisper, smart_turn, TurnConfig(smart_turn=False))
    assert len(found) == 2, found
    assert all(t.reason == "silence" and t.probability is None for t in found)
    assert "bill" in words(found[0].text) and "card" in words(found[1].text)


# -- stand-ins ----------------------------------------------------------------------------------


class ByLength:
    """An end-of-turn rule: complete once the turn's audio is at least ``seconds`` long."""

    name = "by-length"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def predict(self, audio: FloatArray) -> TurnVerdict:
        self.calls += 1
        complete = audio.size >= self.seconds * RATE
        return TurnVerdict(complete, 0.9 if complete else 0.1, 0.0)


class Failing:
    """Raises on loud audio (peak above ``limit``), answers ``text`` otherwise."""

    name = "failing"

    def __init__(self, text: str = "hello there", limit: float = 0.5) -> None:
        self.text = text
        self.limit = limit
        self.failed = 0

    def transcribe(self, audio: FloatArray) -> Transcript:
        if audio.size and float(np.abs(audio).max()) > self.limit:
            self.failed += 1
            raise RuntimeError("recogniser exploded")
        return Transcript(self.text, audio.size / RATE, 0.0)

    def predict(self, audio: FloatArray) -> TurnVerdict:
        if audio.size and float(np.abs(audio).max()) > self.limit:
            self.failed += 1
            raise RuntimeError("model exploded")
        return TurnVerdict(True, 0.9, 0.0)


async def test_a_monologue_is_cut_with_bounded_memory() -> None:
    cfg = TurnConfig(smart_turn=False)
    minute = voiced(60.0)
    frames = frames_of(np.tile(minute, 30))  # 30 minutes without a pause
    assert len(frames) == 30 * 60 * 50
    stt = FakeStt("blah blah")
    peak = [0]
    limit = int((cfg.max_segment_s + 1) * RATE)

    async def fast() -> AsyncIterator[Int16Array]:
        for i, f in enumerate(frames):
            if i % 5 == 0:
                peak[0] = max(peak[0], hearing.buffered_samples)
                await asyncio.sleep(0)  # let the recogniser's results in, as a call would
            yield f

    hearing = Hearing(fast(), stt, None, cfg)
    cut = 0
    async for ev in hearing:
        if isinstance(ev, CallerTurn):
            assert ev.text == "blah blah"
            assert ev.end_ms - ev.start_ms <= cfg.max_segment_s * 1000 + 20
            cut += ev.reason == "cut"
        peak[0] = max(peak[0], hearing.buffered_samples)
    assert cut >= 30 * 60 / cfg.max_segment_s - 2, cut
    assert hearing.turns - cut <= 1  # the end of the call may close the last piece
    assert 0 < peak[0] <= limit, (peak[0], limit)
    assert hearing.errors == 0


async def test_a_failing_recogniser_costs_the_utterance_not_the_hearing() -> None:
    stt = Failing()
    x = np.concatenate([
        voiced(0.8, level=30000), silence(2.0),  # loud: the recogniser raises
        voiced(0.8), silence(2.0),  # heard
        voiced(1.5, level=30000), silence(2.0),  # raises again (partials too)
        voiced(0.8), silence(1.0),
    ])  # fmt: skip
    events, hearing = await hear(x, stt, None, TurnConfig(smart_turn=False), speed=8.0)
    found = turns(events)
    assert [t.text for t in found] == ["hello there", "hello there"]
    assert hearing.errors >= 2 and stt.failed >= 2


async def test_a_failing_model_costs_the_utterance_not_the_hearing() -> None:
    model = Failing()
    x = np.concatenate([voiced(0.8, level=30000), silence(2.0), voiced(0.8), silence(1.0)])
    events, hearing = await hear(x, FakeStt("and then"), model, TurnConfig(), speed=8.0)
    (turn,) = turns(events)
    assert turn.text == "and then" and turn.reason == "model"
    assert hearing.errors >= 1


async def test_the_model_saying_not_yet_makes_the_turn_wait() -> None:
    # Half a turn (model: not finished), a pause, a short rest: one turn; the pause is
    # well under max_silence_ms however the clock is counted.
    model = ByLength(1.8)
    x = np.concatenate([silence(0.2), voiced(1.0), silence(0.6), voiced(0.3), silence(1.0)])
    events, _ = await hear(x, FakeStt("part"), model, TurnConfig(), speed=4.0)
    (turn,) = turns(events)
    assert turn.text == "part part" and turn.reason == "model"
    assert model.calls >= 2


async def test_a_waiting_turn_ends_at_max_silence() -> None:
    model = ByLength(100.0)  # never finished
    cfg = TurnConfig(max_silence_ms=800)
    x = np.concatenate([silence(0.2), voiced(1.0), silence(2.0)])
    ends: list[int] = []

    def watch(h: Hearing, i: int) -> None:
        if h.turns and not ends:
            ends.append(i)

    events, _ = await hear(x, FakeStt("so"), model, cfg, speed=4.0, on_frame=watch)
    (turn,) = turns(events)
    assert turn.reason == "silence" and turn.probability == 0.1
    # Decided on the media clock: max_silence_ms after the end of the speech (a frame late).
    decided_ms = ends[0] * 20
    assert 0 <= decided_ms - (turn.end_ms + 800) <= 60, (decided_ms, turn.end_ms)


async def test_speech_after_a_pause_is_not_counted_as_silence() -> None:
    # Half a turn (not finished), a 0.6 s pause, then 1.5 s more speech: no silence here is
    # anywhere near max_silence_ms (1.5 s), so this is one turn.
    model = ByLength(1.8)
    x = np.concatenate([silence(0.2), voiced(1.0), silence(0.6), voiced(1.5), silence(1.0)])
    events, _ = await hear(x, FakeStt("part"), model, TurnConfig(), speed=4.0)
    found = turns(events)
    assert [(t.text, t.reason) for t in found] == [("part part", "model")]


class SlowStt(FakeStt):
    """Takes ``delay`` seconds (wall clock) per recognition: a loaded CPU."""

    def __init__(self, text: str, delay: float) -> None:
        super().__init__(text)
        self.delay = delay

    def transcribe(self, audio: FloatArray) -> Transcript:
        time.sleep(self.delay)
        return super().transcribe(audio)


class Recording(ByLength):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.heard: list[float] = []

    def predict(self, audio: FloatArray) -> TurnVerdict:
        self.heard.append(audio.size / RATE)
        return super().predict(audio)


async def test_a_lagging_recogniser_still_gives_the_model_the_whole_turn() -> None:
    # Half a turn (0.6 s), a 0.4 s pause, a short rest (0.4 s); the recogniser takes 1.2 s
    # of media time per phrase, so the rest's pause comes before the first half is decided.
    # Alone, neither half is long enough to be "finished"; together they are.
    model = Recording(1.5)
    cfg = TurnConfig(max_silence_ms=5000)  # keep the max-silence clock out of this
    x = np.concatenate([silence(0.2), voiced(0.6), silence(0.4), voiced(0.4), silence(1.5)])
    events, _ = await hear(x, SlowStt("part", 0.3), model, cfg, speed=4.0)
    found = turns(events)
    assert [(t.text, t.reason) for t in found] == [("part part", "model")], model.heard
