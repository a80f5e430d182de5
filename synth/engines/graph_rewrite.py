"""Graph rewrites that keep Piper's split graphs inside onnxruntime's blocked (NCHWc) kernels.

onnxruntime's CPU convolutions are fastest in its NCHWc layout: channels in blocks of 8 (AVX2)
or 16 (AVX-512), fused bias, activation and residual sum (``NchwcTransformer``,
onnxruntime/core/optimizer/nchwc_transformer.cc). The transformer only handles 2-D ``Conv``
(with its fused activation) and a few layout-free ops on tensors that are already blocked:
``Add``/``Sum``, ``Mul``, ``Concat``, ``Relu``/``Sigmoid``/``Tanh``, pooling. Everything else
(``LeakyRelu``, ``ConvTranspose``, ``Div``) runs in plain NCHW, and every crossing costs a
reorder pass over the tensor. After :func:`synth.engines.onnx_engine.decoder_as_2d` made
HiFi-GAN's convolutions 2-D, a quarter of the decoder's time was such passes and the
``ConvTranspose`` upsampling (GEMM + col2im at half the convolutions' FLOP rate).

:func:`decoder_for_nchwc` rewrites the 2-D decoder into the same network built only from what
NCHWc runs (issue 17):

* ``fold_div``: the multi-receptive-field average ``Div(S, 3)`` before ``LeakyRelu`` and the next
  convolution is folded into that convolution's weights (LeakyRelu is positively homogeneous:
  ``lrelu(S / c) = lrelu(S) / c`` for ``c > 0``);
* ``polyphase_upsampling``: ``ConvTranspose`` with stride s is s interleaved ordinary
  convolutions over the input ("polyphase"): output sample ``n*s + p`` only sees input samples
  near n, through the kernel taps ``k = q - d*s`` (``q = p + pad``). Phases with the same input
  offsets become one ``Conv`` (2 taps each for HiFi-GAN's kernel = 2 x stride), then
  ``Concat`` + ``Reshape``/``Transpose``/``Reshape`` interleave them in time. Same FLOPs as
  the GEMM, at the blocked kernels' rate;
* ``depthwise_post``: the last convolution to one channel (NCHWc would pad it to a whole block
  of 16 output channels) becomes a depthwise ``Conv`` plus a 1x1 sum over channels;
* ``nchwc_leaky_relu``: every ``LeakyRelu`` that onnxruntime cannot fuse into the convolution
  before it gets an identity depthwise 1x1 ``Conv`` (weights 1, no bias) in front: the
  optimiser fuses ``Conv + LeakyRelu`` into ``FusedConv`` and the NCHWc transformer keeps the
  fused activation, so the activation runs blocked, in place of two reorders and a plain pass.
  The upsampled tensor of each stage gets the same identity so the stage's residual ``Add``\\ s
  see blocked inputs on both sides (``TransformBinary`` needs all inputs blocked).

Each pass checks its pattern and leaves anything else as it is; the output differs from the
1-D graph only by float summation order (measured ~1e-7 on joe-medium's decoder).

:func:`convs_as_2d` is the plain per-``Conv`` version for graphs whose other ops depend on rank
(the flow): each 1-D ``Conv`` becomes ``Unsqueeze`` → 2-D ``Conv`` → ``Squeeze``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import numpy.typing as npt

# The NCHWc block is 8 (AVX2) or 16 (AVX-512) channels; tensors whose channel count is not a
# multiple of 16 may not be blocked on every CPU, and an identity conv on them is pure cost.
_BLOCK = 16

PASSES = ("fold_div", "polyphase_upsampling", "depthwise_post", "nchwc_leaky_relu")


class _Graph:
    """Index of a graph under rewrite: producers, consumers, initializers, channel counts."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.model = model
        self.graph = model.graph
        self._numpy_helper = numpy_helper
        self.inits: dict[str, Any] = {t.name: t for t in self.graph.initializer}
        self.reindex()

    def reindex(self) -> None:
        self.producer: dict[str, Any] = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for node in self.graph.node:
            for name in node.input:
                if name:
                    self.consumers[name].append(node)
        self.channels = self._channels()

    def array(self, name: str) -> npt.NDArray[Any]:
        return np.asarray(self._numpy_helper.to_array(self.inits[name]))

    def set_array(self, name: str, value: npt.NDArray[Any]) -> None:
        self.inits[name].CopyFrom(self._numpy_helper.from_array(value, name))

    def add_init(self, name: str, value: npt.NDArray[Any]) -> str:
        tensor = self._numpy_helper.from_array(np.ascontiguousarray(value), name)
        self.graph.initializer.append(tensor)
        self.inits[name] = self.graph.initializer[-1]
        return name

    def weight_single_use(self, node: Any) -> bool:
        """The node's weight is an initializer that no other node reads (safe to change)."""
        return (
            len(node.input) > 1
            and node.input[1] in self.inits
            and len(self.consumers[node.input[1]]) == 1
        )

    def _channels(self) -> dict[str, int]:
        """Channel count of each activation, from the convolutions' weights forward."""
        channels: dict[str, int] = {}
        for node in self.graph.node:
            weight = self.inits.get(node.input[1]) if len(node.input) > 1 else None
            if node.op_type == "Conv" and weight is not None:
                channels[node.output[0]] = int(weight.dims[0])
            elif node.op_type == "ConvTranspose" and weight is not None:
                channels[node.output[0]] = int(weight.dims[1]) * max(1, _attr_int(node, "group", 1))
            elif node.op_type in ("Add", "Sub", "Mul", "Div", "LeakyRelu", "Relu", "Tanh"):
                known = [channels[i] for i in node.input if i in channels]
                if known:
                    channels[node.output[0]] = known[0]
        return channels


def _attr_int(node: Any, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _attr_ints(node: Any, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            return [int(v) for v in a.ints]
    return None


def decoder_for_nchwc(model: Any) -> tuple[Any, tuple[str, ...]]:
    """The 2-D decoder (:func:`~synth.engines.onnx_engine.decoder_as_2d`'s output) rewritten so
    onnxruntime runs it in NCHWc throughout (module docstring), and the passes that applied."""
    import onnx

    work = onnx.ModelProto()
    work.CopyFrom(model)
    g = _Graph(work)
    applied: list[str] = []
    for name, rewrite in (
        ("fold_div", _fold_div),
        ("polyphase_upsampling", _polyphase_upsampling),
        ("depthwise_post", _depthwise_post),
        ("nchwc_leaky_relu", _nchwc_leaky_relu),
    ):
        if rewrite(g):
            applied.append(name)
            g.reindex()
    return work, tuple(applied)


def _replace_nodes(g: _Graph, replace: dict[int, list[Any]], drop: set[int]) -> None:
    """Rebuild the node list in order: node id → its replacement nodes; dropped ids vanish."""
    nodes: list[Any] = []
    for node in g.graph.node:
        if id(node) in drop:
            continue
        nodes.extend(replace.get(id(node), [node]))
    copies = [type(n)() for n in nodes]
    for copy, node in zip(copies, nodes, strict=True):
        copy.CopyFrom(node)
    del g.graph.node[:]
    g.graph.node.extend(copies)


def _fold_div(g: _Graph) -> bool:
    """Div(S, c) → LeakyRelu → convolutions  ⇒  LeakyRelu(S) → convolutions with weights / c."""
    drop: set[int] = set()
    for node in g.graph.node:
        if node.op_type != "Div" or node.input[1] not in g.inits:
            continue
        divisor = g.array(node.input[1])
        if divisor.size != 1 or not float(divisor.reshape(-1)[0]) > 0:
            continue  # lrelu(S/c) = lrelu(S)/c holds for c > 0 only
        users = g.consumers[node.output[0]]
        if len(users) != 1 or users[0].op_type != "LeakyRelu" or node.output[0] in _outputs(g):
            continue
        relu = users[0]
        convs = g.consumers[relu.output[0]]
        if not convs or relu.output[0] in _outputs(g):
            continue
        if not all(
            c.op_type in ("Conv", "ConvTranspose")
            and c.input[0] == relu.output[0]
            and g.weight_single_use(c)
            for c in convs
        ):
            continue
        c = np.float32(divisor.reshape(-1)[0])
        for conv in convs:
            weight = g.array(conv.input[1])
            g.set_array(conv.input[1], (weight / c).astype(weight.dtype))
        relu.input[0] = node.input[0]
        drop.add(id(node))
    if drop:
        _replace_nodes(g, {}, drop)
    return bool(drop)


def _outputs(g: _Graph) -> set[str]:
    return {o.name for o in g.graph.output}


def _polyphase_upsampling(g: _Graph) -> bool:
    """ConvTranspose (height 1, stride s) ⇒ per-phase Convs, Concat, interleave (docstring)."""
    from onnx import helper

    replace: dict[int, list[Any]] = {}
    for node in g.graph.node:
        if node.op_type != "ConvTranspose" or not g.weight_single_use(node):
            continue
        kernel, strides = _attr_ints(node, "kernel_shape"), _attr_ints(node, "strides")
        pads, dilations = _attr_ints(node, "pads"), _attr_ints(node, "dilations")
        out_pad = _attr_ints(node, "output_padding") or [0, 0]
        weight = g.array(node.input[1])
        if (
            weight.ndim != 4
            or weight.shape[2] != 1
            or _attr_int(node, "group", 1) != 1
            or kernel not in (None, [1, weight.shape[3]])
            or strides is None
            or strides[0] != 1
            or (dilations not in (None, [1, 1]))
            or pads is None
            or pads[0] != 0
            or pads[2] != 0
            or pads[1] != pads[3]
            or any(out_pad)
            or any(a.name in ("auto_pad", "output_shape") for a in node.attribute)
        ):
            continue
        s, k_len, pad = strides[1], int(weight.shape[3]), pads[1]
        # Output length (T-1)s - 2pad + K must be T*s, so every phase has T samples.
        if s < 2 or k_len - s != 2 * pad:
            continue
        cin, cout = int(weight.shape[0]), int(weight.shape[1])
        # Phase p (output n*s + p) sees input n + d through tap k = q - d*s, q = p + pad.
        phases: list[tuple[int, int]] = []
        for p in range(s):
            q = p + pad
            d_min, d_max = -((k_len - 1 - q) // s), q // s
            if d_min > 0 or d_max < 0:
                break
            phases.append((d_min, d_max))
        else:
            bias = (
                g.array(node.input[2]).astype(np.float32)
                if len(node.input) > 2 and node.input[2] in g.inits
                else None
            )
            if len(node.input) > 2 and node.input[2] and bias is None:
                continue  # a computed bias: leave the node alone
            replace[id(node)] = _polyphase_nodes(
                g, helper, node, weight, phases, s, cin, cout, pad, bias
            )
    if replace:
        _replace_nodes(g, replace, set())
    return bool(replace)


def _polyphase_nodes(
    g: _Graph,
    helper: Any,
    node: Any,
    weight: npt.NDArray[Any],
    phases: list[tuple[int, int]],
    s: int,
    cin: int,
    cout: int,
    pad: int,
    bias: npt.NDArray[np.float32] | None,
) -> list[Any]:
    name = node.output[0]
    nodes: list[Any] = []
    parts: list[str] = []
    start = 0
    while start < s:  # runs of consecutive phases with the same input offsets: one Conv each
        end = start
        while end < s and phases[end] == phases[start]:
            end += 1
        d_min, d_max = phases[start]
        taps = d_max - d_min + 1
        w = np.zeros((end - start, cout, cin, 1, taps), np.float32)
        for p in range(start, end):
            q = p + pad
            for d in range(d_min, d_max + 1):
                k = q - d * s
                # Conv tap j reads input n + j - pad_begin, pad_begin = -d_min.
                w[p - start, :, :, 0, d - d_min] = weight[:, :, 0, k].T
        part = f"{name}/phases{start}_{end}"
        inputs = [node.input[0], g.add_init(f"{part}/w", w.reshape(-1, cin, 1, taps))]
        if bias is not None:
            inputs.append(g.add_init(f"{part}/b", np.tile(bias, end - start)))
        nodes.append(
            helper.make_node(
                "Conv",
                inputs,
                [part],
                name=part,
                kernel_shape=[1, taps],
                pads=[0, -d_min, 0, d_max],
            )
        )
        parts.append(part)
        start = end
    phased = f"{name}/phases"
    if len(parts) > 1:
        nodes.append(helper.make_node("Concat", parts, [phased], name=phased, axis=1))
    else:
        phased = parts[0]
    # [N, s*Cout, 1, T] (phase-major) → [N, s, Cout, T] → [N, Cout, T, s] → [N, Cout, 1, T*s]
    split = g.add_init(f"{name}/split_shape", np.array([0, s, cout, -1], np.int64))
    merge = g.add_init(f"{name}/merge_shape", np.array([0, cout, 1, -1], np.int64))
    nodes += [
        helper.make_node("Reshape", [phased, split], [f"{name}/split"], name=f"{name}/split"),
        helper.make_node(
            "Transpose",
            [f"{name}/split"],
            [f"{name}/interleave"],
            name=f"{name}/interleave",
            perm=[0, 2, 3, 1],
        ),
        helper.make_node("Reshape", [f"{name}/interleave", merge], [name], name=f"{name}/merge"),
    ]
    return nodes


def _depthwise_post(g: _Graph) -> bool:
    """Conv to one channel ⇒ depthwise Conv + 1x1 channel sum (no padded output block)."""
    from onnx import helper

    replace: dict[int, list[Any]] = {}
    for node in g.graph.node:
        if node.op_type != "Conv" or not g.weight_single_use(node):
            continue
        weight = g.array(node.input[1])
        if (
            weight.ndim != 4
            or weight.shape[0] != 1
            or weight.shape[1] % _BLOCK
            or weight.shape[2] != 1
            or _attr_int(node, "group", 1) != 1
            or _attr_ints(node, "strides") not in (None, [1, 1])
            or any(a.name == "auto_pad" for a in node.attribute)
        ):
            continue
        channels, taps = int(weight.shape[1]), int(weight.shape[3])
        name = node.output[0]
        depthwise = g.add_init(f"{name}/dw_w", weight.transpose(1, 0, 2, 3).astype(np.float32))
        ones = g.add_init(f"{name}/sum_w", np.ones((1, channels, 1, 1), np.float32))
        attrs: dict[str, Any] = {"kernel_shape": [1, taps], "group": channels}
        for key in ("pads", "dilations"):
            value = _attr_ints(node, key)
            if value is not None:
                attrs[key] = value
        summed = [f"{name}/dw", ones, *node.input[2:3]]
        replace[id(node)] = [
            helper.make_node(
                "Conv", [node.input[0], depthwise], [f"{name}/dw"], name=f"{name}/dw", **attrs
            ),
            helper.make_node("Conv", summed, [name], name=f"{name}/sum", kernel_shape=[1, 1]),
        ]
    if replace:
        _replace_nodes(g, replace, set())
    return bool(replace)


def _identity_conv(g: _Graph, helper: Any, source: str, output: str, channels: int) -> Any:
    weight = g.add_init(f"{output}/identity_w", np.ones((channels, 1, 1, 1), np.float32))
    return helper.make_node(
        "Conv", [source, weight], [output], name=output, group=channels, kernel_shape=[1, 1]
    )


def _nchwc_leaky_relu(g: _Graph) -> bool:
    """Identity depthwise Conv before each unfusable LeakyRelu and after each upsampling."""
    from onnx import helper

    replace: dict[int, list[Any]] = {}
    upsampled: list[tuple[Any, str]] = []  # (node producing it, tensor)
    for node in g.graph.node:
        if node.op_type == "ConvTranspose" or (
            node.op_type == "Reshape" and node.output[0] + "/merge_shape" in g.inits
        ):
            upsampled.append((node, node.output[0]))
    outputs = _outputs(g)
    for node, tensor in upsampled:
        channels = g.channels.get(tensor, _upsampled_channels(g, node))
        if channels % _BLOCK or tensor in outputs:
            continue
        raw = f"{tensor}/raw"
        node.output[0] = raw
        replace[id(node)] = [node, _identity_conv(g, helper, raw, tensor, channels)]
        g.channels[tensor] = channels
    for node in g.graph.node:
        if node.op_type != "LeakyRelu":
            continue
        source = g.producer.get(node.input[0])
        # onnxruntime fuses Conv + LeakyRelu itself when the Conv output has no other reader.
        fused = (
            source is not None
            and source.op_type == "Conv"
            and len(g.consumers[node.input[0]]) == 1
            and id(source) not in replace
        )
        channels = g.channels.get(node.input[0], 0)
        if fused or not channels or channels % _BLOCK:
            continue
        blocked = f"{node.output[0]}/blocked"
        replace[id(node)] = [_identity_conv(g, helper, node.input[0], blocked, channels), node]
        node.input[0] = blocked
    if replace:
        _replace_nodes(g, replace, set())
    return bool(replace)


def _upsampled_channels(g: _Graph, node: Any) -> int:
    if node.op_type == "Reshape":
        return int(g.array(node.output[0] + "/merge_shape")[1])
    return g.channels.get(node.output[0], 0)


def convs_as_2d(model: Any) -> Any | None:
    """Each 1-D ``Conv`` with its own constant 3-D weight as ``Unsqueeze`` → 2-D ``Conv`` of
    height 1 → ``Squeeze`` (other ops untouched), or None when there is none to rewrite.

    The flow's WN layers slice channels and multiply by masks, so a whole-graph 2-D rewrite
    would have to follow every Slice/Split/Shape; per convolution, onnxruntime still picks its
    blocked kernels (with a reorder on either side). Measured on joe-medium's flow: 38.5 →
    34.4 ms median per 369-frame sentence, z within 2e-5 of the 1-D graph (issue 17).
    """
    import onnx
    from onnx import TensorProto, helper

    work = onnx.ModelProto()
    work.CopyFrom(model)
    g = _Graph(work)
    opset = next((o.version for o in work.opset_import if o.domain in ("", "ai.onnx")), 0)
    axes = "conv2d/axes"
    replace: dict[int, list[Any]] = {}
    for node in g.graph.node:
        if node.op_type != "Conv" or not g.weight_single_use(node):
            continue
        weight = g.array(node.input[1])
        if weight.ndim != 3 or any(a.name == "auto_pad" for a in node.attribute):
            continue
        g.set_array(node.input[1], weight[:, :, None, :])
        attributes = []
        for a in node.attribute:
            if a.name in ("kernel_shape", "strides", "dilations"):
                attributes.append(helper.make_attribute(a.name, [1, *a.ints]))
            elif a.name == "pads":
                begin, end = a.ints
                attributes.append(helper.make_attribute(a.name, [0, begin, 0, end]))
            else:
                attributes.append(a)
        del node.attribute[:]
        node.attribute.extend(attributes)
        x, y = node.input[0], node.output[0]
        x4, y4 = f"{y}/in_2d", f"{y}/out_2d"
        node.input[0], node.output[0] = x4, y4
        if opset >= 13:  # axes: an input from opset 13, an attribute before
            up = helper.make_node("Unsqueeze", [x, axes], [x4], name=x4)
            down = helper.make_node("Squeeze", [y4, axes], [y], name=f"{y}/squeeze")
        else:
            up = helper.make_node("Unsqueeze", [x], [x4], name=x4, axes=[2])
            down = helper.make_node("Squeeze", [y4], [y], name=f"{y}/squeeze", axes=[2])
        replace[id(node)] = [up, node, down]
    if not replace:
        return None
    if opset >= 13:
        g.graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [1], [2]))
    _replace_nodes(g, replace, set())
    # value_info of the rewritten convolutions' outputs still holds; of the weights it does not.
    return work
