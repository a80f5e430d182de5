"""``voxgate bench synth --streams N,...``: how many calls one worker voices in real time.

Each of N simulated calls talks continuously: it asks for a prompt, plays it out (from the first
chunk's arrival at the prompt's own pace), and asks for the next one the moment playback ends,
for ``duration_s``; the calls start spread over the first second or two, as calls arrive. The
real worker serves them over the in-memory bus. Per level and per mode (batched across calls, and
today's per-stream scheduling: each utterance's steps on a pool thread of its own), in one run:

* TTFA (request read → first chunk published) p50/p95/p99;
* underruns: an utterance whose chunk k was published after the audio before it had played out
  (``UNDERRUN_SLACK_MS`` allowed for the gateway's send buffer);
* RTF per stream (an utterance's render wall time over its audio) and the worker's throughput;
* the batch scheduler's batches (mean size per kind, busy fraction);
* on CUDA, torch's peak GPU memory, and GPU utilisation sampled by ``nvidia-smi`` if present.

"Streams sustained", per mode, is the largest level that keeps TTFA p95 within the target
(100 ms on a GPU, 250 ms on a CPU) with at most ``MAX_UNDERRUN_RATE`` of utterances underrun.

``time_budget_s`` bounds a whole run (the prepared GPU check has 10 minutes for everything): a
level starts only if the time it is expected to take (its duration plus the longest utterance
seen so far, which it waits out) fits in what is left; levels not run are listed as skipped.
After each level the result so far can be written out (``on_level``), so a run killed from
outside still leaves every finished level behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from synth.engines.base import Engine
from synth.worker import UtteranceStats, Worker
from voxgate.bench.util import percentiles
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.bus.schema import AudioChunk, AudioMessage, SpeakRequest

TTFA_TARGET_MS = {"cuda": 100.0, "cpu": 250.0}
UNDERRUN_SLACK_MS = 20.0
MAX_UNDERRUN_RATE = 0.01


class TimedBus(MemoryBus):
    """The in-memory bus, noting when each audio chunk of each utterance was published."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: dict[str, list[tuple[float, int, int]]] = {}  # utt -> (at, samples, rate)

    async def publish(self, message: AudioMessage) -> None:
        if isinstance(message, AudioChunk):
            at = time.perf_counter()
            self.chunks.setdefault(message.utterance_id, []).append(
                (at, message.samples, message.rate)
            )
        await super().publish(message)


def underrun_ms(chunks: list[tuple[float, int, int]]) -> float:
    """How late the latest chunk came against playback that starts at the first chunk (ms;
    <= 0: never late)."""
    if not chunks:
        return 0.0
    start, played, worst = chunks[0][0], 0.0, float("-inf")
    for at, samples, rate in chunks:
        worst = max(worst, (at - (start + played)) * 1000.0)
        played += samples / rate
    return worst


@dataclass
class _Level:
    stats: list[UtteranceStats] = field(default_factory=list)
    done: dict[str, asyncio.Future[UtteranceStats]] = field(default_factory=dict)

    def __call__(self, s: UtteranceStats) -> None:
        self.stats.append(s)
        fut = self.done.pop(s.utterance_id, None)
        if fut is not None and not fut.done():
            fut.set_result(s)


class GpuSampler:
    """``nvidia-smi`` polled every ``period_ms`` while active (utilisation %, memory MiB)."""

    def __init__(self, period_ms: int = 200) -> None:
        self.period_ms = period_ms
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        if not self.available():
            return self
        cmd = [
            "nvidia-smi",
            "--query-gpu=utilization.gpu,memory.used",
            "--format=csv,noheader,nounits",
            "-lms",
            str(self.period_ms),
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                self.samples.append((float(parts[0]), float(parts[1])))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(2)
        if self._thread is not None:
            self._thread.join(2)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        util = [u for u, _ in self.samples]
        mem = [m for _, m in self.samples]
        return {
            "util_mean_pct": sum(util) / len(util),
            "util_max_pct": max(util),
            "mem_used_max_mib": max(mem),
            "samples": float(len(util)),
        }


def _device_kind(engine: Engine) -> str:
    backend = getattr(engine, "torch_backend", None)
    device = getattr(backend, "device", None)
    return "cuda" if getattr(device, "type", "cpu") == "cuda" else "cpu"


def _reset_gpu_peak(engine: Engine) -> None:
    if _device_kind(engine) == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def _gpu_memory(engine: Engine) -> dict[str, float]:
    if _device_kind(engine) != "cuda":
        return {}
    from synth.engines.torch_engine import device_memory

    return device_memory()


@contextlib.contextmanager
def _mode_threads(engine: Engine, threads: int | None) -> Iterator[None]:
    """Torch's intra-op threads are process-wide: per-stream and batched engines want
    different counts (one a call with a call a core; all cores for the one batch thread)."""
    if threads is None or engine.name != "torch" or _device_kind(engine) == "cuda":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


async def run_level(
    engine: Engine,
    streams: int,
    prompts: list[str],
    *,
    duration_s: float,
    profile: str = "narrowband",
    spread_s: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """N continuously talking calls against a fresh worker on ``engine`` (already warm)."""
    bus = TimedBus()
    await bus.start()
    level = _Level()
    worker = Worker(bus, engine, name="bench-streams", concurrency=streams, on_stats=level)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop, warm=False))
    await asyncio.sleep(0)
    rnd = random.Random(seed)
    spread = min(2.0, duration_s / 4) if spread_s is None else spread_s
    t_start = time.perf_counter()
    deadline = t_start + duration_s
    loop = asyncio.get_running_loop()
    scheduler = getattr(engine, "scheduler", None)
    records_before = len(scheduler.records) if scheduler is not None else 0
    busy_before = scheduler.busy_s if scheduler is not None else 0.0

    async def call(index: int) -> None:
        await asyncio.sleep(rnd.uniform(0.0, spread))
        n = index
        while time.perf_counter() < deadline:
            utt = uuid.uuid4().hex
            fut: asyncio.Future[UtteranceStats] = loop.create_future()
            level.done[utt] = fut
            await bus.submit(
                SpeakRequest(
                    call_id=f"bench-{index}-{n}",
                    utterance_id=utt,
                    text=prompts[n % len(prompts)],
                    profile=profile,  # type: ignore[arg-type]
                )
            )
            s = await asyncio.wait_for(fut, timeout=max(60.0, 4 * duration_s))
            n += 1
            if s.first_audio_at is None:
                continue
            # Next prompt once this one has played out (the call talks without pause).
            play_end = s.first_audio_at + s.audio_s
            await asyncio.sleep(max(0.0, play_end - time.perf_counter()))

    with GpuSampler() as gpu:
        _reset_gpu_peak(engine)
        try:
            await asyncio.gather(*(call(i) for i in range(streams)))
        finally:
            wall = time.perf_counter() - t_start
            stop.set()
            await task
            await bus.close()
    stats = [s for s in level.stats if s.outcome == "done"]
    ttfa = [(s.first_audio_at - s.read_at) * 1000 for s in stats if s.first_audio_at is not None]
    late = [underrun_ms(bus.chunks.get(s.utterance_id, [])) for s in stats]
    underruns = sum(1 for x in late if x > UNDERRUN_SLACK_MS)
    rtf = [(s.end_at - s.read_at) / s.audio_s for s in stats if s.audio_s > 0]
    audio = sum(s.audio_s for s in stats)
    out: dict[str, Any] = {
        "streams": streams,
        "utterances": len(stats),
        "errors": sum(1 for s in level.stats if s.outcome != "done"),
        "ttfa_ms": percentiles(ttfa),
        "underruns": underruns,
        "underrun_rate": underruns / len(stats) if stats else float("nan"),
        "lateness_ms": percentiles(late),
        "rtf_per_stream": percentiles(rtf),
        "audio_s": audio,
        "wall_s": wall,
        "audio_s_per_s": audio / wall if wall else float("nan"),
        "worker_threads": worker._threads,
        "gpu_memory": _gpu_memory(engine),
        "gpu": gpu.summary(),
    }
    if scheduler is not None:
        recs = list(scheduler.records)[records_before:]
        kinds: dict[str, Any] = {}
        for kind in sorted({r.kind for r in recs}):
            mine = [r for r in recs if r.kind == kind]
            kinds[kind] = {
                "batches": len(mine),
                "mean_size": sum(r.size for r in mine) / len(mine),
                "max_size": max(r.size for r in mine),
                "mean_ms": 1000 * sum(r.seconds for r in mine) / len(mine),
            }
        out["batches"] = kinds
        out["scheduler_busy"] = (scheduler.busy_s - busy_before) / wall if wall else 0.0
    return out


@dataclass(frozen=True, slots=True)
class Mode:
    """One way of serving the streams: a warm engine, and torch CPU threads while it runs."""

    name: str
    engine: Engine
    torch_threads: int | None = None


async def bench_streams(
    modes: list[Mode],
    levels: tuple[int, ...],
    prompts: list[str],
    *,
    duration_s: float = 12.0,
    profile: str = "narrowband",
    give_up_factor: float = 3.0,
    progress: Callable[[str], None] | None = None,
    time_budget_s: float | None = None,
    on_level: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every level for every mode, interleaved (level by level, the modes in turn) so machine
    noise hits all modes alike. A mode whose TTFA p95 passes ``give_up_factor`` x the target
    (or that underruns half its utterances) is not run at the higher levels."""
    kind = _device_kind(modes[0].engine)
    target = TTFA_TARGET_MS[kind]
    results: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes}
    dropped: dict[str, str] = {}
    skipped: list[dict[str, Any]] = []
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t0 = time.perf_counter()
    longest_s = 0.0  # the longest level overrun seen (a level waits out its last utterances)

    def snapshot(final: bool) -> dict[str, Any]:
        return {
            "device": kind,
            "ttfa_target_ms": target,
            "underrun_slack_ms": UNDERRUN_SLACK_MS,
            "max_underrun_rate": MAX_UNDERRUN_RATE,
            "duration_s": duration_s,
            "profile": profile,
            "loadavg_1m_at_start": load1,
            "levels": list(levels),
            "modes": results,
            "dropped": dropped,
            "skipped": skipped,
            "time_budget_s": time_budget_s,
            "elapsed_s": time.perf_counter() - t0,
            "complete": final,
            "sustained_streams": {
                name: sustained_streams(points, target) for name, points in results.items()
            },
        }

    for n in levels:
        for mode in modes:
            if mode.name in dropped:
                continue
            left = None if time_budget_s is None else time_budget_s - (time.perf_counter() - t0)
            expected = duration_s + longest_s
            if left is not None and expected > left:
                skipped.append(
                    {"mode": mode.name, "streams": n, "reason": f"time: {left:.0f} s left"}
                )
                continue
            with _mode_threads(mode.engine, mode.torch_threads):
                r = await run_level(
                    mode.engine, n, prompts, duration_s=duration_s, profile=profile, seed=n
                )
            results[mode.name].append(r)
            longest_s = max(longest_s, r["wall_s"] - duration_s)
            if on_level is not None:
                on_level(snapshot(False))
            if progress is not None:
                progress(
                    f"  {mode.name:<11} {n:>5} streams: TTFA p50 {r['ttfa_ms']['p50']:.0f} "
                    f"p95 {r['ttfa_ms']['p95']:.0f} ms, underruns {r['underruns']}/"
                    f"{r['utterances']}"
                )
            p95 = r["ttfa_ms"]["p95"]
            if not p95 <= give_up_factor * target or r["underrun_rate"] > 0.5:
                dropped[mode.name] = (
                    f"after {n} streams: TTFA p95 {p95:.0f} ms, "
                    f"{r['underruns']}/{r['utterances']} underrun"
                )
    return snapshot(True)


def sustained_streams(points: list[dict[str, Any]], target_ms: float) -> int:
    """The largest level within the TTFA target and the underrun rate (0: none)."""
    ok = [
        p["streams"]
        for p in points
        if p["ttfa_ms"]["p95"] <= target_ms and p["underrun_rate"] <= MAX_UNDERRUN_RATE
    ]
    return max(ok, default=0)


def format_streams(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"  streams talking continuously ({r['duration_s']:.0f} s a level, {r['device']}, "
        f"load {r['loadavg_1m_at_start']:.2f}; TTFA target p95 <= {r['ttfa_target_ms']:.0f} ms, "
        f"underrun = a chunk > {r['underrun_slack_ms']:.0f} ms late):",
        f"  {'mode':<11}{'streams':>8}{'utts':>6}{'TTFA p50':>10}{'p95':>7}{'p99':>7}"
        f"{'underruns':>11}{'RTF/stream p50':>16}{'audio s/s':>10}{'batch':>7}{'GPU MiB':>9}"
        f"{'util %':>7}",
    ]
    for name, points in r["modes"].items():
        for p in points:
            t = p["ttfa_ms"]
            batches = p.get("batches", {})
            dec = batches.get("decode", {}).get("mean_size")
            mem = p.get("gpu_memory", {}).get("max_allocated_mib")
            util = p.get("gpu", {}).get("util_mean_pct")
            lines.append(
                f"  {name:<11}{p['streams']:>8}{p['utterances']:>6}{t['p50']:>9.0f}ms"
                f"{t['p95']:>6.0f}ms{t['p99']:>6.0f}ms{p['underruns']:>6}/{p['utterances']:<4}"
                f"{p['rtf_per_stream']['p50']:>16.3f}{p['audio_s_per_s']:>10.1f}"
                f"{'' if dec is None else f'{dec:.1f}':>7}"
                f"{'' if mem is None else f'{mem:.0f}':>9}"
                f"{'' if util is None else f'{util:.0f}':>7}"
            )
    sustained = ", ".join(f"{k} {v}" for k, v in r["sustained_streams"].items())
    lines.append(f"  streams sustained in real time within the target: {sustained}")
    for name, why in r.get("dropped", {}).items():
        lines.append(f"  {name}: higher levels not run ({why})")
    if r.get("skipped"):
        lines.append(
            "  not run for the time budget: "
            + ", ".join(f"{k['mode']} {k['streams']}" for k in r["skipped"])
        )
    if r.get("plot"):
        lines.append(f"  streams-vs-TTFA curve: {r['plot']}")
    return lines


# --- decoder precision against fp32 ------------------------------------------------------------


def _spectral_snr_db(ref: Any, x: Any, n_fft: int = 1024, hop: int = 256) -> float:
    """SNR of the STFT magnitudes (dB): the error as a listener's spectrum sees it, blind to
    phase wobble that the waveform SNR counts in full."""
    import numpy as np

    def mag(a: Any) -> Any:
        a = np.asarray(a, np.float64)
        if len(a) < n_fft:
            a = np.pad(a, (0, n_fft - len(a)))
        frames = 1 + (len(a) - n_fft) // hop
        idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
        return np.abs(np.fft.rfft(a[idx] * np.hanning(n_fft), axis=1))

    r, t = mag(ref), mag(x)
    err = float(np.sum((r - t) ** 2))
    return float(10 * np.log10(float(np.sum(r**2)) / max(err, 1e-30)))


def _snr_db(ref: Any, x: Any) -> float:
    import numpy as np

    ref = np.asarray(ref, np.float64)
    err = float(np.sum((ref - x) ** 2))
    return float(10 * np.log10(float(np.sum(ref**2)) / max(err, 1e-30)))


def precision_quality(
    engine: Engine,
    precisions: list[str],
    texts: list[str],
    *,
    repeats: int = 3,
    deadline: float | None = None,
) -> dict[str, Any]:
    """The torch decoder in each precision against fp32 on the same latents: waveform and
    spectral SNR (dB) per text, and the decode time of each (ms, median of ``repeats``).
    ``deadline`` (perf_counter): a precision not started by then is listed as skipped."""
    import copy

    import numpy as np
    import torch

    from synth.engines import torch_vits
    from synth.engines.torch_engine import PRECISIONS

    backend = getattr(engine, "torch_backend", None)
    if backend is None:
        return {}
    net, device = backend.net, backend.device
    out: dict[str, Any] = {"device": str(device), "texts": len(texts), "precisions": {}}
    with torch.inference_mode():
        zs = []
        for i, text in enumerate(texts):
            ids = engine.loaded_voice.phonemize(text)[0].phoneme_ids  # type: ignore[attr-defined]
            rng = np.random.default_rng(i)
            z, _ = torch_vits.encode(
                net,
                torch.tensor([list(ids)], device=device),
                0.667,
                1.0,
                0.8,
                duration_noise=torch.from_numpy(
                    rng.standard_normal((1, 2, len(ids)), dtype=np.float32)
                ).to(device),
            )
            zs.append(z)
        dec32 = copy.deepcopy(net.dec).float()
        refs = [dec32(z).float().reshape(-1).cpu().numpy() for z in zs]

        def timed(dec: Any, dtype: Any) -> float:
            times = []
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                for z in zs:
                    dec(z.to(dtype))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            return 1000 * sorted(times)[len(times) // 2]

        out["fp32_ms"] = timed(dec32, torch.float32)
        for name in precisions:
            dtype = PRECISIONS[name]
            if deadline is not None and time.perf_counter() > deadline:
                out["precisions"][name] = {"skipped": "time budget"}
                continue
            try:
                dec = copy.deepcopy(net.dec).to(dtype)
                got = [dec(z.to(dtype)).float().reshape(-1).cpu().numpy() for z in zs]
                snr = [_snr_db(r, g) for r, g in zip(refs, got, strict=True)]
                spec = [_spectral_snr_db(r, g) for r, g in zip(refs, got, strict=True)]
                out["precisions"][name] = {
                    "snr_db_min": min(snr),
                    "snr_db_mean": sum(snr) / len(snr),
                    "spectral_snr_db_min": min(spec),
                    "spectral_snr_db_mean": sum(spec) / len(spec),
                    "decode_ms": timed(dec, dtype),
                }
            except (RuntimeError, TypeError) as exc:  # e.g. a kernel missing for the dtype
                out["precisions"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def format_precision(q: dict[str, Any]) -> list[str]:
    if not q:
        return []
    lines = [
        "",
        f"  decoder precision vs fp32 ({q['device']}, {q['texts']} prompts, same latents; "
        f"fp32 decode {q['fp32_ms']:.1f} ms):",
    ]
    for name, p in q["precisions"].items():
        if "error" in p or "skipped" in p:
            lines.append(f"  {name:<6} not run: {p.get('error') or p['skipped']}")
            continue
        lines.append(
            f"  {name:<6} SNR min {p['snr_db_min']:.1f} dB (mean {p['snr_db_mean']:.1f}), "
            f"spectral SNR min {p['spectral_snr_db_min']:.1f} dB "
            f"(mean {p['spectral_snr_db_mean']:.1f}), decode {p['decode_ms']:.1f} ms"
        )
    return lines


# --- the command -------------------------------------------------------------------------------


def run_command(cfg: Any, args: Any) -> dict[str, Any]:
    """``voxgate bench synth --streams ...``: build, warm and measure each mode (batched and/or
    per-stream) of the configured engine; write the plot (``--plot``) and JSON (``--out``)."""
    import json
    import logging
    from pathlib import Path

    from synth.engines import load_engine
    from voxgate.bench.plots import streams_ttfa
    from voxgate.bench.synth import PROMPTS, conditions

    started = time.perf_counter()
    s = cfg.synth
    if cfg.log.level != "debug":
        # Two lines an utterance, hundreds of utterances: the table is the output.
        logging.getLogger("voxgate.worker").setLevel(logging.WARNING)
    levels = tuple(int(x) for x in str(args.streams).split(",") if x.strip())
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    modes: list[Mode] = []
    warm_s: dict[str, float] = {}
    for name in names:
        if name not in ("batched", "per-stream"):
            raise SystemExit(f"--modes: batched and/or per-stream, not {name!r}")
        batched = name == "batched"
        engine = load_engine(
            s.engine,
            s.voice,
            s.device,
            s.threads,
            cache=None if s.engine != "onnx" else True,
            batching=batched,
            max_batch=s.batch_max,
            budget_ms=s.batch_budget_ms,
            precision=s.precision,
        )
        torch_threads = max(1, s.threads) if s.engine == "torch" else None
        with _mode_threads(engine, torch_threads):
            warm_s[name] = asyncio.run(Worker(MemoryBus(), engine, name="bench-warm").warmup())
        modes.append(Mode(name, engine, torch_threads))
    prompts = PROMPTS
    head: dict[str, Any] = {
        "conditions": conditions(modes[0].engine, args.profile, max(warm_s.values())),
        "warmup_s": warm_s,
    }
    head["conditions"]["device"] = s.device
    head["conditions"]["precision"] = s.precision
    torch_backend = getattr(modes[0].engine, "torch_backend", None)
    if torch_backend is not None and s.device.startswith("cuda"):
        import torch

        head["conditions"]["gpu"] = torch.cuda.get_device_name(torch_backend.device)
        head["conditions"]["torch"] = torch.__version__
    out_path = Path(args.out) if args.out else None

    def write_partial(so_far: dict[str, Any]) -> None:
        if out_path is not None:  # a run killed from outside keeps the levels it finished
            out_path.write_text(json.dumps({**so_far, **head}, indent=2, default=float))

    budget = getattr(args, "time_budget_s", None)
    if budget is not None:
        # What the levels may use of the command's budget: less what is spent (loading, warm-up)
        # and what comes after them (the precision check decodes each prompt 3 times a dtype).
        budget = budget - (time.perf_counter() - started) - (30.0 if args.precision_check else 5.0)
    result = asyncio.run(
        bench_streams(
            modes,
            levels,
            prompts,
            duration_s=args.duration_s,
            profile=args.profile,
            progress=None if args.json else print,
            time_budget_s=budget,
            on_level=write_partial,
        )
    )
    result.update(head)
    for mode in modes:
        sched = getattr(mode.engine, "scheduler", None)
        if sched is not None:
            result.setdefault("max_batch", sched.max_batch)
            result.setdefault("budget_ms", sched.budget_s * 1000)
    if args.precision_check and torch_backend is not None:
        from synth.engines.torch_engine import PRECISIONS

        others = [p for p in PRECISIONS if p != "fp32"]
        # A CPU without native fp16/bf16 emulates them (minutes on a 2-core AVX2 box): there
        # the check only shows the path works, on one prompt decoded once; the figures that
        # matter are the GPU's.
        on_cpu = str(getattr(torch_backend, "device", "cpu")).startswith("cpu")
        result["precision"] = precision_quality(
            modes[0].engine, others, prompts[:1] if on_cpu else prompts[:4],
            repeats=1 if on_cpu else 3,
            deadline=None if args.time_budget_s is None
            else started + args.time_budget_s - 10.0,
        )  # fmt: skip
    if args.plot:
        c = result["conditions"]
        title = (
            f"bench synth --streams: engine {c['engine']} on {c.get('gpu') or s.device} "
            f"({c['cpu']}, {c['cores']} cores)"
        )
        result["plot"] = str(
            streams_ttfa(Path(args.plot), result["modes"], result["ttfa_target_ms"], title)
        )
    if out_path is not None:
        out_path.write_text(json.dumps(result, indent=2, default=float))
    for mode in modes:
        close = getattr(mode.engine, "close", None)
        if close is not None:
            close()
    return result


def format_report(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        f"voxgate bench synth --streams — engine={c['engine']} device={c['device']} "
        f"precision={c['precision']} voice={c['voice']} profile={c['profile']}",
        f"  conditions: {c.get('gpu', '')} {c['cpu']}, {c['cores']} cores, load "
        f"{c['loadavg_1m_at_start']:.2f}, python {c['python']}, warm-up "
        + ", ".join(f"{k} {v:.1f} s" for k, v in r["warmup_s"].items()),
    ]
    if "max_batch" in r:
        lines.append(f"  batching: max_batch {r['max_batch']}, budget {r['budget_ms']:.0f} ms")
    lines += format_streams(r)
    lines += format_precision(r.get("precision", {}))
    return "\n".join(lines)
