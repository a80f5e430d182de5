"""What AMD's word rule hears: the caller's 8 kHz audio cut into utterances to recognise, one
recognition at a time (sans-I/O; the live adapter is :class:`gateway.amd.oncall.AmdOnCall`, the
offline one :func:`gateway.amd.offline.classify`).

jambonz's ``amd`` verb decides on the words as the recogniser reports them, partial results
included, so a long greeting is called a machine while it is still being spoken. Here the
caller's audio is upsampled to 16 kHz and cut by the project's :class:`SpeechSegmenter`
(webrtcvad): a :class:`Partial` of the utterance so far every ``PARTIAL_EVERY_MS`` while the
caller speaks, a :class:`Final` after ``MIN_SILENCE_MS`` of non-speech. Only one recognition runs
at a time; while it runs, only the newest partial waits (an older one is moot), and a final
makes waiting partials moot. The caller of :meth:`AmdEars.feed` starts what it returns and
calls :meth:`AmdEars.done` when the recognition ends; :meth:`AmdEars.close` stops the hearing
for good (the detector no longer needs words).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dsp.pcm import float_to_s16
from dsp.resample import Resampler
from gateway.stt.base import STT_RATE, FloatArray
from gateway.stt.segmenter import FRAME as FRAME_16K
from gateway.stt.segmenter import Final, Partial, SegmenterConfig, SpeechSegmenter

Int16Array = npt.NDArray[np.int16]

# A greeting's sentences are often 300-600 ms apart; a final transcript of the first sentence
# alone is short, and a short final counts as a person for the word rule (jambonz's rule). So
# an utterance ends only after the heuristic's own ``after_greeting_silence`` (800 ms): the
# pause app_amd takes for the end of a person's greeting.
MIN_SILENCE_MS = 800
# Partials as in the agent's hearing (gateway.agents.hearing.PARTIAL_EVERY_MS): ~150 ms of
# recogniser time for a second of speech on this CPU, only while the caller speaks.
PARTIAL_EVERY_MS = 1000


def amd_segmenter_config() -> SegmenterConfig:
    return SegmenterConfig(
        min_silence_ms=MIN_SILENCE_MS, partial_every_ms=PARTIAL_EVERY_MS, max_segment_s=15.0
    )


@dataclass(frozen=True, slots=True)
class Utterance:
    """Audio to recognise: 16 kHz float32 for :class:`~gateway.stt.base.SpeechToText`; times
    in ms of media time since the answer."""

    final: bool
    start_ms: int
    end_ms: int  # the end of the audio it holds
    audio: FloatArray


class AmdEars:
    """Caller frames in, utterances to recognise out (see the module docstring)."""

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.segmenter = SpeechSegmenter(config or amd_segmenter_config())
        # 8 → 16 kHz keeping the telephone band (as CallerAudioTap's own 16 kHz taps do).
        self._up = Resampler.for_rates(8000, STT_RATE, pass_hz=3600.0, stop_hz=4000.0)
        self._buf = np.zeros(0, np.int16)
        self._waiting: list[Utterance] = []
        self.busy = False  # a recognition is running
        self.closed = False
        self.submitted = 0  # recognitions started (finals + partials)

    def feed(self, frame: Int16Array) -> Utterance | None:
        """Caller audio at 8 kHz (any length); returns an utterance to recognise now, when
        none is running and one is waiting."""
        if self.closed:
            return None
        up = float_to_s16(self._up.process_f64(np.asarray(frame, np.float64) / 32768.0))
        buf = np.concatenate((self._buf, up)) if self._buf.size else up
        n = buf.size // FRAME_16K * FRAME_16K
        for i in range(0, n, FRAME_16K):
            for ev in self.segmenter.feed(buf[i : i + FRAME_16K]):
                if isinstance(ev, Final):
                    self._queue(Utterance(True, _ms(ev.start), _ms(ev.end), _float(ev.audio)))
                elif isinstance(ev, Partial):
                    end = ev.start + ev.audio.size
                    self._queue(Utterance(False, _ms(ev.start), _ms(end), _float(ev.audio)))
        self._buf = buf[n:].copy()
        return self._next()

    def done(self) -> Utterance | None:
        """The running recognition ended: the next utterance to recognise, if one waits."""
        self.busy = False
        return self._next()

    def close(self) -> None:
        """No more hearing: what waits is dropped, nothing more is returned."""
        self.closed = True
        self._waiting.clear()
        self._buf = np.zeros(0, np.int16)

    def _queue(self, u: Utterance) -> None:
        # Only the newest partial is worth recognising; a final makes waiting partials moot.
        self._waiting = [w for w in self._waiting if w.final]
        self._waiting.append(u)

    def _next(self) -> Utterance | None:
        if self.busy or self.closed or not self._waiting:
            return None
        self.busy = True
        self.submitted += 1
        return self._waiting.pop(0)


def _ms(samples_16k: int) -> int:
    return samples_16k * 1000 // STT_RATE


def _float(audio: Int16Array) -> FloatArray:
    out: FloatArray = audio.astype(np.float32) / np.float32(32768.0)
    return out
