"""Figures of ``voxgate bench all --report``: matplotlib (Agg, no display), small PNGs.

Every function takes plain numbers (the benchmarks' JSON) and a path, draws one figure with
:class:`matplotlib.figure.Figure` (no pyplot global state) and writes a PNG at :data:`DPI`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

DPI = 100
SIZE = (7.0, 3.8)
# A quantized colour map: spectrograms compress to a fraction of the size as PNG.
CMAP = matplotlib.colormaps["magma"].resampled(24)
PCT_LEVELS = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))


def _figure(size: tuple[float, float] = SIZE) -> Figure:
    return Figure(figsize=size, layout="constrained")


def _save(fig: Figure, path: Path) -> Path:
    """PNG at :data:`DPI`, reduced to a 128-colour palette (a third of the bytes or less; plots
    and the quantized colour map need no more)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=128).save(path, format="PNG", optimize=True)
    return path


def _ok(x: Any) -> bool:
    return isinstance(x, int | float) and not math.isnan(float(x))


def _ecdf(ax: Axes, values: Sequence[float], label: str) -> None:
    v = np.sort(np.asarray(values, np.float64))
    y = np.arange(1, len(v) + 1) / len(v)
    v, y = np.concatenate(([v[0]], v)), np.concatenate(([0.0], y))  # start the step at 0
    ax.step(v, y, where="post", label=f"{label} (n={len(v)})")


def _from_percentiles(ax: Axes, pct: Mapping[str, Any], label: str) -> bool:
    """No raw samples: the p50/p95/p99 as points on the CDF (dashed), if there are any."""
    pts = [(float(pct[k]), q) for k, q in PCT_LEVELS if _ok(pct.get(k))]
    if not pts:
        return False
    xs, ys = zip(*pts, strict=True)
    ax.plot(xs, ys, "o--", label=f"{label}: p50/p95/p99 only (no raw samples)")
    return True


def cdf(
    path: Path,
    title: str,
    xlabel: str,
    series: Mapping[str, Sequence[float]],
    fallback: Mapping[str, Mapping[str, Any]] | None = None,
    targets: Mapping[str, float] | None = None,
) -> Path:
    """Empirical CDFs of ``series`` (label → samples); a label with no samples is drawn from its
    ``fallback`` percentiles instead; ``targets`` (label → x) are vertical dotted lines."""
    fig = _figure()
    ax = fig.add_subplot()
    drawn = 0
    for label, values in series.items():
        if len(values):
            _ecdf(ax, values, label)
            drawn += 1
        elif fallback and label in fallback and _from_percentiles(ax, fallback[label], label):
            drawn += 1
    for label, x in (targets or {}).items():
        ax.axvline(x, color="grey", linestyle=":", linewidth=1.2)
        ax.annotate(
            label,
            (x, 0.02),
            rotation=90,
            fontsize=8,
            color="dimgrey",
            xytext=(3, 0),
            textcoords="offset points",
            va="bottom",
        )
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for q in (0.5, 0.95, 0.99):
        ax.axhline(q, color="lightgrey", linewidth=0.6, zorder=0)
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    if targets:  # keep the target lines inside the frame
        ax.set_xlim(right=max(ax.get_xlim()[1], 1.08 * max(targets.values())))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction ≤ x")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def pacing_histogram(
    path: Path,
    ticker_counts: Sequence[int],
    ticker_bin_ms: float,
    jitter_ms: Sequence[float],
    target_ms: float | None = None,
) -> Path:
    """Two panels: the gateway ticker's send-time error histogram (its own bins) and the
    receive jitter of the sample calls (kernel arrival vs the 20 ms grid)."""
    fig = _figure((SIZE[0], 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    counts = np.asarray(ticker_counts, np.float64)
    if counts.sum() > 0:
        # Fine bins (0.1 ms) merged so that at most ~100 bars are drawn.
        merge = max(1, math.ceil(len(counts) / 100))
        counts = np.pad(counts, (0, -len(counts) % merge)).reshape(-1, merge).sum(axis=1)
        edges = np.arange(len(counts) + 1) * ticker_bin_ms * merge
        ax1.stairs(counts, edges, fill=True, alpha=0.7)
        ax1.set_yscale("log")
        ax1.set_xlim(0, max(edges[-1], (target_ms or 0) * 1.2))
    else:
        ax1.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax1.transAxes)
    if target_ms is not None:
        ax1.axvline(target_ms, color="red", linestyle=":", label=f"p99 target {target_ms:g} ms")
        ax1.legend(fontsize=8)
    ax1.set_title(f"ticker send-time error (n={int(counts.sum())})", fontsize=9)
    ax1.set_xlabel("ms late vs schedule")
    ax1.set_ylabel("packets")
    j = np.asarray(jitter_ms, np.float64)
    if j.size:
        hi = float(np.percentile(j, 99.9)) if j.size > 10 else float(j.max())
        ax2.hist(j, bins=60, range=(0.0, max(hi, 1e-3)), alpha=0.7)
        ax2.set_yscale("log")
    else:
        ax2.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_title(f"receive jitter, sample calls (n={j.size})", fontsize=9)
    ax2.set_xlabel("|arrival − 20 ms grid|, ms")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    return _save(fig, path)


def cpu_curve(path: Path, points: Sequence[Mapping[str, Any]], target_pct: float) -> Path:
    """CPU (% of one core) vs concurrent calls: process and event loop totals (left), per call
    (right). ``points``: dicts with calls, process_pct, event_loop_pct, per_call_pct,
    per_call_event_loop_pct (NaN/None where a run failed)."""
    fig = _figure((SIZE[0], 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    pts = sorted(points, key=lambda p: p["calls"])

    def col(key: str) -> tuple[list[float], list[float]]:
        xs = [float(p["calls"]) for p in pts if _ok(p.get(key))]
        return xs, [float(p[key]) for p in pts if _ok(p.get(key))]

    for key, label in (("process_pct", "gateway process"), ("event_loop_pct", "event loop")):
        ax1.plot(*col(key), "o-", label=label)
    for key, label in (("per_call_pct", "process"), ("per_call_event_loop_pct", "event loop")):
        ax2.plot(*col(key), "o-", label=label)
    ax2.axhline(target_pct, color="red", linestyle=":", label=f"target {target_pct:g} % (loop)")
    ax1.set_title("CPU during the plateau", fontsize=9)
    ax1.set_ylabel("% of one core")
    ax2.set_title("CPU per call (minus idle)", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xlabel("concurrent calls")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def cpu_curve_compare(
    path: Path,
    series: Mapping[str, Sequence[Mapping[str, Any]]],
    target_pct: float,
    core_budget_pct: float | None = None,
) -> Path:
    """Event-loop CPU vs concurrent calls for several builds measured in the same session
    (``series``: label → curve points as :func:`cpu_curve` takes them): the event loop's
    total (left, with ``core_budget_pct`` as a line) and per call (right, ``target_pct``)."""
    fig = _figure((SIZE[0], 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    for label, points in series.items():
        pts = sorted(points, key=lambda p: p["calls"])
        for ax, key in ((ax1, "event_loop_pct"), (ax2, "per_call_event_loop_pct")):
            xy = [(float(p["calls"]), float(p[key])) for p in pts if _ok(p.get(key))]
            if xy:
                ax.plot(*zip(*xy, strict=True), "o-", label=label)
    if core_budget_pct is not None:
        ax1.axhline(core_budget_pct, color="red", linestyle=":", label=f"{core_budget_pct:g} %")
    ax2.axhline(target_pct, color="red", linestyle=":", label=f"target {target_pct:g} %")
    ax1.set_title("event-loop CPU during the plateau", fontsize=9)
    ax2.set_title("event-loop CPU per call (minus idle)", fontsize=9)
    ax1.set_ylabel("% of one core")
    for ax in (ax1, ax2):
        ax.set_xlabel("concurrent calls")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def frequency_response(
    path: Path,
    freqs_hz: Sequence[float],
    gain_db: Sequence[float],
    *,
    noise_freqs_hz: Sequence[float] = (),
    noise_gain_db: Sequence[float] = (),
    cutoff_hz: float = 3800.0,
    eq_band_hz: tuple[float, float] = (1000.0, 3000.0),
    floor_db: float = -90.0,
) -> Path:
    """Measured magnitude (dB) vs Hz, 0–4 kHz: full range (top) and the passband zoomed
    (bottom); the cutoff and the EQ band are marked."""
    fig = _figure((SIZE[0], 5.2))
    ax1, ax2 = fig.subplots(2, 1, height_ratios=(3, 2))
    f = np.asarray(freqs_hz, np.float64)
    g = np.maximum(np.asarray(gain_db, np.float64), floor_db)
    for ax in (ax1, ax2):
        ax.plot(f, g, ".-", color="tab:blue", linewidth=1.2, markersize=3, label="stepped sines")
        if len(noise_freqs_hz):
            ax.plot(
                noise_freqs_hz,
                np.maximum(np.asarray(noise_gain_db, np.float64), floor_db),
                "--",
                color="tab:orange",
                linewidth=1.0,
                zorder=3,
                label="white noise (Welch PSD ratio)",
            )
        ax.axvspan(*eq_band_hz, color="tab:green", alpha=0.10, label="mid-band EQ (1–3 kHz)")
        ax.axvline(cutoff_hz, color="red", linestyle="--", linewidth=1, label="3.8 kHz")
        ax.set_xlim(0, 4000)
        ax.grid(True, alpha=0.3)
        ax.set_ylabel("gain, dB")
    ax1.set_ylim(floor_db, 6)
    ax1.set_title("telephone chain, measured: engine rate in → 8 kHz out", fontsize=10)
    ax1.legend(fontsize=8, loc="lower left")
    ax2.set_ylim(-3, 3.5)
    ax2.set_xlabel("Hz")
    ax2.set_title("passband (zoom)", fontsize=9)
    return _save(fig, path)


def spectrogram_pair(
    path: Path,
    before: npt.NDArray[np.floating[Any]],
    before_rate: int,
    after: npt.NDArray[np.floating[Any]],
    after_rate: int,
    *,
    title: str = "",
    cutoff_hz: float = 3800.0,
    range_db: float = 90.0,
) -> Path:
    """Spectrograms (dB, ~25 ms Hann windows) of the engine's raw output and the 8 kHz phone
    output, on one frequency axis (0 to the engine's Nyquist) and one colour scale."""
    import scipy.signal

    fig = _figure((SIZE[0], 5.4))
    axes = fig.subplots(2, 1, sharex=True, sharey=True)
    specs = []
    for x, rate in ((before, before_rate), (after, after_rate)):
        n = max(64, round(rate * 0.025))
        f, t, s = scipy.signal.spectrogram(
            np.asarray(x, np.float64),
            fs=rate,
            window="hann",
            nperseg=n,
            noverlap=n * 3 // 4,
            scaling="spectrum",
            mode="psd",
        )
        specs.append((f, t, 10 * np.log10(np.maximum(s, 1e-20))))
    top = max(float(s.max()) for _, _, s in specs)
    mesh = None
    labels = (
        f"before: engine output, {before_rate} Hz",
        f"after: telephone chain, {after_rate} Hz",
    )
    for ax, (f, t, s), label in zip(axes, specs, labels, strict=True):
        mesh = ax.pcolormesh(
            t, f, s, shading="auto", vmin=top - range_db, vmax=top, cmap=CMAP, rasterized=True
        )
        ax.axhline(cutoff_hz, color="cyan", linestyle="--", linewidth=0.8)
        ax.set_ylabel("Hz")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(0, before_rate / 2)
        ax.set_facecolor("0.88")
    if after_rate < before_rate:
        axes[1].text(
            0.5, (after_rate / 2 + before_rate / 2) / 2, f"nothing above {after_rate // 2} Hz "
            f"(sampled at {after_rate} Hz)", ha="center", va="center", fontsize=8,
            color="0.35", transform=axes[1].get_yaxis_transform(),
        )  # fmt: skip
    axes[1].set_xlabel("s")
    if mesh is not None:
        fig.colorbar(mesh, ax=list(axes), label="dB")
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def streams_ttfa(
    path: Path, modes: Mapping[str, Sequence[Mapping[str, Any]]], target_ms: float, title: str
) -> Path:
    """TTFA p50 (dashed) and p95 (solid) against concurrent streams, one colour per mode
    (``voxgate bench synth --streams``), log-scaled streams, the p95 target as a line; levels
    with underruns marked with a cross."""
    fig = _figure()
    ax = fig.subplots()
    for i, (label, points) in enumerate(modes.items()):
        pts = sorted(points, key=lambda p: p["streams"])
        colour = f"C{i}"
        for key, style in (("p95", "o-"), ("p50", "o--")):
            xy = [(float(p["streams"]), float(p["ttfa_ms"][key])) for p in pts
                  if _ok(p["ttfa_ms"].get(key))]  # fmt: skip
            if xy:
                ax.plot(*zip(*xy, strict=True), style, color=colour, label=f"{label} {key}")
        bad = [(float(p["streams"]), float(p["ttfa_ms"]["p95"])) for p in pts
               if p.get("underruns") and _ok(p["ttfa_ms"].get("p95"))]  # fmt: skip
        if bad:
            ax.plot(*zip(*bad, strict=True), "x", color="black", markersize=10)
    ax.axhline(target_ms, color="red", linestyle=":", label=f"p95 target {target_ms:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams (x: underruns)")
    ax.set_ylabel("time to first audio, ms")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)
