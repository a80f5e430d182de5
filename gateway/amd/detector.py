"""One detector for an answered call: the three AMD signals joined, events with media times.

Feed the caller's audio (int16 at 8 kHz, any chunking: it is cut into 20 ms frames here) with
:meth:`AmdDetector.process`, and transcripts, where speech-to-text runs, with
:meth:`AmdDetector.transcript`. Each event's ``at_ms`` is the media time of the decision: the end
of the frame that decided, counted from the first sample fed (the answer).

How the signals combine:

- A beep before any decision decides ``amd.machine`` (cause ``BEEP``), then ``amd.beep``.
- The ``app_amd`` heuristic's HUMAN → ``amd.human``; its MACHINE → ``amd.machine`` with its
  cause; MACHINE/INITIALSILENCE (nobody spoke) → ``amd.no_speech``, as jambonz reports it, and
  the dialer chooses; NOTSURE/TOOLONG → keep listening for a beep or a transcript until
  ``decision_timeout_ms``, then ``amd.decision_timeout``.
- A transcript with ``threshold_word_count`` words or a voicemail phrase → ``amd.machine``
  (cause ``WORDCOUNT``/``HINT``) whenever it comes first; a short final transcript → ``amd.human``
  only while the heuristic is unsure (a greeting's first phrase is short too).
- After ``amd.machine``, voicemail may start at the first of: ``amd.beep`` (after the tone), or
  ``amd.greeting_ended`` once ``greeting_completion_timeout_ms`` of silence followed the
  greeting (the event says when that silence began). A beep is still reported after the
  greeting ended, until ``tone_timeout_ms`` after the answer; then the detector is done.

The timers keep jambonz's names snake-cased (``noSpeechTimeoutMs`` has no own timer here: the
heuristic's ``initial_silence`` decides no-speech earlier, at 2.5 s instead of 5 s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from gateway.amd.beep import Beep, BeepConfig, BeepDetector
from gateway.amd.heuristic import (
    FRAME,
    FRAME_MS,
    AsteriskHeuristic,
    Cause,
    HeuristicConfig,
    Status,
    frame_is_silent,
)
from gateway.amd.words import DEFAULT_PHRASES, WordRule, WordsConfig, WordVerdict

Int16Array = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class AmdConfig:
    """Every knob, validated on construction (``ValueError`` with the field's name).

    Asterisk ``amd.conf`` names for the heuristic, jambonz names (snake-cased) for the word rule
    and the timers, ``beep_*`` for the tone detector. All defaults are the documented ones but
    ``maximum_number_of_words``: 3 (Asterisk's default before 1.8) instead of Asterisk's 2,
    because at 2 a person's two-word answer ("Hello, hello?", "Hi, who's calling?") counts as a
    machine: on ``voxgate bench amd`` (96 greetings) 86.5 % correct at 2, 95.8 % at 3.
    """

    initial_silence: int = 2500
    greeting: int = 1500
    after_greeting_silence: int = 800
    total_analysis_time: int = 5000
    min_word_length: int = 100
    between_words_silence: int = 50
    maximum_number_of_words: int = 3
    silence_threshold: int = 256
    maximum_word_length: int = 5000
    beep_min_hz: float = 400.0
    beep_max_hz: float = 2000.0
    beep_min_ms: int = 200
    beep_concentration: float = 0.8
    beep_min_dbfs: float = -45.0
    threshold_word_count: int = 9
    phrases: tuple[str, ...] = DEFAULT_PHRASES
    decision_timeout_ms: int = 15000
    tone_timeout_ms: int = 20000
    greeting_completion_timeout_ms: int = 2000

    def __post_init__(self) -> None:
        self.heuristic()
        self.beep()
        self.words()
        for name in ("decision_timeout_ms", "tone_timeout_ms", "greeting_completion_timeout_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"amd: {name} must be a positive integer, not {value!r}")
        if self.decision_timeout_ms < self.total_analysis_time:
            raise ValueError("amd: decision_timeout_ms must be at least total_analysis_time")

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> AmdConfig:
        """From a config mapping; unknown keys are an error, not silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"amd: unknown setting(s): {', '.join(unknown)}")
        values = dict(data)
        if "phrases" in values and isinstance(values["phrases"], list):
            values["phrases"] = tuple(values["phrases"])
        return cls(**values)  # type: ignore[arg-type]

    def heuristic(self) -> HeuristicConfig:
        return HeuristicConfig(
            initial_silence=self.initial_silence,
            greeting=self.greeting,
            after_greeting_silence=self.after_greeting_silence,
            total_analysis_time=self.total_analysis_time,
            min_word_length=self.min_word_length,
            between_words_silence=self.between_words_silence,
            maximum_number_of_words=self.maximum_number_of_words,
            silence_threshold=self.silence_threshold,
            maximum_word_length=self.maximum_word_length,
        )

    def beep(self) -> BeepConfig:
        return BeepConfig(
            min_hz=self.beep_min_hz,
            max_hz=self.beep_max_hz,
            min_ms=self.beep_min_ms,
            concentration=self.beep_concentration,
            min_dbfs=self.beep_min_dbfs,
        )

    def words(self) -> WordsConfig:
        return WordsConfig(threshold_word_count=self.threshold_word_count, phrases=self.phrases)


@dataclass(frozen=True, slots=True)
class AmdEvent:
    """Base of the events; ``name`` is the ``amd.*`` event name."""

    name: ClassVar[str] = "amd"
    at_ms: int

    def to_dict(self) -> dict[str, object]:
        return {"event": self.name, **asdict(self)}


@dataclass(frozen=True, slots=True)
class AmdHuman(AmdEvent):
    name: ClassVar[str] = "amd.human"
    cause: str = "HUMAN"


@dataclass(frozen=True, slots=True)
class AmdMachine(AmdEvent):
    name: ClassVar[str] = "amd.machine"
    cause: str = ""


@dataclass(frozen=True, slots=True)
class AmdBeep(AmdEvent):
    """A tone from ``start_ms`` to ``end_ms``, known at ``at_ms`` (one hop later): voicemail
    can start."""

    name: ClassVar[str] = "amd.beep"
    frequency_hz: float = 0.0
    start_ms: int = 0
    end_ms: int = 0


@dataclass(frozen=True, slots=True)
class AmdNoSpeech(AmdEvent):
    name: ClassVar[str] = "amd.no_speech"


@dataclass(frozen=True, slots=True)
class AmdDecisionTimeout(AmdEvent):
    name: ClassVar[str] = "amd.decision_timeout"


@dataclass(frozen=True, slots=True)
class AmdGreetingEnded(AmdEvent):
    """``greeting_completion_timeout_ms`` of silence began at ``silence_from_ms``."""

    name: ClassVar[str] = "amd.greeting_ended"
    silence_from_ms: int = 0


class Phase(Enum):
    DECIDING = "deciding"
    UNSURE = "unsure"  # the heuristic said NOTSURE; a beep or transcript may still decide
    AWAIT_END = "await_end"  # machine: waiting for the beep or the end of the greeting
    DONE = "done"


DECISIONS = (AmdHuman, AmdMachine, AmdNoSpeech, AmdDecisionTimeout)


class AmdDetector:
    """Sans-I/O AMD for one call; see the module docstring for how the signals combine."""

    def __init__(self, config: AmdConfig | None = None) -> None:
        self.config = config or AmdConfig()
        self.phase = Phase.DECIDING
        self.heuristic = AsteriskHeuristic(self.config.heuristic())
        self.beeps = BeepDetector(self.config.beep())
        self.words = WordRule(self.config.words())
        self.elapsed_ms = 0
        self.decision: AmdEvent | None = None
        self.events: list[AmdEvent] = []
        self._pending = np.zeros(0, np.int16)
        self._silence_ms = 0
        self._greeting_ended = False

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def process(self, samples: npt.ArrayLike) -> list[AmdEvent]:
        """Feed int16 samples at 8 kHz in any chunking; returns the events they caused."""
        x = np.asarray(samples, dtype=np.int16).ravel()
        buf = np.concatenate((self._pending, x)) if self._pending.size else x
        n = len(buf) // FRAME * FRAME
        out: list[AmdEvent] = []
        for i in range(0, n, FRAME):
            out += self.process_frame(buf[i : i + FRAME])
        self._pending = buf[n:].copy()
        return out

    def process_frame(self, frame: Int16Array) -> list[AmdEvent]:
        """Feed exactly one 20 ms frame (160 samples)."""
        if self.phase is Phase.DONE:
            self.elapsed_ms += FRAME_MS
            return []
        self.elapsed_ms += FRAME_MS
        now = self.elapsed_ms
        out: list[AmdEvent] = []
        beep = self.beeps.process(frame)
        if self.phase is Phase.DECIDING:
            verdict = self.heuristic.process(frame)
            if verdict is not None and beep is None:
                out += self._on_verdict(verdict.status, verdict.cause, now)
        if beep is not None:
            out += self._on_beep(beep)
        if self.phase is Phase.UNSURE and now >= self.config.decision_timeout_ms:
            out += self._decide(AmdDecisionTimeout(now), Phase.DONE)
        if self.phase is Phase.AWAIT_END:
            out += self._await_end(frame, now)
        return out

    def transcript(self, text: str, at_ms: int, final: bool = True) -> list[AmdEvent]:
        """A transcript of the caller's speech up to media time ``at_ms``."""
        if self.phase not in (Phase.DECIDING, Phase.UNSURE):
            return []
        decision = self.words.transcript(text, at_ms, final)
        if decision is None:
            return []
        if decision.verdict is WordVerdict.HUMAN:
            if self.phase is Phase.UNSURE:
                return self._decide(AmdHuman(at_ms, decision.verdict.value), Phase.DONE)
            return []
        return self._decide(AmdMachine(at_ms, decision.verdict.value), Phase.AWAIT_END)

    def finish(self) -> list[AmdEvent]:
        """End of a recording (offline use): a tone still sounding counts as a beep."""
        if self.phase is Phase.DONE:
            return []
        beep = self.beeps.flush()
        return self._on_beep(beep) if beep is not None else []

    def _on_verdict(self, status: Status, cause: Cause, now: int) -> list[AmdEvent]:
        if status is Status.HUMAN:
            return self._decide(AmdHuman(now, cause.value), Phase.DONE)
        if status is Status.NOTSURE:
            self.phase = Phase.UNSURE
            return []
        if cause is Cause.INITIALSILENCE:
            return self._decide(AmdNoSpeech(now), Phase.DONE)
        return self._decide(AmdMachine(now, cause.value), Phase.AWAIT_END)

    def _on_beep(self, beep: Beep) -> list[AmdEvent]:
        out: list[AmdEvent] = []
        if self.phase in (Phase.DECIDING, Phase.UNSURE):
            out += self._decide(AmdMachine(self.elapsed_ms, "BEEP"), Phase.AWAIT_END)
        if self.phase is Phase.AWAIT_END:
            event = AmdBeep(
                self.elapsed_ms, round(beep.frequency_hz, 1), beep.start_ms, beep.end_ms
            )
            self.events.append(event)
            out.append(event)
            self.phase = Phase.DONE
        return out

    def _await_end(self, frame: Int16Array, now: int) -> list[AmdEvent]:
        out: list[AmdEvent] = []
        if frame_is_silent(frame, self.config.silence_threshold):
            self._silence_ms += FRAME_MS
        else:
            self._silence_ms = 0
        if (
            not self._greeting_ended
            and self._silence_ms >= self.config.greeting_completion_timeout_ms
        ):
            self._greeting_ended = True
            event = AmdGreetingEnded(now, now - self._silence_ms)
            self.events.append(event)
            out.append(event)
        if now >= self.config.tone_timeout_ms:
            self.phase = Phase.DONE
        return out

    def _decide(self, event: AmdEvent, phase: Phase) -> list[AmdEvent]:
        self.decision = event
        self.events.append(event)
        self.phase = phase
        return [event]
