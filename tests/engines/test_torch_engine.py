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
from synth.engines.torch_engine import TorchBackend, TorchEngine, row_buckets  # noqa: E402
from synth.engines.voice import DETERMINISTIC, Voice  # noqa: E402

TEXT = "Thank you for calling. Your appointment is on Tuesday, at three thirty."


def snr_db(ref: np.ndarray[Any, Any], x: np.ndarray[Any, Any]) -> float:
    err = float(np.sum((ref.astype(np.float64) - x) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)))


@pytest.fixture(scope="module")
def voice() -> Voice:
    return Voice.load()


@pytest.fixture(scope="module")
def backend(voice: Voice) -> Generator[TorchBackend, None, None]:
    # Batching is a CUDA default; switch it on explicitly to test it on the CPU.
    b = TorchBackend(voice, "cpu", threads=2, batching=True, window_ms=2000.0, max_batch=4)
    yield b
    b.close()


@pytest.fixture(scope="module")
def ids(voice: Voice) -> list[int]:
    return list(voice.phonemize(TEXT)[0].phoneme_ids)


def test_batched_decode_equals_individual_decodes(backend: TorchBackend, ids: list[int]) -> None:
    z = backend.encode(ids, DETERMINISTIC, np.random.default_rng(0)).z
    # Mixed lengths in one batch: padded to the longest and masked.
    pieces = [z[:, :13], z[:, 5:35], z[:, 3:4], z[:, 20:]]
    assert len({p.shape[1] for p in pieces}) == 4
    with torch.inference_mode():
        alone = [
            torch_vits.decode(backend.net.dec, torch.from_numpy(p)[None]).reshape(-1).numpy()
            for p in pieces
        ]
    scheduler = backend.scheduler
    assert scheduler is not None
    scheduler.records.clear()
    # No padding limit for this test: on a CPU the runner keeps batches to similar widths.
    decode_runner = scheduler.runners["decode"]
    scheduler.runners["decode"] = type(decode_runner)(decode_runner.run, decode_runner.units)
    try:
        out: list[np.ndarray[Any, Any] | None] = [None] * len(pieces)
        barrier = threading.Barrier(len(pieces))

        def run(i: int, out: list[np.ndarray[Any, Any] | None] = out) -> None:
            with scheduler.step():
                barrier.wait()
                out[i] = backend.decode(pieces[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pieces))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        scheduler.runners["decode"] = decode_runner
    # All four were inside a step: one batch of four.
    assert [r.size for r in scheduler.records if r.kind == "decode"] == [4]
    for got, ref, p in zip(out, alone, pieces, strict=True):
        assert got is not None and got.shape == (p.shape[1] * backend.hop_length,)
        assert snr_db(ref, got) >= 100.0


def test_row_buckets() -> None:
    assert row_buckets(1) == (1,)
    assert row_buckets(8) == (1, 2, 4, 8)
    assert row_buckets(12) == (1, 2, 4, 8, 12)


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
    assert engine.scheduler is None  # CPU default: no batching
    assert engine.concurrent_steps is None


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
    # The CUDA-only batch warm-up also runs on the CPU when called directly (no graphs there).
    assert backend.warm_batches([engine.config.window_widths[0]], 2) == 2
    assert backend.graphs == 0


def test_concurrent_streams_are_batched_and_unchanged(engine: TorchEngine) -> None:
    batched = TorchEngine(threads=2, seed=5, batching=True, window_ms=200.0, max_batch=4)
    assert batched.concurrent_steps is not None and batched.concurrent_steps >= 4
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
    scheduler = batched.scheduler
    assert scheduler is not None and max(r.size for r in scheduler.records) > 1
    for ref, got in zip(refs, outs, strict=True):
        assert got is not None and got.shape == ref.shape
        assert snr_db(ref, got) >= 60.0
    batched.close()
