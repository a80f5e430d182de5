"""Asterisk ``app_amd``'s energy and word-timing state machine, one 20 ms frame at a time.

The parameter names and defaults are those of Asterisk's ``amd.conf`` (``app_amd.c``'s
``dflt*`` values; ``maximum_number_of_words`` is 2 since Asterisk 1.8, it was 3). A frame is
*silent* when its mean absolute sample is below ``silence_threshold`` (``ast_dsp_silence``).
Words are voiced runs of at least ``min_word_length`` ms that start after at least
``between_words_silence`` ms of silence. The verdicts and causes are ``AMDSTATUS``/``AMDCAUSE``:

- MACHINE/INITIALSILENCE: no word within ``initial_silence`` ms of the answer;
- HUMAN/HUMAN: ``after_greeting_silence`` ms of silence after a greeting began;
- MACHINE/LONGGREETING: the greeting's voiced time reached ``greeting`` ms;
- MACHINE/MAXWORDS: ``maximum_number_of_words`` words counted;
- MACHINE/MAXWORDLENGTH: one voiced run reached ``maximum_word_length`` ms;
- NOTSURE/TOOLONG: nothing decided within ``total_analysis_time`` ms.

The checks run in app_amd's order inside a frame, so ties resolve as Asterisk resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

RATE = 8000
FRAME_MS = 20
FRAME = RATE * FRAME_MS // 1000

Int16Array = npt.NDArray[np.int16]


class Status(Enum):
    HUMAN = "HUMAN"
    MACHINE = "MACHINE"
    NOTSURE = "NOTSURE"


class Cause(Enum):
    INITIALSILENCE = "INITIALSILENCE"
    HUMAN = "HUMAN"
    LONGGREETING = "LONGGREETING"
    MAXWORDS = "MAXWORDS"
    MAXWORDLENGTH = "MAXWORDLENGTH"
    TOOLONG = "TOOLONG"


@dataclass(frozen=True, slots=True)
class HeuristicConfig:
    """``amd.conf``'s ``[general]`` keys, in ms except ``silence_threshold`` (0..32767)."""

    initial_silence: int = 2500
    greeting: int = 1500
    after_greeting_silence: int = 800
    total_analysis_time: int = 5000
    min_word_length: int = 100
    between_words_silence: int = 50
    maximum_number_of_words: int = 2
    silence_threshold: int = 256
    maximum_word_length: int = 5000

    def __post_init__(self) -> None:
        for name in (
            "initial_silence",
            "greeting",
            "after_greeting_silence",
            "total_analysis_time",
            "min_word_length",
            "between_words_silence",
            "maximum_number_of_words",
            "maximum_word_length",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"amd: {name} must be a positive integer, not {value!r}")
        if not 0 <= self.silence_threshold <= 32767:
            raise ValueError(
                f"amd: silence_threshold must be 0..32767, not {self.silence_threshold}"
            )
        if self.min_word_length > self.maximum_word_length:
            raise ValueError("amd: min_word_length must not exceed maximum_word_length")


@dataclass(frozen=True, slots=True)
class Verdict:
    """``AMDSTATUS`` and ``AMDCAUSE``, decided at the end of the frame ending at ``at_ms``."""

    status: Status
    cause: Cause
    at_ms: int
    words: int
    voice_ms: int


def frame_is_silent(frame: Int16Array, threshold: int) -> bool:
    """``ast_dsp_silence``'s test: the mean absolute sample is below ``threshold``."""
    return float(np.mean(np.abs(frame.astype(np.int32)))) < threshold


class AsteriskHeuristic:
    """The state machine; :meth:`process` takes exactly one 160-sample frame."""

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()
        self.total_ms = 0
        self.silence_ms = 0  # ast_dsp_silence's running total of consecutive silence
        self.voice_ms = 0  # voiced time since the greeting began (app_amd's voiceDuration)
        self.run_ms = 0  # consecutiveVoiceDuration
        self.words = 0
        self.in_word = True  # app_amd starts in STATE_IN_WORD: a word needs silence before it
        self.in_initial_silence = True
        self.in_greeting = False
        self.verdict: Verdict | None = None

    def process(self, frame: Int16Array) -> Verdict | None:
        """Feed one frame; returns the verdict on the frame that decides, else ``None``."""
        if self.verdict is not None:
            return None
        if len(frame) != FRAME:
            raise ValueError(f"amd: frames are {FRAME} samples, not {len(frame)}")
        c = self.config
        self.total_ms += FRAME_MS
        if self.total_ms >= c.total_analysis_time:
            return self._decide(Status.NOTSURE, Cause.TOOLONG)
        if frame_is_silent(frame, c.silence_threshold):
            self.silence_ms += FRAME_MS
            if self.silence_ms >= c.between_words_silence:
                self.in_word = False
                self.run_ms = 0
            if self.in_initial_silence and self.silence_ms >= c.initial_silence:
                return self._decide(Status.MACHINE, Cause.INITIALSILENCE)
            if self.in_greeting and self.silence_ms >= c.after_greeting_silence:
                return self._decide(Status.HUMAN, Cause.HUMAN)
            return None
        self.silence_ms = 0  # ast_dsp_silence restarts its silence count on a voiced frame
        self.run_ms += FRAME_MS
        self.voice_ms += FRAME_MS
        if self.run_ms >= c.min_word_length and not self.in_word:
            self.words += 1
            self.in_word = True
        if self.run_ms >= c.maximum_word_length:
            return self._decide(Status.MACHINE, Cause.MAXWORDLENGTH)
        if self.words >= c.maximum_number_of_words:
            return self._decide(Status.MACHINE, Cause.MAXWORDS)
        if self.in_greeting and self.voice_ms >= c.greeting:
            return self._decide(Status.MACHINE, Cause.LONGGREETING)
        if self.run_ms >= c.min_word_length and not self.in_greeting:
            self.in_initial_silence = False
            self.in_greeting = True
        return None

    def _decide(self, status: Status, cause: Cause) -> Verdict:
        self.verdict = Verdict(status, cause, self.total_ms, self.words, self.voice_ms)
        return self.verdict
