"""Barge-in decision core: caller speech start/stop on decoded inbound audio, echo-aware.

Sans-I/O, synchronous, explicit state.  The gateway feeds two streams on one media clock
(integer sample counts, no wall clock):

* :meth:`BargeInDetector.far_end` — the agent audio exactly as sent (silence frames too);
* :meth:`BargeInDetector.near_end` — the caller audio as received and decoded.

``near_end`` returns :class:`VoiceStarted` / :class:`VoiceStopped` events.  A
``VoiceStarted`` while the agent is playing is the barge-in: the gateway then calls
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
   decaying tail for reverberant paths.  While the delay is not trusted (call start, no echo at
   all, path change) the expected echo comes from the **echo ceilings**: per lag and band the
   smallest near/far energy ratio seen (near noise removed; far taken as the quietest of the
   lag and its two neighbours, so a delay between frames or a dispersive path cannot pull it
   below the true gain), floored at −25 dB, +6 dB headroom, at most the −6 dB prior (G.168's
   minimum hybrid ERL), rising 2 dB per second of agent audio so a path may get louder.  For
   the true lag every frame's ratio is at least the echo gain (the caller and noise only add),
   so the minimum bounds it whatever the delay; expected = max over lags of (loudest far of
   the lag ±1) × ceiling.  A few syllables of agent speech pull the ceilings of the lags
   without echo to the floor, so the caller is heard ~0.5 s into the agent's turn, and on an
   echo-free line at all, instead of only after the delay is trusted (before: a caller had to
   beat the agent's loudest frame of the last 300 ms, and a weak first syllable was missed).
   Once trusted, the smaller of the learnt and the ceiling expectation is used (the learnt
   gain starts from the ceilings, then converges as a quantile).
4. **Evidence**: webrtcvad says speech *and* at least ``min_caller_share`` of the frame's
   energy lies in bands that exceed the expected echo by ``echo_margin_db`` and the near
   noise floor by 9 dB.  Working per band is what keeps double talk detectable: at a given
   instant caller and agent occupy different formant/pitch bands, so the caller shows through
   in some bands even when the full-band levels are close.
5. **Delay-agnostic check**: a frame is *strong* evidence when even the far energy at the
   worst lag (max over all lags × the learnt gain; before any gain was learnt, × the largest
   ceiling of any lag) cannot explain it.  An onset needs at least
   one strong frame.  This is what keeps a sudden change of echo delay (echo arriving where
   none was expected, for the ~1–2 s until the estimate follows) from reading as a caller,
   and it is also why only non-strong frames feed the delay search (echo at a new lag must
   still reach it; a caller's frame must not).
6. **Decision**: a run of evidence frames (gaps up to ``max_gap_ms`` tolerated without losing
   what was gathered: double talk makes evidence patchy, and "Ex-cuse" has a 40 ms consonant
   gap) reaching ``min_speech_ms`` with a strong frame → :class:`VoiceStarted`, the onset at
   the run's first frame.  *Clear* frames (the caller share met ``clear_margin_db`` above the
   expected echo) count ``min_speech_ms / fast_speech_ms`` times, so clear evidence decides
   after ``fast_speech_ms`` (40 ms): a short loud first syllable is enough.  ``hangover_ms``
   without evidence → :class:`VoiceStopped`.

Measured on the tests' synthetic calls (Piper agent at −18 dBFS, a higher-pitched caller at
−20 dBFS, echo through a dispersive hybrid + reverberant path and G.711, −60 dBFS line noise):
no false start in 160 s of echo at −10/−15/−20/−25 dB × 20/60/120/250 ms delay, nor in 240 s
from the turn's first sample at delays off the frame grid, nor across delay jumps; 48/48
double-talk onsets found, onset→decision p50 50 ms / p95 80 ms (10 ms frames); callers 0.4–1.5
s into the agent's turn: p95 110–125 ms; caller alone: onset estimate within 30 ms.

CPU: the state of many detectors lives in one :class:`DetectorBank` and :func:`run_batch` runs
a step for all of them at once, so numpy's per-call overhead (most of the cost: ~100 small
operations per frame) is paid once per batch.  Measured on a 2-core EPYC at 20 ms frames, far
+ near with echo: ~30 µs per call and frame in batches of 50, ~50 µs in batches of 10, against
~130 µs for the per-call detector this replaced; a batch of one costs ~400 µs (the gathers and
masks a batch needs), so a lone call pays more than it used to (2 % of a core instead of 0.6 %).

Limits: in the first ~0.5 s of the agent's turn the ceilings are still near the prior, so a
caller who says one short syllable then pauses ("Wait, … stop") is heard on the second one
then; a sudden rise of the echo gain (see below) and echo appearing at above −13 dB on a line
that had none can each cause a false start.

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

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import webrtcvad

try:  # webrtcvad's C entry point: is_speech() is a Python wrapper around it (length checks)
    import _webrtcvad
except ImportError:  # pragma: no cover - every webrtcvad(-wheels) release ships it
    _webrtcvad = None

from voxgate.contract.config import BargeinSettings

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
# Echo ceilings (while no delay is trusted): per lag and band, the smallest near/far energy ratio
# seen.  For the true echo lag every frame's ratio is at least the echo gain (the caller and
# noise only add), so the minimum bounds it from above whatever the delay turns out to be.
_CEIL_MIN_FAR_DB = -55.0  # far band energy must exceed this for a frame to lower a ceiling
_CEIL_FLOOR_DB = -25.0  # ceilings never claim an echo return loss above 25 dB
_CEIL_HEADROOM_DB = 6.0  # added to the observed bound (estimation noise, mild non-linearity)
# Each lag's ceiling covers the lags within this distance: a delay between frames, dispersion,
# and an echo delay that wanders with network jitter (the echo comes back over the network).
_CEIL_SPREAD_MS = 20
# The ceilings (and the delay-agnostic check) look this much further back than the delay search:
# echo from just beyond ``max_echo_delay_ms`` (a leg offset that grew under load) must not read
# as "no echo at any lag".
_CEIL_EXTRA_MS = 100
_CEIL_RISE_DB_PER_S = 2.0  # forgetting (per second of agent audio): a path may get louder


@dataclass(frozen=True, slots=True)
class BargeInConfig:
    """Detector settings.

    ``aggressiveness``: webrtcvad mode 0 (least) – 3 (most aggressive at rejecting non-speech).
    ``min_speech_ms``: evidence needed from the estimated onset to the decision (lower reacts
    sooner; 60 ms keeps onset→silence within ~120 ms at p95 with a 20 ms control path and a
    10 ms fade).  ``hangover_ms``: non-speech after which speech is declared stopped.
    ``echo_margin_db``: how far a band must exceed the expected echo to count as caller.
    ``max_echo_delay_ms``: longest echo path delay searched (includes any fixed leg offset).
    ``max_gap_ms``: evidence gaps tolerated inside one onset run (double talk is patchy;
    consonant clusters between a short first syllable and the next one).
    ``min_caller_share``: fraction of a frame's energy that must be unexplained by echo.
    ``clear_margin_db``: a frame whose caller share clears the expected echo by this much is
    *clear* evidence; ``fast_speech_ms`` of clear evidence decides (instead of min_speech_ms).
    """

    aggressiveness: int = 2
    min_speech_ms: int = 60
    hangover_ms: int = 300
    echo_margin_db: float = 6.0
    max_echo_delay_ms: int = 300
    rate: int = 8000
    frame_ms: int = 10
    max_gap_ms: int = 60
    min_caller_share: float = 0.3
    clear_margin_db: float = 12.0
    fast_speech_ms: int = 40

    def __post_init__(self) -> None:
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness must be 0..3, got {self.aggressiveness}")
        if self.rate not in VAD_RATES:
            raise ValueError(f"rate must be one of {VAD_RATES}, got {self.rate}")
        if self.frame_ms not in (10, 20, 30):
            raise ValueError(f"frame_ms must be 10, 20 or 30, got {self.frame_ms}")
        if self.min_speech_ms < 0 or self.hangover_ms < 0 or self.max_gap_ms < 0:
            raise ValueError("min_speech_ms, hangover_ms and max_gap_ms must be >= 0")
        if not 0 <= self.fast_speech_ms <= self.min_speech_ms:
            raise ValueError("fast_speech_ms must be in 0..min_speech_ms")
        if self.clear_margin_db < self.echo_margin_db:
            raise ValueError("clear_margin_db must be >= echo_margin_db")
        if not 0 <= self.max_echo_delay_ms <= 1000:
            raise ValueError(f"max_echo_delay_ms must be 0..1000, got {self.max_echo_delay_ms}")
        if not 0.0 < self.min_caller_share <= 1.0:
            raise ValueError(f"min_caller_share must be in (0, 1], got {self.min_caller_share}")

    @classmethod
    def from_settings(cls, settings: BargeinSettings, rate: int) -> BargeInConfig:
        """The detector for a leg at ``rate`` as the ``[bargein]`` section configures it (the
        only place the section's keys meet the detector's; the rest keep the detector's
        tuned defaults)."""
        return cls(
            aggressiveness=settings.aggressiveness,
            min_speech_ms=settings.min_speech_ms,
            hangover_ms=settings.hangover_ms,
            echo_margin_db=settings.echo_margin_db,
            rate=rate,
            frame_ms=settings.frame_ms,
        )

    @property
    def frame_samples(self) -> int:
        return self.rate * self.frame_ms // 1000


@dataclass(frozen=True, slots=True)
class VoiceStarted:
    """Caller speech confirmed.  ``onset_sample``: media time where the caller's speech began
    (start of the first evidence frame); ``decision_sample``: media time at which it was
    confirmed (end of the frame that confirmed it).  onset→decision is the detection delay."""

    onset_sample: int
    decision_sample: int

    def __post_init__(self) -> None:
        if self.decision_sample < self.onset_sample:
            raise ValueError("decision_sample must not precede onset_sample")


@dataclass(frozen=True, slots=True)
class VoiceStopped:
    """Caller speech ended.  ``end_sample``: end of the last evidence frame;
    ``decision_sample``: end of the frame that completed the hangover."""

    end_sample: int
    decision_sample: int

    def __post_init__(self) -> None:
        if self.decision_sample < self.end_sample:
            raise ValueError("decision_sample must not precede end_sample")


VadEvent = VoiceStarted | VoiceStopped


class _Analyzer:
    """Band energies of consecutive frames: Hann window over the previous + current frame.

    The two-frame window gives 50 Hz bins at 8 kHz / 10 ms without adding latency (it looks
    back, not ahead).  Energies are scaled so that the band sum of a white signal approximates
    its mean square (full scale 1.0), which keeps the absolute thresholds in dBFS terms.

    Stateless: the previous frames are the caller's (one row per stream), so one analyzer
    serves a whole bank of streams in one FFT call.
    """

    def __init__(self, rate: int, frame: int) -> None:
        n = 2 * frame
        self._window = np.hanning(n + 2)[1:-1]
        freqs = np.fft.rfftfreq(n, 1.0 / rate)
        edges = list(_NB_EDGES) + ([e for e in _WB_EDGES if e < rate / 2] if rate > 8000 else [])
        bands = np.zeros((freqs.size, len(edges) - 1), dtype=np.float64)
        for b in range(len(edges) - 1):
            bands[(freqs >= edges[b]) & (freqs < edges[b + 1]), b] = 1.0
        # rfft of a window-weighted signal: sum |X|^2 over all bins (one-sided, doubled) equals
        # n * sum((x*w)^2); dividing by n * sum(w^2) gives the window-weighted mean square.
        # Input is int16: the 1/32768 scaling to full scale 1.0 is folded in here.
        bands *= 2.0 / (n * float(np.sum(self._window**2)) * 32768.0**2)
        # Rows for the real and the imaginary part of each bin: the spectrum viewed as floats,
        # squared, times this matrix gives the band energies in one product.
        self._bands = np.repeat(bands, 2, axis=0)

    @property
    def n_bands(self) -> int:
        return int(self._bands.shape[1])

    def process(self, prev: FloatArray, frames: FloatArray) -> FloatArray:
        """Band energies ``(streams, bands)`` of ``frames`` (float rows) after ``prev``."""
        x = np.concatenate((prev, frames), axis=1)
        x *= self._window
        parts = np.fft.rfft(x, axis=1).view(np.float64)
        parts *= parts
        out: FloatArray = parts @ self._bands
        np.maximum(out, _FLOOR, out=out)
        return out


Rows = npt.NDArray[np.intp] | slice


_LAG_PM1 = np.array([-1, 0, 1], dtype=np.int64)


def _rows(s: npt.NDArray[np.intp]) -> Rows:
    """``s`` as a slice when it is a run of consecutive slots (one detector alone, or a bank
    filled in order): basic indexing reads views and writes in place, several times cheaper
    than a gather and a scatter per state array."""
    first = int(s[0])
    if s.size == 1 or (s.size == int(s[-1]) - first + 1 and bool((np.diff(s) == 1).all())):
        return slice(first, first + s.size)
    return s


def _sub(s: npt.NDArray[np.intp], ix: Rows, r: npt.NDArray[np.intp], n: int) -> Rows:
    """Bank rows of the batch rows ``r`` (all ``n`` of them: the batch's own indexer)."""
    return ix if r.size == n else _rows(s[r])


def _rowdot(a: FloatArray, b: FloatArray) -> FloatArray:
    """Per-row dot product of two ``(rows, n)`` arrays."""
    out: FloatArray = np.einsum("ij,ij->i", a, b)
    return out


class DetectorBank:
    """The numeric state of many detectors with one configuration, one row (slot) each.

    Every per-frame step works on a batch of slots at once, so the per-frame cost of numpy's
    call overhead is paid once per batch instead of once per call: the media ticker hands it
    all the calls of one wake-up (see :func:`run_batch`).  A :class:`BargeInDetector` alone
    owns a bank of one; in the gateway every call's detector takes a slot of its rate's
    shared bank.  Batches are processed row by row with the same arithmetic, so a detector's
    results do not depend on the company it keeps (tested).
    """

    def __init__(self, config: BargeInConfig, capacity: int = 8) -> None:
        self.config = cfg = config
        self.frame = frame = cfg.frame_samples
        self.analyzer = an = _Analyzer(cfg.rate, frame)
        self.nb = an.n_bands
        fps = 1000.0 / cfg.frame_ms
        self.lags = max(1, round(cfg.max_echo_delay_ms / cfg.frame_ms)) + 1  # lags 0..K
        # Lags the ceilings cover: 0..K + extra.
        self.clags = self.lags + round(_CEIL_EXTRA_MS / cfg.frame_ms)
        self.ring = self.clags + _FAR_AHEAD_FRAMES + 2
        self.lag_range = np.arange(self.clags)
        self.lam = np.array([math.exp(-1.0 / (t * fps)) for t in (_FAST_TAU_S, _SLOW_TAU_S)])
        self.one_minus_lam = 1.0 - self.lam
        self.min_train = round(_MIN_TRAIN_S * fps)
        self.max_disagree = round(_MAX_DISAGREE_S * fps)
        self.gain_prior_lin = 10.0 ** (_GAIN_PRIOR_DB / 10.0)
        self.ceil_rise = 10.0 ** (_CEIL_RISE_DB_PER_S / fps / 10.0)
        self.ceil_min_far = 10.0 ** (_CEIL_MIN_FAR_DB / 10.0)
        self.ceil_spread = max(1, round(_CEIL_SPREAD_MS / cfg.frame_ms))
        self.ceil_floor = 10.0 ** (_CEIL_FLOOR_DB / 10.0)
        self.ceil_headroom = 10.0 ** (_CEIL_HEADROOM_DB / 10.0)
        self.noise_rise = 10.0 ** (_NOISE_RISE_DB_PER_S / fps / 10.0)
        self.tail_decay = 10.0 ** (-_TAIL_DECAY_DB_PER_MS * cfg.frame_ms / 10.0)
        self.margin = 10.0 ** (cfg.echo_margin_db / 10.0)
        self.clear_margin = 10.0 ** (cfg.clear_margin_db / 10.0)
        self.noise_margin = 10.0 ** (_NOISE_MARGIN_DB / 10.0)
        self.gain_snr = 10.0 ** (_GAIN_SNR_DB / 10.0)
        self._free: list[int] = []
        self.capacity = 0
        self._grow(max(capacity, 1))

    # -- slots ---------------------------------------------------------------------------------

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        nb, ring, lags, clags, frame = self.nb, self.ring, self.lags, self.clags, self.frame

        def grown(arr: npt.NDArray[Any] | None, shape: tuple[int, ...], dtype: Any) -> Any:
            new = np.zeros((capacity, *shape), dtype=dtype)
            if arr is not None:
                new[:old] = arr
            return new

        g = getattr
        # Far history per slot, indexed by absolute frame number modulo the ring size.
        self.far_e = grown(g(self, "far_e", None), (ring, nb), np.float64)  # band energies
        self.far_dev = grown(g(self, "far_dev", None), (ring, nb), np.float64)  # log - mean
        self.far_dev2 = grown(g(self, "far_dev2", None), (ring,), np.float64)  # sum of dev^2
        self.far_active = grown(g(self, "far_active", None), (ring,), np.bool_)
        self.far_idx = grown(g(self, "far_idx", None), (ring,), np.int64)
        self.prev_far = grown(g(self, "prev_far", None), (frame,), np.float64)
        self.prev_near = grown(g(self, "prev_near", None), (frame,), np.float64)
        # Running means of the log envelopes, bias-corrected (EMA from zero over the EMA of
        # ones) so that they are right from the first frame: a mean that starts far off puts a
        # common offset into every deviation, which correlates at every lag.
        self.far_mean = grown(g(self, "far_mean", None), (nb,), np.float64)
        self.near_mean = grown(g(self, "near_mean", None), (nb,), np.float64)
        self.far_acc = grown(g(self, "far_acc", None), (nb,), np.float64)
        self.near_acc = grown(g(self, "near_acc", None), (nb,), np.float64)
        self.far_w = grown(g(self, "far_w", None), (), np.float64)
        self.near_w = grown(g(self, "near_w", None), (), np.float64)
        # Delay correlators: [fast, slow] x lag.
        self.sxy = grown(g(self, "sxy", None), (2, lags), np.float64)
        self.sxx = grown(g(self, "sxx", None), (2, lags), np.float64)
        self.syy = grown(g(self, "syy", None), (2,), np.float64)
        self.train = grown(g(self, "train", None), (), np.int64)
        self.delay = grown(g(self, "delay", None), (), np.int64)  # trusted lag; -1: none
        self.disagree = grown(g(self, "disagree", None), (), np.int64)
        self.gain_db = grown(g(self, "gain_db", None), (nb,), np.float64)
        self.gain = grown(g(self, "gain", None), (nb,), np.float64)  # linear
        self.gain_prior = grown(g(self, "gain_prior", None), (nb,), np.float64)
        self.ceil_lag = grown(g(self, "ceil_lag", None), (clags, nb), np.float64)  # lag x band
        self.gain_updates = grown(g(self, "gain_updates", None), (), np.int64)
        self.noise = grown(g(self, "noise", None), (nb,), np.float64)
        self.noise_init = grown(g(self, "noise_init", None), (), np.bool_)
        self.tail = grown(g(self, "tail", None), (nb,), np.float64)
        self._free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def acquire(self) -> int:
        """A fresh slot (the bank grows when full)."""
        if not self._free:
            self._grow(2 * self.capacity)
        slot = self._free.pop()
        self._reset(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"slot {slot} is not in use")
        self._free.append(slot)

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free)

    def _reset(self, s: int) -> None:
        self.far_e[s] = 0.0
        self.far_dev[s] = 0.0
        self.far_dev2[s] = 0.0
        self.far_active[s] = False
        # The sentinel matches no frame number (the first near frames look back to negative
        # frame numbers, so -1 would).
        self.far_idx[s] = np.iinfo(np.int64).min
        self.prev_far[s] = 0.0
        self.prev_near[s] = 0.0
        self.far_mean[s] = _LOG_FLOOR_DB
        self.near_mean[s] = _LOG_FLOOR_DB
        self.far_acc[s] = 0.0
        self.near_acc[s] = 0.0
        self.far_w[s] = 0.0
        self.near_w[s] = 0.0
        self.sxy[s] = 0.0
        self.sxx[s] = 0.0
        self.syy[s] = 0.0
        self.train[s] = 0
        self.delay[s] = -1
        self.disagree[s] = 0
        self.gain_db[s] = _GAIN_PRIOR_DB
        self.gain[s] = self.gain_prior_lin
        self.gain_prior[s] = self.gain_prior_lin
        self.ceil_lag[s] = self.gain_prior_lin
        self.gain_updates[s] = 0
        self.noise[s] = _FLOOR
        self.noise_init[s] = False
        self.tail[s] = 0.0

    # -- far end -------------------------------------------------------------------------------

    def add_far(
        self, s: npt.NDArray[np.intp], idx: npt.NDArray[np.int64], frames: Int16Array
    ) -> None:
        """Far frames ``frames[i]`` (frame number ``idx[i]``) of slots ``s`` (distinct)."""
        ix = _rows(s)
        x = frames.astype(np.float64)
        e = self.analyzer.process(self.prev_far[ix], x)
        self.prev_far[ix] = x
        log_e = np.maximum(10.0 * np.log10(e), _LOG_FLOOR_DB)
        # Mean removal at arrival time, from far data only: the stored deviation then does not
        # depend on how far and near calls interleave.
        a = 1.0 - float(self.lam[1])
        acc = self.far_acc[ix]
        acc += a * (log_e - acc)
        self.far_acc[ix] = acc
        w = self.far_w[ix]
        w += a * (1.0 - w)
        self.far_w[ix] = w
        mean = acc / w[:, None]
        self.far_mean[ix] = mean
        slot = idx % self.ring
        dev = log_e - mean
        self.far_e[s, slot] = e
        self.far_dev[s, slot] = dev
        self.far_dev2[s, slot] = _rowdot(dev, dev)
        self.far_active[s, slot] = 10.0 * np.log10(e.sum(axis=1)) > _FAR_ACTIVE_DB
        self.far_idx[s, slot] = idx

    # -- near end ------------------------------------------------------------------------------

    def near(
        self,
        s: npt.NDArray[np.intp],
        idx: npt.NDArray[np.int64],
        frames: Int16Array,
        vad: npt.NDArray[np.bool_],
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.bool_], FloatArray]:
        """Near frames of slots ``s`` (distinct) with their webrtcvad verdicts.

        Returns per row: evidence, clear evidence, strong evidence, caller share.
        """
        ix = _rows(s)
        n = s.size
        x = frames.astype(np.float64)
        e = self.analyzer.process(self.prev_near[ix], x)
        self.prev_near[ix] = x
        min_share = self.config.min_caller_share

        # Far window: frames idx, idx-1, ... (lag order, the ceilings' range); frames not (or
        # no longer) held read as silence.
        want = idx[:, None] - self.lag_range
        slots = want % self.ring
        rows = s[:, None]
        held = self.far_idx[rows, slots] == want
        far_e = self.far_e[rows, slots]
        far_dev = self.far_dev[rows, slots]
        far_dev2 = self.far_dev2[rows, slots]
        far_active = self.far_active[rows, slots] & held
        if not held.all():
            far_e[~held] = _FLOOR
            far_dev[~held] = 0.0
            far_dev2[~held] = 0.0
        any_far = far_active.any(axis=1)

        # Near noise floor (minimum statistics): drops at once, rises a few dB per second.
        # Started from the first frame: webrtcvad flags the first frames of plain noise as
        # speech (its own noise model starts unadapted), so the floor must be right from the
        # start; if the stream opens with speech, the floor falls to the first dip.
        noise = np.minimum(self.noise[ix] * self.noise_rise, e)
        fresh = ~self.noise_init[ix]
        if fresh.any():
            noise[fresh] = e[fresh]
            self.noise_init[ix] = True
        self.noise[ix] = noise
        noise_m = self.noise_margin * noise

        # Expected echo per band, at the trusted delay; while the delay is not trusted, the
        # echo ceilings: the far frame at every lag times that lag's bound (at most the
        # prior): valid whatever the delay, and tight once the agent has spoken for a few
        # syllables.  Each lag's ceiling covers that lag +-1 frame (a delay between frames,
        # dispersion): it is learnt against the quietest of the three and applied to the
        # loudest.
        ref_any = far_e.max(axis=1)
        far_lo, far_hi = self._spread(far_e)
        prior = self.gain_prior[ix]  # the learnt gain, at least the prior (linear)
        ceil = self.ceil_lag[ix]
        cap = ceil * self.ceil_headroom
        np.minimum(cap, prior[:, None, :], out=cap)
        bound = np.multiply(far_hi, cap, out=far_hi).max(axis=1)  # far_hi: not needed after
        tail_old = self.tail[ix]
        delay = self.delay[ix]
        trusted = delay >= 0
        gain = self.gain[ix]
        # Far energy at the trusted lag +-1 (rows without a trusted lag: unused).
        ref = self._lag_max(far_e, delay)
        learnt = ref * gain
        # While the learnt gain is still converging the ceiling is often the tighter one.
        expected = self._with_tail(
            np.where(trusted[:, None], np.minimum(learnt, bound), bound), tail_old
        )
        share, clear = self._shares(e, expected, noise_m)
        candidate = share >= min_share
        # The gain learns from frames the learnt path explains (so it can follow a path that
        # got louder, which the ceilings only do slowly); that share is at most the one above,
        # so it only needs computing when that one is a candidate.
        learn_share = share.copy()
        pick = trusted & candidate
        if pick.any():
            learn_share[pick] = self._caller_share(
                e[pick], self._with_tail(learnt[pick], tail_old[pick]), noise_m[pick]
            )
        # Delay-agnostic check: could the agent's audio at *any* lag in range explain this
        # frame?  An onset must contain at least one frame where it cannot; otherwise a sudden
        # change of echo delay (echo arriving where none was expected) would read as a caller
        # until the correlators catch up (~0.5 s).  Trusted rows: the loudest far frame at the
        # learnt gain.  Others: the loudest far frame at the largest gain any lag allows, and
        # at least at the learnt gain once there is one (after a change of delay the ceilings
        # at the new lag still say "no echo here" until they rise); its expected echo is at
        # least the one above, so below the share there is no need to look.
        strong = share.copy()
        if trusted.any():
            strong[trusted] = self._caller_share(
                e[trusted],
                np.maximum(ref_any[trusted] * gain[trusted], tail_old[trusted]),
                noise_m[trusted],
            )
        pick = ~trusted & candidate
        if pick.any():
            any_gain = np.where(
                (self.gain_updates[ix][pick] == 0)[:, None], cap[pick].max(axis=1), prior[pick]
            )
            strong[pick] = self._caller_share(
                e[pick], np.maximum(ref_any[pick] * any_gain, expected[pick]), noise_m[pick]
            )
        self.tail[ix] = expected
        evidence = vad & candidate
        strong_ev = evidence & (strong >= min_share)
        clear_ev = evidence & (clear >= min_share)

        # Learn the echo path only from frames that look like echo: a caller frame would blur
        # the delay correlation and inflate the echo gain.  The delay search skips only frames
        # that no lag can explain; echo that moved to another lag must still feed it, or a
        # changed path would freeze the very estimate that has to follow it.  The gain, which
        # is tied to the trusted lag, learns only from frames explained at that lag.  (Neither
        # is gated on the speaking state: a false start must not freeze its own cure.)
        if any_far.any():
            r = np.flatnonzero(any_far)
            if r.size == n:
                self._update_ceiling(ix, e, far_lo, noise, ceil)
            else:
                self._update_ceiling(_sub(s, ix, r, n), e[r], far_lo[r], noise[r], ceil[r])
            echo_like = any_far & (strong < min_share)
            if echo_like.any():
                r = np.flatnonzero(echo_like)
                k = self.lags
                if r.size == n:
                    self._update_delay(ix, e, far_dev[:, :k], far_dev2[:, :k], delay)
                else:
                    self._update_delay(
                        _sub(s, ix, r, n), e[r], far_dev[r, :k], far_dev2[r, :k], delay[r]
                    )
            # The gain follows the delay as just updated by this frame.
            delay_now = self.delay[ix]
            learn = any_far & (learn_share < min_share) & (delay_now >= 0)
            if learn.any():
                lag_now = (self.lag_range >= np.maximum(delay_now - 1, 0)[:, None]) & (
                    self.lag_range < np.minimum(delay_now + 2, self.lags)[:, None]
                )
                learn &= (far_active & lag_now).any(axis=1)
                if learn.any():
                    ref = self._lag_max(far_e, delay_now)
                    r = np.flatnonzero(learn)
                    if r.size == n:
                        self._update_gain(s, ix, e, ref, noise)
                    else:
                        self._update_gain(s[r], _sub(s, ix, r, n), e[r], ref[r], noise[r])
        return evidence, clear_ev, strong_ev, share

    def _lag_max(self, far_e: FloatArray, delay: npt.NDArray[np.int64]) -> FloatArray:
        """Per row and band, the loudest far energy at lags ``delay - 1 .. delay + 1`` within
        ``0 .. lags - 1`` (a row without a trusted lag, -1, reads lag 0).  Three gathered
        lags instead of a mask over all of them: far energies are positive (floored), so the
        clipped duplicates at the edges change no maximum."""
        k = np.clip(delay[:, None] + _LAG_PM1, 0, self.lags - 1)
        out: FloatArray = np.take_along_axis(far_e, k[:, :, None], axis=1).max(axis=1)
        return out

    def _with_tail(self, expected: FloatArray, tail: FloatArray) -> FloatArray:
        # Non-linear echo paths (overdriven speakerphones, compressors) put harmonics of a loud
        # band into others: every band expects a small share of the total echo as well.  The
        # decaying tail covers reverberation longer than the ±1 frame delay window.
        spread = expected + _LEAK * expected.sum(axis=1, keepdims=True)
        out: FloatArray = np.maximum(spread, tail * self.tail_decay)
        return out

    def _caller_share(self, e: FloatArray, expected: FloatArray, noise_m: FloatArray) -> FloatArray:
        """Fraction of each frame's energy in bands the expected echo and noise cannot explain."""
        total = e.sum(axis=1)
        caller = np.where(e > self.margin * expected + noise_m, e, 0.0).sum(axis=1)
        out: FloatArray = np.divide(caller, total, out=np.zeros_like(total), where=total > 0.0)
        return out

    def _shares(
        self, e: FloatArray, expected: FloatArray, noise_m: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """:meth:`_caller_share` at the echo margin and at the clear margin."""
        total = e.sum(axis=1)
        share = np.where(e > self.margin * expected + noise_m, e, 0.0).sum(axis=1)
        clear = np.where(e > self.clear_margin * expected + noise_m, e, 0.0).sum(axis=1)
        ok = total > 0.0
        np.divide(share, total, out=share, where=ok)
        np.divide(clear, total, out=clear, where=ok)
        share[~ok] = 0.0
        clear[~ok] = 0.0
        return share, clear

    def _spread(self, far_e: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per lag, the min and the max of the far energies within ``_CEIL_SPREAD_MS`` of it."""
        lo = far_e.copy()
        hi = far_e.copy()
        for j in range(1, self.ceil_spread + 1):
            np.minimum(lo[:, j:], far_e[:, :-j], out=lo[:, j:])
            np.minimum(lo[:, :-j], far_e[:, j:], out=lo[:, :-j])
            np.maximum(hi[:, j:], far_e[:, :-j], out=hi[:, j:])
            np.maximum(hi[:, :-j], far_e[:, j:], out=hi[:, :-j])
        return lo, hi

    def _update_ceiling(
        self, ix: Rows, e: FloatArray, far_lo: FloatArray, noise: FloatArray, ceil: FloatArray
    ) -> None:
        # Min-hold per lag and band of near (noise removed) over far, where the far end was
        # loud enough to tell; every ceiling rises slowly so that a path can get louder.
        echo = np.maximum(e - 2.0 * noise, _FLOOR)
        ratio = np.divide(echo[:, None, :], far_lo)
        np.maximum(ratio, self.ceil_floor, out=ratio)
        risen = ceil * self.ceil_rise
        np.minimum(risen, self.gain_prior_lin, out=risen)
        # Where the far end was loud enough to tell: min(risen, ratio); elsewhere: risen.
        loud = far_lo > self.ceil_min_far
        np.minimum(ratio, risen, out=ratio, where=loud)
        np.copyto(ratio, risen, where=~loud)
        self.ceil_lag[ix] = ratio

    def _update_delay(
        self,
        ix: Rows,
        e: FloatArray,
        far_dev: FloatArray,
        far_dev2: FloatArray,
        delay: npt.NDArray[np.int64],
    ) -> None:
        log_e = np.maximum(10.0 * np.log10(e), _LOG_FLOOR_DB)
        a = 1.0 - float(self.lam[1])
        acc = self.near_acc[ix]
        acc += a * (log_e - acc)
        self.near_acc[ix] = acc
        w = self.near_w[ix]
        w += a * (1.0 - w)
        self.near_w[ix] = w
        mean = acc / w[:, None]
        self.near_mean[ix] = mean
        y = log_e - mean
        lam = self.lam[None, :, None]
        oml = self.one_minus_lam[None, :, None]
        fy = np.einsum("blk,bk->bl", far_dev, y)
        sxy = self.sxy[ix] * lam + oml * fy[:, None, :]
        sxx = self.sxx[ix] * lam + oml * far_dev2[:, None, :]
        syy = self.lam * self.syy[ix] + self.one_minus_lam * _rowdot(y, y)[:, None]
        self.sxy[ix] = sxy
        self.sxx[ix] = sxx
        self.syy[ix] = syy
        train = self.train[ix] + 1
        self.train[ix] = train
        corr = sxy / np.sqrt(sxx * syy[:, :, None] + 1e-12)
        fast = corr[:, 0].argmax(axis=1)
        slow = corr[:, 1].argmax(axis=1)
        rows = np.arange(len(e))
        # The fast correlator moves first when the echo path changes; a short disagreement
        # (a burst of double talk the evidence gate let through) must not drop trust, a
        # sustained one must.
        disagree = np.where(np.abs(fast - slow) <= 1, 0, self.disagree[ix] + 1)
        self.disagree[ix] = disagree
        trusted = (
            (train >= self.min_train)
            & (corr[rows, 1, slow] >= _MIN_CORR)
            & (disagree < self.max_disagree)
            & ((delay >= 0) | (corr[rows, 0, fast] >= _MIN_CORR))
        )
        self.delay[ix] = np.where(trusted, slow, -1)

    def _update_gain(
        self,
        s: npt.NDArray[np.intp],
        ix: Rows,
        e: FloatArray,
        ref: FloatArray,
        noise: FloatArray,
    ) -> None:
        # Quantile tracking in dB (stochastic gradient on the pinball loss): converges to the
        # 80th percentile of near/far ratios; large steps early, fine steps once settled.
        # Noise is subtracted (the floor is a minimum, so twice it is about the mean) and only
        # bands whose far energy clearly dominates the near noise count: otherwise a weak echo
        # reads as "echo gain = noise / far", far too high.
        echo = np.maximum(e - 2.0 * noise, _FLOOR)
        ratio_db = np.clip(10.0 * np.log10(echo / ref), -60.0, 20.0)
        useful = ref > self.gain_snr * noise
        gain_db = self.gain_db[ix]
        updates = self.gain_updates[ix]
        first = updates == 0
        if first.any():
            # Start from the echo ceilings (the largest gain any lag allows) where they are
            # below the prior: they were learnt on this same path, and the quantile tracker
            # needs a second or more to come down from the prior on its own.
            ceil_db = 10.0 * np.log10(self.ceil_lag[s[first]].max(axis=1) * self.ceil_headroom)
            gain_db[first] = np.minimum(gain_db[first], ceil_db)
        updates = updates + 1
        self.gain_updates[ix] = updates
        step = np.maximum(0.25, 3.0 / np.sqrt(updates))
        delta = np.where(ratio_db > gain_db, _GAIN_QUANTILE, _GAIN_QUANTILE - 1.0)
        gain_db = np.where(useful, gain_db + step[:, None] * delta, gain_db)
        self.gain_db[ix] = gain_db
        gain = 10.0 ** (gain_db / 10.0)
        self.gain[ix] = gain
        self.gain_prior[ix] = np.maximum(gain, self.gain_prior_lin)


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

    def push(
        self, pcm: npt.ArrayLike, start: int | None, *, jump: bool = False
    ) -> list[tuple[int, Int16Array]]:
        """``jump``: a gap of more than a frame is skipped (its frames are never cut: the
        bank reads frames it does not hold as silence) instead of filled with zeros."""
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
        if jump and start - self.pos > self.frame:
            self.pos = start - start % self.frame
            self._fill = 0
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
    """Streaming echo-aware VAD for one call leg.  See the module docstring for the method.

    ``bank``: a shared :class:`DetectorBank` (same config) to take a slot in, so that the
    gateway can run the detectors of many calls in one batch (:func:`run_batch`); without one
    the detector owns a bank of one.  :meth:`close` gives the slot back.
    """

    def __init__(
        self, config: BargeInConfig | None = None, bank: DetectorBank | None = None
    ) -> None:
        cfg = config if config is not None else (bank.config if bank is not None else None)
        self.config = cfg = cfg if cfg is not None else BargeInConfig()
        if bank is not None and bank.config != cfg:
            raise ValueError("the bank was made for another configuration")
        self._bank = bank if bank is not None else DetectorBank(cfg, capacity=1)
        self._slot = self._bank.acquire()
        self._slots = np.array([self._slot], dtype=np.intp)
        self._frame = frame = cfg.frame_samples
        self._vad = webrtcvad.Vad(cfg.aggressiveness)
        self._speech: Callable[[bytes, int], bool] = _vad_speech(self._vad, cfg.rate)
        self._far_framer = _Framer(frame)
        self._near_framer = _Framer(frame)
        # Frames cut but not yet analysed (see stage_far/stage_near and run_batch).
        self._far_q: list[tuple[int, Int16Array]] = []
        self._near_q: list[tuple[int, Int16Array]] = []
        # Onset evidence in units: a frame counts ``need_fast`` units, a clear one ``need``;
        # a run decides at need * need_fast (min_speech_ms of evidence, fast_speech_ms of
        # clear evidence, or a mix).
        self._need = max(1, math.ceil(cfg.min_speech_ms / cfg.frame_ms))
        self._need_fast = max(1, math.ceil(cfg.fast_speech_ms / cfg.frame_ms))
        self._need_units = self._need * self._need_fast
        self._max_gap = cfg.max_gap_ms // cfg.frame_ms
        self._hang = max(1, math.ceil(cfg.hangover_ms / cfg.frame_ms))
        # Decision state.
        self._speaking = False
        self._run_onset = -1  # media time of the pending run's first evidence frame; -1: none
        self._run_units = 0
        self._run_gap = 0
        self._run_strong = False
        self._last_speech_end = 0
        self._silent_frames = 0
        self._closed = False
        # Last frame's internals: diagnostics for metrics and tuning, not a stable interface.
        self.last_caller_share = 0.0
        self.last_vad = False

    def close(self) -> None:
        """Give the bank slot back (the detector is not used any more)."""
        if not self._closed:
            self._closed = True
            self._bank.release(self._slot)

    @property
    def bank(self) -> DetectorBank:
        return self._bank

    @property
    def closed(self) -> bool:
        return self._closed

    # -- public state -------------------------------------------------------------------------

    @property
    def speaking(self) -> bool:
        """True between a :class:`VoiceStarted` and the following :class:`VoiceStopped`."""
        return self._speaking

    @property
    def echo_delay_ms(self) -> float | None:
        """Trusted echo path delay (frame resolution), or None while not trusted."""
        d = int(self._bank.delay[self._slot])
        return None if d < 0 else float(d * self.config.frame_ms)

    @property
    def erl_db(self) -> float | None:
        """Estimated echo return loss (dB, positive = echo below what was sent): the learnt
        band gains averaged in power, weighted by the agent's long-term spectrum; None before
        any gain has been learnt at a trusted delay."""
        b, s = self._bank, self._slot
        if b.gain_updates[s] == 0:
            return None
        w = 10.0 ** (b.far_mean[s] / 10.0)
        g = 10.0 ** (b.gain_db[s] / 10.0)
        return float(-10.0 * math.log10(float(w @ g) / float(np.sum(w))))

    @property
    def could_confirm(self) -> bool:
        """Whether the near frames staged now could confirm caller speech (a
        :class:`VoiceStarted`) once analysed: the pending run's evidence plus the most that
        every staged frame could add (a clear frame's ``need`` units) reaches the decision.

        The media tick asks before it pulls a call's next frame: only then must the batch run
        first, so that a barge-in fades that very frame.  Frames that cannot decide anything
        (the first frame of a run, any frame while the caller is already speaking) wait for
        the batch timer with the other calls' frames: the events are the same, only the
        batches are fewer and fuller."""
        if self._speaking or not self._near_q:
            return False
        units = self._run_units if self._run_onset >= 0 else 0
        return units + len(self._near_q) * self._need >= self._need_units

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
        self.stage_far(pcm, at_sample)
        run_batch([self])

    def near_end(self, pcm: npt.ArrayLike, now_samples: int) -> list[VadEvent]:
        """Caller audio as received and decoded (int16, any length); ``now_samples`` is the
        media time of ``pcm[0]``.  Returns the events of every frame completed by it."""
        self.stage_near(pcm, now_samples)
        return run_batch([self])[0]

    def stage_far(
        self, pcm: npt.ArrayLike, at_sample: int | None = None, *, jump: bool = False
    ) -> None:
        """As :meth:`far_end`, analysed at the next :func:`run_batch` that includes this
        detector (far audio staged before near audio of the same tick, as with the direct
        calls).  ``jump``: a gap since the last far audio (the agent was silent and nothing was
        staged) is skipped rather than analysed as silence; the frames in it read as silence."""
        self._far_q += self._far_framer.push(pcm, at_sample, jump=jump)

    def stage_near(self, pcm: npt.ArrayLike, now_samples: int) -> None:
        """As :meth:`near_end`; the events come from :func:`run_batch`."""
        self._near_q += self._near_framer.push(pcm, now_samples)

    # -- internals ---------------------------------------------------------------------------

    def _decide(
        self, evidence: bool, clear: bool, strong: bool, start: int, end: int
    ) -> VadEvent | None:
        if self._speaking:
            if evidence:
                self._last_speech_end = end
                self._silent_frames = 0
                return None
            self._silent_frames += 1
            if self._silent_frames >= self._hang:
                self._speaking = False
                self._run_onset = -1
                return VoiceStopped(self._last_speech_end, end)
            return None
        if evidence:
            if self._run_onset < 0:
                self._run_onset, self._run_units, self._run_strong = start, 0, False
            self._run_units += self._need if clear else self._need_fast
            self._run_gap = 0
            self._run_strong = self._run_strong or strong
            if self._run_units >= self._need_units and self._run_strong:
                self._speaking = True
                self._last_speech_end = end
                self._silent_frames = 0
                return VoiceStarted(self._run_onset, end)
        elif self._run_onset >= 0:
            self._run_gap += 1
            if self._run_gap > self._max_gap:
                self._run_onset = -1
        return None


def _vad_speech(vad: webrtcvad.Vad, rate: int) -> Callable[[bytes, int], bool]:
    """``speech(pcm_bytes, samples)``: webrtcvad's verdict on one frame, as ``vad.is_speech``
    gives it; bound to the C function when the module exposes it (the wrapper's Python frame
    and length check cost as much as the VAD itself; run_batch cuts whole frames)."""
    handle = getattr(vad, "_vad", None)
    process = getattr(_webrtcvad, "process", None)
    if handle is not None and process is not None:
        return functools.partial(process, handle, rate)
    return lambda buf, n: bool(vad.is_speech(buf, rate, n))


def run_batch(detectors: Sequence[BargeInDetector]) -> list[list[VadEvent]]:
    """Analyse every frame staged on ``detectors`` (distinct, all of one bank), far frames
    first; returns each detector's events in order.

    One vectorised step per round over all detectors with a frame left, so a wake-up of the
    media ticker pays numpy's per-call overhead once, not once per call.  A detector's result
    is the same as feeding it alone (each row is computed on its own).
    """
    events: list[list[VadEvent]] = [[] for _ in detectors]
    if not detectors:
        return events
    bank = detectors[0]._bank
    for d in detectors:
        if d._bank is not bank:
            raise ValueError("run_batch: detectors of different banks")
        if d._closed:
            raise RuntimeError("run_batch: a closed detector")
    frame = bank.frame
    # Far first: a near frame looks back at far frames of the same tick.  The frames of a
    # round become one block by one concatenate (np.stack would add a Python step per frame).
    while True:
        ready = [d for d in detectors if d._far_q]
        if not ready:
            break
        heads = [d._far_q.pop(0) for d in ready]
        bank.add_far(
            np.array([d._slot for d in ready], dtype=np.intp),
            np.array([start // frame for start, _ in heads], dtype=np.int64),
            np.concatenate([f for _, f in heads]).reshape(len(heads), frame),
        )
    while True:
        pos = [i for i, d in enumerate(detectors) if d._near_q]
        if not pos:
            break
        ready = [detectors[i] for i in pos]
        heads = [d._near_q.pop(0) for d in ready]
        # The VAD reads each frame's bytes; the block is made from the same bytes.
        raw = [f.tobytes() for _, f in heads]
        vad_l = [d._speech(b, frame) for d, b in zip(ready, raw, strict=True)]
        evidence, clear, strong, share = bank.near(
            np.array([d._slot for d in ready], dtype=np.intp),
            np.array([start // frame for start, _ in heads], dtype=np.int64),
            np.frombuffer(b"".join(raw), dtype=np.int16).reshape(len(heads), frame),
            np.array(vad_l, dtype=np.bool_),
        )
        ev_l, cl_l, st_l, sh_l = (
            evidence.tolist(),
            clear.tolist(),
            strong.tolist(),
            share.tolist(),
        )
        for j, (i, d) in enumerate(zip(pos, ready, strict=True)):
            d.last_caller_share = sh_l[j]
            d.last_vad = vad_l[j]
            if not ev_l[j] and d._run_onset < 0 and not d._speaking:
                continue  # what _decide does with no evidence, no run and no speech: nothing
            start = heads[j][0]
            ev = d._decide(ev_l[j], cl_l[j], st_l[j], start, start + frame)
            if ev is not None:
                events[i].append(ev)
    return events


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
