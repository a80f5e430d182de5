"""Calendar and clock words: months, dates and times of day."""

from __future__ import annotations

from synth.text.acronyms import spell
from synth.text.numbers import cardinal, ordinal, year
from voxgate.contract.words import ONES

MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
# Written month → number; abbreviations count only next to a day number ("Mar 3"), where
# they cannot be the words "mar", "jan" or "may".
MONTH_NUMBERS: dict[str, int] = {
    **{m: i for i, m in enumerate(MONTHS, 1)},
    **{m[:3]: i for i, m in enumerate(MONTHS, 1)},
    "Sept": 9,
}


def say_date(month: int, day: int | None, yr: int | None, day_first: bool = False) -> str:
    """``say_date(3, 3, 2024)`` → ``"March third, twenty twenty four"``; with ``day_first``,
    ``"the third of March, twenty twenty four"``."""
    name = MONTHS[month - 1]
    if day is None:
        text = name
    elif day_first:
        text = f"the {ordinal(day)} of {name}"
    else:
        text = f"{name} {ordinal(day)}"
    if yr is None:
        return text
    return f"{text}, {year(yr)}" if day is not None else f"{text} {year(yr)}"


def valid_date(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


def full_year(two_or_four: str) -> int:
    """Two-digit years pivot at 70: "24" → 2024, "99" → 1999."""
    n = int(two_or_four)
    if len(two_or_four) == 2:
        return 2000 + n if n < 70 else 1900 + n
    return n


def say_minutes(minute: int) -> str:
    """Minutes after the hour: 5 → "oh five" (as clocks are read), 45 → "forty five"."""
    return f"oh {ONES[minute]}" if minute < 10 else cardinal(minute)


def say_time(hour: int, minute: int, meridiem: str | None) -> str:
    """``say_time(3, 45, "pm")`` → ``"three forty five P M"``; a 24-hour clock time without
    a meridiem is turned into the 12-hour reading a US caller expects ("14:30" → "two thirty
    P M"); a 12-hour time without one on the hour reads "o'clock"."""
    if meridiem is None and (hour == 0 or hour > 12):
        meridiem = "am" if hour < 12 else "pm"
        hour = hour % 12 or 12
    head = cardinal(hour)
    if minute:
        head += " " + say_minutes(minute)
    elif meridiem is None:
        head += " o'clock"
    if meridiem is not None:
        head += " " + spell(meridiem[0] + "m")
    return head
