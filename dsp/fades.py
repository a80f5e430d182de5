"""Click-free gain ramps: cosine fade-out (streaming and one-shot) and Hann crossfade.

Fade-out shape: ``g[k] = 0.5 * (1 + cos(pi * k / n))`` for ``k < n`` and 0 after, i.e. the
falling half of a Hann window.  It starts at exactly 1 with zero slope and reaches 0 with zero
slope, so the faded signal and its first derivative stay continuous; a hard cut is a step,
whose spectrum falls off only as 1/f and is heard as a click.

Crossfade: equal-gain Hann (``w_in + w_out == 1`` on every sample).  The crossfade joins two
renderings of the *same* signal (vocoder chunks decoded with overlapping context): they are
coherent, so their amplitudes add and equal gain keeps the level; identical inputs come out
unchanged.  Equal-power (``w_in² + w_out² == 1``) is for uncorrelated material and would give
a +3 dB bump in the middle of a coherent join.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def fade_out_gain(n: int, start: int = 0, count: int | None = None) -> FloatArray:
    """Gains of an ``n``-sample cosine fade for fade positions ``start .. start+count-1``."""
    if n < 0:
        raise ValueError("fade length must be >= 0")
    count = n - start if count is None else count
    k = np.arange(start, start + count, dtype=np.float64)
    g = 0.5 * (1.0 + np.cos(np.pi * np.minimum(k, n) / max(n, 1)))
    g[k >= n] = 0.0
    return g


class FadeOut:
    """Streaming cosine fade to zero over ``n_samples``, across any chunk boundaries.

    ``process(x)`` returns ``x`` times the next ``len(x)`` fade gains (zeros once the fade is
    complete, same length as the input).  State: the fade position.
    """

    def __init__(self, n_samples: int) -> None:
        if n_samples < 0:
            raise ValueError("n_samples must be >= 0")
        self.n_samples = n_samples
        self.reset()

    def reset(self) -> None:
        self._pos = 0

    @property
    def done(self) -> bool:
        """True once every further sample will be multiplied by zero."""
        return self._pos >= self.n_samples

    @property
    def remaining(self) -> int:
        return max(self.n_samples - self._pos, 0)

    def process(self, x: npt.ArrayLike) -> FloatArray:
        xa = np.asarray(x, dtype=np.float64).reshape(-1)
        g = fade_out_gain(self.n_samples, self._pos, xa.size)
        self._pos += xa.size
        return np.asarray(xa * g, dtype=np.float64)


def cosine_fade_out(x: npt.ArrayLike, n: int) -> FloatArray:
    """One-shot twin of :class:`FadeOut`: fade ``x`` to zero over its first ``n`` samples.

    Samples from ``n`` on are zero; the output has the length of ``x`` (callers drop the
    zeros they do not want to send).
    """
    return FadeOut(n).process(x)


def hann_crossfade_weights(n: int) -> FloatArray:
    """Rising weights ``w_in`` of an equal-gain Hann crossfade of ``n`` samples.

    Sampled at the sample centres ``(k + 0.5) / n`` so that ``w_in[k] + w_in[n-1-k] == 1``:
    the ramp is symmetric, never exactly 0 or 1, and the fade-out is its mirror image.
    """
    t = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
    return np.asarray(0.5 * (1.0 - np.cos(np.pi * t)), dtype=np.float64)


def hann_crossfade(a_tail: npt.ArrayLike, b_head: npt.ArrayLike) -> FloatArray:
    """Equal-gain Hann crossfade of the end of ``a`` into the start of ``b`` (same length).

    Returns ``a_tail * (1 - w) + b_head * w``; identical inputs come out unchanged.
    """
    a = np.asarray(a_tail, dtype=np.float64).reshape(-1)
    b = np.asarray(b_head, dtype=np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"crossfade needs equal lengths, got {a.size} and {b.size}")
    w = hann_crossfade_weights(a.size)
    return np.asarray(a + w * (b - a), dtype=np.float64)
