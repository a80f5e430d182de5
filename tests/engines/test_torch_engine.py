"""The torch backend and engine: batched decoding, seeded noise, and parity with the onnx engine."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch  # noqa: E402

from synth.engines import torch_vits  # noqa: E402
from synth.engines.base import Engine  # noqa: E402
from synth.engines.onnx_engine import OnnxEngine  # noqa: E402
from synth.engines.torch_engine import DecodeBatcher, TorchBackend, TorchEngine  # noqa: E402
from synth.engines.voice import DETERMINISTIC, Voice  # noqa: E402

TEXT = "Thank you for calling. Your appointment is on Tuesday, at three thirty."


def snr_db(ref: np.ndarray[Any, Any], x: np.ndarray[Any, Any]) -> float:
    err = float(np.sum((ref.astype(np.float64) - x) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)))


@pytest.fixture(scope="module")
def voice() -> Voice:
    return Voice.load()


@pytest.fixture(scope="module")
def backend(voice: Voice) -> TorchBackend:
    # Batching is a CUDA default; switch it on explicitly to test it on the CPU.
    b = TorchBackend(voice, "cpu", threads=2, batching=True, batch_window_s=2.0, max_batch=4)
    return b


@pytest.fixture(scope="module")
def ids(voice: Voice) -> list[int]:
    return list(voice.phonemize(TEXT)[0].phoneme_ids)


def test_batched_decode_equals_individual_decodes(backend: TorchBackend, ids: list[int]) -> None:
    z = backend.encode(ids, DETERMINISTIC, np.random.default_rng(0)).z
    pieces = [z[:, :13], z[:, 5:35], z[:, 3:4], z[:, 20:]]
    assert len({p.shape[1] for p in pieces}) == 4
    with torch.inference_mode():
        alone = [
            torch_vits.decode(backend.net.dec, torch.from_numpy(p)[None]).reshape(-1).numpy()
            for p in pieces
        ]
    assert backend.batcher is not None
    for buckets in [(), (64,)]:  # padded to the longest, then up to a warmed bucket
        backend.batcher.buckets = buckets
        backend.batcher.batch_sizes.clear()
        out: list[np.ndarray[Any, Any] | None] = [None] * len(pieces)

        def run(i: int, out: list[np.ndarray[Any, Any] | None] = out) -> None:
            out[i] = backend.decode(pieces[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pieces))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # All four arrived within the window: one batch of four.
        assert backend.batcher.batch_sizes == [4]
        for got, ref, p in zip(out, alone, pieces, strict=True):
            assert got is not None and got.shape == (p.shape[1] * backend.hop_length,)
            assert snr_db(ref, got) >= 60.0


def test_batcher_does_not_wait_for_a_lone_caller() -> None:
    calls: list[list[int]] = []

    def run(z: torch.Tensor, frames: list[int]) -> torch.Tensor:
        calls.append(frames)
        return torch.ones(z.shape[0], z.shape[2] * 2)

    batcher = DecodeBatcher(run, 2, window_s=10.0, max_batch=8, expected=lambda: 1)
    try:
        audio = batcher.decode(torch.zeros(3, 5))  # would hang for 10 s if it waited
        assert audio.shape == (10,) and calls == [[5]]
    finally:
        batcher.close()


def test_batcher_hands_errors_to_the_caller() -> None:
    def run(z: torch.Tensor, frames: list[int]) -> torch.Tensor:
        raise RuntimeError("boom")

    batcher = DecodeBatcher(run, 2, window_s=0.0)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            batcher.decode(torch.zeros(3, 5))
    finally:
        batcher.close()


# -- the engine ---------------------------------------------------------------------------------

LONG = "Your balance is twelve dollars. Press one to pay now, or two to speak with an agent."


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    e = TorchEngine(threads=2, seed=5)
    e.warmup()
    return e


def test_engine_interface(engine: TorchEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.name == "torch" and engine.sample_rate == 22050
    assert engine.voice == "en_US-joe-medium"
    assert engine.torch_backend.batcher is None  # CPU default: no batching


def test_seeded_torch_engine_speaks_like_the_onnx_engine(engine: TorchEngine) -> None:
    # Same seed → same numpy noise in the same order → the same audio from both engines, with
    # the voice's own (non-zero) noise scales.
    onnx_engine = OnnxEngine(threads=2, seed=5)
    ref = onnx_engine.synthesize(TEXT)
    got = engine.synthesize(TEXT)
    assert got.shape == ref.shape
    assert snr_db(ref, got) >= 60.0


def test_stream_equals_synthesize_and_counts_streams(engine: TorchEngine) -> None:
    whole = engine.synthesize(LONG)
    chunks = list(engine.stream(LONG))
    assert engine.active_streams == 0
    assert chunks[-1].final and len(chunks) > 2
    assert snr_db(whole, np.concatenate([c.audio for c in chunks])) >= 60.0
    gen = engine.stream(LONG)
    assert isinstance(gen, Generator)
    next(gen)
    assert engine.active_streams == 1
    gen.close()
    assert engine.active_streams == 0


def test_warmup_covers_every_window_width(engine: TorchEngine) -> None:
    seen: list[int] = []
    backend = engine.torch_backend
    original = backend.decode

    def spy(z: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        seen.append(int(z.shape[1]))
        return original(z)

    backend.decode = spy  # type: ignore[method-assign]
    try:
        engine.warmup()
    finally:
        del backend.decode
    assert set(engine.config.window_widths) <= set(seen)
    # The CUDA-only batch warm-up also runs on the CPU when called directly.
    backend.warm_batches([engine.config.window_widths[0]], 2)


def test_concurrent_streams_are_batched_and_unchanged(engine: TorchEngine) -> None:
    batched = TorchEngine(threads=2, seed=5, batching=True, batch_window_ms=200.0, max_batch=4)
    texts = [TEXT, LONG, "Goodbye.", "One moment, please, while I transfer you."]
    refs = [engine.synthesize(t) for t in texts]
    outs: list[np.ndarray[Any, Any] | None] = [None] * len(texts)
    barrier = threading.Barrier(len(texts))

    def run(i: int) -> None:
        gen = batched.stream(texts[i])
        barrier.wait()
        outs[i] = np.concatenate([c.audio for c in gen])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher = batched.torch_backend.batcher
    assert batcher is not None and max(batcher.batch_sizes) > 1
    for ref, got in zip(refs, outs, strict=True):
        assert got is not None and got.shape == ref.shape
        assert snr_db(ref, got) >= 60.0
    batched.close()
