"""The chunker: its cutting rules, and streamed feeding equal to the one-shot twin."""

from __future__ import annotations

import random

import pytest

from synth.text.normalize import normalize
from voxgate.contract.chunker import Chunker, chunk_text

# --- rules -----------------------------------------------------------------------------------


def test_first_chunk_ends_at_first_clause_boundary() -> None:
    assert chunk_text("Sure, let me check that. One moment please.") == [
        "Sure,",
        "let me check that.",
        "One moment please.",
    ]


@pytest.mark.parametrize("mark", [",", ":", ";", " —", " -", " --", "—"])
def test_first_chunk_clause_marks(mark: str) -> None:
    chunks = chunk_text(f"Okay{mark} here it is. Done.")
    assert chunks[0] == f"Okay{mark}".strip()
    assert chunks[1:] == ["here it is.", "Done."]


def test_first_chunk_ends_after_max_words_without_a_boundary() -> None:
    text = "I can certainly help you with your account today and more. Then we go."
    assert chunk_text(text) == [
        "I can certainly help you with your account",
        "today and more.",
        "Then we go.",
    ]
    assert chunk_text(text, first_max_words=3)[0] == "I can certainly"


def test_first_chunk_may_be_a_whole_short_sentence() -> None:
    assert chunk_text("Hi. How are you, today?") == ["Hi.", "How are you, today?"]


def test_later_chunks_end_only_at_sentence_ends() -> None:
    text = "Hello. First, second, third. Fourth; fifth! Sixth? Seventh"
    assert chunk_text(text) == [
        "Hello.",
        "First, second, third.",
        "Fourth; fifth!",
        "Sixth?",
        "Seventh",
    ]


def test_newline_is_a_boundary() -> None:
    assert chunk_text("Hello\nline two\n\nline three") == ["Hello", "line two", "line three"]


@pytest.mark.parametrize(
    "text",
    [
        "Yes. Pi is about 3.14 and e is 2.72 today.",
        "Yes. Dr. Smith and Mr. Jones met St. Peter.",
        "Yes. Fruit, e.g. apples, i.e. the red ones.",
        "Yes. Bring fruit e.g., apples and pears.",
        "Yes. Visit example.com or call at 3:45 today.",
        "Yes. It costs 1,234 dollars for No. 5 here.",
        "Yes. Acme Inc. is hiring.",
        "Yes. John J. Smith called.",
        "Yes. It is 3–5 days.",
    ],
)
def test_no_cut_at_decimals_abbreviations_or_addresses(text: str) -> None:
    assert chunk_text(text) == ["Yes.", text.removeprefix("Yes. ")]


def test_ambiguous_abbreviation_ends_a_sentence_before_a_capital() -> None:
    assert chunk_text("Hi. We work with Acme Inc. They are great.") == [
        "Hi.",
        "We work with Acme Inc.",
        "They are great.",
    ]


def test_spelled_letters_then_period_end_a_sentence() -> None:
    assert chunk_text(normalize("Hi. Call at 9 a.m. Thanks!")) == [
        "Hi.",
        "Call at nine Eh M.",
        "Thanks!",
    ]


def test_closing_quotes_and_runs_stay_with_their_sentence() -> None:
    assert chunk_text('Hi. He said "no." Then left?! Hmm... ok') == [
        "Hi.",
        'He said "no."',
        "Then left?!",
        "Hmm...",
        "ok",
    ]


def test_long_sentence_cut_at_last_clause_boundary_before_limit() -> None:
    text = "Hi. " + " ".join(["a"] * 6) + ", " + " ".join(["b"] * 6) + ", " + " ".join(["c"] * 6)
    assert chunk_text(text, max_words=14) == [
        "Hi.",
        "a a a a a a, b b b b b b,",
        "c c c c c c",
    ]


def test_long_sentence_without_clauses_cut_at_limit() -> None:
    text = "Hi. " + " ".join(f"w{i}" for i in range(25)) + "."
    chunks = chunk_text(text, max_words=10)
    assert chunks == [
        "Hi.",
        " ".join(f"w{i}" for i in range(10)),
        " ".join(f"w{i}" for i in range(10, 20)),
        " ".join(f"w{i}" for i in range(20, 25)) + ".",
    ]


def test_unspeakable_pieces_are_dropped() -> None:
    assert chunk_text("... — Hello.") == ["Hello."]
    assert chunk_text("   ") == []
    assert chunk_text("") == []


def test_feed_waits_until_a_cut_is_certain() -> None:
    c = Chunker()
    assert c.feed("Pi is 3.") == []  # could be "3.5"
    assert c.feed("14, roughly") == ["Pi is 3.14,"]
    assert c.feed(".") == []  # a period, but is it "roughly.5"?
    assert c.feed(" Then") == ["roughly."]
    assert c.feed(" more") == []
    assert c.feed(" Dr.") == []
    assert c.feed(" Who") == []  # "Dr." never ends a sentence
    assert c.flush() == ["Then more Dr. Who"]


def test_ambiguous_abbreviation_waits_for_the_next_word() -> None:
    c = Chunker()
    assert c.feed("Hi. We use Acme Inc. ") == ["Hi."]
    assert c.feed("  ") == []
    assert c.feed("T") == ["We use Acme Inc."]


def test_flush_resets_for_the_next_utterance() -> None:
    c = Chunker()
    assert c.feed("One, two three. Four") == ["One,", "two three."]
    assert c.flush() == ["Four"]
    assert c.feed("Again, yes. ") == ["Again,", "yes."]


def test_bad_limits_rejected() -> None:
    with pytest.raises(ValueError):
        Chunker(first_max_words=0)
    with pytest.raises(ValueError):
        Chunker(first_max_words=10, max_words=5)


# --- streaming equals one-shot ---------------------------------------------------------------

TEXTS: list[str] = [
    "Sure, let me check. One moment please.",
    "I can certainly help you with your account today and more. Then we go.",
    "Dr. Smith will see you at 3.5 p.m. today. Thanks! Bye?",
    'Hello there. How are you? "Great." Okay...  fine',
    "It is nine P M. Thanks J. Smith. Acme Inc. is great. Acme Inc. Then.",
    "Wait - what -- no—yes, 3–5 items, 1,234 of them at 3:45.",
    "Fruit, e.g., apples; i.e. the red ones. No. 5 is next. No. I won't.",
    "Line one\nline two\n\n- bullet, three\n",
    "Visit https://www.example.com/help or write to john.doe@example.com. Thanks.",
    "   Leading spaces, and trailing.   ",
    " ".join(f"word{i}" for i in range(150)) + ".",
    "Hi. " + ", ".join(" ".join(f"x{i}{j}" for j in range(7)) for i in range(20)) + ".",
    normalize(
        "Your balance is $1,234.56 as of 03/03/2024. Call Dr. Smith at (555) 123-4567 before "
        "3:45 PM, or visit https://www.example.com/help for the FAQ. Your account 12345678 has "
        "an APR of 4.5%. Meet at 12 Main St. Then turn left!"
    ),
]


def _random_text(rng: random.Random) -> str:
    vocab = [
        "the", "account", "Dr.", "St.", "Inc.", "e.g.", "3.5", "1,234", "3:45", "No.", "5",
        "Hello", "okay", "J.", "Smith", "—", "-", "--", "'quoted'", '"hi."', "...", "?!",
        "a.m.", "U.S.", "P", "M.", "Eh", "\n", "well-known", "3–5",
    ]  # fmt: skip
    ends = ["", "", "", ",", ".", "!", "?", ";", ":", " -"]
    return " ".join(rng.choice(vocab) + rng.choice(ends) for _ in range(rng.randint(0, 90)))


def _feed_in_pieces(text: str, cuts: list[int], first: int = 8, limit: int = 60) -> list[str]:
    c = Chunker(first, limit)
    chunks: list[str] = []
    previous = 0
    for cut in [*sorted(cuts), len(text)]:
        chunks += c.feed(text[previous:cut])
        previous = cut
    return chunks + c.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_char_by_char_equals_one_shot(text: str) -> None:
    assert _feed_in_pieces(text, list(range(len(text)))) == chunk_text(text)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_one_shot(text: str) -> None:
    # LLM tokens usually carry their leading space.
    starts = [i for i in range(1, len(text)) if text[i] == " " and text[i - 1] != " "]
    assert _feed_in_pieces(text, starts) == chunk_text(text)


def test_random_splits_equal_one_shot() -> None:
    rng = random.Random(8)
    texts = TEXTS + [_random_text(rng) for _ in range(300)]
    for text in texts:
        first, limit = rng.choice([(8, 60), (3, 10), (1, 5), (8, 8)])
        expected = chunk_text(text, first, limit)
        for _ in range(4):
            cuts = rng.sample(range(len(text) + 1), k=min(len(text), rng.randint(0, 25)))
            assert _feed_in_pieces(text, cuts, first, limit) == expected, (text, cuts)


def test_chunks_keep_every_word_and_respect_limits() -> None:
    rng = random.Random(9)
    for _ in range(300):
        text = _random_text(rng)
        first, limit = rng.choice([(8, 60), (3, 10), (1, 5)])
        chunks = chunk_text(text, first, limit)
        assert all(len(chunk.split()) <= limit for chunk in chunks)
        if chunks:
            assert len(chunks[0].split()) <= first
        spoken = [w for w in text.split() if any(c.isalnum() for c in w)]
        kept = [w for chunk in chunks for w in chunk.split() if any(c.isalnum() for c in w)]
        assert kept == spoken


def test_first_chunk_does_not_cut_inside_a_spelled_number() -> None:
    text = "Your balance is one thousand two hundred thirty four dollars and fifty cents."
    chunks = chunk_text(text)
    assert chunks[0] == "Your balance is one thousand two hundred thirty four"
    # Feeding word by word gives the same cut (it waits to see the next word).
    c = Chunker()
    got: list[str] = []
    for word in text.split(" "):
        got += c.feed(word + " ")
    assert got + c.flush() == chunks


def test_number_grace_is_bounded() -> None:
    text = " ".join(["one"] * 40) + "."
    first = chunk_text(text)[0]
    assert len(first.split()) == 8 + 8
