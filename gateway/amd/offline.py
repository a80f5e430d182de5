"""A whole recording through :class:`~gateway.amd.detector.AmdDetector`: the offline verdict.

Used by ``voxgate amd FILE.wav`` and by ``voxgate bench amd``. The recording stands for the
call's audio from the answer on, so its first sample is media time 0. The detector runs until it
is done or the audio ends; the verdict is the first decision (``human``, ``machine``,
``no_speech`` or ``decision_timeout``), or ``undecided`` when the recording ended first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gateway.amd.detector import (
    AmdBeep,
    AmdConfig,
    AmdDetector,
    AmdEvent,
    AmdGreetingEnded,
    AmdHuman,
    AmdMachine,
    AmdNoSpeech,
)

RATE = 8000


@dataclass(frozen=True, slots=True)
class Classification:
    """The verdict on one recording; times in ms from its start."""

    result: str
    cause: str
    decision_ms: int | None
    voicemail_from_ms: int | None
    events: list[AmdEvent] = field(default_factory=list)
    duration_ms: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "cause": self.cause,
            "decision_ms": self.decision_ms,
            "voicemail_from_ms": self.voicemail_from_ms,
            "duration_ms": self.duration_ms,
            "events": [e.to_dict() for e in self.events],
        }


def classify(pcm: npt.ArrayLike, config: AmdConfig | None = None) -> Classification:
    """Run ``pcm`` (int16 samples at 8 kHz, mono) through a fresh detector."""
    x = np.asarray(pcm, np.int16).ravel()
    det = AmdDetector(config)
    det.process(x)
    det.finish()
    d = det.decision
    result, cause = "undecided", ""
    if isinstance(d, AmdHuman):
        result, cause = "human", d.cause
    elif isinstance(d, AmdMachine):
        result, cause = "machine", d.cause
    elif isinstance(d, AmdNoSpeech):
        result, cause = "no_speech", "INITIALSILENCE"
    elif d is not None:
        result, cause = "decision_timeout", "TOOLONG"
    voicemail: int | None = None
    for e in det.events:
        if isinstance(e, AmdBeep | AmdGreetingEnded):
            voicemail = e.at_ms
            break
    return Classification(
        result,
        cause,
        d.at_ms if d is not None else None,
        voicemail,
        list(det.events),
        len(x) * 1000 // RATE,
    )
