"""Semantic end of turn: has the caller finished what they meant to say, or only paused?

Silence alone cannot tell "I would like to check the balance on my account." from "I would
like to check the ..." (a pause while the caller looks for the word); replying to the second
one interrupts them. smart-turn v3 (Daily, BSD-2) listens to the last 8 s of the turn, words
and intonation together, and gives the probability that the turn is complete. Callers ask it
only after VAD heard speech followed by a short pause; what it says about silence means
nothing (it calls 1 s of digital silence complete, p ≈ 0.99).

Ask it early in the pause: it was made to run after a 0.2 s VAD stop (pipecat's setting), and
the silence it hears counts. Measured on the project's voice, sentences cut mid-phrase score
≤ 0.2 with 0.1-0.2 s of trailing silence but drift towards "complete" (often > 0.9) with
0.5 s or more, so waiting for a longer VAD pause first defeats it.

The model is the ONNX file the pipecat-ai wheel ships (``smart-turn-v3.2-cpu.onnx``, 8.7 MB).
It is located without importing pipecat (that pulls loguru and much more), only from the pinned
pipecat-ai version, and only after its SHA-256 matches the pinned digest: the bytes hashed are
the bytes loaded, so a changed file is refused, never used. Nothing is fetched from a model
hub. Features are computed by :mod:`gateway.stt.features` (Whisper log-mel, as pipecat does).

Its int8 weights are s8 and its activations u8. ONNX Runtime runs that pair with VNNI
instructions where the CPU has them (exact int32 sums); on an x86-64 CPU without VNNI (AVX2
only: older AMD EPYC, Intel before Ice Lake) its u8s8 kernels add pairs of products in 16 bits,
which saturate. The model then drifts to "complete": on the project's voice over 4 noise seeds
(44 turns each) it judged 6 wideband and 12 phone-line turns wrong, among them "I would ..."
at p = 0.96, against 0 and 1 with the model's own arithmetic. So on such a CPU the Q/DQ pairs
are run as written (``session.disable_quant_qdq``: dequantized weights, float matmuls, the
activations still quantized), which costs no time there (~245 ms either way on a 2-core EPYC).

Synchronous and CPU-bound (~50 ms of one core per prediction, ~60 ms to load): callers run
:meth:`SmartTurn.predict` off the event loop; one inference runs at a time per instance.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gateway.stt.base import STT_RATE, FloatArray
from gateway.stt.features import log_mel

# pipecat-ai 1.14.0 ships smart-turn v3.2 (CPU build: int8 QDQ weights) at this path in its
# package. Its one output is named "logits" but ends in a Sigmoid: it is the probability.
MODEL_PACKAGE = "pipecat-ai"
MODEL_PACKAGE_VERSION = "1.14.0"
MODEL_RELPATH = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"

WINDOW_S = 8  # the model hears the last 8 s of the turn, left-padded with silence if shorter
WINDOW = WINDOW_S * STT_RATE
DEFAULT_THRESHOLD = 0.5


class TurnModelUnavailable(RuntimeError):
    """The end-of-turn model is missing or does not match its pinned digest."""


@dataclass(frozen=True, slots=True)
class TurnVerdict:
    complete: bool  # probability > the model's threshold
    probability: float  # that the turn is complete, in [0, 1]
    compute_s: float  # features and inference


class EndOfTurnModel(Protocol):
    """Synchronous and CPU-bound: callers run it off the event loop."""

    name: str

    def predict(self, audio: FloatArray) -> TurnVerdict:
        """``audio``: the caller's current turn, 16 kHz mono, full scale ±1.0, any length."""
        ...


def _bundled_path() -> Path:
    """Where the pinned pipecat-ai keeps the model (found, not imported)."""
    need = f"end-of-turn model needs {MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION} (the 'stt' extra)"
    try:
        version = importlib.metadata.version(MODEL_PACKAGE)
        spec = importlib.util.find_spec("pipecat")  # top level: locates, executes nothing
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError) as exc:
        raise TurnModelUnavailable(need) from exc
    if version != MODEL_PACKAGE_VERSION:
        raise TurnModelUnavailable(f"{need}; {version} is installed")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root).joinpath(*MODEL_RELPATH)
        if path.is_file():
            return path
    raise TurnModelUnavailable(f"{need}; its package lacks {'/'.join(MODEL_RELPATH)}")


def _verified_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TurnModelUnavailable(f"end-of-turn model unreadable: {path} ({exc})") from exc
    if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
        raise TurnModelUnavailable(f"{path} does not match its pinned SHA-256: refusing to load it")
    return data


def model_path(path: Path | None = None) -> Path:
    """The model file, checked against :data:`MODEL_SHA256`: the one the pinned pipecat-ai
    ships, or ``path`` (a copy elsewhere, held to the same digest)."""
    p = _bundled_path() if path is None else Path(path)
    _verified_bytes(p)
    return p


def last_window(audio: FloatArray) -> FloatArray:
    """The last :data:`WINDOW_S` seconds of ``audio``, left-padded with zeros if shorter."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)
    if x.size >= WINDOW:
        return x[x.size - WINDOW :]
    return np.concatenate([np.zeros(WINDOW - x.size, np.float32), x])


# CPU flags (Linux /proc/cpuinfo) under which ONNX Runtime's u8s8 kernels sum exactly.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_is_exact(cpuinfo: str | None = None) -> bool:
    """Whether this CPU runs the model's u8s8 int8 products without 16-bit saturation: an
    x86-64 CPU with VNNI (or AMX), or not x86 at all (ARM's int8 dot products are exact).
    ``cpuinfo``: the text of /proc/cpuinfo (read if None; unreadable: assume exact)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return True
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":  # x86 only; ARM lists "Features"
            return bool(set(value.split()) & VNNI_FLAGS)
    return True


class SmartTurn:
    """smart-turn v3.2 on the CPU with onnxruntime, one inference at a time per instance."""

    name = "smart-turn v3.2"

    def __init__(
        self,
        *,
        threads: int = 1,
        threshold: float = DEFAULT_THRESHOLD,
        path: Path | None = None,
        int8_kernels: bool | None = None,
    ) -> None:
        """``int8_kernels``: run the Q/DQ pairs as ONNX Runtime's fused int8 kernels (as
        pipecat does); None: only where the CPU has VNNI (:func:`int8_is_exact`)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        import onnxruntime as ort

        data = _verified_bytes(_bundled_path() if path is None else Path(path))
        so = ort.SessionOptions()  # as pipecat runs it: one predictable thread by default
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1
        so.intra_op_num_threads = threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.int8_kernels = int8_is_exact() if int8_kernels is None else int8_kernels
        if not self.int8_kernels:
            so.add_session_config_entry("session.disable_quant_qdq", "1")
        self._session: Any = ort.InferenceSession(
            data, sess_options=so, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name  # "input_features": (batch, 80, 800)
        self.threshold = threshold
        self._lock = threading.Lock()  # one run per session keeps latency and threads bounded

    def predict(self, audio: FloatArray) -> TurnVerdict:
        t0 = time.perf_counter()
        window = last_window(audio)
        if not np.isfinite(window).all():
            raise ValueError("end-of-turn audio must be finite (it has NaN or infinity)")
        features = log_mel(window, do_normalize=True)[np.newaxis]
        with self._lock:
            out = self._session.run(None, {self._input: features})
        p = float(np.clip(np.asarray(out[0], dtype=np.float64).reshape(-1)[0], 0.0, 1.0))
        return TurnVerdict(p > self.threshold, p, time.perf_counter() - t0)
