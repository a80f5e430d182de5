"""Level metering in dBFS: RMS and sample peak of a block, and a streaming meter.

Full scale is a sample magnitude of 1.0 (float) / 32768 (int16 input is scaled first).  RMS is
not AES17-corrected: a full-scale sine reads -3.01 dBFS RMS and 0 dBFS peak.  Silence reads
``floor_db`` instead of -inf so levels can be logged and compared.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FLOOR_DB = -150.0


def _as_float(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    xa = np.asarray(x)
    if xa.dtype == np.int16:
        return xa.astype(np.float64) / 32768.0
    return xa.astype(np.float64).reshape(-1)


def _db(amplitude: float, floor_db: float) -> float:
    if amplitude <= 0.0:
        return floor_db
    return max(20.0 * math.log10(amplitude), floor_db)


def dbfs_rms(x: npt.ArrayLike, floor_db: float = FLOOR_DB) -> float:
    """RMS level in dBFS (empty or silent input → ``floor_db``)."""
    xa = _as_float(x)
    if xa.size == 0:
        return floor_db
    return _db(math.sqrt(float(np.mean(np.square(xa)))), floor_db)


def dbfs_peak(x: npt.ArrayLike, floor_db: float = FLOOR_DB) -> float:
    """Sample-peak level in dBFS (empty or silent input → ``floor_db``)."""
    xa = _as_float(x)
    if xa.size == 0:
        return floor_db
    return _db(float(np.max(np.abs(xa))), floor_db)


class LevelMeter:
    """Streaming meter: RMS and peak over everything fed since the last :meth:`reset`.

    State: sample count, sum of squares, peak.  Feeding a signal in any chunking gives the same
    readings as :func:`dbfs_rms` / :func:`dbfs_peak` on the whole signal.
    """

    def __init__(self, floor_db: float = FLOOR_DB) -> None:
        self.floor_db = floor_db
        self.reset()

    def reset(self) -> None:
        self._n = 0
        self._sum_sq = 0.0
        self._peak = 0.0

    def process(self, x: npt.ArrayLike) -> None:
        xa = _as_float(x)
        if xa.size:
            self._n += xa.size
            self._sum_sq += float(np.dot(xa, xa))
            self._peak = max(self._peak, float(np.max(np.abs(xa))))

    @property
    def samples(self) -> int:
        return self._n

    @property
    def rms_dbfs(self) -> float:
        if self._n == 0:
            return self.floor_db
        return _db(math.sqrt(self._sum_sq / self._n), self.floor_db)

    @property
    def peak_dbfs(self) -> float:
        return _db(self._peak, self.floor_db)
