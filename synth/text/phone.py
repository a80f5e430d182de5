"""Phone numbers and identifiers read digit by digit.

Phone numbers are read in their written groups with a comma between groups, so espeak pauses
where a person would ("five five five, one two three, four five six seven"). Zero is always
"zero" (not "oh"): callers copy these down and "oh" is easily heard as the letter O.
"""

from __future__ import annotations

import re

from synth.text.numbers import digits

# Groups said as a word rather than digit by digit ("one, eight hundred, ...").
GROUP_WORDS: dict[str, str] = {"800": "eight hundred"}

# Service numbers always said digit by digit: nobody calls "nine hundred eleven".
SERVICE_NUMBERS: tuple[str, ...] = ("911", "988", "411", "311", "211", "511", "711", "811")

# Words after which a number is an identifier, read digit by digit ("account 1234",
# "card ending in 0042", "PIN is 1234", "confirmation number: 88121"). Longest first in the regex.
ID_KEYWORDS: tuple[str, ...] = (
    "account", "acct", "PIN", "pin", "passcode", "code", "number", "reference", "ref",
    "confirmation", "ending in", "ends in", "ID", "id", "member", "policy", "order", "ticket",
    "case", "claim", "invoice", "tracking", "routing", "extension", "ext", "zip", "zip code",
    "postal code", "serial", "SSN", "last four", "last four digits", "last 4", "last 4 digits",
    "badge", "employee", "customer", "booking", "reservation", "flight", "room", "suite",
    "apartment", "unit", "box", "voucher", "coupon", "promo", "OTP", "verification", "digits",
)  # fmt: skip

_GROUP = re.compile(r"\d+")


def say_groups(text: str, area_code_words: bool = False) -> str:
    """Each run of digits read digit by digit, runs separated by a comma pause. With
    ``area_code_words`` the first three-digit group may be said as a word ("eight hundred")."""
    spoken: list[str] = []
    for group in _GROUP.findall(text):
        if area_code_words and len(group) == 3:
            spoken.append(GROUP_WORDS.get(group, digits(group)))
            area_code_words = False
        else:
            spoken.append(digits(group))
    return ", ".join(spoken)


def say_phone(text: str) -> str:
    """``"+1 (555) 123-4567"`` → ``"plus one, five five five, one two three, four five six
    seven"``; ``"1-800-555-0199"`` → ``"one, eight hundred, five five five, zero one nine nine"``.
    """
    spoken = say_groups(text, area_code_words=sum(c.isdigit() for c in text) >= 10)
    return "plus " + spoken if text.lstrip().startswith("+") else spoken
