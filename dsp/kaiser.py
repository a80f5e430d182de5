"""Kaiser-window FIR low-pass design in NumPy alone (the formulas of ``scipy.signal.kaiserord``
and ``firwin``, which the tests hold these to).

Why not scipy: importing ``scipy.signal`` takes 1.4 s of a worker's 2.3 s of imports on a slow
2-core box (it pulls in scipy.stats and scipy.interpolate), and a worker is useless until it is
ready: the design below is all the start-up path needed from it.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def kaiser_beta(atten_db: float) -> float:
    """Kaiser's β for a stopband attenuation in dB (Oppenheim & Schafer, eq. 7.62)."""
    a = abs(atten_db)
    if a > 50.0:
        return 0.1102 * (a - 8.7)
    if a > 21.0:
        return float(0.5842 * (a - 21.0) ** 0.4 + 0.07886 * (a - 21.0))
    return 0.0


def kaiserord(atten_db: float, width: float) -> tuple[int, float]:
    """(number of taps, β) for ``atten_db`` of attenuation and a transition ``width`` as a
    fraction of Nyquist (Kaiser's estimate, O&S eq. 7.63)."""
    a = abs(atten_db)
    if a < 8.0:
        raise ValueError(f"attenuation {a} dB is too small for the Kaiser formula (needs >= 8)")
    if not width > 0.0:
        raise ValueError(f"transition width must be positive, got {width}")
    numtaps = (a - 7.95) / 2.285 / (math.pi * width) + 1.0
    return math.ceil(numtaps), kaiser_beta(a)


def firwin_lowpass(numtaps: int, cutoff_hz: float, beta: float, fs: float) -> FloatArray:
    """Windowed-sinc low-pass, unity gain at DC, symmetric Kaiser window (``firwin(numtaps,
    cutoff, window=("kaiser", beta), fs=fs)``)."""
    if numtaps < 1:
        raise ValueError(f"numtaps must be >= 1, got {numtaps}")
    cutoff = cutoff_hz / (fs / 2.0)
    if not 0.0 < cutoff < 1.0:
        raise ValueError(f"cutoff {cutoff_hz} Hz must lie strictly between 0 and fs/2 = {fs / 2}")
    m = np.arange(numtaps, dtype=np.float64) - (numtaps - 1) / 2.0
    h = cutoff * np.sinc(cutoff * m) * np.kaiser(numtaps, beta)
    return np.asarray(h / h.sum(), dtype=np.float64)
