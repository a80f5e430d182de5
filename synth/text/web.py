"""E-mail addresses and web addresses, read the way an agent says them on the phone."""

from __future__ import annotations

import re

from synth.text.numbers import digits

# Punctuation inside an address and its spoken name.
ADDRESS_SYMBOLS: dict[str, str] = {
    ".": "dot",
    "@": "at",
    "/": "slash",
    "-": "dash",
    "_": "underscore",
    "+": "plus",
    "~": "tilde",
    "?": "question mark",
    "=": "equals",
    "&": "and",
    "#": "hash",
    ":": "colon",
    "%": "percent",
}
# Parts of an address spelled rather than read: "www" and short consonant-only labels that
# espeak would mangle ("cnn", "bbc"). They have no "a", so lowercase letters are safe.
_VOWELS = set("aeiouy")
_PIECE = re.compile(r"[A-Za-z]+|\d+|[^A-Za-z\d]")


def _say_label(label: str) -> str:
    if label.lower() == "www" or (len(label) <= 4 and not _VOWELS & set(label.lower())):
        return " ".join(label.lower())
    return label.lower()


def say_address(text: str) -> str:
    """``"john.doe@example.com"`` → ``"john dot doe at example dot com"``; digits one by one."""
    words: list[str] = []
    for piece in _PIECE.findall(text):
        if piece.isdigit():
            words.append(digits(piece))
        elif piece.isalpha():
            words.append(_say_label(piece))
        elif piece in ADDRESS_SYMBOLS:
            words.append(ADDRESS_SYMBOLS[piece])
    return " ".join(words)


def say_url(url: str) -> str:
    """Drop the scheme (no caller types "https colon slash slash") and a trailing slash."""
    url = re.sub(r"^[A-Za-z][A-Za-z+.-]*://", "", url).rstrip("/")
    return say_address(url)
