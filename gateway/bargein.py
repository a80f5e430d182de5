"""Barge-in decision core: caller speech start/stop on decoded inbound audio, echo-aware.

Sans-I/O, synchronous, explicit state.  The gateway feeds two streams on one media clock
(integer sample counts, no wall clock):

* :meth:`BargeInDetector.far_end` — the agent audio exactly as sent (silence frames too);
* :meth:`BargeInDetector.near_end` — the caller audio as received and decoded.

``near_end`` returns :class:`SpeechStarted` / :class:`SpeechStopped` events.  A
``SpeechStarted`` while the agent is playing is the barge-in: the gateway then calls
``Call.interrupt()`` (fade to zero, cancel synthesis).  The decision is taken here; the fade is
not.  :func:`detect` is the one-shot twin (same events for any chunking of the same audio).

Why echo matters
----------------
Line hybrids and speakerphones return the agent's own voice at −10 to −25 dB, 20–250 ms late.
A plain VAD calls that speech, and the agent interrupts itself (pipecat's stock agent does so
within about a second at −15 dB echo).  The gateway knows what it sent, so a received frame
counts as caller speech only when it carries energy that the sent audio cannot explain.

Approach: delay-aware sub-band energy comparison (an echo *gate*, not an echo canceller)
-------------------------------------------------------------------------------------------
Per analysis frame (``frame_ms``; 10 ms default) both streams are reduced to band energies
(a Hann-windowed FFT over the frame and the one before it, summed into ~10 speech bands,
250 Hz–3.8 kHz at 8 kHz).  Then, per near-end frame:

1. **Echo delay**: the per-band log-energy envelopes of near and far are cross-correlated at
   every lag 0..``max_echo_delay_ms`` with exponential forgetting, vectorised over lags and
   bands.  Two correlators run, fast (τ ≈ 0.6 s) and slow (τ ≈ 2.5 s); the delay is *trusted*
   while the slow one peaks clearly and the fast one has not sat at another lag for more than
   0.25 s.  A changed echo path moves the fast peak first, which drops trust until the slow
   one agrees again (measured: trusted again ~1.8 s after a jump).
2. **Echo gain** per band: a tracked quantile (80th percentile, dB domain, near noise
   subtracted) of near/far energy at the trusted lag.  A quantile, not a mean, so the frames
   the gate lets through only nudge it.  :attr:`~BargeInDetector.erl_db` reports it as one
   figure (power average weighted by the agent's long-term spectrum).
3. **Expected echo** per band = far energy (max over the trusted lag ±1 frame) × echo gain,
   plus −20 dB of the total in every band (harmonics from non-linear paths), held with a
   decaying tail for reverberant paths.  While the delay is not trusted (call start, path
   change) the far energy is the max over *all* lags and the gain is at least −6 dB (G.168's
   minimum hybrid ERL): conservative, so a quiet caller over loud echo is missed then, but the
   agent does not interrupt itself.
4. **Evidence**: webrtcvad says speech *and* at least ``min_caller_share`` of the frame's
   energy lies in bands that exceed the expected echo by ``echo_margin_db`` and the near
   noise floor by 9 dB.  Working per band is what keeps double talk detectable: at a given
   instant caller and agent occupy different formant/pitch bands, so the caller shows through
   in some bands even when the full-band levels are close.
5. **Delay-agnostic check**: a frame is *strong* evidence when even the far energy at the
   worst lag (max over all lags × the learnt gain) cannot explain it.  An onset needs at least
   one strong frame.  This is what keeps a sudden change of echo delay (echo arriving where
   none was expected, for the ~1–2 s until the estimate follows) from reading as a caller,
   and it is also why only non-strong frames feed the delay search (echo at a new lag must
   still reach it; a caller's frame must not).
6. **Decision**: a run of evidence frames (gaps up to ``max_gap_ms`` tolerated, because
   double talk makes evidence patchy) reaching ``min_speech_ms`` with a strong frame →
   :class:`SpeechStarted`, the onset at the run's first frame; ``hangover_ms`` without
   evidence → :class:`SpeechStopped`.

Measured on the tests' synthetic calls (Piper agent at −18 dBFS, a higher-pitched caller at
−20 dBFS, echo through a dispersive hybrid + reverberant path and G.711, −60 dBFS line noise):
no false start in 160 s of echo at −10/−15/−20/−25 dB × 20/60/120/250 ms delay, nor across
delay jumps; 48/48 double-talk onsets found, onset→decision p50 68 ms / p95 91 ms; caller
alone: onset estimate within 30 ms, decision at onset + 60 ms.  About 85 µs of CPU per 10 ms
frame (far + near, numpy), i.e. < 1 % of a core per call.

Why not an NLMS echo canceller + VAD on the residual?  A 300 ms tail at 8 kHz is 2,400 taps;
sample-by-sample NLMS is out of reach in Python (~40 M MAC/s per call) and a block
frequency-domain canceller is a sizeable component with its own hazards: it needs 0.5–2 s of
far-end speech to converge, diverges under double talk unless a double-talk detector freezes
it (which is this energy comparison again), and the non-linear parts of real echo paths (two
G.711 passes, AGC, speakerphone compression, clock drift between legs) cap its ERLE at
~15–20 dB, so the residual still needs a gate.  The energy gate costs tens of microseconds
per frame, is immune to phase, codec non-linearity and small clock drift, and has no
divergence mode.  What it gives up: a caller much quieter than the echo in every band is not
heard until the agent pauses (a canceller could, in principle, dig them out); detection is
conservative until the delay is trusted (about 1 s of agent speech); and a sudden rise of the
echo gain by ≥ 6 dB (handset switched to speakerphone) can cause one false start before the
gain tracker follows (~1 s), as can a strongly non-linear path (a clipping speakerphone puts
harmonics where the sent audio had none).

Stream alignment: far sample ``i`` is the sample sent at media time ``i`` (or at
``at_sample + j`` when given); near ``pcm[j]`` was received at ``now_samples + j``.  Any fixed
offset between the legs (jitter buffer, packetisation) is simply part of the echo delay, so
it must stay within ``max_echo_delay_ms``.  Feed ``far_end`` for a tick before ``near_end``
for the same tick; far audio not yet fed counts as silence.  Far may run ahead of near by at
most ``_FAR_AHEAD_FRAMES`` frames.  Gaps in either stream are filled with silence; audio for
samples already covered is ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import webrtcvad

Int16Array = npt.NDArray[np.int16]
FloatArray = npt.NDArray[np.float64]

VAD_RATES = (8000, 16000, 32000, 48000)

# Band edges in Hz.  Narrowband speech sits in 250 Hz–3.8 kHz; on wideband legs the bands go
# on to 7.6 kHz (above that there is little speech energy and less echo information).
_NB_EDGES = (250.0, 450.0, 700.0, 950.0, 1250.0, 1600.0, 2000.0, 2450.0, 2950.0, 3400.0, 3800.0)
_WB_EDGES = (4400.0, 5200.0, 6200.0, 7600.0)

_FLOOR = 1e-10  # band energy floor (-100 dB), keeps logs finite
_LOG_FLOOR_DB = -75.0  # envelopes are clipped here so silence/noise is one flat value
_FAR_ACTIVE_DB = -60.0  # far frame counts as "agent audio playing" above this (full band)
_GAIN_PRIOR_DB = -6.0  # G.168's minimum hybrid ERL: echo is at least 6 dB below what was sent
_GAIN_QUANTILE = 0.8
_NOISE_MARGIN_DB = 9.0  # a band must beat the near noise floor by this much to count as caller
_NOISE_RISE_DB_PER_S = 3.0  # minimum-statistics noise floor: follows drops at once, rises slowly
_TAIL_DECAY_DB_PER_MS = 0.3  # expected-echo hold-over for reverberant paths (T60 ≈ 200 ms)
_FAST_TAU_S = 0.6
_SLOW_TAU_S = 2.5
_MIN_CORR = 0.35  # delay trusted only above this normalised correlation (both correlators)
_MIN_TRAIN_S = 0.8  # ... and after this much far-active audio
_MAX_DISAGREE_S = 0.25  # fast and slow correlators apart this long: delay no longer trusted
_GAIN_SNR_DB = 15.0  # echo gain learnt only in bands where far is this far above near noise
_FAR_AHEAD_FRAMES = 100  # far may run this far ahead of near before its history is overwritten
_LEAK_DB = -20.0  # share of the total expected echo every band expects (non-linear paths)
_LEAK = 10.0 ** (_LEAK_DB / 10.0)


@dataclass(frozen=True, slots=True)
class BargeInConfig:
    """Detector settings.

    ``aggressiveness``: webrtcvad mode 0 (least) – 3 (most aggressive at rejecting non-speech).
    ``min_speech_ms``: evidence needed from the estimated onset to the decision (lower reacts
    sooner; 60 ms keeps onset→silence within ~120 ms at p95 with a 20 ms control path and a
    10 ms fade).  ``hangover_ms``: non-speech after which speech is declared stopped.
    ``echo_margin_db``: how far a band must exceed the expected echo to count as caller.
    ``max_echo_delay_ms``: longest echo path delay searched (includes any fixed leg offset).
    ``max_gap_ms``: evidence gaps tolerated inside one onset run (double talk is patchy).
    ``min_caller_share``: fraction of a frame's energy that must be unexplained by echo.
    """

    aggressiveness: int = 2
    min_speech_ms: int = 60
    hangover_ms: int = 300
    echo_margin_db: float = 6.0
    max_echo_delay_ms: int = 300
    rate: int = 8000
    frame_ms: int = 10
    max_gap_ms: int = 30
    min_caller_share: float = 0.3

    def __post_init__(self) -> None:
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness must be 0..3, got {self.aggressiveness}")
        if self.rate not in VAD_RATES:
            raise ValueError(f"rate must be one of {VAD_RATES}, got {self.rate}")
        if self.frame_ms not in (10, 20, 30):
            raise ValueError(f"frame_ms must be 10, 20 or 30, got {self.frame_ms}")
        if self.min_speech_ms < 0 or self.hangover_ms < 0 or self.max_gap_ms < 0:
            raise ValueError("min_speech_ms, hangover_ms and max_gap_ms must be >= 0")
        if not 0 <= self.max_echo_delay_ms <= 1000:
            raise ValueError(f"max_echo_delay_ms must be 0..1000, got {self.max_echo_delay_ms}")
        if not 0.0 < self.min_caller_share <= 1.0:
            raise ValueError(f"min_caller_share must be in (0, 1], got {self.min_caller_share}")

    @property
    def frame_samples(self) -> int:
        return self.rate * self.frame_ms // 1000


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Caller speech confirmed.  ``onset_sample``: media time where the caller's speech began
    (start of the first evidence frame); ``decision_sample``: media time at which it was
    confirmed (end of the frame that confirmed it).  onset→decision is the detection delay."""

    onset_sample: int
    decision_sample: int

    def __post_init__(self) -> None:
        if self.decision_sample < self.onset_sample:
            raise ValueError("decision_sample must not precede onset_sample")


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """Caller speech ended.  ``end_sample``: end of the last evidence frame;
    ``decision_sample``: end of the frame that completed the hangover."""

    end_sample: int
    decision_sample: int

    def __post_init__(self) -> None:
        if self.decision_sample < self.end_sample:
            raise ValueError("decision_sample must not precede end_sample")


VadEvent = SpeechStarted | SpeechStopped


class _Analyzer:
    """Band energies of consecutive frames: Hann window over the previous + current frame.

    The two-frame window gives 50 Hz bins at 8 kHz / 10 ms without adding latency (it looks
    back, not ahead).  Energies are scaled so that the band sum of a white signal approximates
    its mean square (full scale 1.0), which keeps the absolute thresholds in dBFS terms.
    """

    def __init__(self, rate: int, frame: int) -> None:
        n = 2 * frame
        self._prev = np.zeros(frame, dtype=np.float64)
        self._window = np.hanning(n + 2)[1:-1]
        freqs = np.fft.rfftfreq(n, 1.0 / rate)
        edges = list(_NB_EDGES) + ([e for e in _WB_EDGES if e < rate / 2] if rate > 8000 else [])
        bands = np.zeros((freqs.size, len(edges) - 1), dtype=np.float64)
        for b in range(len(edges) - 1):
            bands[(freqs >= edges[b]) & (freqs < edges[b + 1]), b] = 1.0
        # rfft of a window-weighted signal: sum |X|^2 over all bins (one-sided, doubled) equals
        # n * sum((x*w)^2); dividing by n * sum(w^2) gives the window-weighted mean square.
        self._bands = bands * (2.0 / (n * float(np.sum(self._window**2))))

    @property
    def n_bands(self) -> int:
        return int(self._bands.shape[1])

    def process(self, frame: FloatArray) -> FloatArray:
        x = np.concatenate((self._prev, frame))
        self._prev = frame
        spec = np.fft.rfft(x * self._window)
        power = spec.real**2 + spec.imag**2
        out: FloatArray = power @ self._bands
        return np.maximum(out, _FLOOR)


class _Framer:
    """Cuts a stream into fixed frames at media-time multiples of ``frame``.

    Gaps are filled with zeros; samples before the stream's current position are dropped.
    The first call starts the stream at its own start sample, padded back to the frame
    boundary, so framing never depends on how the audio was chunked.
    """

    def __init__(self, frame: int) -> None:
        self.frame = frame
        self.pos: int | None = None  # media time of the next sample expected
        self._buf = np.zeros(frame, dtype=np.int16)
        self._fill = 0

    def push(self, pcm: npt.ArrayLike, start: int | None) -> list[tuple[int, Int16Array]]:
        x = np.asarray(pcm)
        if x.dtype != np.int16:
            raise TypeError(f"expected int16 samples, got {x.dtype}")
        x = x.reshape(-1)
        if self.pos is None:
            first = 0 if start is None else start
            self.pos = first - first % self.frame
            self._fill = 0
        if start is None:
            start = self.pos
        out: list[tuple[int, Int16Array]] = []
        if start > self.pos:  # gap: silence up to the new start
            out += self._feed(np.zeros(start - self.pos, dtype=np.int16))
        elif start < self.pos:  # overlap: drop what is already covered
            x = x[self.pos - start :]
        if x.size:
            out += self._feed(x)
        return out

    def reset_partial(self) -> None:
        """Drop a partly filled frame (the stream jumps ahead)."""
        self._fill = 0

    def _feed(self, x: Int16Array) -> list[tuple[int, Int16Array]]:
        assert self.pos is not None
        out: list[tuple[int, Int16Array]] = []
        frame = self.frame
        i = 0
        if self._fill:
            take = min(frame - self._fill, x.size)
            self._buf[self._fill : self._fill + take] = x[:take]
            self._fill += take
            i = take
            if self._fill == frame:
                out.append((self.pos + i - frame, self._buf.copy()))
                self._fill = 0
        while x.size - i >= frame:
            out.append((self.pos + i, x[i : i + frame].copy()))
            i += frame
        rest = x.size - i
        if rest:
            self._buf[:rest] = x[i:]
            self._fill = rest
        self.pos += x.size
        return out


class BargeInDetector:
    """Streaming echo-aware VAD for one call leg.  See the module docstring for the method."""

    def __init__(self, config: BargeInConfig | None = None) -> None:
        self.config = cfg = config if config is not None else BargeInConfig()
        self._frame = frame = cfg.frame_samples
        self._vad = webrtcvad.Vad(cfg.aggressiveness)
        self._far_framer = _Framer(frame)
        self._near_framer = _Framer(frame)
        self._far_an = _Analyzer(cfg.rate, frame)
        self._near_an = _Analyzer(cfg.rate, frame)
        nb = self._far_an.n_bands
        fps = 1000.0 / cfg.frame_ms
        self._lags = max(1, round(cfg.max_echo_delay_ms / cfg.frame_ms)) + 1  # lags 0..K
        self._ring = self._lags + _FAR_AHEAD_FRAMES + 2
        # Far history, indexed by absolute frame number modulo the ring size.
        self._far_e = np.zeros((self._ring, nb))  # band energies
        self._far_dev = np.zeros((self._ring, nb))  # log-envelope minus its running mean
        self._far_active = np.zeros(self._ring, dtype=bool)
        self._far_idx = np.full(self._ring, -1, dtype=np.int64)  # which frame sits in a slot
        self._far_mean = np.full(nb, _LOG_FLOOR_DB)
        self._near_mean = np.full(nb, _LOG_FLOOR_DB)
        # Delay correlators: [fast, slow] x lag.
        self._lam = np.array([math.exp(-1.0 / (t * fps)) for t in (_FAST_TAU_S, _SLOW_TAU_S)])
        self._sxy = np.zeros((2, self._lags))
        self._sxx = np.zeros((2, self._lags))
        self._syy = np.zeros(2)
        self._train_frames = 0
        self._min_train = round(_MIN_TRAIN_S * fps)
        self._delay: int | None = None  # trusted lag in frames
        self._disagree = 0
        self._max_disagree = round(_MAX_DISAGREE_S * fps)
        self._gain_db = np.full(nb, _GAIN_PRIOR_DB)
        self._gain_updates = 0
        self._noise = np.full(nb, _FLOOR)
        self._noise_init = False
        self._noise_rise = 10.0 ** (_NOISE_RISE_DB_PER_S / fps / 10.0)
        self._tail = np.zeros(nb)
        self._tail_decay = 10.0 ** (-_TAIL_DECAY_DB_PER_MS * cfg.frame_ms / 10.0)
        self._margin = 10.0 ** (cfg.echo_margin_db / 10.0)
        self._noise_margin = 10.0 ** (_NOISE_MARGIN_DB / 10.0)
        self._gain_snr = 10.0 ** (_GAIN_SNR_DB / 10.0)
        self._need = max(1, math.ceil(cfg.min_speech_ms / cfg.frame_ms))
        self._max_gap = cfg.max_gap_ms // cfg.frame_ms
        self._hang = max(1, math.ceil(cfg.hangover_ms / cfg.frame_ms))
        # Decision state.
        self._speaking = False
        self._run_onset = -1  # media time of the pending run's first evidence frame; -1: none
        self._run_count = 0
        self._run_gap = 0
        self._run_strong = False
        self._last_speech_end = 0
        self._silent_frames = 0
        # Last frame's internals: diagnostics for metrics and tuning, not a stable interface.
        self.last_caller_share = 0.0
        self.last_vad = False

    # -- public state -------------------------------------------------------------------------

    @property
    def speaking(self) -> bool:
        """True between a :class:`SpeechStarted` and the following :class:`SpeechStopped`."""
        return self._speaking

    @property
    def echo_delay_ms(self) -> float | None:
        """Trusted echo path delay (frame resolution), or None while not trusted."""
        return None if self._delay is None else float(self._delay * self.config.frame_ms)

    @property
    def erl_db(self) -> float | None:
        """Estimated echo return loss (dB, positive = echo below what was sent): the learnt
        band gains averaged in power, weighted by the agent's long-term spectrum; None before
        any gain has been learnt at a trusted delay."""
        if self._gain_updates == 0:
            return None
        w = 10.0 ** (self._far_mean / 10.0)
        g = 10.0 ** (self._gain_db / 10.0)
        return float(-10.0 * math.log10(float(w @ g) / float(np.sum(w))))

    @property
    def idle(self) -> bool:
        """No caller speech in progress and no onset pending: safe to ``skip_to``."""
        return not self._speaking and self._run_onset < 0

    def skip_to(self, sample: int) -> None:
        """Advance both streams to media time ``sample`` without analysing the gap.

        For a caller leg known to be quiet while the agent is silent (most of a call's idle
        time): the learnt echo path, gains and noise floor are kept as they are, and far frames
        in the gap read as silence later (the ring checks frame numbers). Only while ``idle``.
        """
        if not self.idle:
            raise RuntimeError("skip_to while caller speech is in progress")
        aligned = sample - sample % self._frame
        for framer in (self._far_framer, self._near_framer):
            if framer.pos is None or framer.pos < aligned:
                framer.pos = aligned
                framer.reset_partial()

    # -- streams -----------------------------------------------------------------------------

    def far_end(self, pcm: npt.ArrayLike, at_sample: int | None = None) -> None:
        """Agent audio as sent (int16, any length), in send order, silence included.

        ``at_sample``: media time of ``pcm[0]``; None continues where the last call ended
        (the first call then starts at 0).
        """
        for start, frame in self._far_framer.push(pcm, at_sample):
            self._add_far(start // self._frame, frame)

    def near_end(self, pcm: npt.ArrayLike, now_samples: int) -> list[VadEvent]:
        """Caller audio as received and decoded (int16, any length); ``now_samples`` is the
        media time of ``pcm[0]``.  Returns the events of every frame completed by it."""
        events: list[VadEvent] = []
        for start, frame in self._near_framer.push(pcm, now_samples):
            ev = self._near_frame(start, frame)
            if ev is not None:
                events.append(ev)
        return events

    # -- internals ---------------------------------------------------------------------------

    def _add_far(self, idx: int, frame: Int16Array) -> None:
        e = self._far_an.process(frame.astype(np.float64) / 32768.0)
        log_e = np.maximum(10.0 * np.log10(e), _LOG_FLOOR_DB)
        # Mean removal at arrival time, from far data only: the stored deviation then does not
        # depend on how far and near calls interleave.
        self._far_mean += (1.0 - self._lam[1]) * (log_e - self._far_mean)
        slot = idx % self._ring
        self._far_e[slot] = e
        self._far_dev[slot] = log_e - self._far_mean
        self._far_active[slot] = 10.0 * math.log10(float(np.sum(e))) > _FAR_ACTIVE_DB
        self._far_idx[slot] = idx

    def _far_window(self, idx: int) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Far energies/deviations/activity for frames idx, idx-1, ..., idx-K (lag order);
        frames not (or no longer) held read as silence."""
        want = idx - np.arange(self._lags)
        slots = want % self._ring
        held = self._far_idx[slots] == want
        e = np.where(held[:, None], self._far_e[slots], _FLOOR)
        dev = np.where(held[:, None], self._far_dev[slots], 0.0)
        active = held & self._far_active[slots]
        return e, dev, active

    def _near_frame(self, start: int, frame: Int16Array) -> VadEvent | None:
        idx = start // self._frame
        x = frame.astype(np.float64) / 32768.0
        e = self._near_an.process(x)
        far_e, far_dev, far_active = self._far_window(idx)
        any_far = bool(far_active.any())

        # Near noise floor (minimum statistics): drops at once, rises a few dB per second.
        if not self._noise_init:
            # Start from the first frame.  webrtcvad flags the first frames of plain noise as
            # speech (its own noise model starts unadapted), so the floor must be right from
            # the start; if the stream opens with speech, the floor falls to the first dip.
            self._noise = e.copy()
            self._noise_init = True
        else:
            self._noise = np.minimum(self._noise * self._noise_rise, e)

        # Expected echo per band, at the trusted delay; while the delay is not trusted, the
        # loudest far frame at any lag with at least the prior gain (conservative).
        vad = self._vad.is_speech(frame.tobytes(), self.config.rate)
        ref_any = far_e.max(axis=0)
        if self._delay is not None:
            d = self._delay
            lo, hi = max(d - 1, 0), min(d + 2, self._lags)
            gain = 10.0 ** (self._gain_db / 10.0)
            expected = self._with_tail(far_e[lo:hi].max(axis=0) * gain)
            share = self._caller_share(e, expected)
            # Delay-agnostic check: could the agent's audio at *any* lag in range explain this
            # frame?  An onset must contain at least one frame where it cannot; otherwise a
            # sudden change of echo delay (echo arriving where none was expected) would read
            # as a caller until the correlators catch up (~0.5 s).
            strong = self._caller_share(e, np.maximum(ref_any * gain, self._tail))
            self._tail = expected
        else:
            gain = 10.0 ** (np.maximum(self._gain_db, _GAIN_PRIOR_DB) / 10.0)
            expected = self._with_tail(ref_any * gain)
            share = self._caller_share(e, expected)
            strong = share
            self._tail = expected
        self.last_caller_share = share
        self.last_vad = vad
        candidate = share >= self.config.min_caller_share
        evidence = vad and candidate
        strong_evidence = evidence and strong >= self.config.min_caller_share

        # Learn the echo path only from frames that look like echo: a caller frame would blur
        # the delay correlation and inflate the echo gain.  The delay search skips only frames
        # that no lag can explain; echo that moved to another lag must still feed it, or a
        # changed path would freeze the very estimate that has to follow it.  The gain, which
        # is tied to the trusted lag, learns only from frames explained at that lag.  (Neither
        # is gated on the speaking state: a false start must not freeze its own cure.)
        if any_far and strong < self.config.min_caller_share:
            self._update_delay(e, far_dev)
        if any_far and not candidate and self._delay is not None:
            d = self._delay
            lo, hi = max(d - 1, 0), min(d + 2, self._lags)
            if bool(far_active[lo:hi].any()):
                self._update_gain(e, far_e[lo:hi].max(axis=0))
        return self._decide(evidence, strong_evidence, start, start + self._frame)

    def _with_tail(self, expected: FloatArray) -> FloatArray:
        # Non-linear echo paths (overdriven speakerphones, compressors) put harmonics of a loud
        # band into others: every band expects a small share of the total echo as well.  The
        # decaying tail covers reverberation longer than the ±1 frame delay window.
        spread = expected + _LEAK * float(np.sum(expected))
        out: FloatArray = np.maximum(spread, self._tail * self._tail_decay)
        return out

    def _caller_share(self, e: FloatArray, expected: FloatArray) -> float:
        """Fraction of the frame's energy in bands the expected echo and noise cannot explain."""
        caller_band = e > self._margin * expected + self._noise_margin * self._noise
        total = float(np.sum(e))
        return float(np.sum(e[caller_band])) / total if total > 0.0 else 0.0

    def _update_delay(self, e: FloatArray, far_dev: FloatArray) -> None:
        log_e = np.maximum(10.0 * np.log10(e), _LOG_FLOOR_DB)
        self._near_mean += (1.0 - self._lam[1]) * (log_e - self._near_mean)
        y = log_e - self._near_mean
        lam = self._lam[:, None]
        self._sxy = lam * self._sxy + (1.0 - lam) * (far_dev @ y)[None, :]
        self._sxx = lam * self._sxx + (1.0 - lam) * np.sum(far_dev**2, axis=1)[None, :]
        self._syy = self._lam * self._syy + (1.0 - self._lam) * float(y @ y)
        self._train_frames += 1
        corr = self._sxy / np.sqrt(self._sxx * self._syy[:, None] + 1e-12)
        fast, slow = int(np.argmax(corr[0])), int(np.argmax(corr[1]))
        # The fast correlator moves first when the echo path changes; a short disagreement
        # (a burst of double talk the evidence gate let through) must not drop trust, a
        # sustained one must.
        self._disagree = 0 if abs(fast - slow) <= 1 else self._disagree + 1
        trusted = (
            self._train_frames >= self._min_train
            and corr[1, slow] >= _MIN_CORR
            and self._disagree < self._max_disagree
            and (self._delay is not None or corr[0, fast] >= _MIN_CORR)
        )
        self._delay = slow if trusted else None

    def _update_gain(self, e: FloatArray, ref: FloatArray) -> None:
        # Quantile tracking in dB (stochastic gradient on the pinball loss): converges to the
        # 90th percentile of near/far ratios; large steps early, fine steps once settled.
        # Noise is subtracted (the floor is a minimum, so twice it is about the mean) and only
        # bands whose far energy clearly dominates the near noise count: otherwise a weak echo
        # reads as "echo gain = noise / far", far too high.
        echo = np.maximum(e - 2.0 * self._noise, _FLOOR)
        ratio_db = np.clip(10.0 * np.log10(echo / ref), -60.0, 20.0)
        useful = ref > self._gain_snr * self._noise
        self._gain_updates += 1
        step = max(0.25, 3.0 / math.sqrt(self._gain_updates))
        delta = np.where(ratio_db > self._gain_db, _GAIN_QUANTILE, _GAIN_QUANTILE - 1.0)
        self._gain_db = np.where(useful, self._gain_db + step * delta, self._gain_db)

    def _decide(self, evidence: bool, strong: bool, start: int, end: int) -> VadEvent | None:
        if self._speaking:
            if evidence:
                self._last_speech_end = end
                self._silent_frames = 0
                return None
            self._silent_frames += 1
            if self._silent_frames >= self._hang:
                self._speaking = False
                self._run_onset = -1
                return SpeechStopped(self._last_speech_end, end)
            return None
        if evidence:
            if self._run_onset < 0:
                self._run_onset, self._run_count, self._run_strong = start, 0, False
            self._run_count += 1
            self._run_gap = 0
            self._run_strong = self._run_strong or strong
            if self._run_count >= self._need and self._run_strong:
                self._speaking = True
                self._last_speech_end = end
                self._silent_frames = 0
                return SpeechStarted(self._run_onset, end)
        elif self._run_onset >= 0:
            self._run_gap += 1
            if self._run_gap > self._max_gap:
                self._run_onset = -1
        return None


def detect(
    near: npt.ArrayLike,
    far: npt.ArrayLike,
    config: BargeInConfig | None = None,
) -> list[VadEvent]:
    """One-shot twin of :class:`BargeInDetector`: ``near`` and ``far`` int16 on the same media
    clock starting at sample 0 (far is what was sent at those times; a shorter far reads as
    silence after its end).  Equals streaming the same audio in any chunking."""
    det = BargeInDetector(config)
    n = np.asarray(near).reshape(-1)
    f = np.asarray(far).reshape(-1)
    frame = det.config.frame_samples
    events: list[VadEvent] = []
    for s in range(0, n.size, frame):
        e = min(s + frame, n.size)
        if s < f.size:
            det.far_end(f[s : min(e, f.size)], at_sample=s)
        events += det.near_end(n[s:e], s)
    return events
