"""A whole recording through :class:`~gateway.amd.detector.AmdDetector`: the offline verdict.

Used by ``voxgate amd FILE.wav`` and by ``voxgate bench amd``. The recording stands for the
call's audio from the answer on, so its first sample is media time 0. The detector runs until it
is done or the audio ends; the verdict is the first decision (``human``, ``machine``,
``no_speech`` or ``decision_timeout``), or ``undecided`` when the recording ended first.

With a recogniser (``stt``) the word rule runs as on a live call (:class:`AmdOnCall`): the same
:class:`~gateway.amd.speech.AmdEars` segments, one recognition at a time, hearing stopped at the
first decision. The recording is not played in real time, so a recognition is run when it is
started, and its transcript reaches the detector once the media time has advanced by the
recogniser's measured compute time (at the first frame at or after it), as a live call's
frames would have by the time the result came back.
"""

from __future__ import annotations

import math
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
from gateway.amd.heuristic import FRAME
from gateway.amd.speech import AmdEars, Utterance
from gateway.stt.base import SpeechToText

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
    recognitions: int = 0  # recogniser jobs started (the word rule; 0 without one)
    stt_s: float = 0.0  # their compute time

    def to_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "cause": self.cause,
            "decision_ms": self.decision_ms,
            "voicemail_from_ms": self.voicemail_from_ms,
            "duration_ms": self.duration_ms,
            "recognitions": self.recognitions,
            "stt_s": round(self.stt_s, 3),
            "events": [e.to_dict() for e in self.events],
        }


def classify(
    pcm: npt.ArrayLike, config: AmdConfig | None = None, stt: SpeechToText | None = None
) -> Classification:
    """Run ``pcm`` (int16 samples at 8 kHz, mono) through a fresh detector (and, with ``stt``,
    the word rule as a live call runs it)."""
    x = np.asarray(pcm, np.int16).ravel()
    det = AmdDetector(config)
    recognitions, stt_s = 0, 0.0
    if stt is None:
        det.process(x)
    else:
        recognitions, stt_s = _with_words(det, x, stt)
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
        recognitions,
        stt_s,
    )


def _with_words(det: AmdDetector, x: npt.NDArray[np.int16], stt: SpeechToText) -> tuple[int, float]:
    """Frame by frame in :class:`AmdOnCall`'s order: the detector, then a finished
    recognition's transcript, then the ears. Returns (recognitions, their compute seconds)."""
    ears = AmdEars()
    job: tuple[Utterance, str, int] | None = None  # utterance, its text, media time it is ready
    stt_s = 0.0

    def start(u: Utterance | None) -> tuple[Utterance, str, int] | None:
        nonlocal stt_s
        if u is None:
            return None
        result = stt.transcribe(u.audio)
        stt_s += result.compute_s
        return u, result.text, det.elapsed_ms + math.ceil(result.compute_s * 1000)

    n = len(x) // FRAME * FRAME
    for i in range(0, n, FRAME):
        frame = x[i : i + FRAME]
        det.process(frame)
        if ears.closed:
            continue
        if job is not None and det.elapsed_ms >= job[2]:
            u, text, _ = job
            job = None
            if text:
                det.transcript(text, det.elapsed_ms, u.final)
            if det.decision is None:
                job = start(ears.done())
        if det.decision is not None:
            ears.close()  # as on a live call: no recognition after the first decision
            continue
        job = start(ears.feed(frame)) or job
    det.process(x[n:])
    return ears.submitted, stt_s
