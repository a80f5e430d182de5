"""Number words."""

from __future__ import annotations

import pytest

from synth.text.numbers import cardinal, decade, decimal, digits, number, ordinal, year


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (105, "one hundred five"),
        (1234, "one thousand two hundred thirty four"),
        (1_000_000, "one million"),
        (2_000_000_001, "two billion one"),
        (-45, "minus forty five"),
    ],
)
def test_cardinal(n: int, words: str) -> None:
    assert cardinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [(1, "first"), (2, "second"), (3, "third"), (5, "fifth"), (8, "eighth"), (9, "ninth"),
     (12, "twelfth"), (20, "twentieth"), (22, "twenty second"), (103, "one hundred third"),
     (1000, "one thousandth")],
)  # fmt: skip
def test_ordinal(n: int, words: str) -> None:
    assert ordinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [(1999, "nineteen ninety nine"), (2005, "two thousand five"), (2024, "twenty twenty four"),
     (1905, "nineteen oh five"), (1900, "nineteen hundred"), (2000, "two thousand"),
     (2010, "twenty ten")],
)  # fmt: skip
def test_year(n: int, words: str) -> None:
    assert year(n) == words


def test_digits_decimals_decades() -> None:
    assert digits("007") == "zero zero seven"
    assert number("007") == "zero zero seven"
    assert number("1,234") == "one thousand two hundred thirty four"
    assert decimal("3.14") == "three point one four"
    assert decimal(".5") == "point five"
    assert decade(1990) == "nineteen nineties"
    assert decade(2000) == "two thousands"
