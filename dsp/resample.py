"""Streaming rational resampler (polyphase FIR) with explicit state, and its one-shot twin.

The filter is a linear-phase Kaiser low-pass designed at the virtual up-sampled rate
``in_rate * L`` (``L/M = out_rate/in_rate`` in lowest terms).  Only the output samples are
computed: for a ratio of ``L/M`` the filter pattern repeats every ``M`` input / ``L`` output
samples, so one period is a dense ``L x W`` matrix and a period of output is one BLAS
matrix-vector product over a window of ``W`` inputs.  The band is about half zeros, but a
single gemv beats gathering ``L`` phase rows sample by sample in numpy by a wide margin.

Output is time-aligned with the input: output sample ``j`` is the band-limited input at time
``j / out_rate`` (the filter's group delay is held back, not emitted as leading silence), and
after ``last=True`` the stream has produced exactly ``ceil(n_in * out_rate / in_rate)`` samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from dsp.kaiser import firwin_lowpass, kaiserord

FloatArray = npt.NDArray[np.float64]
Float32Array = npt.NDArray[np.float32]

# Guards against rate pairs whose filter would be absurdly large (e.g. 22051 -> 8000 has
# L = 8000 and a multi-million-tap prototype).  All the usual engine rates are far below.
_MAX_TAPS = 1 << 20
_MAX_MATRIX = 1 << 22

# Above this many whole periods in one call a gemm is used; below it a loop of gemv is faster
# (OpenBLAS gemm has a large fixed cost for a handful of rows on this kind of box).
_GEMM_MIN_PERIODS = 8
# Whole periods per gemm: bounds the copied window matrix (a few MB) for long one-shot inputs.
_GEMM_MAX_PERIODS = 512


@dataclass(frozen=True)
class ResamplerDesign:
    """The fixed (shareable, read-only) part of a resampler: filter and its period matrix."""

    in_rate: int
    out_rate: int
    up: int  # L
    down: int  # M
    taps: FloatArray  # prototype at in_rate * up, DC gain == up
    delay: int  # group delay of ``taps`` in up-sampled samples, (N - 1) / 2
    i_lo: int  # first input offset (relative to q * M) used by period q; <= 0
    matrix: FloatArray  # (up, width): output row r of period q = matrix[r] @ x[qM+i_lo : ...]

    @property
    def width(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def latency_samples(self) -> int:
        """Output samples a stream holds back waiting for future input (the filter's delay)."""
        return math.ceil(self.delay / self.down)


@lru_cache(maxsize=32)
def design(
    in_rate: int,
    out_rate: int,
    pass_hz: float,
    stop_hz: float,
    atten_db: float = 80.0,
) -> ResamplerDesign:
    """Design (and cache: chains are created per call/utterance) a resampler filter.

    ``pass_hz``/``stop_hz`` are the band edges of the anti-alias / anti-image low-pass;
    ``atten_db`` its stopband attenuation (Kaiser: passband ripple is of the same order, so
    80 dB means about 0.001 dB of ripple).
    """
    if in_rate <= 0 or out_rate <= 0:
        raise ValueError(f"rates must be positive, got {in_rate} -> {out_rate}")
    nyq = min(in_rate, out_rate) / 2.0
    if not 0.0 < pass_hz < stop_hz <= max(nyq, 1.0) * 1.0000001:
        raise ValueError(
            f"need 0 < pass ({pass_hz}) < stop ({stop_hz}) <= {nyq} Hz for {in_rate}->{out_rate}"
        )
    g = math.gcd(in_rate, out_rate)
    up, down = out_rate // g, in_rate // g
    fs_up = float(in_rate * up)
    numtaps, beta = kaiserord(atten_db, (stop_hz - pass_hz) / (fs_up / 2.0))
    numtaps = int(numtaps) | 1  # odd: integer group delay, symmetric about the centre tap
    if numtaps > _MAX_TAPS:
        raise ValueError(f"unsupported rate pair {in_rate} -> {out_rate}: filter too long")
    taps = firwin_lowpass(numtaps, (pass_hz + stop_hz) / 2.0, beta, fs_up)
    taps = taps * up  # zero-stuffing by L divides the gain by L
    delay = (numtaps - 1) // 2

    # Output j = qL + r uses input k = qM + i with weight taps[rM + delay - iL].
    i_lo = -(delay // up)
    i_hi = ((up - 1) * down + delay) // up
    width = i_hi - i_lo + 1
    if up * width > _MAX_MATRIX:
        raise ValueError(f"unsupported rate pair {in_rate} -> {out_rate}: matrix too large")
    r = np.arange(up)[:, None]
    i = np.arange(i_lo, i_hi + 1)[None, :]
    t = r * down + delay - i * up
    valid = (t >= 0) & (t < numtaps)
    matrix = np.where(valid, taps[np.clip(t, 0, numtaps - 1)], 0.0)
    matrix = np.ascontiguousarray(matrix)
    taps.setflags(write=False)
    matrix.setflags(write=False)
    return ResamplerDesign(in_rate, out_rate, up, down, taps, delay, i_lo, matrix)


def output_length(n_in: int, in_rate: int, out_rate: int) -> int:
    """Samples produced for ``n_in`` input samples once the stream is flushed."""
    return -(-n_in * out_rate // in_rate)


class Resampler:
    """Streaming polyphase resampler: ``process(x, last=False)`` like soxr's ``resample_chunk``.

    State: the unconsumed input window, the count of inputs received and the index of the next
    output sample.  After ``last=True`` the stream is finished; call :meth:`reset` to reuse it.
    """

    def __init__(self, d: ResamplerDesign) -> None:
        self.design = d
        self.reset()

    @classmethod
    def for_rates(
        cls, in_rate: int, out_rate: int, pass_hz: float, stop_hz: float, atten_db: float = 80.0
    ) -> Resampler:
        return cls(design(in_rate, out_rate, pass_hz, stop_hz, atten_db))

    @property
    def latency_samples(self) -> int:
        return self.design.latency_samples

    def reset(self) -> None:
        d = self.design
        # The buffer starts at absolute input index _base = (j // L) * M + i_lo; indices < 0
        # are the zeros before the signal, so it begins as -i_lo zeros.
        self._buf: FloatArray = np.zeros(-d.i_lo, dtype=np.float64)
        self._n_in = 0
        self._j = 0
        self._finished = False

    def process_f64(self, x: npt.ArrayLike, last: bool = False) -> FloatArray:
        """:meth:`process` in float64, for chains that keep precision between their stages."""
        if self._finished:
            raise RuntimeError("stream already flushed with last=True; call reset()")
        d = self.design
        xa = np.asarray(x, dtype=np.float64).reshape(-1)
        self._n_in += xa.size
        up, down = d.up, d.down
        if last:
            self._finished = True
            j_end = output_length(self._n_in, d.in_rate, d.out_rate)
        else:
            # Output j is final once its newest input, floor((jM + delay) / L), has arrived.
            j_end = -(-(self._n_in * up - d.delay) // down)
        j0 = self._j
        if j_end <= j0:
            if xa.size:
                self._buf = np.concatenate((self._buf, xa))
            return np.zeros(0, dtype=np.float64)
        q0, q1 = j0 // up, (j_end - 1) // up
        # Columns past the received input only meet zero weights for the rows computed (or,
        # when flushing, stand for the zeros after the signal), so zero padding is exact.
        have = self._buf.size + xa.size
        pad = max((q1 - q0) * down + d.width - have, 0)
        buf = np.concatenate((self._buf, xa, np.zeros(pad)))  # one copy per call
        out = _run_periods(d.matrix, buf, down, j0 - q0 * up, j_end - q0 * up)
        self._j = j_end
        self._buf = buf[(j_end // up - q0) * down : have]
        return out

    def process(self, x: npt.ArrayLike, last: bool = False) -> Float32Array:
        """Feed ``x`` (any length, even 0); return every output sample that is now final."""
        return self.process_f64(x, last).astype(np.float32)


def _run_periods(
    matrix: FloatArray, buf: FloatArray, down: int, start: int, stop: int
) -> FloatArray:
    """Output rows [start, stop) counted from period 0 whose window starts at buf[0]."""
    up, width = matrix.shape
    q_first, q_last = start // up, (stop - 1) // up
    parts: list[FloatArray] = []
    r0 = start - q_first * up
    if q_first == q_last:
        win = buf[q_first * down : q_first * down + width]
        return matrix[r0 : stop - q_first * up] @ win
    parts.append(matrix[r0:] @ buf[q_first * down : q_first * down + width])
    q = q_first + 1
    while q < q_last:
        n_batch = min(q_last - q, _GEMM_MAX_PERIODS)
        if n_batch >= _GEMM_MIN_PERIODS:
            windows = np.lib.stride_tricks.as_strided(
                buf[q * down :],
                shape=(n_batch, width),
                strides=(down * buf.strides[0], buf.strides[0]),
                writeable=False,
            )
            # Copy: overlapping rows are not BLAS-compatible (numpy would use a slow loop).
            parts.append((np.ascontiguousarray(windows) @ matrix.T).reshape(-1))
        else:
            for qq in range(q, q + n_batch):
                parts.append(matrix @ buf[qq * down : qq * down + width])
        q += n_batch
    parts.append(matrix[: stop - q_last * up] @ buf[q_last * down : q_last * down + width])
    return np.concatenate(parts)


def resample(
    x: npt.ArrayLike,
    in_rate: int,
    out_rate: int,
    pass_hz: float,
    stop_hz: float,
    atten_db: float = 80.0,
) -> Float32Array:
    """One-shot twin of :class:`Resampler`: the whole, flushed output for ``x``."""
    return Resampler.for_rates(in_rate, out_rate, pass_hz, stop_hz, atten_db).process(x, last=True)
