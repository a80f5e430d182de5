"""deploy/gpu-check.sh, the prepared GPU check of issue 16, run for real in its CPU mode.

The GPU itself is not here; what can be checked is everything around it: the script finds its
Python, writes the machine's description, runs ``voxgate bench synth --streams`` through its
time guard and leaves the JSON and the plot in ``$OUT``; and without its pack, on a machine
missing packages, it stops at once and says what to do.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu-check.sh"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env(out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    return {**env, "OUT": str(out), **extra}


def test_script_is_valid_bash() -> None:
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
@pytest.mark.torch
def test_cpu_dry_run_writes_json_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    env = _env(
        out,
        GPU_CHECK_DEVICE="cpu",
        GPU_CHECK_STREAMS="1",
        GPU_CHECK_MODES="batched",
        GPU_CHECK_DURATION_S="2",
        GPU_CHECK_BUDGET_S="150",
    )
    run = subprocess.run(
        [str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    r = json.loads((out / "synth-gpu.json").read_text())
    assert r["device"] == "cpu" and r["complete"] and r["conditions"]["engine"] == "torch"
    (point,) = r["modes"]["batched"]
    assert point["streams"] == 1 and point["utterances"] >= 1 and point["errors"] == 0
    assert r["time_budget_s"] is not None and r["time_budget_s"] < 150
    assert set(r["precision"]["precisions"]) == {"fp16", "bf16"}  # --precision-check ran
    assert (out / "synth-gpu.png").read_bytes()[:8] == PNG_MAGIC
    env_txt = (out / "env.txt").read_text()
    assert "torch" in env_txt and "load average at start" in env_txt
    assert "done: rc 0" in (out / "gpu-check.log").read_text()


def test_missing_pack_stops_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(out, GPU_CHECK_FORCE_PACK="1", GPU_CHECK_PACK_DIR=str(tmp_path / "no-pack"))
    run = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "deploy/gpu-check.sh pack" in run.stdout
    assert not (out / "synth-gpu.json").exists()
