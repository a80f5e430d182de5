"""``voxgate bench fuzz``: the atheris/libFuzzer runner counts inputs, coverage and crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from voxgate.bench.fuzz import SELFTEST, TARGETS, format_results, run_target

pytest.importorskip("atheris", reason="atheris is in the dev extra (make test installs it)")


def test_a_clean_target_runs_its_inputs_with_coverage(tmp_path: Path) -> None:
    r = run_target("sdp-crypto", 3000, work=tmp_path, timeout_s=10)
    assert r.exit_code == 0, r.log_tail
    assert r.runs == 3000
    assert r.crashes == []
    assert r.seeds == len(TARGETS["sdp-crypto"].seeds())
    # Our modules are instrumented: the parser's edges show up as coverage and features.
    assert r.coverage is not None and r.coverage > 20
    assert r.features is not None and r.features >= r.coverage
    assert "sdp-crypto" in format_results([r])


def test_a_crash_is_saved_and_reported(tmp_path: Path) -> None:
    r = run_target(SELFTEST.name, 1000, work=tmp_path, timeout_s=10)
    assert r.exit_code != 0
    assert len(r.crashes) == 1 and r.crashes[0].startswith("crash-")
    saved = (tmp_path / f"crashes-{SELFTEST.name}" / r.crashes[0]).read_bytes()
    assert saved.startswith(b"FUZZ")
    assert "selftest: an input starting FUZZ" in r.log_tail


def test_cli_lists_every_target() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "fuzz", "--list"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert listed == list(TARGETS)
    assert SELFTEST.name not in listed


def test_max_time_stops_a_target_short_of_its_runs() -> None:
    """``--max-time``: a campaign that cannot reach ``--runs`` in its time ends cleanly with
    the inputs it did run reported (never the asked-for count)."""
    import json

    out = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "bench", "fuzz", "--target", "sdp-crypto",
         "--runs", str(10**9), "--max-time", "2", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)
    assert 0 < r["runs"] < 10**9
    assert r["crashes"] == [] and r["coverage"] > 20
