"""The [synth] batching keys (issue 16): validation, and what the worker builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth.app import build_engine
from synth.engines.onnx_batch import BatchedOnnxEngine
from voxgate.contract.config import ConfigError, load


@pytest.mark.parametrize(
    ("toml", "env", "match"),
    [
        ('[synth]\nbatching = "yes"\n', {}, "synth.batching"),
        ('[synth]\nprecision = "int8"\n', {}, "synth.precision"),
        ('[synth]\nengine = "onnx"\nprecision = "fp16"\n', {}, "synth.precision: the onnx"),
        ("[synth]\nbatch_max = -1\n", {}, "synth.batch_max"),
        ("[synth]\nbatch_budget_ms = -2\n", {}, "synth.batch_budget_ms"),
        ("", {"VOXGATE_SYNTH_BATCHING": "sometimes"}, "synth.batching"),
        ("", {"VOXGATE_SYNTH_BATCH_MAX": "lots"}, "synth.batch_max"),
    ],
)
def test_bad_batching_config_names_the_key(
    tmp_path: Path, toml: str, env: dict[str, str], match: str
) -> None:
    f = tmp_path / "v.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError, match=match):
        load(f, env=env)


def test_batching_defaults_and_good_values(tmp_path: Path) -> None:
    s = load(None, env={}).synth
    assert (s.batching, s.batch_max, s.batch_budget_ms, s.precision) == ("auto", 0, -1.0, "fp32")
    f = tmp_path / "v.toml"
    f.write_text(
        '[synth]\nengine = "torch"\nbatching = "on"\nbatch_max = 512\n'
        'batch_budget_ms = 0\nprecision = "bf16"\n'
    )
    s = load(f, env={}).synth
    assert (s.batching, s.batch_max, s.batch_budget_ms, s.precision) == ("on", 512, 0.0, "bf16")


def test_worker_builds_what_the_keys_say() -> None:
    on = build_engine(load(None, env={}, overrides={"synth.batching": "on", "synth.batch_max": 3}))
    assert isinstance(on, BatchedOnnxEngine)
    try:
        assert on.scheduler.max_batch == 3
    finally:
        on.close()
    for value in ("auto", "off"):  # auto: batching is torch-on-CUDA's default only
        engine = build_engine(load(None, env={}, overrides={"synth.batching": value}))
        assert not isinstance(engine, BatchedOnnxEngine)
