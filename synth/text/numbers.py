"""Numbers as English words: cardinals, ordinals, digit strings, years, decimals.

Readings follow US phone-agent usage: no "and" inside numbers ("one hundred five"), no hyphens
("thirty four" — espeak reads both the same, and plain words keep the chunker's word counts
honest), "zero" for 0 when digits are read one by one.
"""

from __future__ import annotations

from voxgate.contract.words import ONES, SCALES, TENS

# Irregular ordinal endings; every other word takes "th" ("-y" becomes "-ieth").
ORDINAL_WORDS: dict[str, str] = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
DIGIT_WORDS: dict[str, str] = {str(i): ONES[i] for i in range(10)}
# "the nineties": a decade is its tens word made plural.
DECADE_WORDS: dict[str, str] = {t: t[:-1] + "ies" for t in TENS if t}


def _below_thousand(n: int) -> list[str]:
    words: list[str] = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(TENS[tens])
        if ones:
            words.append(ONES[ones])
    elif rest:
        words.append(ONES[rest])
    return words


def cardinal(n: int) -> str:
    """``1234`` → ``"one thousand two hundred thirty four"``; negatives read "minus"."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n == 0:
        return "zero"
    if n >= 1000 * SCALES[0][0]:
        return digits(str(n))  # past trillions nobody says it as a quantity
    words: list[str] = []
    for scale, name in SCALES:
        group, n = divmod(n, scale)
        if group:
            words += [*_below_thousand(group), name]
    words += _below_thousand(n)
    return " ".join(words)


def ordinal(n: int) -> str:
    """``22`` → ``"twenty second"``, ``103`` → ``"one hundred third"``."""
    words = cardinal(n).split(" ")
    last = words[-1]
    if last in ORDINAL_WORDS:
        words[-1] = ORDINAL_WORDS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def digits(s: str) -> str:
    """Read every digit of ``s`` on its own (``"007"`` → ``"zero zero seven"``); others dropped."""
    return " ".join(DIGIT_WORDS[c] for c in s if c in DIGIT_WORDS)


def parse_int(s: str) -> int:
    """An integer written with optional thousands separators (``"1,234"``)."""
    return int(s.replace(",", ""))


def number(s: str) -> str:
    """A written integer as spoken: cardinal, except that leading zeros are read digit by digit."""
    plain = s.replace(",", "")
    if len(plain) > 1 and plain.startswith("0"):
        return digits(plain)
    return cardinal(int(plain))


def decimal(s: str) -> str:
    """``"3.14"`` → ``"three point one four"``; ``".5"`` → ``"point five"``."""
    whole, _, frac = s.partition(".")
    head = number(whole) + " " if whole else ""
    if not frac:
        return head.strip()
    return head + "point " + digits(frac)


def year(n: int) -> str:
    """Years as said aloud: 1999 "nineteen ninety nine", 2005 "two thousand five",
    2024 "twenty twenty four", 1905 "nineteen oh five", 1900 "nineteen hundred"."""
    if not 1000 <= n <= 9999 or 2000 <= n <= 2009 or n % 1000 == 0:
        return cardinal(n)
    high, low = divmod(n, 100)
    if low == 0:
        return cardinal(high) + " hundred"
    if low < 10:
        return cardinal(high) + " oh " + ONES[low]
    return cardinal(high) + " " + cardinal(low)


def decade(n: int) -> str:
    """``1990`` → ``"nineteen nineties"``, ``2000`` → ``"two thousands"``, ``1900`` →
    ``"nineteen hundreds"``; ``n`` is the first year of the decade."""
    if n % 100 == 0:
        return year(n) + "s"
    head = year(n)
    words = head.split(" ")
    words[-1] = DECADE_WORDS.get(words[-1], words[-1] + "s")
    return " ".join(words)


def decade_short(tens_digit: int) -> str:
    """``'90s`` → ``"nineties"``."""
    return DECADE_WORDS.get(TENS[tens_digit], "") if tens_digit >= 2 else ""
