"""jambonz's word-count and phrase rule on transcripts."""

from __future__ import annotations

import pytest

from gateway.amd.words import WordRule, WordsConfig, WordVerdict, words_of


def test_words_of_keeps_contractions_and_digits() -> None:
    assert words_of("Hi, you’ve reached 555-1234!") == ["hi", "you've", "reached", "555", "1234"]


def test_nine_words_are_a_machine() -> None:
    rule = WordRule()
    d = rule.transcript("one two three four five six seven eight nine", 3200)
    assert d is not None
    assert (d.verdict, d.at_ms, d.words) == (WordVerdict.MACHINE_WORDCOUNT, 3200, 9)


def test_eight_words_final_are_a_person() -> None:
    d = WordRule().transcript("one two three four five six seven eight", 2000)
    assert d is not None and d.verdict is WordVerdict.HUMAN


def test_a_phrase_is_a_machine_whatever_the_count() -> None:
    d = WordRule().transcript("Please leave a message", 1800, final=False)
    assert d is not None
    assert (d.verdict, d.phrase) == (WordVerdict.MACHINE_HINT, "leave a message")


def test_phrases_match_whole_words_only() -> None:
    # "mailboxes" is not "mailbox"; "unavailable" is in the list, "available" alone is not
    assert WordRule().transcript("mailboxes", 900, final=False) is None
    assert WordRule().transcript("is it available", 900, final=False) is None


def test_partials_do_not_decide_a_person() -> None:
    rule = WordRule()
    assert rule.transcript("hello", 700, final=False) is None
    d = rule.transcript("hello who is this", 1500, final=True)
    assert d is not None and (d.verdict, d.words) == (WordVerdict.HUMAN, 4)


def test_partials_replace_each_other_and_empty_finals_do_not_decide() -> None:
    rule = WordRule(WordsConfig(threshold_word_count=7))
    assert rule.transcript("", 500, final=True) is None  # nothing heard: no decision
    assert rule.transcript("hi it's", 800, final=False) is None
    # the second partial covers the first: 6 words, not 8
    assert rule.transcript("hi it's alex sorry I missed", 2600, final=False) is None
    d = rule.transcript("hi it's alex sorry I missed your", 2900, final=False)
    assert d is not None and (d.verdict, d.words) == (WordVerdict.MACHINE_WORDCOUNT, 7)


def test_decides_once() -> None:
    rule = WordRule()
    assert rule.transcript("leave a message", 1000) is not None
    assert rule.transcript("leave a message", 2000) is None


def test_custom_phrases() -> None:
    rule = WordRule(WordsConfig(phrases=("nicht erreichbar",)))
    d = rule.transcript("Ich bin nicht erreichbar", 1500, final=False)
    assert d is not None and d.phrase == "nicht erreichbar"


@pytest.mark.parametrize("kwargs", [{"threshold_word_count": 0}, {"phrases": ("...",)}])
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="amd:"):
        WordsConfig(**kwargs)  # type: ignore[arg-type]
