"""jambonz's transcript rule: a long greeting, or a voicemail phrase, means a machine.

jambonz's ``amd`` verb counts the words the recogniser heard in the greeting: at
``thresholdWordCount`` words (default 9) it reports ``amd_machine_detected``; a short final
transcript reports ``amd_human_detected``. It also matches the transcript against a list of
voicemail hints (phrases such as "leave a message"); a hit is a machine whatever the count. The
phrase list here is voxgate's own, in that spirit; it is lower-cased and matched on word
boundaries after the transcript is normalised (punctuation dropped, "you've" kept whole).

The transcript comes with its media time (the end of the audio it covers); the rule keeps the
words heard so far, so partial and final transcripts of successive utterances add up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

DEFAULT_PHRASES: tuple[str, ...] = (
    "leave a message",
    "leave your message",
    "leave me a message",
    "after the tone",
    "after the beep",
    "at the tone",
    "record your message",
    "not available",
    "unavailable",
    "can't come to the phone",
    "cannot come to the phone",
    "can't take your call",
    "cannot take your call",
    "you have reached",
    "you've reached",
    "voicemail",
    "voice mail",
    "mailbox",
    "get back to you",
    "call you back",
    "please leave",
)

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words_of(text: str) -> list[str]:
    """Lower-cased words of ``text`` (digits count as words, apostrophes stay inside words)."""
    return _WORD.findall(text.lower().replace("\u2019", "'"))


class WordVerdict(Enum):
    MACHINE_WORDCOUNT = "WORDCOUNT"
    MACHINE_HINT = "HINT"
    HUMAN = "SHORTGREETING"


@dataclass(frozen=True, slots=True)
class WordsConfig:
    """jambonz's names, snake-cased: ``thresholdWordCount`` → ``threshold_word_count``."""

    threshold_word_count: int = 9
    phrases: tuple[str, ...] = DEFAULT_PHRASES

    def __post_init__(self) -> None:
        if self.threshold_word_count < 1:
            raise ValueError(
                f"amd: threshold_word_count must be at least 1, not {self.threshold_word_count}"
            )
        for p in self.phrases:
            if not words_of(p):
                raise ValueError(f"amd: phrase {p!r} has no words")


@dataclass(frozen=True, slots=True)
class WordDecision:
    verdict: WordVerdict
    at_ms: int
    words: int
    phrase: str = ""


class WordRule:
    """Accumulates transcripts; :meth:`transcript` returns a decision when one is reached."""

    def __init__(self, config: WordsConfig | None = None) -> None:
        self.config = config or WordsConfig()
        self._phrases = [(p, " ".join(words_of(p))) for p in self.config.phrases]
        self.final_words: list[str] = []
        self.decision: WordDecision | None = None

    def transcript(self, text: str, at_ms: int, final: bool = True) -> WordDecision | None:
        """A transcript of the current utterance (``final``: the utterance is over)."""
        if self.decision is not None:
            return None
        heard = self.final_words + words_of(text)
        if final:
            self.final_words = heard
        joined = " " + " ".join(heard) + " "
        for phrase, norm in self._phrases:
            if f" {norm} " in joined:
                return self._decide(WordVerdict.MACHINE_HINT, at_ms, len(heard), phrase)
        if len(heard) >= self.config.threshold_word_count:
            return self._decide(WordVerdict.MACHINE_WORDCOUNT, at_ms, len(heard))
        if final and heard:
            return self._decide(WordVerdict.HUMAN, at_ms, len(heard))
        return None

    def _decide(self, verdict: WordVerdict, at_ms: int, n: int, phrase: str = "") -> WordDecision:
        self.decision = WordDecision(verdict, at_ms, n, phrase)
        return self.decision
