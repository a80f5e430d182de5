"""The worker's render path: text checks, and streamed output equal to the one-shot render."""

from __future__ import annotations

import numpy as np
import pytest

from synth.engines.onnx_engine import OnnxEngine
from synth.render import Renderer, RenderError, prepare_text
from voxgate.contract.bus.schema import ERR_EMPTY_TEXT, ERR_TEXT_TOO_LONG


def test_control_and_format_characters_are_dropped() -> None:
    pieces = prepare_text("\x00hello\x07 there\u202e\u200b friend\x7f", raw=False, max_chars=100)
    joined = " ".join(pieces)
    assert "hello" in joined and "friend" in joined
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in joined)
    assert "\u202e" not in joined and "\u200b" not in joined


@pytest.mark.parametrize("text", ["", "   ", "😀😀", "...;;;", "\x00\x01"])
def test_nothing_to_speak(text: str) -> None:
    with pytest.raises(RenderError) as info:
        prepare_text(text, raw=False, max_chars=100)
    assert info.value.code == ERR_EMPTY_TEXT


def test_too_long_before_and_after_normalization() -> None:
    with pytest.raises(RenderError, match="101 characters; the limit is 100") as info:
        prepare_text("a" * 101, raw=False, max_chars=100)
    assert info.value.code == ERR_TEXT_TOO_LONG
    # 100 digits are within the request limit but read digit by digit they expand ~5x.
    with pytest.raises(RenderError, match="when spoken") as info:
        prepare_text("9" * 100, raw=False, max_chars=100)
    assert info.value.code == ERR_TEXT_TOO_LONG


@pytest.fixture(scope="module")
def engine() -> OnnxEngine:
    return OnnxEngine(seed=7)


def render(engine: OnnxEngine, text: str, profile: str, whole: bool) -> tuple[np.ndarray, int]:
    pieces = prepare_text(text, raw=False, max_chars=5000)
    r = Renderer(engine, pieces, profile, whole=whole)  # type: ignore[arg-type]
    data = b""
    while (out := r.step()) is not None:
        assert out.offset * 2 == len(data)
        data += out.data
    return np.frombuffer(data, "<i2").astype(np.float64), r.rate


@pytest.mark.parametrize("profile", ["narrowband", "wideband"])
def test_streamed_render_equals_one_shot(engine: OnnxEngine, profile: str) -> None:
    text = "Thank you for calling Acme Bank. Your balance is $1,234.56. Goodbye."
    streamed, rate = render(engine, text, profile, whole=False)
    whole, rate2 = render(engine, text, profile, whole=True)
    assert rate == rate2 == (8000 if profile == "narrowband" else 48000)
    assert len(streamed) == len(whole)
    noise = np.sum((streamed - whole) ** 2)
    snr = 10 * np.log10(np.sum(whole**2) / max(noise, 1e-12))
    # Context joins are exact to ~1e-6; s16 rounding of two renderings differs by <= 1 LSB.
    assert snr > 60, snr
    assert np.max(np.abs(streamed - whole)) <= 2
