"""Look-ahead-free peak limiter with explicit state, and its one-shot twin.

Without look-ahead the only way to guarantee that no sample leaves the ceiling (so G.711 and
int16 conversion never clip) is an instantaneous attack: the gain drops on the very sample
that would exceed the ceiling.  It then recovers exponentially (release time constant).

Per sample, with ``d`` the gain reduction (gain = 1 - d):
``d[n] = max(d_target[n], d[n-1] * r)``, ``d_target = max(0, 1 - ceiling / |x|)``.
That max-plus recursion has a closed form that numpy can evaluate without a Python loop:
``log d[n] = n*log r + max(log d[-1] + log r, cummax_k(log d_target[k] - k*log r))``.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Below this the remaining reduction is inaudible and numerically irrelevant (< 1e-9 of the
# sample); snapping it to zero lets the common no-limiting block take the fast path.
_SNAP = 1e-12


class Limiter:
    """Streaming peak limiter: instant attack, exponential release, ceiling in dBFS."""

    def __init__(self, rate: int, ceiling_db: float = -1.0, release_ms: float = 50.0) -> None:
        if release_ms <= 0:
            raise ValueError("release_ms must be positive")
        self.rate = rate
        self.ceiling = 10.0 ** (ceiling_db / 20.0)
        self._log_r = -1.0 / (release_ms * 1e-3 * rate)
        self.reset()

    def reset(self) -> None:
        self._d = 0.0  # gain reduction after the last sample processed

    @property
    def gain_reduction_db(self) -> float:
        return 20.0 * math.log10(1.0 - self._d) if self._d < 1.0 else -math.inf

    def process(self, x: npt.ArrayLike) -> FloatArray:
        xa = np.asarray(x, dtype=np.float64).reshape(-1)
        n = xa.size
        if n == 0:
            return xa.copy()
        mag = np.abs(xa)
        peak = float(mag.max())
        c = self.ceiling
        if peak <= c and self._d == 0.0:
            return xa.copy()
        steps = np.arange(n, dtype=np.float64) * self._log_r
        with np.errstate(divide="ignore"):
            log_target = np.log(np.maximum(1.0 - c / np.maximum(mag, 1e-300), 0.0))
            log_prev = math.log(self._d) + self._log_r if self._d > 0.0 else -math.inf
        held = np.maximum.accumulate(log_target - steps)
        np.maximum(held, log_prev, out=held)
        d = np.exp(held + steps)
        y = np.clip(xa * (1.0 - d), -c, c)  # the clip only removes last-ulp rounding
        last = float(d[-1])
        self._d = last if last >= _SNAP else 0.0
        return np.asarray(y, dtype=np.float64)


def limit(
    x: npt.ArrayLike, rate: int, ceiling_db: float = -1.0, release_ms: float = 50.0
) -> FloatArray:
    """One-shot twin of :class:`Limiter`."""
    return Limiter(rate, ceiling_db, release_ms).process(x)
