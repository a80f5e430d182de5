"""Acronyms: those spelled letter by letter, and letter names espeak reads correctly.

Spelled acronyms are matched case-sensitively as whole words, optionally with a plural "s"
("ATMs"). Acronyms said as words (NASA, NATO, FEMA) are not listed: espeak already reads
them as words.
"""

from __future__ import annotations

SPELLED: frozenset[str] = frozenset(
    (
        "ACH", "APR", "APY", "ASAP", "ATM", "AWS", "BBB", "CD", "CDC", "CEO", "CFO", "COO",
        "CPA", "CPU", "CSR", "CVV", "DIY", "DMV", "DNA", "DOB", "DVD", "EIN", "EOB", "ER",
        "ETA", "EV", "FAQ", "FBI", "FDA", "FHA", "FSA", "FYI", "GPS", "HMO", "HOA", "HR",
        "HSA", "HTML", "IBM", "ICU", "ID", "IOU", "IP", "IRA", "IRS", "ISP", "IT", "IVR",
        "LLC", "LLP", "MD", "MRI", "NBA", "NDA", "NFL", "OTP", "PC", "PDF", "PIN", "PO", "PPO",
        "PR", "PTO", "QR", "RN", "RSVP", "RV", "SMS", "SSN", "SUV", "TBD", "TV", "UPS", "URL",
        "US", "USA", "USB", "USPS", "VA", "VIN", "VIP", "VPN",
    )
)  # fmt: skip
# In all-caps text these are more likely words than acronyms ("CALL US", "IT IS"), so they are
# spelled only when the surrounding text is not shouting.
SHOUTING_AMBIGUOUS: frozenset[str] = frozenset({"IT", "US", "PR", "ER", "MD", "VA", "PO", "CD"})

# Said as words although written in capitals.
WORDS: dict[str, str] = {
    "OK": "okay",
}

# Letter names as espeak must see them. A lone "A" followed by another word is read as the
# article (/ɐ/), so the spelled letter A is written "Eh", which espeak reads /eɪ/.
LETTER_NAMES: dict[str, str] = {chr(c): chr(c) for c in range(ord("A"), ord("Z") + 1)}
LETTER_NAMES["A"] = "Eh"


def spell(letters: str) -> str:
    """``"APR"`` → ``"Eh P R"``; lowercase letters are spelled as their capitals."""
    return " ".join(LETTER_NAMES[c] for c in letters.upper() if c in LETTER_NAMES)
