"""The default engine: Piper's ONNX graph on onnxruntime, split so the decoder can stream.

A Piper export is one graph: phoneme ids → audio. We cut it into three sessions:

* ``front_a``: ids, lengths, scales (+ sid), duration noise → durations (the ``Ceil`` tensor,
  frames per id) and everything the flow needs;
* ``front_b``: those tensors + latent noise → latent z (the input of the decoder's first Conv,
  ``/Mul_7_output_0`` [1, 192, frames] in joe-medium);
* ``decoder``: z (+ sid) → audio, run on windows of z by ``synth.engines.streaming``.

The decoder (HiFi-GAN, all 1-D convolutions) is rewritten as the same network in 2-D with a
height of 1 (:func:`decoder_as_2d`): onnxruntime's NCHWc layout transformer, which gives its
CPU convolutions blocked AVX2/AVX-512 kernels and fuses the activations, only handles 2-D
convolutions; 1-D ones run as im2col + GEMM. Then :func:`graph_rewrite.decoder_for_nchwc`
turns what NCHWc cannot run (LeakyRelu between residual adds, ConvTranspose upsampling, the
MRF average, the one-channel output conv) into ops it can, so the decoder stays blocked from
conv_pre to the end. The flow's convolutions run 2-D too (:func:`graph_rewrite.convs_as_2d`).
Same weights, same arithmetic up to float summation order (max difference ~1e-7), about 40 %
less decoder time than the 1-D graph on an Intel Xeon (issue 17).

The cut at the latent ``RandomNormalLike`` exists so noise comes from a numpy generator (seedable
per call, identical to what the torch engine draws) instead of onnxruntime's unseeded RNG; the
duration predictor's ``RandomNormalLike`` becomes a graph input for the same reason. All cut
points are found by graph structure (op types and dependencies), so other Piper voices
(x_low/low/medium/high) split the same way; a graph that does not fit raises ``VoiceError``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from synth.engines.backend import draw_noise
from synth.engines.base import FloatArray
from synth.engines.graph_cache import (
    GraphCache,
    GraphFile,
    cache_key,
    cpu_identity,
    voice_sha256,
)
from synth.engines.graph_rewrite import convs_as_2d, decoder_for_nchwc
from synth.engines.streaming import StreamConfig, StreamingEngine
from synth.engines.voice import (
    Scales,
    Voice,
    VoiceArch,
    VoiceError,
    find_conv_pre,
)

log = logging.getLogger("voxgate.worker")


@dataclass(frozen=True, slots=True)
class GraphSplit:
    """The three sub-models of a Piper graph and the tensor names that join them."""

    front_a: Any  # onnx.ModelProto
    front_b: Any
    decoder: Any
    z_name: str  # latent tensor, input of the decoder
    durations_name: str  # Ceil output: frames per phoneme id
    latent_noise_name: str  # front_b input replacing the latent RandomNormalLike
    latent_shape_name: str  # front_a output whose shape the latent noise takes
    dp_noise_name: str  # front_a input replacing the duration predictor's RandomNormalLike
    boundary: tuple[str, ...]  # other tensors passed from front_a to front_b
    dp_noise_channels: int
    decoder_extra_inputs: tuple[str, ...]  # graph inputs the decoder needs besides z (sid)
    time_aligned: tuple[str, ...]  # front_b inputs laid out [1, C, frames], like z
    flow_context: int  # frames of context that make a window of front_b exact; -1: not local
    decoder_2d: bool = False  # the decoder was rewritten by decoder_as_2d
    decoder_passes: tuple[str, ...] = ()  # graph_rewrite.decoder_for_nchwc passes applied
    front_b_2d: bool = False  # front_b's convolutions run 2-D (graph_rewrite.convs_as_2d)
    front_a_2d: bool = False  # front_a's too


# Ops that mix information across the time axis beyond a convolution's reach.
_TIME_MIXING = frozenset(
    {"MatMul", "Gemm", "Softmax", "CumSum", "ConvTranspose", "LSTM", "GRU", "RNN", "Resize"}
    | {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Einsum", "TopK", "NonZero"}
)


def _ancestors(producer: dict[str, Any], targets: Sequence[str], stop: set[str]) -> list[Any]:
    """Nodes needed to compute ``targets`` when the tensors in ``stop`` are given."""
    seen_nodes: dict[int, Any] = {}
    seen: set[str] = set()
    stack = [t for t in targets if t not in stop]
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        node = producer.get(tensor)
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes[id(node)] = node
        stack.extend(i for i in node.input if i and i not in stop)
    return list(seen_nodes.values())


def _graph_inputs_reached(
    producer: dict[str, Any], graph_inputs: set[str], targets: Sequence[str], stop: set[str]
) -> set[str]:
    reached: set[str] = set()
    for node in _ancestors(producer, targets, stop):
        reached.update(i for i in node.input if i in graph_inputs)
    reached.update(t for t in targets if t in graph_inputs)
    return reached


def split_piper_graph(model: Any, *, rewrite: bool = True) -> GraphSplit:
    """Cut a Piper VITS ONNX graph into front_a / front_b / decoder (see module docstring).

    ``rewrite``: run the decoder and the flow as their 2-D, NCHWc-friendly rewrites
    (:func:`decoder_as_2d`, :mod:`synth.engines.graph_rewrite`); False keeps the graphs as cut
    from the voice (the 1-D reference the tests compare the rewrites with)."""
    import onnx
    from onnx import TensorProto, helper, shape_inference
    from onnx.utils import Extractor

    work = onnx.ModelProto()
    work.CopyFrom(model)
    graph = work.graph
    output_name = graph.output[0].name
    graph_inputs = {i.name for i in graph.input}
    inits = {t.name for t in graph.initializer}
    ids_input = graph.input[0].name

    z_name = find_conv_pre(work).input[0]
    producer = {out: node for node in graph.node for out in node.output}
    front_nodes = _ancestors(producer, [z_name], set())
    front_ids = {id(n) for n in front_nodes}

    ceils = [n for n in front_nodes if n.op_type == "Ceil"]
    if len(ceils) != 1:
        raise VoiceError(f"voice graph: expected one Ceil (durations) before z, found {len(ceils)}")
    durations_name = ceils[0].output[0]

    randoms = [n for n in graph.node if n.op_type in ("RandomNormalLike", "RandomNormal")]
    if any(n.op_type == "RandomNormal" for n in randoms) or any(
        id(n) not in front_ids for n in randoms
    ):
        raise VoiceError("voice graph: unexpected random node; cannot split this graph")
    # Which noise depends on the durations? That one is the latent noise; the other one is the
    # duration predictor's.
    after_ceil = {durations_name}
    for node in graph.node:
        if any(i in after_ceil for i in node.input):
            after_ceil.update(node.output)
    latent_rnd = [n for n in randoms if n.input[0] in after_ceil]
    dp_rnd = [n for n in randoms if n.input[0] not in after_ceil]
    if len(latent_rnd) != 1 or len(dp_rnd) != 1:
        raise VoiceError(
            f"voice graph: expected one duration and one latent noise node, found "
            f"{len(dp_rnd)} and {len(latent_rnd)}"
        )
    latent, dp = latent_rnd[0], dp_rnd[0]

    # Duration noise: channels from shape inference (2 in VITS; time is the phoneme axis).
    inferred = shape_inference.infer_shapes(work, data_prop=True)
    shapes = {v.name: v.type.tensor_type.shape for v in inferred.graph.value_info}
    dp_shape = shapes.get(dp.input[0])
    if dp_shape is None or len(dp_shape.dim) != 3 or not dp_shape.dim[1].HasField("dim_value"):
        raise VoiceError("voice graph: cannot infer the duration noise's channel count")
    dp_channels = int(dp_shape.dim[1].dim_value)

    # Replace the duration noise node by a graph input of the same tensor name.
    dp_out = dp.output[0]
    graph.node.remove(dp)
    graph.input.append(
        helper.make_tensor_value_info(dp_out, TensorProto.FLOAT, ["batch", dp_channels, "phonemes"])
    )
    # Extractor needs value_info for every tensor it cuts at.
    graph.value_info.extend(
        v for v in inferred.graph.value_info if v.name not in {i.name for i in graph.value_info}
    )
    producer = {out: node for node in graph.node for out in node.output}

    # front_b: nodes downstream of the latent noise that lead to z; whatever else they read
    # crosses the cut.
    latent_out = latent.output[0]
    downstream = {latent_out}
    for node in graph.node:
        if any(i in downstream for i in node.input):
            downstream.update(node.output)
    b_nodes = [
        n for n in _ancestors(producer, [z_name], set()) if any(o in downstream for o in n.output)
    ]
    b_produced = {o for n in b_nodes for o in n.output}
    boundary: list[str] = []
    for node in b_nodes:
        for name in node.input:
            crosses = name and name not in b_produced and name not in inits
            if crosses and name != latent_out and name not in boundary:
                boundary.append(name)
    a_inputs = [i.name for i in graph.input]
    a_outputs = [durations_name]
    for name in (latent.input[0], *boundary):
        if name not in graph_inputs and name not in a_outputs:
            a_outputs.append(name)

    extractor = Extractor(work)
    try:
        front_a = extractor.extract_model(a_inputs, a_outputs)
        front_b = extractor.extract_model([*boundary, latent_out], [z_name])
    except Exception as exc:  # Extractor raises KeyError/ValueError on a bad cut
        raise VoiceError(f"voice graph: cannot extract the front halves: {exc}") from exc

    dec_extra = _graph_inputs_reached(producer, graph_inputs, [output_name], {z_name})
    if ids_input in dec_extra or "input_lengths" in dec_extra or "scales" in dec_extra:
        raise VoiceError(
            f"voice graph: the decoder after {z_name} still depends on {sorted(dec_extra)}"
        )
    try:
        decoder = extractor.extract_model([z_name, *sorted(dec_extra)], [output_name])
    except Exception as exc:
        raise VoiceError(f"voice graph: cannot extract the decoder: {exc}") from exc
    decoder_2d = decoder_as_2d(decoder) if rewrite else None
    decoder_passes: tuple[str, ...] = ()
    if decoder_2d is not None:
        decoder_2d, decoder_passes = decoder_for_nchwc(decoder_2d)

    # front_b (the flow) is a stack of convolutions along time; if that is all it mixes time
    # with, a window of z needs only the sum of the convolutions' half-widths as context.
    frames_dim = shapes.get(z_name)
    frames_sym = (
        frames_dim.dim[2].dim_param if frames_dim is not None and len(frames_dim.dim) == 3 else ""
    )
    time_aligned: list[str] = []
    for name in [*boundary, latent_out]:
        dims = shapes.get(name)
        aligned = dims is not None and len(dims.dim) == 3 and dims.dim[2].dim_param == frames_sym
        if frames_sym and aligned:
            time_aligned.append(name)
    flow_context = 0
    for node in front_b.graph.node:
        if node.op_type in _TIME_MIXING:
            flow_context = -1
            break
        if node.op_type == "Conv":
            attrs = {a.name: list(a.ints) for a in node.attribute}
            kernel = attrs.get("kernel_shape", [1])[-1]  # the time axis is the last one
            dilation = attrs.get("dilations", [1])[-1]
            flow_context += (kernel - 1) // 2 * dilation + (kernel - 1) % 2
    if latent_out not in time_aligned or not frames_sym:
        flow_context = -1
    front_b_2d = convs_as_2d(front_b) if rewrite else None
    # The text encoder's FFN convolutions are 40 % of front_a: 2-D they take 8 % less of it.
    # The durations (a Ceil) see the new float order; none moved on the bench prompts, and the
    # torch engine's order differs more and gives the same durations (test_torch_engine).
    front_a_2d = convs_as_2d(front_a) if rewrite else None

    return GraphSplit(
        front_a=front_a_2d if front_a_2d is not None else front_a,
        front_b=front_b_2d if front_b_2d is not None else front_b,
        decoder=decoder_2d if decoder_2d is not None else decoder,
        z_name=z_name,
        durations_name=durations_name,
        latent_noise_name=latent_out,
        latent_shape_name=latent.input[0],
        dp_noise_name=dp_out,
        boundary=tuple(boundary),
        dp_noise_channels=dp_channels,
        decoder_extra_inputs=tuple(sorted(dec_extra)),
        time_aligned=tuple(time_aligned),
        flow_context=flow_context,
        decoder_2d=decoder_2d is not None,
        decoder_passes=decoder_passes,
        front_b_2d=front_b_2d is not None,
        front_a_2d=front_a_2d is not None,
    )


# Ops whose meaning does not change when every activation gains a height axis of size 1 (with
# scalar constants only: a constant [C, 1] would broadcast differently against [1, C, 1, T]).
_RANK_FREE = frozenset({"Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh", "Identity"})


def decoder_as_2d(model: Any) -> Any | None:
    """The decoder with every 1-D Conv/ConvTranspose as a 2-D one of height 1, or None when the
    graph holds anything this rewrite does not know to be rank-free (then the 1-D graph runs).

    Input z [1, C, T] gains its height axis through one ``Unsqueeze`` at the start; weights
    [O, I, K] become [O, I, 1, K], and kernel_shape, strides, dilations, pads, output_padding
    gain the height's neutral value (ONNX Conv: pads are [begin..., end...] per spatial axis).
    The graph's last ``Unsqueeze`` (Tanh [1, 1, T] → output [1, 1, 1, T]) becomes ``Identity``:
    the 2-D Tanh is [1, 1, 1, T] already. Multi-speaker decoders (a speaker-embedding branch
    with Gather/Unsqueeze of sid) are left as they are.
    """
    import onnx
    from onnx import helper, numpy_helper

    work = onnx.ModelProto()
    work.CopyFrom(model)
    graph = work.graph
    if len(graph.input) != 1 or len(graph.output) != 1:
        return None
    opset = next((o.version for o in work.opset_import if o.domain in ("", "ai.onnx")), 0)
    z_name, output_name = graph.input[0].name, graph.output[0].name
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose"):
            weight = inits.get(node.input[1])
            if weight is None or uses[weight.name] != 1 or len(weight.dims) != 3:
                return None
            attrs = {a.name for a in node.attribute}
            if "auto_pad" in attrs or "output_shape" in attrs:
                return None
        elif node.op_type == "Unsqueeze":
            if node.output[0] != output_name:
                return None
            if len(node.input) > 1:  # axes: an input from opset 13, an attribute before
                const = inits.get(node.input[1])
                axes = numpy_helper.to_array(const).tolist() if const is not None else None
            else:
                axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
            if axes != [1]:
                return None
        elif node.op_type in _RANK_FREE:
            for name in node.input:
                const = inits.get(name)
                if const is not None and int(np.prod(const.dims)) != 1:
                    return None
        else:
            return None

    z_2d = f"{z_name}/2d"
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == z_name:
                node.input[i] = z_2d
    if opset >= 13:  # Unsqueeze's axes: an input from opset 13, an attribute before
        axes_name = f"{z_name}/2d_axes"
        graph.initializer.append(helper.make_tensor(axes_name, onnx.TensorProto.INT64, [1], [2]))
        head = helper.make_node("Unsqueeze", [z_name, axes_name], [z_2d], name="to_2d")
    else:
        head = helper.make_node("Unsqueeze", [z_name], [z_2d], name="to_2d", axes=[2])
    nodes = [head]
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose"):
            weight = inits[node.input[1]]
            array = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(array[:, :, None, :], weight.name))
            attributes = []
            for a in node.attribute:
                if a.name in ("kernel_shape", "strides", "dilations"):
                    attributes.append(helper.make_attribute(a.name, [1, *a.ints]))
                elif a.name == "output_padding":
                    attributes.append(helper.make_attribute(a.name, [0, *a.ints]))
                elif a.name == "pads":
                    begin, end = a.ints
                    attributes.append(helper.make_attribute(a.name, [0, begin, 0, end]))
                else:
                    attributes.append(a)
            del node.attribute[:]
            node.attribute.extend(attributes)
        elif node.op_type == "Unsqueeze":
            node.op_type = "Identity"
            del node.input[1:]
            del node.attribute[:]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # the 1-D shapes no longer hold; onnxruntime infers the new ones
    return work


_SPLIT_MODELS = ("front_a", "front_b", "decoder")


def split_meta(split: GraphSplit) -> dict[str, Any]:
    """The split's names and facts (everything but the graphs), JSON-able, for the cache."""
    return {
        name: list(value) if isinstance(value, tuple) else value
        for name in GraphSplit.__slots__
        if name not in _SPLIT_MODELS
        for value in [getattr(split, name)]
    }


def split_from_meta(meta: dict[str, Any], models: dict[str, Any]) -> GraphSplit:
    """Inverse of :func:`split_meta`, with the graphs given (``GraphFile`` from the cache)."""
    fields: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value for name, value in meta.items()
    }
    return GraphSplit(**models, **fields)


def make_session_options(threads: int, *, optimized: bool = False, save_to: str = "") -> Any:
    """Session options; ``optimized``: the graph was saved already optimised (from the graph
    cache), so onnxruntime skips its passes; ``save_to``: write the optimised graph there."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # 0 lets onnxruntime pick (one per physical core); the worker usually runs N engines with 1.
    opts.intra_op_num_threads = max(0, threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3  # the split graphs carry unused initializers: not worth warnings
    if optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if save_to:
        opts.optimized_model_filepath = save_to
    return opts


class OnnxEncoded:
    """Durations now, z on demand: the flow (front_b) runs on growing blocks of frames, each
    with ``context`` frames either side, so the first chunk only waits for the frames it needs.
    ``context`` -1 computes all of z at the first request."""

    def __init__(
        self,
        session: Any,
        split: GraphSplit,
        feed: dict[str, Any],
        durations: npt.NDArray[np.int64],
        frames: int,
        context: int,
    ) -> None:
        self._session = session
        self._split = split
        self._feed = feed
        self._durations = durations
        self._frames = frames
        self._context = context
        self._z = np.empty((int(feed[split.latent_noise_name].shape[1]), frames), np.float32)
        self._ready = 0  # z[:, :ready] is computed
        self.flow_runs: list[tuple[int, int]] = []  # windows run, for tests

    @property
    def durations(self) -> npt.NDArray[np.int64]:
        return self._durations

    @property
    def frames(self) -> int:
        return self._frames

    def latent(self, start: int, end: int) -> FloatArray:
        end = min(end, self._frames)
        if end > self._ready:
            if self._context < 0 or (self._ready == 0 and end >= self._frames):
                self._compute(0, self._frames)
            else:
                # Grow geometrically so a long sentence takes few flow runs; the first block is
                # exactly what was asked for (first audio waits for nothing more). Every block
                # boundary costs 2 x context frames computed twice, so later blocks grow 4x
                # (the second chunk has the first one's ~230 ms of audio to hide behind), and a
                # block that would stop within one context of the end runs to the end: its
                # window reaches the end anyway. Over the bench prompts the flow computes 1.16
                # frames a frame instead of 1.28 (issue 17).
                target = end if self._ready == 0 else max(end, 4 * self._ready + 128)
                if target + self._context >= self._frames:
                    target = self._frames
                self._compute(self._ready, min(self._frames, target))
        return self._z[:, start:end]

    def _compute(self, start: int, end: int) -> None:
        context = max(self._context, 0) if self._context >= 0 else self._frames
        lo, hi = max(0, start - context), min(self._frames, end + context)
        feed = dict(self._feed)
        if lo > 0 or hi < self._frames:
            for name in self._split.time_aligned:
                feed[name] = np.ascontiguousarray(feed[name][:, :, lo:hi])
        (z,) = self._session.run([self._split.z_name], feed)
        self._z[:, start:end] = z[0, :, start - lo : end - lo]
        self._ready = max(self._ready, end)
        self.flow_runs.append((lo, hi))


class OnnxBackend:
    """Front and decoder sessions of one voice (``Backend`` protocol). Thread-safe: sessions'
    ``run`` is, and no per-call state lives on the object."""

    def __init__(
        self,
        voice: Voice,
        threads: int = 1,
        split: GraphSplit | None = None,
        *,
        save_dir: Path | None = None,
        windowed_flow: bool | None = None,
    ) -> None:
        """``split``: graphs already split (``GraphFile`` ones from the graph cache are loaded
        by path, already optimised); ``save_dir``: save each optimised graph there as
        ``<name>.onnx`` (filling a cache entry); ``windowed_flow``: the self-check's verdict,
        when known (cached), else it runs."""
        import onnxruntime as ort

        self.voice = voice
        self.split = split if split is not None else split_piper_graph(voice.model)
        self.sample_rate = voice.sample_rate
        self.hop_length = voice.hop_length
        self.latent_channels = voice.arch.latent_channels
        providers = ["CPUExecutionProvider"]

        def session(name: str) -> Any:
            model = getattr(self.split, name)
            save_to = str(save_dir / f"{name}.onnx") if save_dir is not None else ""
            if isinstance(model, GraphFile):
                opts = make_session_options(threads, optimized=True, save_to=save_to)
                return ort.InferenceSession(str(model.path), opts, providers=providers)
            opts = make_session_options(threads, save_to=save_to)
            return ort.InferenceSession(model.SerializeToString(), opts, providers=providers)

        self._front_a = session("front_a")
        self._front_b = session("front_b")
        self._decoder = session("decoder")
        self._front_a_outputs = [o.name for o in self._front_a.get_outputs()]
        self._front_a_inputs = {i.name for i in self._front_a.get_inputs()}
        self._front_b_inputs = [i.name for i in self._front_b.get_inputs()]
        self._sid = np.array([voice.speaker_id], dtype=np.int64)
        # Decoder shapes seen, for tests and warm-up checks (set.add is atomic under the GIL).
        self.decoder_shapes: set[tuple[int, ...]] = set()
        # Windowed flow only where the graph is purely convolutional in time (checked above)
        # and a numerical self-check agrees; else z is computed whole.
        if windowed_flow is None:
            windowed_flow = self.split.flow_context >= 0 and self._flow_self_check()
        self.windowed_flow = windowed_flow and self.split.flow_context >= 0

    def _front_feed(
        self, phoneme_ids: Sequence[int], scales: Scales, dp_noise: FloatArray
    ) -> dict[str, Any]:
        ids = np.asarray(phoneme_ids, dtype=np.int64)[None, :]
        feed: dict[str, Any] = {
            "input": ids,
            "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
            "scales": scales.as_array(),
            self.split.dp_noise_name: dp_noise,
        }
        if "sid" in self._front_a_inputs:
            feed["sid"] = self._sid
        return feed

    def encode(
        self, phoneme_ids: Sequence[int], scales: Scales, rng: np.random.Generator
    ) -> OnnxEncoded:
        split = self.split
        n = len(phoneme_ids)
        dp_noise = draw_noise(rng, (split.dp_noise_channels, n))[None]
        feed = self._front_feed(phoneme_ids, scales, dp_noise)
        feed = {k: v for k, v in feed.items() if k in self._front_a_inputs}
        results = dict(zip(self._front_a_outputs, self._front_a.run(None, feed), strict=True))
        durations = np.asarray(results[split.durations_name]).reshape(-1).astype(np.int64)
        latent_shape = tuple(np.shape(results[split.latent_shape_name]))
        if len(latent_shape) != 3 or latent_shape[1] != self.latent_channels:
            raise VoiceError(f"voice graph: latent noise shape {latent_shape} is not [1, C, T]")
        frames = int(latent_shape[2])
        feed_b: dict[str, Any] = {}
        for name in self._front_b_inputs:
            if name == split.latent_noise_name:
                feed_b[name] = draw_noise(rng, (self.latent_channels, frames))[None]
            elif name in results:
                feed_b[name] = results[name]
            else:
                feed_b[name] = feed[name]
        context = split.flow_context if self.windowed_flow else -1
        return OnnxEncoded(self._front_b, split, feed_b, durations, frames, context)

    def _flow_self_check(self) -> bool:
        """Windowed z must equal whole z on a real sentence (a guard for unusual graphs)."""
        phonemes = list("ðɪs ɪz ɐ tˈɛst ʌv ðə flˈoʊ wˈɪndoʊz, ænd ðɛɹ kˈɑːntɛkst.")
        ids, _ = self.voice.phonemes_to_ids(phonemes)
        self.windowed_flow = True
        lazy = self.encode(ids, self.voice.scales, np.random.default_rng(1))
        self.windowed_flow = False
        whole = self.encode(ids, self.voice.scales, np.random.default_rng(1))
        frames = lazy.frames
        step = max(1, frames // 5)
        windowed = np.concatenate(
            [lazy.latent(a, min(frames, a + step)) for a in range(0, frames, step)], axis=1
        )
        return bool(np.max(np.abs(windowed - whole.latent(0, frames))) < 1e-4)

    def decode(self, z: FloatArray) -> FloatArray:
        feed: dict[str, Any] = {self.split.z_name: np.ascontiguousarray(z[None], dtype=np.float32)}
        if "sid" in self.split.decoder_extra_inputs:
            feed["sid"] = self._sid
        self.decoder_shapes.add(tuple(z.shape))
        (audio,) = self._decoder.run(None, feed)
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def full_model_session(self) -> Any:
        """A session on the unsplit graph (for tests comparing halves with the whole)."""
        import onnxruntime as ort

        return ort.InferenceSession(
            self.voice.model.SerializeToString(),
            make_session_options(1),
            providers=["CPUExecutionProvider"],
        )


class OnnxEngine(StreamingEngine):
    """Piper on onnxruntime with a streaming decoder. ``threads``: intra-op threads per session
    (0 = onnxruntime default). ``scales``: override the voice's inference scales (e.g.
    ``voice.DETERMINISTIC``). ``seed``: make every call reproducible."""

    name = "onnx"

    def __init__(
        self,
        voice: str = "",
        threads: int = 1,
        *,
        scales: Scales | None = None,
        seed: int | None = None,
        config: StreamConfig | None = None,
        cache: GraphCache | bool | None = True,
    ) -> None:
        """``cache``: where the split, optimised graphs are kept between starts (``True``: the
        default directory, :func:`default_cache_dir`; ``False``/``None``: split every time)."""
        t0 = time.perf_counter()
        if cache is True:
            cache = GraphCache()
        loaded, backend, how = load_backend(voice, threads, cache or None)
        super().__init__(backend, loaded, scales=scales, seed=seed, config=config)
        self.voice = voice or loaded.name
        self.load_s = time.perf_counter() - t0
        self.load_how = how
        log.info("onnx engine: voice %s %s in %.2f s", loaded.name, how, self.load_s)


def load_backend(
    voice: str, threads: int, cache: GraphCache | None
) -> tuple[Voice, OnnxBackend, str]:
    """Voice and backend, from the graph cache when it holds this voice's graphs (else split
    and, with a cache, saved for next time). The string says which happened (for logs)."""
    if cache is None:
        loaded = Voice.load(voice)
        return loaded, OnnxBackend(loaded, threads), "split (no cache)"
    import onnxruntime as ort

    model_path, _ = Voice.paths(voice)
    if not model_path.is_file():
        Voice.load(voice)  # raises VoiceNotFoundError with the full story
    sha = voice_sha256(model_path, cache.root)
    key = cache_key(sha, ort.__version__, cpu_identity(), "all")
    entry = cache.lookup(key)
    if entry is not None:
        try:
            meta = entry.meta
            loaded = Voice.load(voice, arch=_arch_from_meta(meta["arch"]))
            models = {name: GraphFile(entry.graph(name)) for name in _SPLIT_MODELS}
            split = split_from_meta(meta["split"], models)
            backend = OnnxBackend(loaded, threads, split, windowed_flow=bool(meta["windowed_flow"]))
            return loaded, backend, f"loaded from the graph cache {entry.path}"
        except VoiceError:
            raise  # the voice's config, not the cache: splitting again would not help
        except Exception as exc:  # onnxruntime's load errors share no base class
            # A damaged file of the right size, or meta from a buggy writer: rebuild.
            cache.discard(key, f"cannot load it: {type(exc).__name__}: {exc}")
    loaded = Voice.load(voice)
    split = split_piper_graph(loaded.model)
    try:
        staging: Path | None = cache.staging()
    except OSError as exc:
        log.warning("graph cache %s not writable (%s); graphs not cached", cache.root, exc)
        staging = None
    backend = OnnxBackend(loaded, threads, split, save_dir=staging)
    if staging is None:
        return loaded, backend, "split (cache not writable)"
    meta = {
        "voice": str(model_path),
        "voice_sha256": sha,
        "onnxruntime": ort.__version__,
        "split": split_meta(split),
        "arch": _arch_meta(loaded.arch),
        "windowed_flow": backend.windowed_flow,
    }
    try:
        cache.commit(staging, key, meta)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        log.warning("graph cache: cannot save %s (%s)", key, exc)
        return loaded, backend, "split (cache write failed)"
    return loaded, backend, "split and saved to the graph cache"


def _arch_meta(arch: VoiceArch) -> dict[str, Any]:
    return {
        "latent_channels": arch.latent_channels,
        "upsample_rates": list(arch.upsample_rates),
        "upsample_initial_channel": arch.upsample_initial_channel,
        "hidden_channels": arch.hidden_channels,
    }


def _arch_from_meta(meta: dict[str, Any]) -> VoiceArch:
    return VoiceArch(
        latent_channels=int(meta["latent_channels"]),
        upsample_rates=tuple(int(r) for r in meta["upsample_rates"]),
        upsample_initial_channel=int(meta["upsample_initial_channel"]),
        hidden_channels=int(meta["hidden_channels"]),
    )
