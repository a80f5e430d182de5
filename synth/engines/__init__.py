"""TTS engines: ``onnx`` (default, onnxruntime) and ``torch`` (Piper's VITS, CPU or CUDA).

Both share the voice frontend (:mod:`synth.engines.voice`) and the streaming decoder
(:mod:`synth.engines.streaming`); they differ only in the model backend. Engines are imported
lazily so the gateway side never pays for onnxruntime or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synth.engines.base import Engine, EngineChunk, EngineError, WordMark

if TYPE_CHECKING:
    from synth.engines.graph_cache import GraphCache

__all__ = ["ENGINE_NAMES", "Engine", "EngineChunk", "EngineError", "WordMark", "load_engine"]

ENGINE_NAMES = ("onnx", "torch")


def load_engine(
    name: str,
    voice: str = "",
    device: str = "cpu",
    threads: int = 1,
    *,
    cache: GraphCache | bool | None = True,
    batching: bool | None = None,
    max_batch: int = 0,
    budget_ms: float = -1.0,
    precision: str = "fp32",
) -> Engine:
    """Build the engine called ``name`` for ``voice`` (``""``: the bundled joe-medium).

    ``device`` only matters for torch (``"cpu"``, ``"cuda"``, ``"cuda:N"``); the onnx engine runs
    on the CPU and refuses anything else rather than silently ignoring it. ``threads``: intra-op
    threads (0: the runtime's default). ``cache``: the onnx engine's graph cache
    (:mod:`synth.engines.graph_cache`; ``True``: the default directory, ``False``/``None``:
    none); torch builds its model from the voice's weights and has nothing to cache.
    ``batching`` (None: torch on CUDA only), ``max_batch`` (0: by device), ``budget_ms`` (-1: by
    device): batching across utterances (:mod:`synth.engines.batching`); ``precision``: the
    torch decoder's dtype.
    """
    if name == "onnx":
        if device != "cpu":
            raise EngineError(f"engine 'onnx' runs on the CPU only, not {device!r}; use 'torch'")
        if precision != "fp32":
            raise EngineError(f"engine 'onnx' runs fp32, not {precision!r}; use 'torch'")
        if batching:
            from synth.engines.onnx_batch import BatchedOnnxEngine

            # The scheduler's thread is the only one running the sessions: all the cores.
            return BatchedOnnxEngine(
                voice,
                0 if threads <= 1 else threads,
                cache=cache,
                max_batch=max_batch or 8,
                budget_ms=max(0.0, budget_ms),
            )
        from synth.engines.onnx_engine import OnnxEngine

        return OnnxEngine(voice, threads, cache=cache)
    if name == "torch":
        from synth.engines.torch_engine import TorchEngine

        engine: Engine = TorchEngine(
            voice,
            device,
            threads,
            batching=batching,
            max_batch=max_batch,
            budget_ms=budget_ms,
            precision=precision,
        )
        return engine
    raise EngineError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
