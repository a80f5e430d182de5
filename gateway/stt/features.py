"""Whisper-style log-mel features in numpy, for the end-of-turn model (:mod:`gateway.stt.turn`).

smart-turn v3 is a Whisper encoder with a classifier head, trained on the features that
``transformers.WhisperFeatureExtractor`` computes. Those are reproduced here rather than taken
from pipecat's private ``_whisper_features`` module (importing pipecat pulls loguru and much
more, and a private module may change under a patch release) or from ``transformers`` (far
too heavy for one spectrogram). A test checks that the two agree to ~1e-4.

The recipe, at 16 kHz: optionally normalise the waveform to zero mean and unit variance; frame
it centred (reflect padding of ``N_FFT // 2``) with a periodic Hann window of 400 samples every
160 (25 ms windows, 10 ms hop); power spectrum; 80 Slaney-scale, Slaney-normalised triangular
mel filters over 0-8 kHz; ``log10`` with a floor of 1e-10; drop the last frame; clamp to
8 decades below the maximum; ``(x + 4) / 4``. The arithmetic runs in float64 (as the
reference does) and the result is float32, shape ``(80, len(audio) // 160)``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 80
LOG_FLOOR = 1e-10  # power floor before log10
DYNAMIC_RANGE = 8.0  # decades kept below the loudest bin
NORM_EPS = 1e-7  # variance floor of the waveform normalisation

FloatArray = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above it.
_LIN_HZ_PER_MEL = 200.0 / 3.0
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _LIN_HZ_PER_MEL  # 15 mel
_MELS_PER_LOG_HZ = 27.0 / np.log(6.4)


def hz_to_mel(hz: npt.ArrayLike) -> Float64Array:
    f = np.asarray(hz, dtype=np.float64)
    log_part = _LOG_START_MEL + np.log(np.maximum(f, _LOG_START_HZ) / _LOG_START_HZ) * (
        _MELS_PER_LOG_HZ
    )
    return np.where(f >= _LOG_START_HZ, log_part, f / _LIN_HZ_PER_MEL)


def mel_to_hz(mel: npt.ArrayLike) -> Float64Array:
    m = np.asarray(mel, dtype=np.float64)
    log_part = _LOG_START_HZ * np.exp(
        (np.maximum(m, _LOG_START_MEL) - _LOG_START_MEL) / _MELS_PER_LOG_HZ
    )
    return np.where(m >= _LOG_START_MEL, log_part, m * _LIN_HZ_PER_MEL)


def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SAMPLE_RATE) -> Float64Array:
    """Triangular filters, shape ``(n_mels, n_fft // 2 + 1)``, evenly spaced in Slaney mels
    from 0 Hz to Nyquist, each scaled to unit area (``2 / bandwidth``, librosa's
    ``norm="slaney"``) as Whisper's filter bank is."""
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(rate / 2.0), n_mels + 2))
    bins = np.linspace(0.0, rate // 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return np.asarray(tri * (2.0 / (hi - lo)), dtype=np.float64)


_WINDOW = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
_FILTERS = mel_filters()
# Each filter spans at most 14 FFT bins: applying them band by band is ~7x faster than the dense
# (80 x 201) product and stays out of the threaded BLAS, whose idle workers would otherwise spin
# on the other core for tens of ms after every call (the cost of a prediction doubled).
_BANDS = tuple(
    (int(nz[0]), int(nz[-1]) + 1, row[nz[0] : nz[-1] + 1].copy())
    for row in _FILTERS
    for nz in [np.flatnonzero(row)]
)


def normalize(audio: npt.ArrayLike) -> FloatArray:
    """Zero mean, unit variance (``do_normalize``), in float32 as the reference computes it."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size == 0:
        return x
    out = (x - x.mean()) / np.sqrt(x.var() + np.float32(NORM_EPS))
    return np.asarray(out, dtype=np.float32)


def log_mel(audio: npt.ArrayLike, *, do_normalize: bool = True) -> FloatArray:
    """Log-mel features of 16 kHz mono ``audio``: shape ``(80, len(audio) // 160)``, roughly
    in [-1, 1]. The caller fixes the length (smart-turn wants exactly 8 s: 800 frames)."""
    x = normalize(audio) if do_normalize else np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size <= N_FFT // 2:
        raise ValueError(f"log-mel features need more than {N_FFT // 2} samples, got {x.size}")
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = sliding_window_view(padded, N_FFT)[::HOP]  # (1 + len // HOP, N_FFT), no copy
    power = np.ascontiguousarray((np.abs(np.fft.rfft(frames * _WINDOW, axis=-1)) ** 2).T)
    mel = np.empty((N_MELS, power.shape[1]), np.float64)  # power: (bins, frames)
    for m, (lo, hi, weights) in enumerate(_BANDS):
        np.dot(weights, power[lo:hi], out=mel[m])
    mel = np.log10(np.maximum(mel, LOG_FLOOR))[:, :-1]  # (n_mels, frames - 1)
    mel = np.maximum(mel, mel.max() - DYNAMIC_RANGE)
    return np.asarray((mel + 4.0) / 4.0, dtype=np.float32)
