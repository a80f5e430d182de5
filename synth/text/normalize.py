"""Text normalization: written English → the spoken form Piper's espeak frontend reads right.

``normalize`` runs an ordered list of rewrite steps. Order matters and follows specificity:
addresses and phone numbers first (they contain dots, dashes and digits every later rule would
take apart), then money, dates and times, then abbreviations and identifiers, then units,
ordinals and ranges, and last a fallback that reads any digit still standing. The tables the
steps read (units, currencies, abbreviations, acronyms, month names) live in their own modules.

The output keeps sentence punctuation (. , ? ! ; : and the em dash) for the chunker and for
espeak's prosody, contains no digits, and is a fixed point: ``normalize(normalize(x)) ==
normalize(x)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from synth.text import abbreviations as abbr
from synth.text import acronyms, currency, dates, phone, symbols, units, web
from synth.text.numbers import (
    cardinal,
    decade,
    decade_short,
    decimal,
    digits,
    number,
    ordinal,
    parse_int,
    year,
)

Replacer = Callable[[re.Match[str]], str]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite step: every match of ``pattern`` is replaced by ``replace(match)``."""

    name: str
    pattern: re.Pattern[str]
    replace: Replacer

    def __call__(self, text: str) -> str:
        return self.pattern.sub(self.replace, text)


def _alternation(words: list[str] | tuple[str, ...] | set[str]) -> str:
    """A regex alternation, longest first so "lbs" wins over "lb"."""
    return "|".join(re.escape(w) for w in sorted(words, key=lambda w: (-len(w), w)))


# --- shared pieces ---------------------------------------------------------------------------

INT = r"\d{1,3}(?:,\d{3})+(?!\d)|\d+"  # 1,234,567 or 1234567
VALUE = rf"(?:{INT})(?:\.\d+)?|\.\d+"  # 12 / 1,234.5 / .5
_SENTENCE_END_AFTER = re.compile(r"\s*$|\s+[\"'(]?[A-Z]")


def _ends_sentence(m: re.Match[str]) -> bool:
    """Whether the period a match swallowed was probably also its sentence's period (end of
    text, or a capitalised word follows)."""
    return _SENTENCE_END_AFTER.match(m.string, m.end()) is not None


def _period(m: re.Match[str]) -> str:
    return "." if m.group(0).endswith(".") and _ends_sentence(m) else ""


def say_value(s: str) -> str:
    """A written number (with separators, decimals, sign, leading zeros) as words."""
    s = s.strip()
    if s.startswith(("-", "−")):
        return "minus " + say_value(s[1:])
    if "." in s:
        return decimal(s.replace(",", ""))
    return number(s)


def say_quantity(s: str) -> tuple[str, bool]:
    """A value or a range "3-5" as words, and whether it takes a singular unit (exactly 1)."""
    parts = re.split(r"\s*[-–]\s*(?=[\d.])", s.strip())
    if len(parts) == 2 and parts[0]:
        return f"{say_value(parts[0])} to {say_value(parts[1])}", False
    return say_value(s), s.strip() in ("1", "-1")


# --- 1. clean-up of typography ---------------------------------------------------------------

_TYPOGRAPHY: dict[str, str] = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u2026": "...",
    "\u2212": "-",
    "\r\n": "\n",
    "\r": "\n",
    "\t": " ",
}
_TYPOGRAPHY_RE = re.compile(_alternation(list(_TYPOGRAPHY)))


def clean(text: str) -> str:
    return _TYPOGRAPHY_RE.sub(lambda m: _TYPOGRAPHY[m.group(0)], text)


# --- 2. e-mail and web addresses -------------------------------------------------------------

_TLDS = "com|org|net|gov|edu|mil|io|co|us|uk|ca|info|biz|ai|app|dev|me|ly|tv|health|bank"
_TRAILING = re.compile(r"[.,;:!?)\]'\"]+$")


def _url(m: re.Match[str]) -> str:
    found = m.group(0)
    tail = _TRAILING.search(found)
    core = found[: tail.start()] if tail else found
    return web.say_url(core) + (tail.group(0) if tail else "")


EMAIL = Rule(
    "email",
    re.compile(
        r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])"
    ),
    lambda m: web.say_address(m.group(0)),
)
URL = Rule(
    "url",
    re.compile(
        r"\b[A-Za-z][A-Za-z+.-]*://[^\s<>\"]+"
        r"|\bwww\.[A-Za-z0-9][^\s<>\"]*"
        rf"|(?<![\w@.-])[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?i:{_TLDS})\b(?!\.\w)(?:/[^\s<>\"]*)?"
    ),
    _url,
)

# --- 3. fixed written forms: "w/", "N/A", "24/7", "etc.", "Inc.", "e.g." ----------------------


def _plain(m: re.Match[str]) -> str:
    return abbr.PLAIN[m.group(0)] + _period(m)


def _introducer(m: re.Match[str]) -> str:
    spoken = abbr.INTRODUCERS[m.group(1).lower()]
    return (spoken[0].upper() + spoken[1:] if m.group(1)[0].isupper() else spoken) + ","


PLAIN_ABBREVIATIONS = Rule(
    "plain abbreviations",
    re.compile(rf"(?<![\w./])(?:{_alternation(list(abbr.PLAIN))})(?!\w|(?<=/)\S)"),
    _plain,
)
INTRODUCERS = Rule(
    "e.g./i.e.",
    re.compile(rf"(?<![\w.])((?i:{_alternation(list(abbr.INTRODUCERS))}))(?:\s*,)?"),
    _introducer,
)
KEYPAD_CODE = Rule(
    "*67",
    re.compile(r"(?<![\w*])\*(\d{1,4})(?![\w.,]\d|\w)"),
    lambda m: "star " + digits(m.group(1)),
)
NUMBER_SIGN = Rule(
    "No. 5 / #5",
    re.compile(r"(?<![\w.])(?:(Nos?|nos?)\.|#)\s?(?=\d)"),
    lambda m: "numbers " if (m.group(1) or "").lower() == "nos" else "number ",
)

# --- 4. phone numbers and digit groups -------------------------------------------------------

_EXTENSION = r"(?:\s*,?\s*(?:ext\.?|x|extension)\s?(\d{1,6}))?"


def _nanp(m: re.Match[str]) -> str:
    text = m.group(1)
    spoken = phone.say_phone(text)
    if m.group(2):
        spoken += ", extension " + digits(m.group(2))
    return spoken


PHONE_NANP = Rule(
    "North American phone number",
    re.compile(
        r"(?<![\w+])((?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4})(?![\w-])"
        + _EXTENSION,
        re.IGNORECASE,
    ),
    _nanp,
)
PHONE_INTERNATIONAL = Rule(
    "international phone number",
    re.compile(r"(?<![\w+])(\+\d{1,3}(?:[\s.-]\(?\d{1,4}\)?){2,5})(?![\w-])" + _EXTENSION),
    _nanp,
)
PHONE_LOCAL = Rule(
    "seven-digit phone number",
    re.compile(r"(?<![\w.,-])(\d{3}-\d{4})(?![\w-])" + _EXTENSION),
    _nanp,
)
VANITY_NUMBER = Rule(
    "1-800-FLOWERS",
    re.compile(r"(?<![\w+-])(?:\+?(1)[\s.-])?\(?(8\d\d)\)?[\s.-]([A-Z]{4,}(?:-[A-Z]+)?)\b"),
    lambda m: ", ".join(
        p for p in (m.group(1) and "one", phone.say_groups(m.group(2), True), m.group(3)) if p
    ),
)
SERVICE_NUMBER = Rule(
    "911",
    re.compile(rf"(?<![\w.,$-])({_alternation(phone.SERVICE_NUMBERS)})(?![\w%°]|[.,]\d)"),
    lambda m: digits(m.group(1)),
)
DIGIT_GROUPS = Rule(
    "card numbers and SSNs",
    re.compile(r"(?<![\w-])(?:\d{4}(?:[ -]\d{4}){2,3}|\d{3}-\d{2}-\d{4})(?![\w-])"),
    lambda m: phone.say_groups(m.group(0)),
)

# --- 5. money --------------------------------------------------------------------------------

_CURRENCY_SYMBOL = _alternation(list(currency.SYMBOLS))
_MONEY = rf"({INT})(?:\.(\d+))?"
_SCALE = r"(?:\s(thousand|million|billion|trillion)|(k|K|M|MM|mm|m|b|B|bn))(?![\w])"


def _money_parts(whole: str, frac: str | None) -> tuple[int, int | None] | None:
    """Whole and cents, or None when the fraction is not cents (``$0.015``)."""
    if frac is None:
        return parse_int(whole), None
    if len(frac) > 2:
        return None
    return parse_int(whole), int(frac.ljust(2, "0"))


def _say_money(cur: currency.Currency, whole: str, frac: str | None) -> str:
    parts = _money_parts(whole, frac)
    if parts is None:
        return f"{decimal(whole.replace(',', '') + '.' + (frac or ''))} {cur.majors}"
    return cur.say(*parts)


def _money(m: re.Match[str]) -> str:
    sign, symbol, whole, frac, whole2, frac2, scale_word, scale_suffix = m.groups()
    cur = currency.SYMBOLS[symbol]
    scale = scale_word or (currency.SCALE_WORDS[scale_suffix] if scale_suffix else None)
    minus = "minus " if sign else ""
    if scale:
        first = decimal(whole.replace(",", "") + (f".{frac}" if frac else ""))
        if whole2:
            first += " to " + decimal(whole2.replace(",", "") + (f".{frac2}" if frac2 else ""))
        return f"{minus}{first} {scale} {cur.majors}"
    if whole2:
        if not frac and not frac2:  # "$5-10": "five to ten dollars", the currency said once
            return (
                f"{minus}{cardinal(parse_int(whole))} to {cardinal(parse_int(whole2))} {cur.majors}"
            )
        return f"{minus}{_say_money(cur, whole, frac)} to {_say_money(cur, whole2, frac2)}"
    return minus + _say_money(cur, whole, frac)


MONEY = Rule(
    "money",
    re.compile(
        rf"(?<![\w.])(-)?({_CURRENCY_SYMBOL})\s?{_MONEY}"
        rf"(?:\s?[-–]\s?(?:{_CURRENCY_SYMBOL})?\s?{_MONEY})?(?:{_SCALE})?"
    ),
    _money,
)
_CODES = _alternation(list(currency.CODES))
MONEY_CODE = Rule(
    "amount with currency code",
    re.compile(rf"(?<![\w.])(?:{_MONEY}\s?({_CODES})|({_CODES})\s?{_MONEY})\b"),
    lambda m: _say_money(
        currency.CODES[m.group(3) or m.group(4)], m.group(1) or m.group(5), m.group(2) or m.group(6)
    ),
)
# "$20/mo", "$5/kg": single-letter denominators are left out, "and/or" reads "or" instead.
_PER_WORDS = [u for u in units.PER_UNITS if len(u) > 1]
PER = Rule(
    "per month",
    re.compile(rf"(?<=[A-Za-z])\s?/\s?({_alternation(_PER_WORDS)})(?![\w/])"),
    lambda m: " per " + units.PER_UNITS[m.group(1)],
)

# --- 6. dates --------------------------------------------------------------------------------

_MONTH = _alternation(list(dates.MONTH_NUMBERS))
_FULL_MONTH = _alternation(list(dates.MONTHS))
_WEEKDAYS: dict[str, str] = {
    "Mon": "Monday", "Tue": "Tuesday", "Tues": "Tuesday", "Wed": "Wednesday",
    "Thu": "Thursday", "Thur": "Thursday", "Thurs": "Thursday", "Fri": "Friday",
    "Sat": "Saturday", "Sun": "Sunday",
}  # fmt: skip


def _date_or_keep(
    m: re.Match[str], month: int, day: int | None, yr: int | None, day_first: bool = False
) -> str:
    if day is not None and not dates.valid_date(month, day):
        return m.group(0)
    return dates.say_date(month, day, yr, day_first)


def _iso_date(m: re.Match[str]) -> str:
    spoken = _date_or_keep(m, int(m.group(2)), int(m.group(3)), int(m.group(1)))
    if m.group(4) is None or spoken == m.group(0):
        return spoken
    hour, minute = int(m.group(4)), int(m.group(5))
    if not _valid_clock(hour, minute, False):
        return m.group(0)
    # A timestamp: the zone is dropped; callers are told times in their own zone.
    return f"{spoken} at {dates.say_time(hour, minute, None)}"


def _numeric_date(m: re.Match[str]) -> str:
    first, sep, second, yr = int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
    if len(yr) == 2 and sep != "/":  # "1.2.24", "3-5-10": versions and codes, not dates
        return m.group(0)
    # "/" and "-" are US month-first, "." is day-first; an impossible month means the other.
    month, day = (second, first) if sep == "." else (first, second)
    if month > 12 >= day:
        month, day = day, month
    return _date_or_keep(m, month, day, dates.full_year(yr))


# Written fractions that are not dates.
FRACTIONS: dict[str, str] = {
    "1/2": "one half", "1/3": "one third", "2/3": "two thirds", "1/4": "one quarter",
    "3/4": "three quarters", "1/8": "one eighth",
}  # fmt: skip


def _month_day(m: re.Match[str]) -> str:
    if m.group(0) in FRACTIONS:
        return FRACTIONS[m.group(0)]
    month, day = int(m.group(1)), int(m.group(2))
    if dates.valid_date(month, day):
        return dates.say_date(month, day, None)
    return f"{number(m.group(1))} {number(m.group(2))}"  # "50/50", "80/20"


def _named_date(m: re.Match[str]) -> str:
    yr = int(m.group(3)) if m.group(3) else None
    return _date_or_keep(m, dates.MONTH_NUMBERS[m.group(1)], int(m.group(2)), yr)


def _day_first_date(m: re.Match[str]) -> str:
    yr = int(m.group(4)) if m.group(4) else None
    spoken = _date_or_keep(m, dates.MONTH_NUMBERS[m.group(3)], int(m.group(2)), yr, True)
    # "the 3rd of March" already has its article.
    return spoken.removeprefix("the ") if m.group(1) and spoken != m.group(0) else spoken


_WEEKDAY = _alternation(list(_WEEKDAYS))
WEEKDAY_RANGE = Rule(
    "Mon-Fri",
    re.compile(rf"\b({_WEEKDAY})\.?\s?[-–]\s?({_WEEKDAY})\b(\.?)"),
    lambda m: f"{_WEEKDAYS[m.group(1)]} to {_WEEKDAYS[m.group(2)]}" + _period(m),
)
# Alone, "Sun." or "Wed." may be a word; before a date it is a weekday.
WEEKDAY = Rule(
    "weekday abbreviation",
    re.compile(rf"\b({_WEEKDAY})\.?(?=,?\s+(?:{_MONTH}|\d))"),
    lambda m: _WEEKDAYS[m.group(1)],
)
ISO_DATE = Rule(
    "ISO date",
    re.compile(
        r"(?<![\w-])(\d{4})-(\d{2})-(\d{2})"
        r"(?:[T ](\d{2}):(\d{2})(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
    ),
    _iso_date,
)
NUMERIC_DATE = Rule(
    "numeric date",
    re.compile(r"(?<![\w/.-])(\d{1,2})([/.-])(\d{1,2})\2(\d{4}|\d{2})(?![\w/-]|\.\d)"),
    _numeric_date,
)
MONTH_DAY_NUMERIC = Rule(
    "month/day or fraction",
    re.compile(r"(?<![\w/.-])(\d{1,2})/(\d{1,2})(?![\w/-]|\.\d)"),
    _month_day,
)
NAMED_DATE = Rule(
    "March 3rd, 2024",
    re.compile(
        rf"\b({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?![\d:.]\d|\w)"
        r"(?:,?\s+(\d{4})(?![\w]|[.,]\d))?"
    ),
    _named_date,
)
DAY_FIRST_DATE = Rule(
    "3rd of March 2024",
    re.compile(
        rf"\b(?:(the)\s+)?(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_FULL_MONTH})\b"
        r"(?:,?\s+(\d{4})(?![\w]|[.,]\d))?"
    ),
    lambda m: ("the " if m.group(1) else "") + _day_first_date(m),
)
MONTH_YEAR = Rule(
    "March 2024",
    re.compile(rf"\b({_FULL_MONTH})\s+(\d{{4}})(?![\w]|[.,]\d)"),
    lambda m: f"{m.group(1)} {year(int(m.group(2)))}",
)
DECADE = Rule(
    "1990s / '90s",
    re.compile(r"(?<![\w.])(?:(1[1-9]\d0|20\d0)s|'?([2-9])0s)\b"),
    lambda m: decade(int(m.group(1))) if m.group(1) else decade_short(int(m.group(2))),
)
_YEAR_CONTEXT = ("in", "In", "since", "Since", "by", "from", "From", "until", "till", "through",
                 "of", "year", "during", "before", "after", "circa", "around", "early", "late",
                 "mid", "fiscal", "FY", "spring", "summer", "fall", "autumn", "winter")  # fmt: skip
YEAR = Rule(
    "year after in/since/…",
    re.compile(rf"\b({_alternation(_YEAR_CONTEXT)})\s+(1[1-9]\d\d|20\d\d)(?![\w]|[.,:]\d)"),
    lambda m: f"{m.group(1)} {year(int(m.group(2)))}",
)

# --- 7. times --------------------------------------------------------------------------------

_CLOCK = r"(\d{1,2})(?::([0-5]\d))?"
_MERIDIEM = r"\s?([AaPp])\.?\s?[Mm]\b\.?"


def _valid_clock(hour: int, minute: int, twelve_hour: bool) -> bool:
    return minute < 60 and (1 <= hour <= 12 if twelve_hour else 0 <= hour <= 23)


def _clock_ampm(m: re.Match[str]) -> str:
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if not _valid_clock(hour, minute, True):
        return m.group(0)
    return dates.say_time(hour, minute, m.group(3).lower() + "m") + _period(m)


def _clock_range(m: re.Match[str]) -> str:
    h1, m1, mer1, h2, m2, mer2 = m.groups()
    hour1, min1, hour2, min2 = int(h1), int(m1 or 0), int(h2), int(m2 or 0)
    if not (_valid_clock(hour1, min1, True) and _valid_clock(hour2, min2, True)):
        return m.group(0)
    first = (
        dates.say_time(hour1, min1, mer1.lower() + "m")
        if mer1
        else cardinal(hour1) + (" " + dates.say_minutes(min1) if min1 else "")
    )
    return f"{first} to {dates.say_time(hour2, min2, mer2.lower() + 'm')}" + _period(m)


def _clock_24(m: re.Match[str]) -> str:
    hour, minute, second = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if not _valid_clock(hour, minute, False) or second > 59:
        return m.group(0)
    spoken = dates.say_time(hour, minute, None)
    if second:
        spoken += f" and {cardinal(second)} {'second' if second == 1 else 'seconds'}"
    return spoken


TIME_RANGE = Rule(
    "9am-5pm",
    re.compile(rf"(?<![\w:.$]){_CLOCK}(?:{_MERIDIEM})?\s?[-–]\s?{_CLOCK}{_MERIDIEM}"),
    _clock_range,
)
TIME_AMPM = Rule(
    "3:45 PM",
    re.compile(rf"(?<![\w:.$]){_CLOCK}{_MERIDIEM}"),
    _clock_ampm,
)
TIME_24 = Rule(
    "14:30",
    re.compile(r"(?<![\w:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:]|\.\d)"),
    _clock_24,
)
RATIO = Rule(
    "3:1",
    re.compile(r"(?<![\w:.])(\d+):(\d+)(?![\w:]|\.\d)"),
    lambda m: f"{number(m.group(1))} to {number(m.group(2))}",
)

# --- 8. titles and street names: Dr. Smith / Oak Dr. ----------------------------------------

_NAME_TOKEN = re.compile(r"^(?:[A-Z][\w'-]*|\d[\w-]*)$")
_PREV_TOKEN = re.compile(r"(\S+)\s+$")
_NEXT_CAPITAL = re.compile(r"\s*[A-Z]")


def _after_name(m: re.Match[str]) -> tuple[bool, bool]:
    """Is the abbreviation preceded by a name or house number ("Main St.", "12 Oak Dr")? Two
    answers: loosely (any capitalised word) and strictly (not a word that merely begins the
    sentence, as in "Visit St. Louis")."""
    before = m.string[: m.start()]
    prev = _PREV_TOKEN.search(before)
    if prev is None or not _NAME_TOKEN.match(prev.group(1)):
        return False, False
    earlier = before[: prev.start()].rstrip()
    strict = (bool(earlier) and earlier[-1] not in ".!?:\n") or prev.group(1)[0].isdigit()
    return True, strict


def _title_or_place(m: re.Match[str]) -> str:
    key, dotted = m.group(1), m.group(2) == "."
    title, place = abbr.TITLES.get(key), abbr.PLACES.get(key)
    before_name = _NEXT_CAPITAL.match(m.string, m.end()) is not None
    loose, strict = _after_name(m)
    if place and (strict or (loose and not before_name)):
        return place + _period(m)
    if title and (before_name or dotted):
        return title + ("" if before_name else _period(m))
    if place and dotted:
        return place + _period(m)
    return m.group(0)


TITLES_AND_PLACES = Rule(
    "Dr./St./Ave.",
    re.compile(rf"(?<![\w.])({_alternation(set(abbr.TITLES) | set(abbr.PLACES))})(\.|\b)(?!\.\w)"),
    _title_or_place,
)

# --- 9. identifiers read digit by digit ------------------------------------------------------

_ID_FILLER = r"(?:\s*(?:number|no\.|#|code|is|are|was|will be|of|:|-)(?![\w]))*"
IDENTIFIER = Rule(
    "account/PIN/confirmation digits",
    re.compile(
        rf"\b((?i:{_alternation(phone.ID_KEYWORDS)})){_ID_FILLER}\s*#?\s*"
        r"(\d+(?:-\d+)*(?: \d{3,}(?:-\d+)*)*)(?![\w]|[.,]\d)"
    ),
    lambda m: m.group(0)[: m.start(2) - m.start(0)] + phone.say_groups(m.group(2)),
)

# --- 10. units, temperatures, percentages ----------------------------------------------------

_QUANTITY = rf"(-?(?:{VALUE})(?:\s?[-–]\s?(?:{VALUE}))?)"


def _unit(m: re.Match[str]) -> str:
    spoken, singular = say_quantity(m.group(1))
    one, many = units.UNITS[m.group(2)]
    per = f" per {units.PER_UNITS[m.group(3)]}" if m.group(3) else ""
    return f"{spoken} {one if singular else many}{per}"


def _temperature(m: re.Match[str]) -> str:
    spoken, singular = say_quantity(m.group(1))
    scale = f" {units.TEMPERATURE_SCALES[m.group(2)]}" if m.group(2) else ""
    return f"{spoken} {'degree' if singular else 'degrees'}{scale}"


TEMPERATURE = Rule(
    "72°F",
    re.compile(rf"(?<![\w.]){_QUANTITY}\s?°\s?([FCK])?(?![a-z])"),
    _temperature,
)
PERCENT = Rule(
    "4.5%",
    re.compile(rf"(?<![\w.]){_QUANTITY}\s?%"),
    lambda m: say_quantity(m.group(1))[0] + " percent",
)
UNIT = Rule(
    "5 mg/L",
    re.compile(
        rf"(?<![\w.]){_QUANTITY}\s?({_alternation(list(units.UNITS))})"
        rf"(?:/({_alternation(list(units.PER_UNITS))}))?(?![\w/])"
    ),
    _unit,
)

# --- 11. ordinals, multipliers, ranges -------------------------------------------------------

ORDINAL = Rule(
    "22nd",
    re.compile(rf"(?<![\w.])({INT})(?i:st|nd|rd|th)\b"),
    lambda m: ordinal(parse_int(m.group(1))),
)
TIMES_SIGN = Rule(
    "3 x 4",
    re.compile(r"(?<=\d)\s?[x×]\s?(?=\d)"),
    lambda m: " times ",
)
MULTIPLIER = Rule(
    "2x / x2",
    re.compile(rf"(?<![\w.])(?:({VALUE})x|x(\d+))\b"),
    lambda m: (
        f"{say_value(m.group(1))} times" if m.group(1) else f"times {cardinal(int(m.group(2)))}"
    ),
)


def _range_end(s: str) -> str:
    n = s.replace(",", "")
    return year(int(n)) if n.isdigit() and len(n) == 4 and 1100 <= int(n) <= 2099 else ""


def _range(m: re.Match[str]) -> str:
    a, b = m.group(1), m.group(2)
    if _range_end(a) and _range_end(b):  # "2019-2024" is two years
        return f"{_range_end(a)} to {_range_end(b)}"
    return f"{say_value(a)} to {say_value(b)}"


RANGE = Rule(
    "3-5",
    re.compile(rf"(?<![\w.,-])({VALUE})\s?[-–]\s?({VALUE})(?![\w-]|[.,]\d)"),
    _range,
)

# --- 12. codes and acronyms ------------------------------------------------------------------


def _spell_code(m: re.Match[str]) -> str:
    """ "AB12C" → "Eh B one two C"; lowercase runs stay words ("user42" → "user four two")."""
    pieces = re.findall(r"[A-Z]+(?=[A-Z\d]|$)|[A-Za-z][a-z]+|[a-z]+|\d+|[A-Z]", m.group(0))
    words: list[str] = []
    for piece in pieces:
        if piece.isdigit():
            words.append(digits(piece))
        elif piece.isupper():
            words.append(acronyms.spell(piece))
        else:
            words.append(piece)
    return " ".join(words)


ALPHANUMERIC = Rule(
    "mixed letters and digits",
    re.compile(r"\b(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z\d]{2,}\b"),
    _spell_code,
)
LETTERS_DASH_NUMBER = Rule(
    "I-95, COVID-19",
    re.compile(r"\b([A-Z]{1,6})-(\d+)(?![\w-]|[.,]\d)"),
    lambda m: (
        (acronyms.spell(m.group(1)) if len(m.group(1)) == 1 else m.group(1))
        + " "
        + number(m.group(2))
    ),
)
DOTTED_INITIALS = Rule(
    "U.S.A.",
    re.compile(r"(?<![\w.])((?:[A-Z]\.){2,})"),
    lambda m: acronyms.spell(m.group(1)) + _period(m),
)


def spell_acronyms(text: str) -> str:
    """Spell table acronyms; in all-caps text skip those that are also plain words."""
    letters = [c for c in text if c.isalpha()]
    shouting = len(letters) >= 12 and sum(c.isupper() for c in letters) > 0.8 * len(letters)

    def one(m: re.Match[str]) -> str:
        word, plural = m.group(1), m.group(2)
        if word in acronyms.WORDS and not plural:
            return acronyms.WORDS[word]
        if word not in acronyms.SPELLED or (shouting and word in acronyms.SHOUTING_AMBIGUOUS):
            return m.group(0)
        return acronyms.spell(word) + ("'s" if plural else "")

    return _ACRONYM.sub(one, text)


_ACRONYM = re.compile(r"\b([A-Z]{2,5})(s)?\b")

# --- 13. any number still standing -----------------------------------------------------------

DOTTED_NUMBER = Rule(
    "1.2.3 / 192.168.0.1",
    re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?![\w]|\.\d)"),
    lambda m: " dot ".join(number(p) for p in m.group(0).split(".")),
)
APPROXIMATE = Rule("~5", re.compile(r"~\s?(?=[\d.]\d*)"), lambda m: "about ")
SIGNED = Rule(
    "-5 / +5",
    re.compile(rf"(?<![\w.,-])([-+])(?={VALUE})"),
    lambda m: "minus " if m.group(1) == "-" else "plus ",
)
DECIMAL = Rule(
    "3.14",
    re.compile(rf"(?<![\w.])(?:{INT})?\.\d+(?![\w]|\.\d)"),
    lambda m: decimal(m.group(0).replace(",", "")),
)


def _integer(m: re.Match[str]) -> str:
    s = m.group(0)
    plain = s.replace(",", "")
    # Long unseparated strings are identifiers (read digit by digit) unless they are round
    # amounts nobody would read that way ("10000").
    if "," not in s and len(plain) >= 5 and not plain.endswith("000"):
        return digits(plain)
    return number(s)


INTEGER = Rule("1,234 / 007", re.compile(rf"(?:{INT})"), _integer)
# Digits glued to letters after every rule above ("abc123"): read one by one, set apart.
GLUED_DIGIT = Rule("stray digit", re.compile(r"\d+"), lambda m: f" {digits(m.group(0))} ")

# --- 14. symbols and tidy-up -----------------------------------------------------------------

_SYMBOL_WORD = re.compile(_alternation(list(symbols.SPOKEN)))
_KEYPAD = re.compile(r"(?<!\S)([#*])(?=[\s.,;:!?]|$)")
_SLASH_WORDS = re.compile(r"(?<=[A-Za-z])\s?/\s?(?=[A-Za-z])")
_SPACED_DASH = re.compile(r"(?:\s+(?:-{1,2}|[–—]))+\s+|(?<=\w)--(?=\w)")
_BULLET = re.compile(r"^[ ]*(?:[-*•—–][ ]+)+", re.MULTILINE)


def say_symbols(text: str) -> str:
    text = _KEYPAD.sub(lambda m: symbols.KEYPAD[m.group(1)], text)
    text = _SLASH_WORDS.sub(" or ", text)
    text = _SYMBOL_WORD.sub(lambda m: f" {symbols.SPOKEN[m.group(0)]} ", text)
    text = text.replace("/", " ").translate({ord(c): " " for c in symbols.SILENT})
    text = _BULLET.sub("", text)
    return _SPACED_DASH.sub(" — ", text)  # espeak pauses at an em dash, not at " - "


_TIDY: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[ ]*\(\s*"), ", "),  # espeak does not pause at brackets; a comma does
    (re.compile(r"\s*\)"), ","),
    (re.compile(r"[ ]+"), " "),
    (re.compile(r" ?\n ?"), "\n"),
    (re.compile(r" ([,.;:!?])"), r"\1"),
    (re.compile(r",(?:\s*,)+"), ","),
    (re.compile(r",\s*([.;:!?])"), r"\1"),
    (re.compile(r"(^|\n|[.!?] ?|[\"“']),\s*"), r"\1"),
    (re.compile(r",(?=\w)"), ", "),
    (re.compile(r"^(?:[—–-] ?)+", re.MULTILINE), ""),  # a dash that begins a line is a bullet
)


def tidy(text: str) -> str:
    for pattern, replacement in _TIDY:
        text = pattern.sub(replacement, text)
    return text.strip()


# --- the pipeline ----------------------------------------------------------------------------

STEPS: tuple[Callable[[str], str], ...] = (
    clean,
    EMAIL,
    URL,
    INTRODUCERS,
    PLAIN_ABBREVIATIONS,
    KEYPAD_CODE,
    NUMBER_SIGN,
    PHONE_NANP,
    VANITY_NUMBER,
    PHONE_INTERNATIONAL,
    DIGIT_GROUPS,
    PHONE_LOCAL,
    SERVICE_NUMBER,
    MONEY,
    MONEY_CODE,
    PER,
    WEEKDAY_RANGE,
    WEEKDAY,
    ISO_DATE,
    NUMERIC_DATE,
    NAMED_DATE,
    DAY_FIRST_DATE,
    MONTH_YEAR,
    DECADE,
    TIME_RANGE,
    TIME_AMPM,
    TIME_24,
    RATIO,
    MONTH_DAY_NUMERIC,
    TITLES_AND_PLACES,
    IDENTIFIER,
    TEMPERATURE,
    PERCENT,
    UNIT,
    YEAR,
    ORDINAL,
    TIMES_SIGN,
    MULTIPLIER,
    RANGE,
    LETTERS_DASH_NUMBER,
    DOTTED_INITIALS,
    ALPHANUMERIC,
    spell_acronyms,
    DOTTED_NUMBER,
    APPROXIMATE,
    SIGNED,
    DECIMAL,
    INTEGER,
    GLUED_DIGIT,
    say_symbols,
    tidy,
)


def normalize_once(text: str) -> str:
    """One pass of every step."""
    for step in STEPS:
        text = step(text)
    return text


def normalize(text: str) -> str:
    """Written English → the words a phone agent says, ready for Piper/espeak."""
    spoken = normalize_once(text)
    # A pass can expose text that an earlier step reads: digits glued to an abbreviation
    # ("Smith4567St.") come apart only in the fallback. Passing again until nothing changes
    # makes the result a fixed point; ordinary text settles after one pass.
    for _ in range(3):
        again = normalize_once(spoken)
        if again == spoken:
            break
        spoken = again
    return spoken
