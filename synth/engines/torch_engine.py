"""The ``torch`` engine: Piper's VITS on torch (CPU or CUDA), same voice as the onnx engine.

The model is Piper's own ``SynthesizerTrn`` filled from the voice's ONNX weights
(:mod:`synth.engines.torch_vits`), wrapped as a backend for the shared streaming decoder. What torch
adds over onnxruntime is the GPU and, with it, batching: on CUDA the decoder calls of concurrent
utterances (the worker steps several ``stream()`` generators from a thread pool) are gathered for a
few milliseconds, zero-padded to one length, decoded as one batch and split back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from synth.engines import torch_vits
from synth.engines.backend import EagerEncoded, draw_noise
from synth.engines.base import EngineChunk, EngineError, FloatArray
from synth.engines.streaming import StreamConfig, StreamingEngine
from synth.engines.voice import Scales, Voice


@dataclass(slots=True)
class _Request:
    z: torch.Tensor  # [C, T] on the device
    done: threading.Event = field(default_factory=threading.Event)
    audio: FloatArray | None = None
    error: BaseException | None = None


class DecodeBatcher:
    """Gathers concurrent ``decode`` calls into padded batches run by one thread.

    A caller blocks until its audio is ready. The batching thread takes the first waiting request,
    then waits up to ``window_s`` for more, but not longer than needed: as soon as ``expected()``
    requests (the number of utterances currently streaming, at most ``max_batch``) are waiting the
    batch runs, so a lone utterance never waits. Lengths are padded up to the smallest of
    ``buckets`` that fits (the streaming schedule's chunk shapes, which warm-up ran), so on a GPU a
    batch reuses kernels already selected instead of meeting a new shape.
    """

    def __init__(
        self,
        run: Callable[[torch.Tensor, list[int]], torch.Tensor],
        hop_length: int,
        *,
        window_s: float = 0.003,
        max_batch: int = 8,
        buckets: Sequence[int] = (),
        expected: Callable[[], int] | None = None,
    ) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError("max_batch must be >= 1 and window_s >= 0")
        self._run = run
        self._hop = hop_length
        self.window_s = window_s
        self.max_batch = max_batch
        self.buckets = tuple(sorted(set(buckets)))
        self.expected_fn: Callable[[], int] = expected or (lambda: max_batch)
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batch_sizes: list[int] = []  # sizes of the batches run (for tests and stats)

    def padded_length(self, frames: int) -> int:
        for b in self.buckets:
            if b >= frames:
                return b
        return frames

    def decode(self, z: torch.Tensor) -> FloatArray:
        """Audio (float32, ``T * hop`` samples) for latent ``z`` ``[C, T]``; thread-safe."""
        req = _Request(z)
        with self._cond:
            if self._closed:
                raise RuntimeError("decode batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="torch-decode-batcher", daemon=True
                )
                self._thread.start()
            self._queue.append(req)
            self._cond.notify_all()
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.audio is not None
        return req.audio

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _take(self) -> list[_Request] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = time.monotonic() + self.window_s
            while True:
                target = max(1, min(self.max_batch, self.expected_fn()))
                left = deadline - time.monotonic()
                if len(self._queue) >= target or left <= 0 or self._closed:
                    break
                self._cond.wait(left)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            return batch

    def _loop(self) -> None:
        # Inference mode is thread-local: this thread builds the padded batch, so enter it here.
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            try:
                frames = [int(r.z.shape[1]) for r in batch]
                width = self.padded_length(max(frames))
                z = batch[0].z.new_zeros((len(batch), int(batch[0].z.shape[0]), width))
                for i, r in enumerate(batch):
                    z[i, :, : frames[i]] = r.z
                audio = self._run(z, frames).float().cpu().numpy()
                self.batch_sizes.append(len(batch))
                for i, r in enumerate(batch):
                    r.audio = np.ascontiguousarray(audio[i, : frames[i] * self._hop])
            except BaseException as exc:  # handed to every waiting caller, loop keeps serving
                for r in batch:
                    r.error = exc
            for r in batch:
                r.done.set()


class TorchBackend:
    """Piper VITS on torch behind the shared streaming decoder's backend interface.

    ``encode`` runs text encoder, duration predictor and reverse flow; ``decode`` runs the HiFi-GAN
    generator, directly or through a :class:`DecodeBatcher`. Both take and return numpy arrays so
    the streaming code stays backend-agnostic; the latent crossing to the host is small (192 floats
    a frame) next to the audio.
    """

    def __init__(
        self,
        voice: Voice,
        device: str = "cpu",
        *,
        threads: int = 1,
        fp16: bool = False,
        batching: bool | None = None,
        batch_window_s: float = 0.003,
        max_batch: int = 8,
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"torch engine: device {device!r} asked for, but torch sees no GPU")
        if self.device.type == "cpu" and threads > 0:
            # Process-wide in torch; the worker runs one engine per process.
            torch.set_num_threads(threads)
        net, arch, report = torch_vits.load_vits_from_onnx(voice.model)
        self.arch = arch
        self.mapping = report
        self.net: Any = net.to(self.device)
        # fp16 only for the decoder and only on CUDA: durations come from ceil() of the encoder's
        # output, where half precision could shift a frame; the decoder is where the time goes.
        self.fp16 = fp16 and self.device.type == "cuda"
        self._dec_dtype = torch.float16 if self.fp16 else torch.float32
        if self.fp16:
            self.net.dec.half()
        self.sample_rate = voice.sample_rate
        self.hop_length = arch.hop_length
        self.latent_channels = arch.inter_channels
        self.speaker_id = voice.speaker_id
        with torch.inference_mode():
            g = torch_vits.speaker_embedding(self.net, self.speaker_id, self.device)
        self._g = None if g is None else g.to(self._dec_dtype)
        batching = self.device.type == "cuda" if batching is None else batching
        self.batcher: DecodeBatcher | None = None
        if batching:
            self.batcher = DecodeBatcher(
                self._decode_batch, self.hop_length, window_s=batch_window_s, max_batch=max_batch
            )

    # -- backend interface --------------------------------------------------------------------

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> EagerEncoded:
        """Phoneme ids of one sentence → latent z and per-id durations (backend.py's contract)."""
        # Raw standard-normal noise in backend.py's order (duration noise, then latent noise once
        # the frame count is known); the model scales it exactly where Piper's graph does.
        dur_noise = torch.from_numpy(draw_noise(rng, (2, len(phoneme_ids))))[None]

        def latent_noise(frames: int) -> torch.Tensor:
            noise = draw_noise(rng, (self.latent_channels, frames))
            return torch.from_numpy(noise)[None].to(self.device)

        with torch.inference_mode():
            ids = torch.tensor([list(phoneme_ids)], dtype=torch.long, device=self.device)
            z, durations = torch_vits.encode(
                self.net,
                ids,
                scales.noise_scale,
                scales.length_scale,
                scales.noise_w,
                duration_noise=dur_noise.to(self.device),
                latent_noise=latent_noise,
                speaker_id=self.speaker_id,
            )
            return EagerEncoded(
                z=np.ascontiguousarray(z[0].float().cpu().numpy()),
                durations=durations.cpu().numpy().astype(np.int64),
            )

    def decode(self, z: FloatArray) -> FloatArray:
        """Audio for latent ``z`` ``[C, T]``: ``T * hop_length`` float32 samples."""
        with torch.inference_mode():
            zt = torch.from_numpy(np.ascontiguousarray(z, dtype=np.float32)).to(self.device)
            if self.batcher is not None:
                return self.batcher.decode(zt)
            audio = self._decode_batch(zt[None], [int(zt.shape[1])])
            return audio[0].float().cpu().numpy()

    # -- helpers --------------------------------------------------------------------------------

    def _decode_batch(self, z: torch.Tensor, frames: list[int]) -> torch.Tensor:
        # Called from the batcher's thread as well as directly; inference mode is thread-local.
        with torch.inference_mode():
            return torch_vits.decode(self.net.dec, z.to(self._dec_dtype), frames, self._g)

    def warm_batches(self, widths: Sequence[int], max_batch: int) -> None:
        """Run every batch size 1..``max_batch`` at every width through the decoder, both the
        equal-length path and the masked (padded) one, so no batch shape is new on a GPU."""
        with torch.inference_mode():
            for width in widths:
                for size in range(1, max_batch + 1):
                    z = torch.zeros(size, self.latent_channels, width, device=self.device)
                    self._decode_batch(z, [width] * size)
                    self._decode_batch(z, [width] * (size - 1) + [max(1, width - 1)])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()


class TorchEngine(StreamingEngine):
    """Piper on torch with the shared streaming decoder (``name = "torch"``).

    ``voice``: ``""`` for the bundled en_US-joe-medium or a Piper ``.onnx`` path. ``device``:
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. ``threads``: torch intra-op threads on the CPU (0:
    torch's default). ``batching`` (default: on for CUDA) gathers concurrent decoder calls for up to
    ``batch_window_ms`` into batches of at most ``max_batch``. ``fp16`` runs the decoder in half
    precision on CUDA. ``scales``, ``seed`` and ``config`` are as for the onnx engine; with the
    same seed both engines draw the same noise and speak alike.
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
        batch_window_ms: float = 3.0,
        max_batch: int = 8,
        fp16: bool = False,
    ) -> None:
        loaded = Voice.load(voice)
        backend = TorchBackend(
            loaded,
            device,
            threads=threads,
            fp16=fp16,
            batching=batching,
            batch_window_s=batch_window_ms / 1000.0,
            max_batch=max_batch,
        )
        super().__init__(backend, loaded, scales=scales, seed=seed, config=config)
        self.torch_backend = backend
        self.voice = voice or loaded.name
        self._active = 0
        self._active_lock = threading.Lock()
        if backend.batcher is not None:
            # Pad batches up to the streaming windows' widths (the shapes warm-up runs), and
            # stop waiting once every utterance streaming right now has handed in its chunk.
            backend.batcher.buckets = self.config.window_widths
            backend.batcher.expected_fn = lambda: self._active

    @property
    def active_streams(self) -> int:
        return self._active

    def warmup_steps(self) -> tuple[list[Callable[[], None]], list[Callable[[], None]]]:
        """Zero inputs through the encoder and every decoder window width (the shared streaming
        warm-up), then, when batching, every batch size at every width: all of it before ready
        (on CUDA the batch shapes are what the first requests meet, and this engine's start is
        dominated by building the model, not by its warm-up)."""
        first, rest = super().warmup_steps()
        return [*first, *rest, self._warm_batches], []

    def _warm_batches(self) -> None:
        batcher = self.torch_backend.batcher
        # On the CPU there is nothing shape-specific to prepare; on CUDA each new batch shape
        # would otherwise pay kernel selection and allocator growth on a live call.
        if batcher is not None and self.torch_backend.device.type == "cuda":
            self.torch_backend.warm_batches(self.config.window_widths, batcher.max_batch)

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
        return self._counted(inner)

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
