"""Currencies: symbols and ISO codes → the names of their major and minor units."""

from __future__ import annotations

from dataclasses import dataclass

from synth.text.numbers import cardinal, decimal


@dataclass(frozen=True, slots=True)
class Currency:
    major: str
    majors: str
    minor: str
    minors: str

    def say(self, whole: int, cents: int | None) -> str:
        """``say(1234, 56)`` → ``"one thousand two hundred thirty four dollars and fifty six
        cents"``; no cents part when ``cents`` is 0/None, no dollar part when ``whole`` is 0."""
        major = f"{cardinal(whole)} {self.major if whole == 1 else self.majors}"
        if not cents:
            return major
        minor = f"{cardinal(cents)} {self.minor if cents == 1 else self.minors}"
        return minor if whole == 0 else f"{major} and {minor}"

    def say_scaled(self, amount: str, scale: str) -> str:
        """``$2.5 million`` → ``"two point five million dollars"`` (always plural)."""
        return f"{decimal(amount)} {scale} {self.majors}"


DOLLAR = Currency("dollar", "dollars", "cent", "cents")
EURO = Currency("euro", "euros", "cent", "cents")
POUND = Currency("pound", "pounds", "penny", "pence")
YEN = Currency("yen", "yen", "sen", "sen")
RUPEE = Currency("rupee", "rupees", "paisa", "paise")

SYMBOLS: dict[str, Currency] = {
    "$": DOLLAR,
    "US$": DOLLAR,
    "€": EURO,
    "£": POUND,
    "¥": YEN,
    "₹": RUPEE,
}

# Codes written after the amount ("20 USD").
CODES: dict[str, Currency] = {
    "USD": DOLLAR,
    "EUR": EURO,
    "GBP": POUND,
    "JPY": YEN,
    "INR": RUPEE,
    "CAD": Currency("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "AUD": Currency("Australian dollar", "Australian dollars", "cent", "cents"),
}

# Magnitude suffixes in money talk: "$5k", "$3M", "$1.2bn", "$2 million".
SCALE_WORDS: dict[str, str] = {
    "k": "thousand",
    "K": "thousand",
    "thousand": "thousand",
    "m": "million",
    "M": "million",
    "mm": "million",
    "MM": "million",
    "million": "million",
    "b": "billion",
    "B": "billion",
    "bn": "billion",
    "billion": "billion",
    "trillion": "trillion",
}
