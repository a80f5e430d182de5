"""AmdDetector: the signals joined into amd.* events at the media times the rules give, the
same events in any chunking, and its configuration's checks."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.amd.detector import (
    AmdBeep,
    AmdConfig,
    AmdDecisionTimeout,
    AmdDetector,
    AmdEvent,
    AmdGreetingEnded,
    AmdHuman,
    AmdMachine,
    AmdNoSpeech,
    Phase,
)
from tests.amd.signals import Int16Array, burst, join, silence, tone


def run(x: Int16Array, config: AmdConfig | None = None) -> list[AmdEvent]:
    det = AmdDetector(config)
    return det.process(x) + det.finish()


def test_a_short_answer_is_human() -> None:
    assert run(join(silence(500), burst(400), silence(3000))) == [AmdHuman(1700, "HUMAN")]


def test_a_long_greeting_is_a_machine_then_its_end() -> None:
    events = run(join(silence(300), burst(3000), silence(3000)))
    assert events == [AmdMachine(1800, "LONGGREETING"), AmdGreetingEnded(5300, 3300)]


def test_a_greeting_and_beep_gives_the_beeps_end() -> None:
    events = run(join(silence(300), burst(3000), silence(500), tone(1000.0, 500), silence(1000)))
    assert events[0] == AmdMachine(1800, "LONGGREETING")
    assert len(events) == 2 and isinstance(events[1], AmdBeep)
    beep = events[1]
    assert abs(beep.end_ms - 4300) <= 20 and abs(beep.start_ms - 3800) <= 20
    assert beep.at_ms == beep.end_ms + 40  # the first hop whose window has no tone
    assert abs(beep.frequency_hz - 1000.0) < 5.0


def test_a_beep_before_any_decision_decides_machine() -> None:
    det = AmdDetector()
    events = det.process(join(silence(500), tone(850.0, 600), silence(3000)))
    assert [e.name for e in events] == ["amd.machine", "amd.beep"]
    assert events[0] == AmdMachine(1140, "BEEP")  # the hop after the tone's end
    assert det.done


def test_silence_is_no_speech() -> None:
    assert run(silence(6000)) == [AmdNoSpeech(2500)]


def test_a_voicemail_phrase_decides_machine() -> None:
    det = AmdDetector()
    assert det.process(join(silence(500), burst(200))) == []
    events = det.transcript("Hi, you've reached Dana", 700, final=False)
    assert events == [AmdMachine(700, "HINT")]
    assert det.phase is Phase.AWAIT_END


def test_a_short_final_transcript_waits_for_the_heuristic() -> None:
    det = AmdDetector()
    det.process(join(silence(500), burst(400), silence(100)))
    assert det.transcript("Hello?", 1000) == []
    assert det.process(silence(1000)) == [AmdHuman(1700, "HUMAN")]


def _unsure() -> tuple[AmdDetector, Int16Array]:
    cfg = AmdConfig(maximum_number_of_words=50, greeting=4000, decision_timeout_ms=8000)
    return AmdDetector(cfg), join(silence(300), *[join(burst(200), silence(600)) for _ in range(8)])


def test_unsure_then_decision_timeout() -> None:
    det, x = _unsure()
    assert det.process(x) == []
    assert det.phase is Phase.UNSURE
    assert det.process(silence(4000)) == [AmdDecisionTimeout(8000)]


def test_unsure_then_a_short_final_transcript_is_human() -> None:
    det, x = _unsure()
    det.process(x)
    assert det.transcript("yes hello", 5200) == [AmdHuman(5200, "SHORTGREETING")]


def test_nothing_after_done() -> None:
    det = AmdDetector()
    det.process(silence(3000))
    assert det.done
    assert det.process(join(tone(1000.0, 500), silence(500))) == []
    assert det.transcript("leave a message", 4000) == []
    assert det.elapsed_ms == 4000


@pytest.mark.parametrize("chunk", [1, 7, 159, 161, 333, 0])
def test_any_chunking_gives_the_same_events(chunk: int) -> None:
    x = join(silence(300), burst(2500), silence(700), tone(440.0, 700), silence(2500))
    whole = run(x)
    assert [e.name for e in whole] == ["amd.machine", "amd.beep"]
    det = AmdDetector()
    got: list[AmdEvent] = []
    rng = np.random.default_rng(chunk)
    i = 0
    while i < len(x):
        n = chunk or int(rng.integers(1, 500))
        got += det.process(x[i : i + n])
        i += n
    assert got + det.finish() == whole


def test_events_as_dicts() -> None:
    assert AmdBeep(4340, 1000.0, 3800, 4300).to_dict() == {
        "event": "amd.beep",
        "at_ms": 4340,
        "frequency_hz": 1000.0,
        "start_ms": 3800,
        "end_ms": 4300,
    }
    assert AmdNoSpeech(2500).to_dict() == {"event": "amd.no_speech", "at_ms": 2500}


def test_config_defaults() -> None:
    c = AmdConfig()
    assert c.threshold_word_count == 9
    assert (c.decision_timeout_ms, c.tone_timeout_ms, c.greeting_completion_timeout_ms) == (
        15000,
        20000,
        2000,
    )
    assert (c.initial_silence, c.greeting, c.after_greeting_silence, c.silence_threshold) == (
        2500,
        1500,
        800,
        256,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_silence": 0},
        {"silence_threshold": -1},
        {"beep_min_hz": 100.0},
        {"beep_min_ms": 50},
        {"threshold_word_count": 0},
        {"tone_timeout_ms": 0},
        {"decision_timeout_ms": 4000},  # shorter than total_analysis_time
        {"greeting_completion_timeout_ms": True},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="amd:"):
        AmdConfig(**kwargs)  # type: ignore[arg-type]


def test_config_from_dict() -> None:
    c = AmdConfig.from_dict({"maximum_number_of_words": 2, "phrases": ["leave a message"]})
    assert c.maximum_number_of_words == 2 and c.phrases == ("leave a message",)
    with pytest.raises(ValueError, match="unknown setting"):
        AmdConfig.from_dict({"thresholdWordCount": 9})
