"""Backend-agnostic streaming: chunk schedule, context windows, crossfades, tails, gain, marks.

The decoder (HiFi-GAN) is convolutional, so audio for frames [a, b) can be computed from the
latent window [a - L, b + R] and trimmed; with enough context (12 frames for Piper's decoder) the
result equals the whole-utterance decode to float rounding. Joins are Hann-crossfaded over
``crossfade_ms`` using the previous window's look-ahead audio: when both sides agree the
crossfade changes nothing, when they do not (short context) it hides the step. Chunks grow
(10, 20, 40, 80, 80, ... frames) so the first audio comes after a small decode and later chunks
amortise the context overhead. Every window has one of a few fixed widths (chunk + L + R), which
``warmup`` runs once, so no request meets a fresh shape mid-stream; only a sentence shorter than
a window is decoded whole at its own length.

Each sentence ends with a tail: ``tail_ms`` of zero latent frames appended to z, decoded like the
rest (the decoder's ring-out of the last phoneme, instead of a hard edge that swallows final
consonants), under a half-Hann decay to exactly zero. The tail, the gain and the clip are pure
functions of the sample position in the sentence, so ``stream()`` equals ``synthesize()``.

Gain is one constant per engine (``StreamConfig.gain``), never per-sentence peak normalisation:
Piper's own code normalises each sentence to full scale, which makes a short quiet "Okay." as
loud as a shouted one and changes level between sentences of one prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from synth.engines.backend import Backend, Encoded, limit_blas_threads
from synth.engines.base import EngineChunk, EngineError, FloatArray, WordMark
from synth.engines.voice import Scales, Sentence, Voice

# joe-medium's raw sentence peaks (16 IVR prompts x 3 noise seeds): median 0.53, p90 0.66, max
# 0.76. 1.25 puts typical peaks near -3.5 dBFS and the loudest just under full scale; the
# worker's limiter catches the rest. Piper's per-sentence normalisation would be ≈1.9x, varying.
DEFAULT_GAIN = 1.25


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Streaming parameters. ``schedule``: chunk sizes in latent frames, the last one repeats;
    ``left_context``/``right_context``: frames decoded either side of a chunk and trimmed;
    ``crossfade_ms``: Hann crossfade at chunk joins (at most half the right context: the faded-in
    look-ahead of the previous window is exact only if context remains beyond it, so stream ==
    one-shot needs ``right_context`` >= decoder reach + crossfade frames);
    ``tail_ms``: decaying tail after each sentence; ``gain``: fixed output gain;
    ``whole_sentence_factor``: a sentence no longer than this many first-step windows is decoded
    in one go (cheaper than chunking it, and barely slower to first audio)."""

    # First chunk 20 frames (~230 ms of audio at hop 256 / 22050 Hz): first audio in ~35 ms on
    # this CPU, and enough audio queued to cover the next window even with 4 streams per core.
    # Growing 3x keeps the context overhead (L+R frames per window) near 30 %.
    schedule: tuple[int, ...] = (20, 60, 160)
    left_context: int = 12
    right_context: int = 12
    crossfade_ms: float = 10.0
    tail_ms: float = 120.0
    gain: float = DEFAULT_GAIN
    whole_sentence_factor: float = 1.25
    # Round each window up to a schedule width (a few fixed shapes, all warmed: what a GPU with
    # shape-specialised kernels wants). Off, windows are exactly chunk + context: onnxruntime on a
    # CPU has no per-shape compile, and the padding cost 7 % of RTF (0.0507 vs 0.0470 measured).
    fixed_windows: bool = False

    def __post_init__(self) -> None:
        if not self.schedule or any(n < 1 for n in self.schedule):
            raise ValueError(f"schedule must be positive frame counts, got {self.schedule}")
        if self.left_context < 0 or self.right_context < 0:
            raise ValueError("context frames must be >= 0")
        if self.crossfade_ms < 0 or self.tail_ms < 0 or self.gain <= 0:
            raise ValueError("crossfade_ms, tail_ms must be >= 0 and gain > 0")

    def step_size(self, step: int) -> int:
        return self.schedule[min(step, len(self.schedule) - 1)]

    @property
    def window_widths(self) -> tuple[int, ...]:
        """The decoder input lengths (frames) a chunked sentence uses: chunk + both contexts."""
        return tuple(sorted({n + self.left_context + self.right_context for n in self.schedule}))

    @property
    def warm_widths(self) -> tuple[int, ...]:
        """Every decoder width a chunked sentence uses except its last window: the schedule's
        windows, and with exact windows also each size's first window (no left context)."""
        edges = set() if self.fixed_windows else {n + self.right_context for n in self.schedule}
        return tuple(sorted(set(self.window_widths) | edges))

    def tail_frames(self, sample_rate: int, hop_length: int) -> int:
        return math.ceil(self.tail_ms * sample_rate / 1000.0 / hop_length)

    def crossfade_samples(self, sample_rate: int) -> int:
        return round(self.crossfade_ms * sample_rate / 1000.0)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Chunk [start, end) of a sentence's frames, decoded from window [win_start, win_end)."""

    start: int
    end: int
    win_start: int
    win_end: int


def plan_chunks(frames: int, config: StreamConfig, first_step: int = 0) -> list[ChunkPlan]:
    """Cut ``frames`` latent frames into chunks following the schedule from ``first_step``.

    Every window is ``chunk + L + R`` wide for some schedule size (it slides inward at the
    sentence edges, where extra context on the other side is harmless), except for a sentence
    too short for that: it is one chunk decoded whole.
    """
    if frames <= 0:
        return []
    widths = config.window_widths
    left, right = config.left_context, config.right_context
    if frames <= config.whole_sentence_factor * (config.step_size(first_step) + left + right):
        return [ChunkPlan(0, frames, 0, frames)]
    plans: list[ChunkPlan] = []
    start, step = 0, first_step
    while start < frames:
        size = config.step_size(step)
        end = min(start + size, frames)
        # Fold a sliver of a last chunk into this one when the window still fits: a 2-frame
        # chunk would cost a whole window.
        if frames - end <= left and (frames - max(0, start - left)) <= size + left + right:
            end = frames
        lo, hi = max(0, start - left), min(frames, end + right)
        fitting = [w for w in widths if w >= hi - lo]
        width = fitting[0] if fitting and config.fixed_windows else hi - lo
        if width >= frames:
            win_start, win_end = 0, frames
        else:
            win_start = max(0, min(lo, frames - width))
            win_end = win_start + width
        plans.append(ChunkPlan(start, end, win_start, win_end))
        start, step = end, step + 1
    return plans


@lru_cache(maxsize=32)
def _fades(length: int) -> tuple[FloatArray, FloatArray]:
    """Hann (sin²/cos²) crossfade pair of ``length`` samples; they sum to exactly 1."""
    t = (np.arange(length, dtype=np.float64) + 0.5) / length
    fade_in = np.sin(0.5 * np.pi * t) ** 2
    return fade_in.astype(np.float32), (1.0 - fade_in).astype(np.float32)


@lru_cache(maxsize=32)
def _tail_envelope(length: int) -> FloatArray:
    """Half-Hann decay from 1 to 0 over ``length`` samples (reaches 0 on the last sample)."""
    if length <= 1:
        return np.zeros(length, dtype=np.float32)
    t = np.arange(length, dtype=np.float64) / (length - 1)
    return (0.5 * (1.0 + np.cos(np.pi * t))).astype(np.float32)


@dataclass(slots=True)
class _PreparedSentence:
    encoded: Encoded
    frames: int  # speech frames + tail frames
    speech_samples: int  # samples before the tail
    marks: list[WordMark]  # sample offsets within the sentence

    def window(self, start: int, end: int) -> FloatArray:
        """z[:, start:end] of the sentence extended by its tail: the last speech frame repeated.

        Repeating the last frame (the end-of-sentence pause in Piper's output) lets the decoder
        ring out naturally; zero frames would not: the decoder turns z = 0 into a -40 dBFS hum.
        """
        speech = self.encoded.frames
        if end <= speech:
            return self.encoded.latent(start, end)
        real = self.encoded.latent(start, speech) if start < speech else None
        if speech > 0:
            last = self.encoded.latent(speech - 1, speech)
        else:
            last = np.zeros((self.encoded.latent(0, 0).shape[0], 1), dtype=np.float32)
        pad = np.repeat(last, end - max(start, speech), axis=1)
        return pad if real is None else np.concatenate([real, pad], axis=1)


def _prepare(
    backend: Backend,
    sentence: Sentence,
    scales: Scales,
    rng: np.random.Generator,
    config: StreamConfig,
) -> _PreparedSentence:
    """Encode one sentence, add the tail frames, turn word spans into sample marks."""
    encoded = backend.encode(sentence.phoneme_ids, scales, rng)
    hop = backend.hop_length
    tail = config.tail_frames(backend.sample_rate, hop)
    durations = encoded.durations
    cum = np.concatenate([[0], np.cumsum(durations)]).astype(np.int64) * hop
    marks: list[WordMark] = []
    for word, first_id, end_id in sentence.word_spans:
        if end_id > len(durations):
            continue  # only if the id map and the ids disagree; drop the mark, not the audio
        start, end = int(cum[first_id]), int(cum[end_id])
        if marks and start < marks[-1].start:
            continue
        marks.append(WordMark(word, start, max(start, end)))
    return _PreparedSentence(
        encoded=encoded,
        frames=encoded.frames + tail,
        speech_samples=encoded.frames * hop,
        marks=marks,
    )


class StreamingEngine:
    """An ``Engine`` over any :class:`Backend`. Subclasses set ``name`` and build the backend.

    Stateless per call (the rng is made per call), so several threads may step several
    ``stream()`` generators of one engine at once if the backend is thread-safe.
    """

    name: str = "base"
    sample_rate: int
    voice: str

    def __init__(
        self,
        backend: Backend,
        voice: Voice,
        *,
        scales: Scales | None = None,
        seed: int | None = None,
        config: StreamConfig | None = None,
    ) -> None:
        self.backend = backend
        self.loaded_voice = voice
        self.voice = voice.name
        self.sample_rate = backend.sample_rate
        self.scales = scales if scales is not None else voice.scales
        self.seed = seed
        self.config = config if config is not None else StreamConfig()
        # The process that runs an engine runs its DSP too: numpy's BLAS on one thread (the
        # worker parallelises across utterances; see limit_blas_threads, issue 17).
        limit_blas_threads(1)

    @property
    def _tail_samples(self) -> int:
        hop = self.backend.hop_length
        return self.config.tail_frames(self.sample_rate, hop) * hop

    @property
    def _crossfade(self) -> int:
        # The look-ahead audio for a crossfade comes from the right context, and it is only exact
        # if context remains beyond it: keep at least half of the right context for that.
        hop = self.backend.hop_length
        wanted = self.config.crossfade_samples(self.sample_rate)
        return min(wanted, self.config.right_context * hop // 2)

    # -- helpers ---------------------------------------------------------------------------

    def _rng(self, seed: int | None) -> np.random.Generator:
        chosen = seed if seed is not None else self.seed
        return np.random.default_rng(chosen)

    def _sentences(self, text: str) -> list[Sentence]:
        sentences = self.loaded_voice.phonemize(text)
        if not sentences:
            raise EngineError(f"nothing to speak in {text[:60]!r}")
        return sentences

    def _finish(self, audio: FloatArray, pos: int, speech: int) -> FloatArray:
        """Tail envelope, gain and clip for ``audio`` that starts at sample ``pos`` of a
        sentence whose speech (before the tail) is ``speech`` samples long."""
        end = pos + len(audio)
        if end > speech and self._tail_samples:
            envelope = _tail_envelope(self._tail_samples)
            lo = max(pos, speech)
            audio[lo - pos :] *= envelope[lo - speech : end - speech]
        audio *= np.float32(self.config.gain)
        np.clip(audio, -1.0, 1.0, out=audio)
        return audio

    # -- Engine ------------------------------------------------------------------------------

    def warmup(self) -> None:
        """Run zero inputs through the front and through the decoder at every window width the
        schedule uses, plus one long whole-sentence decode so the memory arena is grown."""
        first, rest = self.warmup_steps()
        for step in (*first, *rest):
            step()

    def warmup_steps(self) -> tuple[list[Callable[[], None]], list[Callable[[], None]]]:
        """:meth:`warmup` in two lists of steps: what the first request needs (a short sentence
        through the front, the decoder at the first chunk's windows), to run before a worker
        reports ready, and the rest (the other widths twice, a long sentence through the front,
        a long whole decode that grows the arena), small steps to run in the background after.

        onnxruntime on a CPU compiles nothing per shape (a fresh width costs what a warmed one
        does, measured), so the first list is about first-touch costs (arena, caches, lazily
        built kernels) and stays short: the first request waits for nothing else.
        """
        voice = self.loaded_voice
        ids = voice.phonemes_to_ids(list("həlˈoʊ wˈɜːld."))[0]
        channels = self.backend.latent_channels
        config = self.config
        rng = np.random.default_rng

        def encode(repeat: int) -> Callable[[], None]:
            def run() -> None:
                self.backend.encode(ids * repeat, self.scales, rng(0))

            return run

        def decode(width: int) -> Callable[[], None]:
            def run() -> None:
                self.backend.decode(np.zeros((channels, width), dtype=np.float32))

            return run

        # First chunk of an urgent request: its window at the sentence start (no left context)
        # and the full one; a short sentence is decoded whole at its own length, about these.
        head = config.step_size(0)
        first_widths = sorted(
            {head + config.right_context, head + config.left_context + config.right_context}
        )
        first = [encode(1), *(decode(w) for w in first_widths)]
        # Each decode twice (the second run meets the grown arena), one run a step: a request
        # that arrives during the background warm-up shares the CPU with at most one of them.
        rest = [encode(8)]
        for width in [*config.warm_widths, 2 * max(config.window_widths)]:
            rest += [decode(width), decode(width)]
        return first, rest

    def stream(
        self,
        text: str,
        should_stop: Callable[[], bool] | None = None,
        *,
        seed: int | None = None,
        urgent: bool = True,
    ) -> Iterator[EngineChunk]:
        sentences = self._sentences(text)
        rng = self._rng(seed)
        # A text whose audio nobody is waiting for yet (a later piece of an utterance that is
        # already playing) starts at the steady chunk size: small first chunks only buy latency,
        # and each one costs a whole window of context.
        first_step = 0 if urgent else len(self.config.schedule) - 1
        return self._stream(sentences, rng, should_stop, first_step)

    def _stream(
        self,
        sentences: Sequence[Sentence],
        rng: np.random.Generator,
        should_stop: Callable[[], bool] | None,
        first_step: int = 0,
    ) -> Iterator[EngineChunk]:
        hop = self.backend.hop_length
        config = self.config
        offset = 0  # utterance sample offset of the next chunk
        # Schedule position; keeps growing across sentences (later ones need no hurry).
        step = first_step
        for s_index, sentence in enumerate(sentences):
            sentence_offset = offset
            if should_stop is not None and should_stop():
                return
            prepared = _prepare(self.backend, sentence, self.scales, rng, config)
            plans = plan_chunks(prepared.frames, config, step)
            marks = prepared.marks
            mark_i = 0
            pending: FloatArray | None = None  # look-ahead audio of the previous window
            last_sentence = s_index == len(sentences) - 1
            for c_index, plan in enumerate(plans):
                if (s_index or c_index) and should_stop is not None and should_stop():
                    return
                window = prepared.window(plan.win_start, plan.win_end)
                decoded = self.backend.decode(np.ascontiguousarray(window))
                base = (plan.start - plan.win_start) * hop
                chunk = decoded[base : base + (plan.end - plan.start) * hop].copy()
                if pending is not None:
                    n = min(len(pending), len(chunk))
                    fade_in, fade_out = _fades(n)
                    chunk[:n] = pending[:n] * fade_out + chunk[:n] * fade_in
                pending = None
                if plan.end < plan.win_end and self._crossfade:
                    ahead = base + (plan.end - plan.start) * hop
                    pending = decoded[ahead : ahead + self._crossfade].copy()
                pos = plan.start * hop
                chunk = self._finish(chunk, pos, prepared.speech_samples)
                final_chunk = c_index == len(plans) - 1
                words: list[WordMark] = []
                while mark_i < len(marks) and (
                    final_chunk or marks[mark_i].start < pos + len(chunk)
                ):
                    m = marks[mark_i]
                    words.append(
                        WordMark(m.word, sentence_offset + m.start, sentence_offset + m.end)
                    )
                    mark_i += 1
                yield EngineChunk(
                    audio=chunk,
                    offset=offset,
                    final=last_sentence and final_chunk,
                    words=tuple(words),
                )
                offset += len(chunk)
            step += len(plans)

    def synthesize(self, text: str, *, seed: int | None = None) -> FloatArray:
        sentences = self._sentences(text)
        rng = self._rng(seed)
        parts: list[FloatArray] = []
        for sentence in sentences:
            prepared = _prepare(self.backend, sentence, self.scales, rng, self.config)
            audio = self.backend.decode(prepared.window(0, prepared.frames)).copy()
            parts.append(self._finish(audio, 0, prepared.speech_samples))
        return np.concatenate(parts).astype(np.float32, copy=False)

    def synthesize_with_marks(
        self, text: str, *, seed: int | None = None
    ) -> tuple[FloatArray, list[WordMark]]:
        """One-shot audio and all word marks (utterance sample offsets)."""
        sentences = self._sentences(text)
        rng = self._rng(seed)
        parts: list[FloatArray] = []
        marks: list[WordMark] = []
        offset = 0
        for sentence in sentences:
            prepared = _prepare(self.backend, sentence, self.scales, rng, self.config)
            audio = self._finish(
                self.backend.decode(prepared.window(0, prepared.frames)).copy(),
                0,
                prepared.speech_samples,
            )
            marks.extend(WordMark(m.word, offset + m.start, offset + m.end) for m in prepared.marks)
            parts.append(audio)
            offset += len(audio)
        return np.concatenate(parts).astype(np.float32, copy=False), marks
