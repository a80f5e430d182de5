"""Narrowband telephone chain: anti-alias 3.8 kHz → 8 kHz → presence EQ → limiter.

Order matters: the resampler's Kaiser low-pass (passband to 3.8 kHz, ≥ 80 dB from 4.0 kHz)
removes everything that would fold back at 8 kHz before decimating; the EQ then runs at
8 kHz on 160 samples per 20 ms instead of at the engine rate; the limiter comes last so
nothing after it (int16 conversion, G.711) can clip.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dsp.eq import MidbandEQ
from dsp.limiter import Limiter
from dsp.resample import Resampler, design, output_length

Float32Array = npt.NDArray[np.float32]

OUT_RATE = 8000
PASS_HZ = 3800.0
STOP_HZ = 4000.0
ATTEN_DB = 80.0


class TelephoneChain:
    """Streaming engine-rate → 8 kHz telephone shaping with explicit state.

    ``process(x, last=False)`` takes float samples at ``in_rate`` in any chunking and returns the
    8 kHz samples that are final so far; ``last=True`` flushes the filter tail, after which the
    total output is exactly ``ceil(n_in * 8000 / in_rate)`` samples, time-aligned with the input
    (the resampler's group delay is withheld, see :attr:`latency_samples`).
    """

    out_rate = OUT_RATE

    def __init__(
        self,
        in_rate: int,
        eq_gain_db: float = 2.0,
        ceiling_db: float = -1.0,
        release_ms: float = 50.0,
    ) -> None:
        self.in_rate = in_rate
        self.eq_gain_db = eq_gain_db
        self._resampler = Resampler(design(in_rate, OUT_RATE, PASS_HZ, STOP_HZ, ATTEN_DB))
        self._eq = MidbandEQ(OUT_RATE, eq_gain_db)
        self._limiter = Limiter(OUT_RATE, ceiling_db, release_ms)

    @property
    def latency_samples(self) -> int:
        """8 kHz samples held back by the anti-alias filter (≈12.6 ms for a 200 Hz transition)."""
        return self._resampler.latency_samples

    def output_length(self, n_in: int) -> int:
        return output_length(n_in, self.in_rate, OUT_RATE)

    def reset(self) -> None:
        self._resampler.reset()
        self._eq.reset()
        self._limiter.reset()

    def process(self, x: npt.ArrayLike, last: bool = False) -> Float32Array:
        y = self._resampler.process_f64(x, last)
        if y.size:
            y = self._limiter.process(self._eq.process(y))
        return y.astype(np.float32)


def telephone(
    x: npt.ArrayLike, in_rate: int, eq_gain_db: float = 2.0, ceiling_db: float = -1.0
) -> Float32Array:
    """One-shot twin of :class:`TelephoneChain`: the whole flushed 8 kHz output for ``x``."""
    return TelephoneChain(in_rate, eq_gain_db, ceiling_db).process(x, last=True)
