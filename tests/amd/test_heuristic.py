"""The app_amd state machine on synthetic voiced bursts and silence: each verdict and cause,
at the frame Asterisk's rules give."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.amd.heuristic import AsteriskHeuristic, Cause, HeuristicConfig, Status, Verdict
from tests.amd.signals import Int16Array, burst, frames, join, noise, silence


def run(x: Int16Array, config: HeuristicConfig | None = None) -> Verdict | None:
    h = AsteriskHeuristic(config)
    for f in frames(x):
        v = h.process(f)
        if v is not None:
            return v
    return None


def test_defaults_are_asterisks() -> None:
    c = HeuristicConfig()
    assert (c.initial_silence, c.greeting, c.after_greeting_silence) == (2500, 1500, 800)
    assert (c.total_analysis_time, c.min_word_length, c.between_words_silence) == (5000, 100, 50)
    assert (c.maximum_number_of_words, c.silence_threshold, c.maximum_word_length) == (2, 256, 5000)


def test_silence_is_initialsilence_machine() -> None:
    v = run(silence(4000))
    assert v is not None
    assert (v.status, v.cause, v.at_ms) == (Status.MACHINE, Cause.INITIALSILENCE, 2500)


def test_noise_under_the_threshold_is_silence() -> None:
    v = run(noise(silence(4000), 150.0))  # mean |x| ≈ 120 < 256
    assert v is not None and v.cause is Cause.INITIALSILENCE


def test_short_answer_then_silence_is_human() -> None:
    v = run(join(silence(500), burst(400), silence(2000)))
    assert v is not None
    # after_greeting_silence counts from the first silent frame after the word
    assert (v.status, v.cause, v.at_ms) == (Status.HUMAN, Cause.HUMAN, 500 + 400 + 800)
    assert v.words == 1


def test_second_word_is_maxwords_at_two() -> None:
    v = run(join(silence(500), burst(200), silence(200), burst(200), silence(2000)))
    assert v is not None
    # the second word counts once it is min_word_length long: 500 + 200 + 200 + 100
    assert (v.status, v.cause, v.at_ms, v.words) == (Status.MACHINE, Cause.MAXWORDS, 1000, 2)


def test_gaps_shorter_than_between_words_silence_do_not_split_words() -> None:
    x = join(silence(500), burst(200), silence(40), burst(200), silence(2000))
    v = run(x)
    assert v is not None and (v.status, v.words) == (Status.HUMAN, 1)


def test_continuous_voice_is_longgreeting() -> None:
    v = run(join(silence(300), burst(3000)))
    assert v is not None
    assert (v.status, v.cause, v.at_ms) == (Status.MACHINE, Cause.LONGGREETING, 300 + 1500)


def test_maximum_word_length() -> None:
    cfg = HeuristicConfig(greeting=4000, maximum_word_length=1000)
    v = run(join(silence(300), burst(3000)), cfg)
    assert v is not None
    assert (v.status, v.cause, v.at_ms) == (Status.MACHINE, Cause.MAXWORDLENGTH, 1300)


def test_undecided_until_total_analysis_time_is_notsure() -> None:
    cfg = HeuristicConfig(maximum_number_of_words=50, greeting=4000)
    x = join(silence(300), *[join(burst(200), silence(600)) for _ in range(8)])
    v = run(x, cfg)
    assert v is not None
    assert (v.status, v.cause, v.at_ms) == (Status.NOTSURE, Cause.TOOLONG, 5000)


def test_decides_once() -> None:
    h = AsteriskHeuristic()
    verdicts = [h.process(f) for f in frames(silence(6000))]
    assert sum(v is not None for v in verdicts) == 1


def test_frames_must_be_20_ms() -> None:
    with pytest.raises(ValueError, match="160"):
        AsteriskHeuristic().process(np.zeros(80, np.int16))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_silence": 0},
        {"greeting": -1},
        {"maximum_number_of_words": 0},
        {"silence_threshold": 40000},
        {"min_word_length": 6000},
        {"total_analysis_time": 1.5},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="amd:"):
        HeuristicConfig(**kwargs)  # type: ignore[arg-type]
