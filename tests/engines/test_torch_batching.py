"""Batched streaming across streams in the torch engine (issue 16), on the CPU.

Every stream's audio must be what it is unbatched, whatever shares its batches: mixed lengths,
streams starting and stopping mid-batch, a stream cancelled while its call waits in a batch, a
poison request in a batch.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from synth.engines.base import EngineChunk  # noqa: E402
from synth.engines.batching import Runner  # noqa: E402
from synth.engines.torch_engine import TorchEngine  # noqa: E402
from tests.engines.batch_support import (  # noqa: E402
    hold_scheduler,
    patch_poison,
    run_threads,
)

TEXTS = [
    "Thank you for calling. How can I help you today?",
    "Goodbye.",
    "Your appointment with Doctor Smith is confirmed for Tuesday at three forty five.",
    "Please hold.",
]
POISON = "this one is poison"


def snr_db(ref: np.ndarray[Any, Any], x: np.ndarray[Any, Any]) -> float:
    err = float(np.sum((ref.astype(np.float64) - x) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)))


@pytest.fixture(scope="module")
def reference() -> dict[str, list[np.ndarray[Any, Any]]]:
    """Each text's chunks from the unbatched engine (same seed: same noise)."""
    engine = TorchEngine(threads=2, seed=11)
    return {t: [c.audio for c in engine.stream(t)] for t in TEXTS}


@pytest.fixture(scope="module")
def batched() -> Iterator[TorchEngine]:
    engine = TorchEngine(seed=11, batching=True, window_ms=50.0, max_batch=8, budget_ms=0)
    patch_poison(engine, POISON)  # the text embedding raises
    yield engine
    engine.close()


_threads = run_threads


def _hold(engine: TorchEngine) -> tuple[threading.Event, threading.Thread]:
    assert engine.scheduler is not None
    return hold_scheduler(engine.torch_backend.on_scheduler, engine.scheduler)


def _wait_queued(engine: TorchEngine, n: int) -> None:
    assert engine.scheduler is not None
    deadline = time.monotonic() + 30
    while engine.scheduler.waiting < n and time.monotonic() < deadline:
        time.sleep(0.002)
    assert engine.scheduler.waiting >= n


def test_mixed_lengths_starting_and_stopping_mid_batch(
    batched: TorchEngine, reference: dict[str, list[np.ndarray[Any, Any]]]
) -> None:
    scheduler = batched.scheduler
    assert scheduler is not None
    scheduler.records.clear()
    first_chunk = threading.Event()

    def whole(text: str, *, signal: bool = False, after: threading.Event | None = None) -> Any:
        if after is not None:
            after.wait(60)  # starts while the others are mid-stream
        chunks = []
        for c in batched.stream(text):
            chunks.append(c.audio)
            if signal:
                first_chunk.set()
        return chunks

    def stopped(text: str, keep: int) -> Any:
        gen = batched.stream(text)
        assert isinstance(gen, Generator)
        chunks = [next(gen).audio for _ in range(keep)]
        gen.close()  # its caller went away mid-utterance
        return chunks

    out = _threads(
        [
            lambda: whole(TEXTS[0], signal=True),
            lambda: stopped(TEXTS[2], 2),
            lambda: whole(TEXTS[1]),
            lambda: whole(TEXTS[3], after=first_chunk),
            lambda: whole(TEXTS[2], after=first_chunk),
        ]
    )
    expected = [
        reference[TEXTS[0]],
        reference[TEXTS[2]][:2],
        reference[TEXTS[1]],
        reference[TEXTS[3]],
        reference[TEXTS[2]],
    ]
    for got, ref in zip(out, expected, strict=True):
        assert not isinstance(got, Exception), got
        assert len(got) == len(ref)
        for g, r in zip(got, ref, strict=True):
            assert g.shape == r.shape
            assert snr_db(r, g) >= 100.0
    # Decoder windows of several streams shared batches (encodes run one by one on a CPU).
    assert max(r.size for r in scheduler.records if r.kind == "decode") > 1
    assert batched.active_streams == 0 and scheduler.in_step == 0


def test_cancel_inside_a_batch_stops_only_that_stream(
    batched: TorchEngine, reference: dict[str, list[np.ndarray[Any, Any]]]
) -> None:
    scheduler = batched.scheduler
    assert scheduler is not None
    cancel = threading.Event()
    release, holder = _hold(batched)
    try:

        def run(text: str, should_stop: Callable[[], bool] | None = None) -> Any:
            return [c for c in batched.stream(text, should_stop)]

        results: list[Any] = []
        runner = threading.Thread(
            target=lambda: results.extend(
                _threads(
                    [
                        lambda: run(TEXTS[0]),
                        lambda: run(TEXTS[1], cancel.is_set),
                        lambda: run(TEXTS[3]),
                    ]
                )
            )
        )
        runner.start()
        _wait_queued(batched, 3)  # all three encodes wait for the held scheduler
        scheduler.records.clear()
        cancel.set()  # the caller of the second hangs up while its call sits in the batch
    finally:
        release.set()
        holder.join(30)
    runner.join(120)
    kept0, cancelled, kept3 = results
    assert cancelled == []  # stopped before any audio: no chunk, hence none final
    for got, text in ((kept0, TEXTS[0]), (kept3, TEXTS[3])):
        assert isinstance(got, list) and got[-1].final
        audio = np.concatenate([c.audio for c in got])
        assert snr_db(np.concatenate(reference[text]), audio) >= 100.0
    # The cancelled stream's encode never ran; the others' all did.
    encoded = sum(r.size for r in scheduler.records if r.kind == "encode")
    assert encoded == len(batched._sentences(TEXTS[0])) + len(batched._sentences(TEXTS[3]))


def test_poison_request_in_a_batch_fails_only_itself(
    batched: TorchEngine, reference: dict[str, list[np.ndarray[Any, Any]]]
) -> None:
    release, holder = _hold(batched)

    def run(text: str) -> list[EngineChunk]:
        return list(batched.stream(text))

    try:
        results: list[Any] = []
        runner = threading.Thread(
            target=lambda: results.extend(
                _threads([lambda: run(TEXTS[1]), lambda: run(POISON), lambda: run(TEXTS[3])])
            )
        )
        runner.start()
        _wait_queued(batched, 3)
    finally:
        release.set()
        holder.join(30)
    runner.join(120)
    good1, poison, good3 = results
    assert isinstance(poison, IndexError)
    for got, text in ((good1, TEXTS[1]), (good3, TEXTS[3])):
        assert not isinstance(got, Exception), got
        audio = np.concatenate([c.audio for c in got])
        assert snr_db(np.concatenate(reference[text]), audio) >= 100.0
    # The scheduler serves on after it.
    assert len(run(TEXTS[1])) == len(reference[TEXTS[1]])


def test_batched_encoder_matches_the_lone_one_to_rounding() -> None:
    """The GPU path's padded encoder batch (off on a CPU: see torch_engine's doc): same
    durations, z within float rounding of encoding each sentence alone."""
    import torch

    from synth.engines import torch_vits
    from synth.engines.backend import draw_noise

    engine = TorchEngine(threads=2, seed=3, batching=True, batch_encode=True, max_batch=4)
    try:
        backend = engine.torch_backend
        voice = engine.loaded_voice
        ids = [list(voice.phonemize(t)[0].phoneme_ids) for t in TEXTS]
        scales = engine.scales

        def call(i: int) -> Any:
            rng = np.random.default_rng(i)
            return backend.encode(ids[i], scales, rng)

        scheduler = engine.scheduler
        assert scheduler is not None
        # All four in one batch: no CPU padding limit for this test.
        encode = scheduler.runners["encode"]
        scheduler.runners["encode"] = Runner(encode.run, encode.units)
        release, holder = _hold(engine)
        results: list[Any] = []
        calls: list[Callable[[], Any]] = [functools.partial(call, i) for i in range(len(ids))]
        runner = threading.Thread(target=lambda: results.extend(_threads(calls)))
        runner.start()
        _wait_queued(engine, len(ids))
        release.set()
        holder.join(30)
        runner.join(120)
        assert [r.size for r in scheduler.records if r.kind == "encode"][-1] == len(ids)
        with torch.inference_mode():
            for i, got in enumerate(results):
                rng = np.random.default_rng(i)
                dur = torch.from_numpy(draw_noise(rng, (2, len(ids[i]))))[None]

                def latent(n: int, rng: np.random.Generator = rng) -> torch.Tensor:
                    return torch.from_numpy(draw_noise(rng, (backend.latent_channels, n)))[None]

                z, durations = torch_vits.encode(
                    backend.net, torch.tensor([ids[i]]), scales.noise_scale,
                    scales.length_scale, scales.noise_w, duration_noise=dur, latent_noise=latent,
                )  # fmt: skip
                assert np.array_equal(got.durations, durations.numpy())
                assert snr_db(z[0].numpy(), got.z) >= 110.0
    finally:
        engine.close()
