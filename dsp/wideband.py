"""Wideband profile (WebRTC path): engine rate → 48 kHz or 16 kHz, then the limiter.

No narrowband filter: the resampler keeps the band up to 90 % of the lower of the two
Nyquist frequencies and is ≥ 80 dB down at that Nyquist (anti-alias when going down, e.g.
22050 → 16000; anti-image when going up, e.g. 22050 → 48000).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dsp.limiter import Limiter
from dsp.resample import Resampler, design, output_length

Float32Array = npt.NDArray[np.float32]

ATTEN_DB = 80.0
PASS_FRACTION = 0.9  # passband edge as a fraction of min(in, out) / 2


class WidebandChain:
    """Streaming resample-to-``out_rate`` plus peak limiter; same contract as TelephoneChain."""

    def __init__(
        self,
        in_rate: int,
        out_rate: int = 48000,
        ceiling_db: float = -1.0,
        release_ms: float = 50.0,
    ) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._resampler: Resampler | None = None
        if in_rate != out_rate:
            nyq = min(in_rate, out_rate) / 2.0
            self._resampler = Resampler(
                design(in_rate, out_rate, PASS_FRACTION * nyq, nyq, ATTEN_DB)
            )
        self._limiter = Limiter(out_rate, ceiling_db, release_ms)
        self._finished = False

    @property
    def latency_samples(self) -> int:
        """Output samples held back by the resampling filter (0 when the rates are equal)."""
        return 0 if self._resampler is None else self._resampler.latency_samples

    def output_length(self, n_in: int) -> int:
        return output_length(n_in, self.in_rate, self.out_rate)

    def reset(self) -> None:
        if self._resampler is not None:
            self._resampler.reset()
        self._limiter.reset()
        self._finished = False

    def process(self, x: npt.ArrayLike, last: bool = False) -> Float32Array:
        if self._resampler is None:
            # Same contract as the resampling path: nothing may follow a flush.
            if self._finished:
                raise RuntimeError("stream already flushed with last=True; call reset()")
            self._finished = last
            y = np.asarray(x, dtype=np.float64).reshape(-1)
        else:
            y = self._resampler.process_f64(x, last)
        if y.size:
            y = self._limiter.process(y)
        return y.astype(np.float32)


def wideband(
    x: npt.ArrayLike, in_rate: int, out_rate: int = 48000, ceiling_db: float = -1.0
) -> Float32Array:
    """One-shot twin of :class:`WidebandChain`."""
    return WidebandChain(in_rate, out_rate, ceiling_db).process(x, last=True)
