"""What differs between the onnx and torch engines: the two halves of Piper's VITS.

``encode`` runs everything up to the latent z (text encoder, stochastic duration predictor,
length regulation, flow); ``decode`` runs the HiFi-GAN generator on a window of z. Streaming,
word marks, gain and tails live above this line (``synth.engines.streaming``) and are shared.

Noise is drawn by the caller's ``numpy.random.Generator`` in a fixed order, so a seeded call is
reproducible and both backends, given the same generator state, use the very same noise:

1. duration noise: ``draw_noise(rng, (dp_channels, n_ids))`` (dp_channels is 2 in VITS),
2. latent noise: ``draw_noise(rng, (latent_channels, frames))``, after the durations are known.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from synth.engines.base import FloatArray
from synth.engines.voice import Scales

IntArray = npt.NDArray[np.int64]

log = logging.getLogger("voxgate.worker")

# Environment variables an operator sets to choose BLAS threading; if any is set, we obey it.
_BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# OpenBLAS's setter under the names its builds export (numpy/scipy wheels prefix and suffix it).
_OPENBLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def limit_blas_threads(threads: int = 1) -> list[str]:
    """Set every OpenBLAS loaded in this process to ``threads`` threads; the libraries changed.

    A worker's numpy work (the telephone chain's polyphase resampler is one gemm per chunk)
    runs in the worker's own pool, one utterance per thread; OpenBLAS's default of one thread
    per core makes each small gemm hand work to threads that compete with onnxruntime and the
    other utterances. Measured on the 2-core Xeon under load (issue 17): the chain on 5.7 s of
    audio took 512 ms median with the default, 8 ms with one thread. Numpy exposes no setter,
    so the library's own exported one is called (found by the process's memory map: Linux);
    ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` set by an operator win.
    """
    if any(os.environ.get(name) for name in _BLAS_ENV):
        return []
    import numpy  # noqa: F401  # numpy's OpenBLAS must be loaded to be found

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    changed: list[str] = []
    for path in sorted(paths):
        if not path.startswith("/"):
            continue
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
        except OSError:
            continue
        for name in _OPENBLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(max(1, threads))
                changed.append(os.path.basename(path))
                break
    if changed:
        log.debug("BLAS threads set to %d in %s", max(1, threads), ", ".join(changed))
    return changed


def draw_noise(rng: np.random.Generator, shape: tuple[int, ...]) -> FloatArray:
    """Standard normal float32 noise: the one way both backends draw it."""
    return rng.standard_normal(shape, dtype=np.float32)


class Encoded(Protocol):
    """One encoded sentence: per-id durations and a latent z that can be read by windows.

    ``latent(start, end)`` returns z[:, start:end] (float32 [latent_channels, end - start]).
    A backend may compute z lazily (the onnx backend runs the flow, which is local in time,
    only on the frames asked for so far, plus context, so the first chunk does not wait for the
    flow over the whole sentence); any window must equal the same slice of the full z.
    Not thread-safe: an ``Encoded`` belongs to one ``stream()`` call.
    """

    @property
    def durations(self) -> IntArray:
        """Frames per phoneme id (int64, one per input id; they sum to ``frames``)."""
        ...

    @property
    def frames(self) -> int: ...

    def latent(self, start: int, end: int) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class EagerEncoded:
    """An ``Encoded`` whose whole z is already computed (the simple case, e.g. torch/GPU)."""

    z: FloatArray  # [latent_channels, frames]
    durations: IntArray

    @property
    def frames(self) -> int:
        return int(self.z.shape[1])

    def latent(self, start: int, end: int) -> FloatArray:
        return self.z[:, start:end]


@runtime_checkable
class Backend(Protocol):
    """The model halves an engine runs. Implementations must be safe to call from several
    threads at once (the worker steps several ``stream()`` generators in a thread pool)."""

    sample_rate: int
    hop_length: int
    latent_channels: int

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> Encoded:
        """Phoneme ids of one sentence → per-id durations and latent z (see module doc). Draws
        all of the sentence's noise before returning, so a lazy z stays deterministic."""
        ...

    def decode(self, z: FloatArray) -> FloatArray:
        """Latent z [latent_channels, T] → float32 audio of exactly T·hop_length samples."""
        ...
