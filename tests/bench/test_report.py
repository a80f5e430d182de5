"""``voxgate bench all --report DIR``: the report, its plots, the measured telephone response,
failing and skipped stages, progress output.

The heavy benchmarks (sipp calls, barge-in calls, WebRTC) are replaced by stand-ins that return
their JSON shapes; the synth benchmark runs for real on the tone engine; the frequency response
and the spectrogram run the real DSP chain and render path."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.fakes import ToneEngine
from voxgate.bench import report as bench_report
from voxgate.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = {
    "ttfa_cdf.png",
    "pacing_hist.png",
    "calls_cpu.png",
    "bargein_cdf.png",
    "webrtc_cdf.png",
    "freq_response.png",
    "spectrogram.png",
}


# --- stand-ins --------------------------------------------------------------------------------
def _pct(values: list[float]) -> dict[str, Any]:
    from voxgate.bench.util import percentiles

    return percentiles(values)


def fake_calls_result(n: int) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    jitter = [float(x) for x in np.abs(rng.normal(0.3, 0.2, 500))]
    counts = [0, 40 * n, 30 * n, 8 * n, 2 * n, 0, 1]
    cond = {
        "cpu": "Test CPU",
        "cores": 2,
        "loadavg_1m_at_start": 0.5,
        "loadavg_1m_at_end": 0.7,
        "python": "3.11",
        "quick": True,
        "mode": "voxgate serve",
        "calls": n,
    }
    return {
        "conditions": cond,
        "calls": {"target": n, "held_during_plateau": {"min": n, "max": n, "polls": 5}},
        "cpu": {
            "idle": {"process_pct": 1.0, "event_loop_thread_pct": 0.5},
            "plateau": {"process_pct": 1.0 + 0.8 * n, "event_loop_thread_pct": 0.5 + 0.3 * n},
            "per_call_pct_core": 0.8,
            "per_call_event_loop_pct_core": 0.3,
            "system_busy_pct_all_cores": 20.0 + n,
            "note": "stand-in",
        },
        "pacing": {
            "ticker_send_error_ms": {
                "n": sum(counts),
                "p50": 0.2,
                "p95": 0.4,
                "p99": 0.7,
                "max": 0.7,
                "bin_ms": 0.1,
                "counts": counts,
            },
            "receive_jitter_ms": _pct(jitter),
            "skipped_ticks_total": 0,
        },
        "greeting": {
            "first_audio_after_ack_ms": _pct([180.0, 200.0, 240.0]),
            "under_load_first_audio_ms": {**_pct([150.0, 210.0]), "never": 0},
        },
        "underruns": {"playout_underrun_frames_total": 0},
        "targets": {
            "calls": 100,
            "ticker_p99_ms": 2.0,
            "underruns": 0,
            "cpu_per_call_pct": 0.5,
            "greeting_p95_ms": 300.0,
        },
        "pass": {
            "calls": n >= 100,
            "ticker_p99": True,
            "underruns": True,
            "cpu_per_call": True,
            "greeting_p95": True,
        },
        "samples": {"pacing_error_ms": sorted(jitter)},
        "samples_note": "pacing_error_ms: stand-in",
    }


def fake_bargein_result(opts: Any) -> dict[str, Any]:
    from voxgate.bench.bargein import conditions, report

    rng = np.random.default_rng(3)
    trials = []
    for i in range(opts.trials):
        onset = 1000.0 + 500 * i
        decision = onset + float(rng.uniform(60, 110))
        zero = decision + 10.0
        trials.append(
            {
                "sentence": i,
                "echo": i % 2 == 1,
                "offset_s": 1.0,
                "onset_ms": onset,
                "bargeins": 1,
                "early": 0,
                "missed": False,
                "detector_onset_ms": onset + 5,
                "decision_ms": decision,
                "zero_ms": zero,
                "decision_to_zero_ms": zero - decision,
                "onset_to_zero_ms": zero - onset,
                "detector_onset_to_zero_ms": zero - onset - 5,
                "onset_to_decision_ms": decision - onset,
                "detector_onset_error_ms": 5.0,
                "worker_stop_ms": 30.0,
            }
        )
    echo = [{"echo_s": 20.0, "echo_level_db": -15.0, "false_bargeins": 0, "outcomes": ["done"]}]
    return report(conditions(opts), trials, echo)


def fake_webrtc_result(opts: Any) -> dict[str, Any]:
    vals = [120.0 + 7 * i for i in range(12)]
    return {
        "conditions": {
            "cpu": "Test CPU",
            "cores": 2,
            "loadavg_1m_at_start": 0.4,
            "python": "3.11",
            "quick": opts.quick,
        },
        "connect_to_first_audio_ms": _pct(vals),
        "samples": {"connect_to_first_audio_ms": vals},
        "met": {"connect_to_first_audio_p95": True},
    }


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The tone engine for synth/spectrogram/response; stand-ins for calls, bargein, webrtc."""
    import synth.app
    import voxgate.bench.agent
    import voxgate.bench.bargein
    import voxgate.bench.calls
    import voxgate.bench.webrtc

    seen: dict[str, list[Any]] = {"calls": [], "bargein": [], "webrtc": [], "agent": []}
    monkeypatch.setattr(synth.app, "build_engine", lambda cfg: ToneEngine())

    def calls(opts: Any) -> dict[str, Any]:
        seen["calls"].append(opts)
        return fake_calls_result(opts.calls)

    def bargein(opts: Any) -> dict[str, Any]:
        seen["bargein"].append(opts)
        return fake_bargein_result(opts)

    monkeypatch.setattr(voxgate.bench.calls, "run_bench", calls)
    monkeypatch.setattr(voxgate.bench.bargein, "run_bench", bargein)

    def webrtc(opts: Any) -> dict[str, Any]:
        seen["webrtc"].append(opts)
        return fake_webrtc_result(opts)

    monkeypatch.setattr(voxgate.bench.webrtc, "run_bench", webrtc)

    def agent(trials: int, concurrency: tuple[int, ...], **kw: Any) -> dict[str, Any]:
        seen["agent"].append((trials, concurrency, kw))
        return {"v2v_ms": {"p50": 600.0}, "trials": trials}

    monkeypatch.setattr(voxgate.bench.agent, "run_agent_bench", agent)
    monkeypatch.setattr(
        voxgate.bench.agent, "format_report", lambda r: f"voice to voice p50 {r['v2v_ms']['p50']}"
    )
    return seen


# --- checks -----------------------------------------------------------------------------------
def referenced_pngs(md: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", md)


def assert_valid_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert 2_000 < len(data) < 400_000, (path, len(data))
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        w, h = im.size
        assert w >= 400 and h >= 250, (path, im.size)
        px = np.asarray(im.convert("L"), np.float64)
    # Non-trivial: not a blank canvas; enough ink and distinct grey levels for axes + data.
    assert px.std() > 10.0, path
    assert (px < 200).mean() > 0.02, path
    assert len(np.unique(px)) > 8, path


def run_cli(tmp_path: Path, *extra: str) -> tuple[int, str, dict[str, Any] | None]:
    out = tmp_path / "report"
    rc = main(["bench", "all", "--quick", "--json", "--report", str(out), *extra])
    md = (out / "report.md").read_text()
    doc = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return rc, md, doc


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_report_written_with_all_plots(
    tmp_path: Path, stubbed: dict[str, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, md, doc = run_cli(tmp_path)
    assert rc == 0, md
    out = tmp_path / "report"

    pngs = referenced_pngs(md)
    assert set(pngs) == ALL_FIGURES, pngs
    for name in pngs:
        assert_valid_png(out / name)

    # Every stage ran, in quick mode, with the benchmarks' own option builders.
    assert [o.calls for o in stubbed["calls"]] == list(bench_report.CALL_COUNTS[True])
    assert all(o.quick for o in stubbed["calls"])
    assert len(stubbed["bargein"]) == 1 and stubbed["bargein"][0].quick
    assert stubbed["bargein"][0].trials == 4
    assert len(stubbed["webrtc"]) == 1 and stubbed["webrtc"][0].quick
    assert stubbed["agent"] == [(3, (1,), {"pipecat": False})]
    assert "voice to voice p50 600.0" in md

    # Tables: p50/p95/p99, run conditions, met/missed from the benchmarks' own fields.
    assert md.count("| p50 | p95 | p99 |") >= 5
    assert "quick run" in md and "Test CPU" in md
    assert "**MISSED**" in md  # bench calls' own "calls" verdict is False below 100 calls
    assert "| 3 | 3 |" in md and "| 6 | 6 |" in md  # the CPU curve's rows

    assert doc is not None and doc["quick"] is True
    st = doc["stages"]
    assert {k: v["status"] for k, v in st.items()} == dict.fromkeys(bench_report.STAGES, "ok")
    synth = st["synth"]["result"]
    assert len(synth["samples"]["ttfa_stream_ms"]) == synth["ttfa_streaming_ms"]["n"] > 0
    assert len(synth["samples"]["ttfa_baseline_ms"]) == synth["ttfa_baseline_ms"]["n"] > 0
    assert st["calls"]["result"]["main"] == "6"

    err = capsys.readouterr().err
    for i, name in enumerate(bench_report.STAGES, 1):
        # Plain progress lines (stderr is not a TTY).
        assert f"[{i}/{len(bench_report.STAGES)}] {name}: ok in" in err


def test_measured_response_shows_the_38_khz_cutoff() -> None:
    r = bench_report.measure_response(22050, 2.0)
    f = np.asarray(r["freqs_hz"])
    g = np.asarray(r["gain_db"])

    def at(hz: float) -> float:
        return float(g[np.argmin(np.abs(f - hz))])

    ref = at(1000.0)
    # Passband to 3.8 kHz; transition 3.8–4.0 kHz (windowed sinc cut at 3.9 kHz: -6 dB there).
    assert abs(at(3800.0)) < 0.5
    assert -9.0 < at(3900.0) - ref < -4.0
    assert at(3950.0) <= ref - 20.0
    assert at(3990.0) <= ref - 50.0
    # The +2 dB mid-band EQ is visible in the measurement, and the flat low band.
    assert 1.5 < at(2000.0) < 2.5
    assert abs(at(300.0)) < 0.3
    # White noise through the same chain agrees with the stepped sines in the passband.
    nf, ng = np.asarray(r["noise"]["freqs_hz"]), np.asarray(r["noise"]["gain_db"])
    for hz in (500.0, 1000.0, 2000.0, 3000.0):
        assert abs(float(np.interp(hz, nf, ng)) - at(hz)) < 0.5, hz
    # Nothing above 4 kHz folds back: at least 80 dB down.
    assert r["alias"]["worst_db"] <= -80.0
    assert r["met"]["alias"] is True and r["met"]["at_3800"] is True


def test_measured_response_catches_a_chain_without_anti_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The response is measured, not computed from the design: a naive decimator fails it."""
    import dsp.telephone

    def naive(x: Any, in_rate: int, eq_gain_db: float = 2.0, ceiling_db: float = -1.0) -> Any:
        x = np.asarray(x, np.float64)
        t_out = np.arange(int(len(x) * 8000 / in_rate)) / 8000
        return np.interp(t_out, np.arange(len(x)) / in_rate, x).astype(np.float32)

    monkeypatch.setattr(dsp.telephone, "telephone", naive)
    r = bench_report.measure_response(22050, 2.0)
    assert r["met"]["alias"] is False
    assert r["alias"]["worst_db"] > -40.0
    f, g = np.asarray(r["freqs_hz"]), np.asarray(r["gain_db"])
    assert float(g[np.argmin(np.abs(f - 3950.0))]) > -20.0  # no cutoff: the check above fails


@pytest.mark.timeout(180)
def test_failing_stage_is_reported_and_the_others_run(
    tmp_path: Path, stubbed: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(opts: Any) -> dict[str, Any]:
        raise RuntimeError("sipp not found; boom from the test")

    import voxgate.bench.calls

    monkeypatch.setattr(voxgate.bench.calls, "run_bench", boom)
    rc, md, doc = run_cli(tmp_path, "--skip", "synth")
    assert rc == 1
    assert "**FAILED**" in md and "sipp not found; boom from the test" in md
    assert "| 3 | failed |" in md
    assert doc is not None
    st = doc["stages"]
    assert st["calls"]["status"] == "failed"
    assert "boom from the test" in st["calls"]["error"]
    assert st["synth"]["status"] == "skipped"
    for name in ("bargein", "webrtc", "response", "spectrogram"):
        assert st[name]["status"] == "ok", name
    pngs = referenced_pngs(md)
    assert {"bargein_cdf.png", "freq_response.png", "spectrogram.png"} <= set(pngs)
    assert not {"ttfa_cdf.png", "pacing_hist.png", "calls_cpu.png"} & set(pngs)
    for name in pngs:
        assert_valid_png(tmp_path / "report" / name)


def test_bargein_without_samples_falls_back(
    tmp_path: Path, stubbed: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import voxgate.bench.bargein

    def only_percentiles(opts: Any) -> dict[str, Any]:
        r = fake_bargein_result(opts)
        r.pop("samples", None)
        r["per_trial"] = []
        return r

    monkeypatch.setattr(voxgate.bench.bargein, "run_bench", only_percentiles)
    skip = "synth,calls,webrtc,response,spectrogram"
    rc, md, _ = run_cli(tmp_path, "--skip", skip)
    assert rc == 0
    assert "no raw samples, plotted from p50/p95/p99" in md
    assert_valid_png(tmp_path / "report" / "bargein_cdf.png")


def test_unknown_skip_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "all", "--report", str(tmp_path / "r"), "--skip", "synth,nope"])
    assert rc == 2
    assert "unknown stage(s) nope" in capsys.readouterr().err
    assert not (tmp_path / "r" / "report.md").exists()


def test_progress_bar_on_a_tty_plain_lines_otherwise() -> None:
    tty = io.StringIO()
    p = bench_report.Progress(2, tty, tty=True)
    with p.stage(1, "calls", steps=2, expected_s=1.0) as sp:
        sp.step("10 calls")
        sp.step("25 calls")
    p.finish(1, "calls", "ok", 3.2)
    p.close()
    s = tty.getvalue()
    assert "\r\x1b[K[1/2] calls" in s
    assert "[" + "#" * 12 + "-" * 12 + "]  50%" in s  # step 2 of 2 started: half way
    assert "25 calls" in s and "ok in 0:03" in s

    plain = io.StringIO()
    p = bench_report.Progress(2, plain, tty=False)
    with p.stage(2, "bargein", expected_s=1.0) as sp:
        sp.step("4 trials")
    p.finish(2, "bargein", "failed", 1.5)
    p.close()
    s = plain.getvalue()
    assert "\r" not in s and "\x1b" not in s
    assert s.splitlines() == [
        "[2/2] bargein: started",
        "[2/2] bargein: 4 trials (0:00)",
        "[2/2] bargein: failed in 1.5 s",
    ]


def test_calls_samples_are_capped_and_the_histogram_kept() -> None:
    from voxgate.bench.calls import SAMPLES_CAP, decimate, hist_delta

    vals = list(np.random.default_rng(1).exponential(1.0, 3 * SAMPLES_CAP))
    d = decimate(vals)
    assert len(d) == SAMPLES_CAP and d == sorted(d)
    assert d[0] == min(vals) and d[-1] == max(vals)
    assert abs(float(np.median(d)) - float(np.median(vals))) < 0.01
    assert decimate([3.0, 1.0]) == [1.0, 3.0]
    a = {"ticker": {"bin_ms": 0.1, "bins": {"1": 5}}}
    b = {"ticker": {"bin_ms": 0.1, "bins": {"1": 9, "4": 2}}}
    h = hist_delta(a, b)
    assert h["counts"] == [0, 4, 0, 0, 2] and h["n"] == 6 and h["bin_ms"] == 0.1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_end_to_end_real_engine(tmp_path: Path) -> None:
    """The console command in a subprocess with the real engine (the quick DSP stages)."""
    out = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "voxgate.cli",
            "bench",
            "all",
            "--quick",
            "--report",
            str(out),
            "--skip",
            "synth,calls,bargein,webrtc",
        ],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = (out / "report.md").read_text()
    assert set(referenced_pngs(md)) == {"freq_response.png", "spectrogram.png"}
    for name in referenced_pngs(md):
        assert_valid_png(out / name)
    assert "22050 Hz" in md
    assert not (out / "report.json").exists()


def test_png_check_rejects_a_blank_figure(tmp_path: Path) -> None:
    """The plot check can fail: an empty canvas of the right size is not accepted."""
    blank = tmp_path / "blank.png"
    Image.new("RGB", (700, 380), "white").save(blank)
    with pytest.raises(AssertionError):
        assert_valid_png(blank)
    (tmp_path / "not.png").write_bytes(b"GIF89a" + bytes(5000))
    with pytest.raises(AssertionError):
        assert_valid_png(tmp_path / "not.png")


def test_cold_start_table_in_the_synth_section() -> None:
    """bench synth's cold start (issue 17) reaches the Markdown, not just the JSON: spawn →
    ready p50/p95 and the first request's TTFA for each mode, with the 2 s verdict."""
    from voxgate.bench.synth import COLD_MODES, COLD_TARGET_S

    ready = {"old: split, full warm-up": [6.4, 6.6, 7.1], "new: cache cold": [4.2, 4.4, 4.9],
             "new: cache warm": [1.41, 1.45, 2.31]}  # fmt: skip
    assert set(ready) == set(COLD_MODES)  # the names bench synth measures
    modes = {
        name: {"start_to_ready_s": _pct(v), "ttfa_first_ms": _pct([95.0, 110.0, 180.0])}
        for name, v in ready.items()
    }
    cold = {
        "conditions": {"cpu": "Test CPU", "loadavg_1m_at_start": 0.8, "runs_per_mode": 3},
        "modes": modes,
        "target_s": COLD_TARGET_S,
        "pass": False,
    }
    synth = {"conditions": {"cpu": "Test CPU", "cores": 2}, "cold_start": cold}
    host = {"generated": "now", "cpu": "Test CPU", "cores": 2, "platform": "test"}
    stage = bench_report.StageResult("synth", "ok", 1.0, synth)
    md = bench_report.render_markdown([stage], host, 1.0, ["bench", "all"])
    assert "Worker cold start, spawn → ready (3 fresh processes a mode" in md
    assert "| new: cache warm | 1.45 | 2.31 | 110 | 180 |" in md
    assert "| old: split, full warm-up | 6.60 | 7.10 | 110 | 180 |" in md
    assert "| cache-warm spawn → ready p95 ≤ 2 s | 2.31 | **MISSED** |" in md
    # Without a cold start (another engine, or none measured) there is no table.
    del synth["cold_start"]
    md = bench_report.render_markdown([stage], host, 1.0, ["bench", "all"])
    assert "Worker cold start" not in md
