"""Caller speech cut into utterances for speech-to-text (sans-I/O, synchronous, explicit state).

Feed 20 ms frames of 16 kHz int16 audio with :meth:`SpeechSegmenter.feed`; it answers with
what to transcribe:

- :class:`Partial` — the audio of the utterance so far, every ``partial_every_ms`` while the
  caller speaks (for live captions and early intent);
- :class:`Pause` — the caller paused (``pause_ms`` of non-speech, once per pause): the audio
  the :class:`Final` will carry if nothing more is said, so recognition can start before the
  silence that ends the utterance has passed (an eager transcript; reuse it when the
  :class:`Final` has the same ``start``/``end``);
- :class:`Final` — the whole utterance once ``min_silence_ms`` of non-speech followed it, or
  when it reached ``max_segment_s`` (a monologue is cut there, so memory stays bounded).

Speech is webrtcvad on each frame (mode ``aggressiveness``) with a little hysteresis: an
utterance starts after ``start_ms`` of speech frames within a short window, and keeps
``pre_roll_ms`` of audio before its first speech frame so a soft word start is not clipped.
Timestamps are media time in samples at 16 kHz, so nothing depends on the wall clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import webrtcvad

RATE = 16000
FRAME = RATE * 20 // 1000
# Non-speech kept after an utterance's last speech frame: 60 ms (webrtcvad already calls speech
# 100-170 ms past a word's end, so soft endings are inside; a short tail lets the eager
# transcript start 60 ms into a pause).
TAIL_FRAMES = 3
Int16Array = npt.NDArray[np.int16]


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    aggressiveness: int = 2
    # A frame webrtcvad calls speech counts as speech only within this many dB of the
    # utterance's loudest speech frame so far (0: off). webrtcvad keeps saying "speech" for
    # 100-170 ms after a word has ended (its own hangover); the level has fallen 40 dB by then,
    # so the end of an utterance is found ~100 ms sooner (measured on the agent bench's ten
    # questions: end lag p50 125 → 22 ms, no gap of 100 ms or more opened inside a sentence).
    energy_gate_db: float = 40.0
    start_ms: int = 60  # speech needed to open an utterance
    min_silence_ms: int = 500  # non-speech that closes it
    pre_roll_ms: int = 200  # audio kept before the first speech frame
    partial_every_ms: int = 600
    max_segment_s: float = 15.0
    min_segment_ms: int = 200  # shorter bursts (a cough, a click) are dropped
    pause_ms: int = 0  # non-speech that announces a Pause (0: no Pause events)

    def __post_init__(self) -> None:
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness must be 0..3, got {self.aggressiveness}")
        if not 0 <= self.energy_gate_db <= 90:
            raise ValueError(f"energy_gate_db must be 0-90, got {self.energy_gate_db}")
        for name in ("start_ms", "min_silence_ms", "partial_every_ms", "min_segment_ms"):
            if getattr(self, name) < 20:
                raise ValueError(f"{name} must be >= 20 ms")
        if not 1.0 <= self.max_segment_s <= 120.0:
            raise ValueError("max_segment_s must be 1-120")
        if self.pause_ms and not TAIL_FRAMES * 20 <= self.pause_ms < self.min_silence_ms:
            raise ValueError(
                f"pause_ms must be 0 or {TAIL_FRAMES * 20} <= pause_ms < min_silence_ms"
            )


@dataclass(frozen=True, slots=True)
class Partial:
    start: int  # media time (samples at 16 kHz) of the utterance's first sample
    audio: Int16Array


@dataclass(frozen=True, slots=True)
class Pause:
    start: int
    end: int  # media time just after the last speech frame so far
    audio: Int16Array  # what a Final ending here would carry


@dataclass(frozen=True, slots=True)
class Final:
    start: int
    end: int  # media time just after its last speech frame
    audio: Int16Array
    cut: bool  # ended by max_segment_s, not by silence


SegmentEvent = Partial | Pause | Final


class SpeechSegmenter:
    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = cfg = config or SegmenterConfig()
        self._vad = webrtcvad.Vad(cfg.aggressiveness)
        self._pre: deque[Int16Array] = deque(maxlen=max(1, cfg.pre_roll_ms // 20))
        self._recent: deque[bool] = deque(maxlen=max(1, 2 * cfg.start_ms // 20))
        self._start_frames = max(1, cfg.start_ms // 20)
        self._end_frames = max(1, cfg.min_silence_ms // 20)
        self._partial_frames = max(1, cfg.partial_every_ms // 20)
        self._pause_frames = cfg.pause_ms // 20
        self._max_frames = int(cfg.max_segment_s * 1000) // 20
        self._min_frames = max(1, cfg.min_segment_ms // 20)
        self._frames: list[Int16Array] = []  # the open utterance
        self._speech_frames = 0
        self._peak_power = 0.0  # of the open utterance (the energy gate's reference)
        self._gate_ratio = 10 ** (-cfg.energy_gate_db / 10)
        self._silent = 0
        self._since_partial = 0
        self._start = 0
        self._last_speech_end = 0
        self.pos = 0  # media time of the next frame

    @property
    def speaking(self) -> bool:
        return bool(self._frames)

    @property
    def buffered_samples(self) -> int:
        return sum(f.size for f in self._frames) + sum(f.size for f in self._pre)

    def feed(self, frame: Int16Array) -> list[SegmentEvent]:
        """One 20 ms frame of 16 kHz int16 audio."""
        if frame.size != FRAME:
            raise ValueError(f"expected {FRAME} samples (20 ms at 16 kHz), got {frame.size}")
        at = self.pos
        self.pos += FRAME
        speech = self._vad.is_speech(frame.tobytes(), RATE)
        if speech and self.config.energy_gate_db > 0:
            speech = self._loud_enough(frame)
        out: list[SegmentEvent] = []
        if not self._frames:
            self._recent.append(speech)
            self._pre.append(frame)
            if speech and sum(self._recent) >= self._start_frames:
                # Open: the pre-roll (which holds the speech frames that opened it) first.
                self._frames = list(self._pre)
                self._start = at + FRAME - FRAME * len(self._pre)
                self._pre.clear()
                self._recent.clear()
                self._speech_frames = self._start_frames
                self._silent = 0
                self._since_partial = 0
                self._last_speech_end = at + FRAME
            return out
        self._frames.append(frame)
        self._since_partial += 1
        if speech:
            self._speech_frames += 1
            self._silent = 0
            self._last_speech_end = at + FRAME
        else:
            self._silent += 1
            if self._silent == self._pause_frames and self._speech_frames >= self._min_frames:
                out.append(Pause(self._start, self._last_speech_end, self._tail_audio()))
        if self._silent >= self._end_frames:
            out += self._close(cut=False)
        elif len(self._frames) >= self._max_frames:
            out += self._close(cut=True)
        elif self._since_partial >= self._partial_frames and speech:
            # Only while the caller speaks: a caption begun in the trailing silence is a decode
            # running when the turn's own transcript is wanted.
            self._since_partial = 0
            out.append(Partial(self._start, np.concatenate(self._frames)))
        return out

    def flush(self) -> list[SegmentEvent]:
        """The stream ended (the call did): close an open utterance."""
        return self._close(cut=False) if self._frames else []

    def _tail_audio(self, frames: list[Int16Array] | None = None) -> Int16Array:
        """The utterance up to its last speech frame and a short tail: trailing silence
        beyond that is not the caller's."""
        frames = self._frames if frames is None else frames
        keep = (self._last_speech_end - self._start) // FRAME + TAIL_FRAMES
        return np.concatenate(frames[: max(1, keep)])

    def _loud_enough(self, frame: Int16Array) -> bool:
        """Within ``energy_gate_db`` of the loudest speech frame (learnt on this one)."""
        power = float(np.dot(frame.astype(np.float64), frame.astype(np.float64))) / frame.size
        self._peak_power = max(self._peak_power, power)
        return power >= self._peak_power * self._gate_ratio

    def _close(self, *, cut: bool) -> list[SegmentEvent]:
        frames, self._frames = self._frames, []
        speech = self._speech_frames
        self._speech_frames = 0
        self._silent = 0
        self._peak_power = 0.0
        if speech < self._min_frames:
            return []  # a click or a cough
        audio = self._tail_audio(frames)
        end = self._last_speech_end
        if cut:
            # A long monologue goes on: the next utterance starts right here.
            self._frames = []
        return [Final(self._start, end, audio, cut)]
