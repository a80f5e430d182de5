"""``python -m voxgate.bench.int8``: the int8 decoder measured against the engine's fp32 one.

No timing is asserted (that is the tool's report to read); what is checked is that the tool
measures what it says: the int8 graph really is quantised (QDQ nodes, different audio), its
audio is still the sentence (the SNR is far from noise), and the report carries the figures."""

from __future__ import annotations

import json
import math

import pytest

from voxgate.bench import int8

pytestmark = pytest.mark.slow


def test_one_sentence_through_both_decoders(capsys: pytest.CaptureFixture[str]) -> None:
    assert int8.main(["--rounds", "2", "--sentences", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["sentences"] == 1 and r["calibration_windows"] > 10
    assert r["window_frames"] == 160 + 12 + 12  # the schedule's steady-state window
    assert r["fp32_ms_per_frame"] > 0 and r["int8_ms_per_frame"] > 0
    # Quantised (not the fp32 graph again: that would be bit-identical, SNR inf) and still
    # the same sentence (an unrelated signal would be near 0 dB).
    for key in ("snr_db", "snr_8k_db", "worst_sentence_snr_8k_db"):
        assert math.isfinite(r[key]) and 6.0 < r[key] < 35.0, r
    assert 0.3 < r["decoder_share"] < 0.95, r
    assert r["wer_fp32"] is None and r["wer_int8"] is None
    text = int8.format_report(int8.Int8Report(**r))
    assert "int8 against fp32" in text and "not measured" in text
