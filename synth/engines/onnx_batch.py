"""The onnx engine with its model calls batched across streams (issue 16), on the CPU.

The same split, rewritten graphs as :mod:`synth.engines.onnx_engine` (loaded the same way, from the
same graph cache); what changes is who runs them. Every stream's model calls (front, flow block,
decoder window) go to one :class:`~synth.engines.batching.BatchScheduler` thread whose sessions
use all the cores, first chunks first:

* decoder windows of **equal width** run as one batch: the decoder graph takes a batch dimension
  (its input is ``[batch, C, frames]``; the 2-D rewrite keeps it) and gives each row exactly the
  audio it gives alone (measured: bit-identical), but it has no sequence mask, so rows of
  different widths cannot share a batch (zero frames past a row's end are not the decoder's
  zero padding: its biases make them sound);
* the front and the flow blocks run one call at a time on the same thread: their inputs differ
  in length every call, and without masks a padded batch would change the audio.

What it buys on a CPU is measured by ``voxgate bench synth --streams``: batched against today's
per-stream scheduling (each stream's calls on its own pool thread, one intra-op thread each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from synth.engines.backend import Encoded, IntArray
from synth.engines.base import EngineChunk, FloatArray
from synth.engines.batching import BatchScheduler, Runner, drive, one_by_one
from synth.engines.graph_cache import GraphFile
from synth.engines.onnx_engine import OnnxBackend, OnnxEngine, make_session_options
from synth.engines.voice import Scales

# Decoder batches beyond this many frames x rows ran no faster than their rows one by one on
# the 2-core Xeon (8 x 32 frames: 82 vs 91 ms; 8 x 92: 709 vs 457 ms; the activations of a
# batch outgrow the caches).
DECODE_MAX_UNITS = 8 * 48


def batch_sessions(inner: OnnxBackend, threads: int) -> None:
    """Give ``inner`` sessions of ``threads`` intra-op threads (0: one per physical core) for
    the scheduler's thread, from the same (cached, optimised) graphs. onnxruntime's pool must
    not spin between runs here: the worker's threads run the DSP and the streaming code on the
    same cores meanwhile, and a spinning pool took them (2 streams: TTFA p95 455 ms and every
    utterance underrun, against 111 ms per stream, on the 2-core Xeon)."""
    import onnxruntime as ort

    for name in ("front_a", "front_b", "decoder"):
        model = getattr(inner.split, name)
        if isinstance(model, GraphFile):
            opts = make_session_options(threads, optimized=True)
            source: Any = str(model.path)
        else:
            opts = make_session_options(threads)
            source = model.SerializeToString()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        setattr(inner, f"_{name}", session)


class _ScheduledEncoded:
    """An ``Encoded`` whose lazy flow runs on the scheduler's thread (``latent`` is a call)."""

    def __init__(self, inner: Encoded, scheduler: BatchScheduler) -> None:
        self._inner = inner
        self._scheduler = scheduler

    @property
    def durations(self) -> IntArray:
        return self._inner.durations

    @property
    def frames(self) -> int:
        return self._inner.frames

    def latent(self, start: int, end: int) -> FloatArray:
        out: FloatArray = self._scheduler.submit("flow", (self._inner, start, end))
        return out


class BatchedOnnxBackend:
    """:class:`OnnxBackend`'s calls through a scheduler (``Backend`` protocol)."""

    def __init__(
        self,
        inner: OnnxBackend,
        *,
        max_batch: int = 8,
        budget_ms: float = 0.0,
        window_ms: float = 2.0,
    ) -> None:
        self.inner = inner
        self.sample_rate = inner.sample_rate
        self.hop_length = inner.hop_length
        self.latent_channels = inner.latent_channels
        self.scheduler = BatchScheduler(
            {
                "encode": Runner(
                    one_by_one(lambda call: inner.encode(*call)),
                    max_rows=1,
                    units=lambda calls: float(sum(len(c[0]) for c in calls)),
                ),
                "flow": Runner(
                    one_by_one(lambda call: np.array(call[0].latent(call[1], call[2]))),
                    max_rows=1,
                    units=lambda calls: float(sum(c[2] - c[1] for c in calls)),
                ),
                "decode": Runner(
                    self._run_decodes,
                    units=lambda zs: float(len(zs) * max(int(z.shape[1]) for z in zs)),
                    own=lambda z: float(z.shape[1]),
                    max_padding=1.0,  # equal widths only (module doc)
                    max_units=DECODE_MAX_UNITS,
                ),
                # Anything else that must run on the scheduler's thread (tests park it here).
                "exec": Runner(one_by_one(lambda fn: fn()), max_rows=1, units=len),
            },
            max_batch=max_batch,
            budget_s=budget_ms / 1000.0,
            window_s=window_ms / 1000.0,
            name="onnx-batch",
        )

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> Encoded:
        encoded: Encoded = self.scheduler.submit("encode", (phoneme_ids, scales, rng))
        return _ScheduledEncoded(encoded, self.scheduler)

    def decode(self, z: FloatArray) -> FloatArray:
        audio: FloatArray = self.scheduler.submit("decode", np.ascontiguousarray(z, np.float32))
        return audio

    def on_scheduler(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the scheduler's thread, between batches."""
        return self.scheduler.submit("exec", fn)

    def _run_decodes(self, zs: list[FloatArray]) -> list[FloatArray]:
        if len(zs) == 1:
            return [self.inner.decode(zs[0])]
        split = self.inner.split
        feed: dict[str, Any] = {split.z_name: np.ascontiguousarray(np.stack(zs))}
        if "sid" in split.decoder_extra_inputs:
            feed["sid"] = np.repeat(self.inner._sid, len(zs))
        (audio,) = self.inner._decoder.run(None, feed)
        rows = np.asarray(audio, dtype=np.float32).reshape(len(zs), -1)
        return [np.ascontiguousarray(row) for row in rows]

    def close(self) -> None:
        self.scheduler.close()


class BatchedOnnxEngine(OnnxEngine):
    """:class:`OnnxEngine` with batched model calls (``name`` stays ``"onnx"``: same voice, same
    graphs). ``threads``: intra-op threads of the scheduler's sessions (0: onnxruntime's
    default, one per physical core: the scheduler's thread is the only one running them)."""

    def __init__(
        self,
        voice: str = "",
        threads: int = 0,
        *,
        max_batch: int = 8,
        budget_ms: float = 0.0,
        window_ms: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(voice, 1, **kwargs)
        assert isinstance(self.backend, OnnxBackend)
        batch_sessions(self.backend, threads)
        self.onnx_backend = self.backend
        self.batched = BatchedOnnxBackend(
            self.backend, max_batch=max_batch, budget_ms=budget_ms, window_ms=window_ms
        )
        self.backend = self.batched

    @property
    def scheduler(self) -> BatchScheduler:
        return self.batched.scheduler

    @property
    def concurrent_steps(self) -> int:
        """A thread per utterance in the worker: each step mostly waits for the scheduler."""
        return 1 << 16

    def stream(
        self,
        text: str,
        should_stop: Callable[[], bool] | None = None,
        *,
        seed: int | None = None,
        urgent: bool = True,
    ) -> Iterator[EngineChunk]:
        inner = super().stream(text, should_stop, seed=seed, urgent=urgent)
        return drive(inner, self.scheduler, urgent=urgent, should_stop=should_stop)

    def close(self) -> None:
        self.batched.close()
