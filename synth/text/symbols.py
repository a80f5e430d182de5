"""Symbols left after every number, address and abbreviation has been read.

Whatever espeak would read oddly or skip is either said as a word or turned into the pause it
stands for; the sentence punctuation the chunker and espeak's prosody need is left alone.
"""

from __future__ import annotations

# Said as a word wherever they remain (surrounded by spaces in the output).
SPOKEN: dict[str, str] = {
    "&": "and",
    "@": "at",
    "%": "percent",
    "+": "plus",
    "=": "equals",
    "°": "degrees",
    "$": "dollars",
    "€": "euros",
    "£": "pounds",
    "¥": "yen",
    "₹": "rupees",
    "©": "copyright",
    "®": "",
    "™": "",
}

# Keypad keys, said only when they stand alone ("press # to repeat"); anywhere else they are
# Markdown from an LLM ("**bold**", "## Heading") and are dropped.
KEYPAD: dict[str, str] = {"#": "pound", "*": "star"}

# Dropped (replaced by a space): decoration espeak would either skip or read by name.
SILENT: str = "*#_~^`\\{}[]<>|"
