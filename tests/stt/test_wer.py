"""gateway.stt.wer: the word error rate's two parts."""

from __future__ import annotations

from gateway.stt.wer import edit_distance, words


def test_words_drop_case_and_punctuation_but_keep_apostrophes() -> None:
    expected = ["sorry", "i", "didn't", "catch", "that"]
    assert words("Sorry, I DIDN'T catch that... 48271!") == expected
    assert words("") == []


def test_edit_distance_counts_substitutions_insertions_and_deletions() -> None:
    ref = words("please transfer me to billing")
    assert edit_distance(ref, ref) == 0
    assert edit_distance(ref, words("please transfer me to the billing")) == 1  # insertion
    assert edit_distance(ref, words("please transfer to billing")) == 1  # deletion
    assert edit_distance(ref, words("please transfer me to building")) == 1  # substitution
    assert edit_distance(ref, []) == len(ref) and edit_distance([], ref) == len(ref)
