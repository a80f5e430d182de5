"""The ``torch`` engine: Piper's VITS on torch (CPU or CUDA), same voice as the onnx engine.

The model is Piper's own ``SynthesizerTrn`` filled from the voice's ONNX weights
(:mod:`synth.engines.torch_vits`), wrapped as a backend for the shared streaming decoder. What torch
adds over onnxruntime is the GPU and, with it, batching across calls (issue 16): with
``batching`` on (the CUDA default) every model call of every stream of the worker goes to one
:class:`~synth.engines.batching.BatchScheduler`, which runs them as batches, one per step:

* **encode** (text encoder, duration predictor, flow) of the sentences that start now, padded to
  the longest and masked (:func:`torch_vits.encode_batch`) where ``batch_encode`` is on (the CUDA
  default). On a CPU they run one by one inside the step: a batched encoder's z differs from
  the lone one's by float rounding (about 120-135 dB: the kernels differ by shape, even a
  batch of two equal rows), and the decoder amplifies a z difference by about 28 dB, so the
  audio would keep only 91-105 dB of the 100 dB that batching may cost;
* **decode** (HiFi-GAN) of the windows due now, padded and masked (:func:`torch_vits.decode_masked`)
  so each row's audio equals decoding it alone; on CUDA rows and widths are padded up to fixed
  sizes (powers of two up to ``max_batch``, the streaming windows' widths) whose CUDA graphs were
  captured at warm-up: a live step pays no kernel selection, no allocation, no launch overhead.

First chunks get priority and a batch's width is capped by a latency budget (the scheduler's
doc). ``precision`` runs the decoder in fp16 or bf16 (the encoder stays fp32: durations come from
``ceil`` of its output, where half precision could move a frame); the quality of each is measured
against fp32 by ``voxgate bench synth --precision`` (spectral SNR) before anyone turns it on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from synth.engines import torch_vits
from synth.engines.backend import EagerEncoded, draw_noise
from synth.engines.base import EngineChunk, EngineError, FloatArray
from synth.engines.batching import BatchScheduler, Runner, drive, one_by_one
from synth.engines.streaming import StreamConfig, StreamingEngine
from synth.engines.voice import Scales, Voice

log = logging.getLogger("voxgate.worker")

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Batch limits by device when not given. A GPU runs a batch of hundreds of windows in about the
# time of one (it is launch-bound at one), so the cap is the latency budget; on a CPU a batch
# costs what its rows cost and helps only where per-call overhead dominates (short windows,
# the text encoder's small matrices), so batches stay small there. The encoder batched at 8 equal
# rows cost 33 ms an item against 53 alone: padding up to 1.5x still pays.
DEFAULT_MAX_BATCH = {"cuda": 256, "cpu": 8}
# A first chunk waits for the batch running when it arrives, then an encode and a decode batch:
# about three budgets. 25 ms keeps that under the GPU goal of 100 ms at p95. A CPU has no
# budget (0): its batches are capped by work (CPU_DECODE_MAX_UNITS), and a time budget learnt on
# a loaded 2-core machine refused every batch of two.
DEFAULT_BUDGET_MS = {"cuda": 25.0, "cpu": 0.0}
# On a CPU: padding is real work (see Runner.max_padding), and decoder batches beyond this many
# frames x rows ran slower than their rows one by one (8 x 184 frames: 1033 vs 537 ms on the
# 2-core Xeon; 8 x 32: 108 vs 104 ms; the encoder 33 vs 53 ms an item at 8 rows).
CPU_ENCODE_MAX_PADDING = 1.5
CPU_DECODE_MAX_PADDING = 1.3
CPU_DECODE_MAX_UNITS = 8 * 48


@dataclass(frozen=True, slots=True)
class EncodeCall:
    """One sentence to encode in a batch: ids, scales, and its stream's noise (the duration
    noise drawn already, the latent noise drawn once the frame count is known)."""

    ids: tuple[int, ...]
    scales: Scales
    duration_noise: FloatArray  # [2, N]
    latent_noise: Callable[[int], FloatArray]  # frames -> [C, frames]


@dataclass(slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    z: torch.Tensor  # static input [rows, C, width]
    lengths: torch.Tensor  # static input [rows] int64
    out: torch.Tensor  # static output [rows, width * hop]


def row_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes CUDA graphs are captured for: powers of two below ``max_batch``, and it."""
    sizes = {max_batch}
    n = 1
    while n < max_batch:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def _bucket(value: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= value:
            return b
    return value


class TorchBackend:
    """Piper VITS on torch behind the shared streaming decoder's backend interface.

    ``encode`` runs text encoder, duration predictor and reverse flow; ``decode`` runs the HiFi-GAN
    generator. Both take and return numpy arrays so the streaming code stays backend-agnostic;
    the latent crossing to the host is small (192 floats a frame) next to the audio. With
    ``batching`` both go through :attr:`scheduler` (module doc); without, they run on the calling
    thread.
    """

    def __init__(
        self,
        voice: Voice,
        device: str = "cpu",
        *,
        threads: int = 1,
        precision: str = "fp32",
        batching: bool | None = None,
        max_batch: int = 0,
        budget_ms: float = -1.0,
        window_ms: float = 2.0,
        widths: Sequence[int] = (),
        cuda_graphs: bool | None = None,
        batch_encode: bool | None = None,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"torch engine: device {device!r} asked for, but torch sees no GPU")
        if precision not in PRECISIONS:
            raise EngineError(f"torch engine: precision {precision!r}; one of {list(PRECISIONS)}")
        batching = self.device.type == "cuda" if batching is None else batching
        if self.device.type == "cpu" and threads > 0:
            # Process-wide in torch; the worker runs one engine per process. Batched too: more
            # intra-op threads for the one batch thread would spin (OpenMP) on the cores the
            # worker's threads need for the DSP between calls.
            torch.set_num_threads(threads)
        net, arch, report = torch_vits.load_vits_from_onnx(voice.model)
        self.arch = arch
        self.mapping = report
        self.net: Any = net.to(self.device)
        self.precision = precision
        self._dec_dtype = PRECISIONS[precision]
        if self._dec_dtype != torch.float32:
            self.net.dec.to(self._dec_dtype)
        self.sample_rate = voice.sample_rate
        self.hop_length = arch.hop_length
        self.latent_channels = arch.inter_channels
        self.speaker_id = voice.speaker_id
        with torch.inference_mode():
            g = torch_vits.speaker_embedding(self.net, self.speaker_id, self.device)
        self._g = None if g is None else g.to(self._dec_dtype)
        kind = "cuda" if self.device.type == "cuda" else "cpu"
        self.max_batch = max_batch if max_batch > 0 else DEFAULT_MAX_BATCH[kind]
        self.widths = tuple(sorted(set(widths)))  # decoder widths rows are padded up to (CUDA)
        self.rows = row_buckets(self.max_batch)
        on_gpu = self.device.type == "cuda"
        self.cuda_graphs = on_gpu if cuda_graphs is None else (cuda_graphs and on_gpu)
        self.batch_encode = on_gpu if batch_encode is None else batch_encode
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool: Any = None
        self.scheduler: BatchScheduler | None = None
        if batching:
            budget = budget_ms if budget_ms >= 0 else DEFAULT_BUDGET_MS[kind]
            cpu = not on_gpu
            self.scheduler = BatchScheduler(
                {
                    "encode": Runner(
                        self._run_encodes,
                        units=self._encode_units,
                        max_rows=0 if self.batch_encode else 1,
                        own=lambda call: float(len(call.ids)),
                        max_padding=(
                            CPU_ENCODE_MAX_PADDING if cpu and self.batch_encode else float("inf")
                        ),
                    ),
                    "decode": Runner(
                        self._run_decodes,
                        units=self._decode_units,
                        own=lambda z: float(z.shape[1]),
                        max_padding=CPU_DECODE_MAX_PADDING if cpu else float("inf"),
                        max_units=CPU_DECODE_MAX_UNITS if cpu else float("inf"),
                    ),
                    # Arbitrary work on the scheduler's thread (graph capture: nothing else may
                    # launch on the GPU meanwhile, and everything else launches from there).
                    "exec": Runner(lambda fns: [fn() for fn in fns], units=len),
                },
                max_batch=self.max_batch,
                budget_s=budget / 1000.0,
                window_s=window_ms / 1000.0,
                thread_context=torch.inference_mode,
                name="torch-batch",
            )

    # -- backend interface --------------------------------------------------------------------

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> EagerEncoded:
        """Phoneme ids of one sentence → latent z and per-id durations (backend.py's contract)."""
        # Raw standard-normal noise in backend.py's order (duration noise, then latent noise once
        # the frame count is known); the model scales it exactly where Piper's graph does.
        dur_noise = draw_noise(rng, (2, len(phoneme_ids)))
        channels = self.latent_channels
        drawn: dict[int, FloatArray] = {}

        def latent_noise(frames: int) -> FloatArray:
            # Drawn once: a batch that failed is run again call by call (batching.py), and the
            # second run must see the noise of the first, not the generator's next numbers.
            if frames not in drawn:
                drawn[frames] = draw_noise(rng, (channels, frames))
            return drawn[frames]

        call = EncodeCall(tuple(phoneme_ids), scales, dur_noise, latent_noise)
        if self.scheduler is not None:
            result: EagerEncoded = self.scheduler.submit("encode", call)
            return result
        with torch.inference_mode():
            return self._encode_one(call)

    def _encode_one(self, call: EncodeCall) -> EagerEncoded:
        def latent_noise(frames: int) -> torch.Tensor:
            return torch.from_numpy(call.latent_noise(frames))[None].to(self.device)

        ids = torch.tensor([list(call.ids)], dtype=torch.long, device=self.device)
        z, durations = torch_vits.encode(
            self.net,
            ids,
            call.scales.noise_scale,
            call.scales.length_scale,
            call.scales.noise_w,
            duration_noise=torch.from_numpy(call.duration_noise)[None].to(self.device),
            latent_noise=latent_noise,
            speaker_id=self.speaker_id,
        )
        return EagerEncoded(
            z=np.ascontiguousarray(z[0].float().cpu().numpy()),
            durations=durations.cpu().numpy().astype(np.int64),
        )

    def decode(self, z: FloatArray) -> FloatArray:
        """Audio for latent ``z`` ``[C, T]``: ``T * hop_length`` float32 samples."""
        z = np.ascontiguousarray(z, dtype=np.float32)
        if self.scheduler is not None:
            audio: FloatArray = self.scheduler.submit("decode", z)
            return audio
        with torch.inference_mode():
            zt = torch.from_numpy(z).to(self.device)
            out = torch_vits.decode(self.net.dec, zt[None].to(self._dec_dtype), None, self._g)
            return np.ascontiguousarray(out[0].float().cpu().numpy())

    # -- batch runners (the scheduler's thread, inside inference mode) ---------------------------

    def _encode_units(self, calls: list[EncodeCall]) -> float:
        if self.batch_encode:
            return float(len(calls) * max(len(c.ids) for c in calls))
        return float(sum(len(c.ids) for c in calls))

    def _run_encodes(self, calls: list[EncodeCall]) -> list[Any]:
        if not self.batch_encode:
            return one_by_one(self._encode_one)(calls)
        out: list[EagerEncoded | None] = [None] * len(calls)
        groups: dict[Scales, list[int]] = {}
        for i, call in enumerate(calls):
            groups.setdefault(call.scales, []).append(i)
        for scales, idx in groups.items():
            encoded = torch_vits.encode_batch(
                self.net,
                [calls[i].ids for i in idx],
                scales.noise_scale,
                scales.length_scale,
                scales.noise_w,
                duration_noise=[torch.from_numpy(calls[i].duration_noise) for i in idx],
                latent_noise=[_latent_fn(calls[i].latent_noise) for i in idx],
                speaker_id=self.speaker_id,
                device=self.device,
            )
            for i, (z, durations) in zip(idx, encoded, strict=True):
                out[i] = EagerEncoded(
                    z=np.ascontiguousarray(z.float().cpu().numpy()),
                    durations=durations.cpu().numpy().astype(np.int64),
                )
        return [e for e in out if e is not None]

    def _decode_shape(self, frames: Sequence[int]) -> tuple[int, int]:
        """(rows, width) a batch of windows of ``frames`` runs at."""
        width = max(frames)
        if self.cuda_graphs:
            return _bucket(len(frames), self.rows), _bucket(width, self.widths)
        return len(frames), width

    def _decode_units(self, zs: list[FloatArray]) -> float:
        rows, width = self._decode_shape([int(z.shape[1]) for z in zs])
        return float(rows * width)

    def _run_decodes(self, zs: list[FloatArray]) -> list[FloatArray]:
        frames = [int(z.shape[1]) for z in zs]
        rows, width = self._decode_shape(frames)
        host = np.zeros((rows, self.latent_channels, width), dtype=np.float32)
        for i, z in enumerate(zs):
            host[i, :, : frames[i]] = z
        lengths = torch.tensor(frames + [0] * (rows - len(zs)), dtype=torch.long)
        graph = self._graphs.get((rows, width))
        if graph is not None:
            graph.z.copy_(torch.from_numpy(host), non_blocking=False)
            graph.lengths.copy_(lengths)
            graph.graph.replay()
            audio = graph.out[: len(zs)].float().cpu().numpy()
        else:
            zt = torch.from_numpy(host).to(self.device, self._dec_dtype)
            out = torch_vits.decode_masked(self.net.dec, zt, lengths.to(self.device), self._g)
            audio = out[: len(zs)].float().cpu().numpy()
        hop = self.hop_length
        return [np.ascontiguousarray(audio[i, : frames[i] * hop]) for i in range(len(zs))]

    # -- warm-up --------------------------------------------------------------------------------

    def on_scheduler(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the scheduler's thread (where all batched GPU work runs), else here."""
        if self.scheduler is None:
            with torch.inference_mode():
                return fn()
        return self.scheduler.submit("exec", fn)

    def warm_batches(self, widths: Sequence[int] | None = None, max_rows: int = 0) -> int:
        """Run every batch shape the decoder can meet (each row bucket up to ``max_rows`` at
        each width) and, on CUDA with graphs, capture one graph per shape, sharing one memory
        pool (replays never overlap, and each one's output is copied out before the next).
        Also a masked encode batch of every row bucket, so its kernels are loaded too. Returns
        the number of shapes warmed."""
        widths = tuple(widths) if widths is not None else self.widths
        rows = [r for r in self.rows if r <= (max_rows or self.max_batch)]

        def warm() -> int:
            shapes = 0
            for width in widths:
                for n in rows:
                    self._warm_shape(n, width)
                    shapes += 1
            ids = (1, 2, 3, 4, 5, 6, 7, 8)
            for n in rows:
                torch_vits.encode_batch(self.net, [ids] * n, device=self.device)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return shapes

        shapes: int = self.on_scheduler(warm)
        return shapes

    def _warm_shape(self, rows: int, width: int) -> None:
        shape = (rows, self.latent_channels, width)
        z = torch.zeros(shape, device=self.device, dtype=self._dec_dtype)
        lengths = torch.full((rows,), width, dtype=torch.long, device=self.device)
        lengths[-1] = max(1, width - 1)  # the masked path with a shorter row, as live
        if not self.cuda_graphs:
            torch_vits.decode_masked(self.net.dec, z, lengths, self._g)
            return
        if (rows, width) in self._graphs:
            return
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # kernel selection and the allocator's growth, before capture
                torch_vits.decode_masked(self.net.dec, z, lengths, self._g)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = torch_vits.decode_masked(self.net.dec, z, lengths, self._g)
        self._graphs[(rows, width)] = _Graph(graph, z, lengths, out)

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()


def _latent_fn(draw: Callable[[int], FloatArray]) -> Callable[[int], torch.Tensor]:
    return lambda frames: torch.from_numpy(draw(frames))


class TorchEngine(StreamingEngine):
    """Piper on torch with the shared streaming decoder (``name = "torch"``).

    ``voice``: ``""`` for the bundled en_US-joe-medium or a Piper ``.onnx`` path. ``device``:
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``threads``: torch intra-op threads on the CPU (0:
    torch's default). ``batching`` (default: on for CUDA) runs every stream's model calls as
    batches (module doc): ``max_batch`` rows at most (0: by device), ``budget_ms`` the latency
    budget of one batch (-1: by device, 0: none), ``window_ms`` the longest wait for streams busy
    between two calls. ``precision``: the decoder's dtype (fp32, fp16, bf16). ``cuda_graphs``
    (default: on with CUDA batching). ``batch_encode``: pad sentences into one encoder batch
    (default: on CUDA only; the module doc says why not on a CPU). ``scales``, ``seed`` and
    ``config`` are as for the onnx engine; with the same seed both engines draw the same noise
    and speak alike.
    """

    name = "torch"

    def __init__(
        self,
        voice: str = "",
        device: str = "cpu",
        threads: int = 1,
        *,
        scales: Scales | None = None,
        seed: int | None = None,
        config: StreamConfig | None = None,
        batching: bool | None = None,
        max_batch: int = 0,
        budget_ms: float = -1.0,
        window_ms: float = 2.0,
        precision: str = "fp32",
        cuda_graphs: bool | None = None,
        batch_encode: bool | None = None,
    ) -> None:
        loaded = Voice.load(voice)
        if config is None and torch.device(device).type == "cuda":
            # Every window one of a few widths: what the captured graphs are.
            config = StreamConfig(fixed_windows=True)
        config = config if config is not None else StreamConfig()
        backend = TorchBackend(
            loaded,
            device,
            threads=threads,
            precision=precision,
            batching=batching,
            max_batch=max_batch,
            budget_ms=budget_ms,
            window_ms=window_ms,
            widths=config.window_widths,
            cuda_graphs=cuda_graphs,
            batch_encode=batch_encode,
        )
        super().__init__(backend, loaded, scales=scales, seed=seed, config=config)
        self.torch_backend = backend
        self.voice = voice or loaded.name
        self._active = 0
        self._active_lock = threading.Lock()

    @property
    def active_streams(self) -> int:
        return self._active

    @property
    def scheduler(self) -> BatchScheduler | None:
        return self.torch_backend.scheduler

    @property
    def concurrent_steps(self) -> int | None:
        """How many stream steps the worker should run at once: batched, a step mostly waits
        for the scheduler, so one thread per utterance (each a batch row); else one per core."""
        return None if self.scheduler is None else 1 << 16

    def warmup_steps(self) -> tuple[list[Callable[[], None]], list[Callable[[], None]]]:
        """Zero inputs through the encoder and every decoder window width (the shared streaming
        warm-up), then, when batching, every batch shape (graphs captured on CUDA): all of it
        before ready (on CUDA the batch shapes are what the first requests meet, and this
        engine's start is dominated by building the model, not by its warm-up)."""
        first, rest = super().warmup_steps()
        return [*first, *rest, self._warm_batches], []

    def _warm_batches(self) -> None:
        # On the CPU there is nothing shape-specific to prepare (and 8 rows of the widest window
        # take seconds there); on CUDA each new batch shape would otherwise pay kernel selection
        # and allocator growth on a live call, or a graph capture.
        if self.scheduler is None or self.torch_backend.device.type != "cuda":
            return
        shapes = self.torch_backend.warm_batches()
        log.info(
            "torch engine: %d decoder batch shapes warmed (%d CUDA graphs)",
            shapes,
            self.torch_backend.graphs,
        )

    def stream(
        self,
        text: str,
        should_stop: Callable[[], bool] | None = None,
        *,
        seed: int | None = None,
        urgent: bool = True,
    ) -> Iterator[EngineChunk]:
        # raises EngineError up front
        inner = super().stream(text, should_stop, seed=seed, urgent=urgent)
        driven = drive(inner, self.scheduler, urgent=urgent, should_stop=should_stop)
        return self._counted(driven)

    def _counted(self, inner: Iterator[EngineChunk]) -> Iterator[EngineChunk]:
        with self._active_lock:
            self._active += 1
        try:
            yield from inner
        finally:
            with self._active_lock:
                self._active -= 1

    def close(self) -> None:
        self.torch_backend.close()


def device_memory() -> dict[str, float]:
    """Peak and current memory torch allocated on the GPU, MiB (empty on a CPU-only torch)."""
    if not torch.cuda.is_available():
        return {}
    with contextlib.suppress(RuntimeError):
        return {
            "max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
            "max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
            "allocated_mib": torch.cuda.memory_allocated() / 2**20,
        }
    return {}
