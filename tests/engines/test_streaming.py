"""The backend-agnostic streaming layer, driven by a tiny fake backend (fast, exact)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from synth.engines.backend import EagerEncoded
from synth.engines.base import FloatArray
from synth.engines.streaming import (
    DEFAULT_GAIN,
    StreamConfig,
    StreamingEngine,
    plan_chunks,
)
from synth.engines.voice import Scales, Voice

HOP = 32


class FakeBackend:
    """A decoder that is a 7-frame FIR over z followed by hop-fold repetition: local in time like
    HiFi-GAN (receptive field 3 frames each side), so windows with >= 3 frames of context are
    exact. ``level`` scales the output so gain handling can be checked."""

    sample_rate = 8000
    hop_length = HOP
    latent_channels = 2

    def __init__(self, level: float = 0.3) -> None:
        self.level = level
        self.shapes: list[int] = []

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> EagerEncoded:
        durations = np.array([1 + (i % 3) for i in range(len(phoneme_ids))], dtype=np.int64)
        frames = int(durations.sum())
        z = rng.standard_normal((self.latent_channels, frames), dtype=np.float32)
        return EagerEncoded(z=z, durations=durations)

    def decode(self, z: FloatArray) -> FloatArray:
        self.shapes.append(z.shape[1])
        kernel = np.array([0.1, 0.2, 0.4, 1.0, 0.4, 0.2, 0.1], dtype=np.float32)
        y = np.convolve(z[0], kernel, mode="same") + 0.5 * np.convolve(z[1], kernel, mode="same")
        ramp = np.linspace(0.2, 1.0, HOP, dtype=np.float32)
        return (self.level * 0.25 * np.outer(y, ramp).reshape(-1)).astype(np.float32)


@pytest.fixture(scope="module")
def voice() -> Voice:
    return Voice.load()


def make(voice: Voice, **kwargs: float | int) -> StreamingEngine:
    level = float(kwargs.pop("level", 0.3))
    config = StreamConfig(**kwargs)  # type: ignore[arg-type]
    return StreamingEngine(FakeBackend(level), voice, seed=3, config=config)


LONG = (
    "Please hold while I transfer your call to the next available representative, who will be "
    "with you shortly. Thank you for your patience. Goodbye."
)


@pytest.mark.parametrize("frames", [1, 5, 33, 34, 60, 61, 150, 151, 400, 1000])
@pytest.mark.parametrize("first_step", [0, 3])
def test_plan_covers_frames_with_fixed_windows(frames: int, first_step: int) -> None:
    config = StreamConfig(fixed_windows=True)
    plans = plan_chunks(frames, config, first_step)
    assert plans[0].start == 0 and plans[-1].end == frames
    for prev, cur in itertools.pairwise(plans):
        assert prev.end == cur.start
    for plan in plans:
        assert 0 <= plan.win_start <= max(0, plan.start - config.left_context)
        assert plan.win_end >= min(frames, plan.end + config.right_context)
        assert plan.win_end <= frames
        width = plan.win_end - plan.win_start
        # A warmed window width, or the whole sentence when no warmed width fits inside it.
        assert width in config.window_widths or width == frames


@pytest.mark.parametrize("frames", [1, 5, 33, 34, 60, 61, 150, 151, 400, 1000])
def test_exact_windows_are_chunk_plus_context(frames: int) -> None:
    config = StreamConfig()
    plans = plan_chunks(frames, config)
    assert plans[0].start == 0 and plans[-1].end == frames
    for plan in plans:
        lo = max(0, plan.start - config.left_context)
        hi = min(frames, plan.end + config.right_context)
        assert (plan.win_start, plan.win_end) == (lo, hi) or len(plans) == 1


def test_plan_follows_the_schedule() -> None:
    config = StreamConfig(schedule=(10, 20, 40, 80))
    sizes = [p.end - p.start for p in plan_chunks(1000, config)]
    assert sizes[:4] == [10, 20, 40, 80]
    assert all(s == 80 for s in sizes[4:-1])
    # A later sentence continues the schedule: no small chunks any more.
    assert [p.end - p.start for p in plan_chunks(1000, config, 4)][:2] == [80, 80]
    # Short sentences are decoded whole.
    assert len(plan_chunks(40, config)) == 1


@pytest.mark.parametrize("context", [6, 12])  # reach 3 + crossfade 2.5 frames
@pytest.mark.parametrize("crossfade_ms", [0.0, 10.0])
def test_stream_equals_one_shot(voice: Voice, context: int, crossfade_ms: float) -> None:
    engine = make(voice, left_context=context, right_context=context, crossfade_ms=crossfade_ms)
    for text in ("Hi.", "Hello", LONG):
        one = engine.synthesize(text)
        chunks = list(engine.stream(text))
        streamed = np.concatenate([c.audio for c in chunks])
        np.testing.assert_allclose(streamed, one, atol=1e-6)
        assert [c.offset for c in chunks] == list(
            np.cumsum([0] + [len(c.audio) for c in chunks])[:-1]
        )
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]


def test_short_context_joins_are_smoothed_by_crossfade(voice: Voice) -> None:
    # Too little context: chunk edges disagree with the one-shot decode. Without a crossfade that
    # shows as a step at each join; the crossfade must shrink it.
    def join_steps(crossfade_ms: float) -> float:
        engine = make(voice, left_context=2, right_context=2, crossfade_ms=crossfade_ms)
        one = engine.synthesize(LONG)
        chunks = list(engine.stream(LONG))
        audio = np.concatenate([c.audio for c in chunks])
        steps = np.diff(audio) - np.diff(one)
        return float(sum(abs(steps[c.offset - 1]) for c in chunks[1:]))

    hard, soft = join_steps(0.0), join_steps(4.0)
    assert 0 < soft < 0.8 * hard


def test_should_stop_ends_within_one_chunk(voice: Voice) -> None:
    engine = make(voice)
    total = len(list(engine.stream(LONG)))
    assert total > 4
    stop = threading.Event()
    got = []
    for chunk in engine.stream(LONG, should_stop=stop.is_set):
        got.append(chunk)
        if len(got) == 2:
            stop.set()
    assert len(got) == 2
    assert not got[-1].final


def test_fixed_gain_and_sentence_tails(voice: Voice) -> None:
    quiet = make(voice, level=0.1, gain=1.0, tail_ms=0.0)
    loud = make(voice, level=0.3, gain=1.0, tail_ms=0.0)
    gained = make(voice, level=0.1, tail_ms=0.0)
    a, b, c = (e.synthesize("Hello there.") for e in (quiet, loud, gained))
    # Not normalised per sentence: a 3x louder model output stays 3x louder.
    np.testing.assert_allclose(b, 3 * a, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(c, np.clip(DEFAULT_GAIN * a, -1, 1), rtol=1e-5, atol=1e-7)
    # Tails: each sentence grows by tail_ms and ends at exactly zero.
    tailed = make(voice, level=0.1, gain=1.0, tail_ms=120.0)
    engine_rate = FakeBackend.sample_rate
    tail = tailed.config.tail_frames(engine_rate, HOP) * HOP
    assert tail >= 0.12 * engine_rate
    d = tailed.synthesize("Hello there.")
    assert len(d) == len(a) + tail
    assert d[-1] == 0.0
    np.testing.assert_allclose(d[: len(a) - 200], a[: len(a) - 200], atol=1e-6)


def test_word_marks(voice: Voice) -> None:
    engine = make(voice)
    chunks = list(engine.stream(LONG))
    total = sum(len(c.audio) for c in chunks)
    marks = [m for c in chunks for m in c.words]
    words = [w.strip(",.") for w in LONG.split()]
    assert [m.word for m in marks] == words
    starts = [m.start for m in marks]
    assert starts == sorted(starts)
    for chunk in chunks:
        for mark in chunk.words:
            assert chunk.offset <= mark.start < chunk.offset + len(chunk.audio)
            assert mark.start <= mark.end <= total
    _, one_marks = engine.synthesize_with_marks(LONG)
    assert one_marks == marks


def test_seeds(voice: Voice) -> None:
    engine = make(voice)
    a = engine.synthesize("Hello there.", seed=1)
    assert np.array_equal(a, engine.synthesize("Hello there.", seed=1))
    assert not np.array_equal(a, engine.synthesize("Hello there.", seed=2))
