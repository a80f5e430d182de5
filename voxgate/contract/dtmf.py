"""The sixteen telephone keys, in RFC 4733 §3.2 event-code order (events 0-15): one spelling
for the RTP event codec, SIP INFO, the browser keypad, the API and the IVR's config."""

from __future__ import annotations

from typing import TypeGuard

DTMF_KEYS = "0123456789*#ABCD"


def is_dtmf_key(text: object) -> TypeGuard[str]:
    """One of the sixteen keys, exactly (one character, upper case)."""
    return isinstance(text, str) and len(text) == 1 and text in DTMF_KEYS
