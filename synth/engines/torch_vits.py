"""Piper's VITS model in torch, filled from the weights of a Piper ONNX export.

The torch engine runs the same voice as the onnx engine, but on torch so that it can run on CUDA
and batch the decoder across calls. Nothing here is specific to one voice: the architecture
(channels, layers, heads, upsampling, resblocks, flows, vocabulary, speakers) is read from the
initializer shapes and from the attributes of the ONNX nodes that consume them, then Piper's own
modules (``piper.train.vits``) are built with it and every tensor is checked on the way in.

How the export names its tensors (``piper.train.export_onnx`` with ``torch.onnx.export``):

* most parameters keep their torch name (``enc_p.proj.weight``, ``dec.ups.0.weight`` ...);
* weight-normed convs of the flow's WaveNet lose their name: ``remove_weight_norm`` is not called
  on the flow before export, so torch folds ``g * v / |v|`` into an anonymous constant
  ``onnx::Conv_NNNN``; the name of the consuming Conv node (``/flow/flows.6/enc/in_layers.0/Conv``)
  gives it back;
* the text embedding appears under whatever name the exporter picked (``sid`` for single-speaker
  voices); it is the table of the Gather whose indices are the graph input ``input``;
* the duration predictor's first ``ElementwiseAffine.logs`` is constant-folded to
  ``exp(-logs)`` (``/dp/flows.0/Exp_output_0``), the only form the reverse pass uses; a newer
  exporter folds only the negation (``onnx::Exp_NNNN`` = ``-logs``, input of ``/dp/flows.0/Exp``).

The rest of the initializers are small shape/scalar constants of the graph.
"""

from __future__ import annotations

import importlib
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

# piper's training code is untyped; import it as Any so strict mypy does not flag every call.
# Its commons.py decorates a helper with torch.jit.script, which torch 2.13 warns is deprecated.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    _vits_models: Any = importlib.import_module("piper.train.vits.models")
    _vits_modules: Any = importlib.import_module("piper.train.vits.modules")
    _vits_attentions: Any = importlib.import_module("piper.train.vits.attentions")

# What a torch parameter name looks like ("enc_p.proj.weight"); graph constants are named
# "/enc_p/Constant_output_0", "onnx::Split_4075" or just "6549".
_PARAM_NAME = re.compile(r"[A-Za-z_]\w*(\.\w+)+")

# Leaky-ReLU slope of HiFi-GAN (Generator.LRELU_SLOPE); the final one uses torch's default 0.01.
_LRELU_SLOPE = 0.1


class VitsLoadError(ValueError):
    """The ONNX file is not a Piper VITS export this loader understands (message says why)."""


@dataclass(frozen=True, slots=True)
class VitsArch:
    """Hyper-parameters of a Piper VITS voice, as read from its ONNX export."""

    n_vocab: int
    inter_channels: int
    hidden_channels: int
    filter_channels: int
    n_heads: int
    n_layers: int
    kernel_size: int
    window_size: int
    resblock: str
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_initial_channel: int
    upsample_kernel_sizes: tuple[int, ...]
    n_speakers: int
    gin_channels: int
    flow_n_flows: int
    flow_hidden_channels: int
    flow_kernel_size: int
    flow_dilation_rate: int
    flow_n_layers: int
    use_sdp: bool
    dp_filter_channels: int
    dp_kernel_size: int
    dp_n_flows: int

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame (product of the upsample rates)."""
        return math.prod(self.upsample_rates)


@dataclass(slots=True)
class MappingReport:
    """How the ONNX initializers were turned into torch parameters (for logs and tests)."""

    by_name: list[str] = field(default_factory=list)
    by_consumer: dict[str, str] = field(default_factory=dict)  # onnx name -> torch name
    text_embedding: str = ""
    speaker_embedding: str = ""
    exp_inverted: dict[str, str] = field(default_factory=dict)  # onnx name -> torch name (logs)
    constants: list[str] = field(default_factory=list)

    @property
    def n_mapped(self) -> int:
        return (
            len(self.by_name)
            + len(self.by_consumer)
            + len(self.exp_inverted)
            + bool(self.text_embedding)
            + bool(self.speaker_embedding)
        )


@dataclass(slots=True)
class _Graph:
    tensors: dict[str, npt.NDArray[Any]]
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]]
    inputs: set[str]
    origin: dict[str, str] = field(default_factory=dict)  # torch name -> initializer name

    def attr(self, node: onnx.NodeProto, name: str) -> Any:
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        raise VitsLoadError(f"node {node.name} has no attribute {name!r}")

    def conv_of(self, weight: str) -> onnx.NodeProto:
        """The Conv/ConvTranspose node that takes torch parameter ``weight`` as its kernel."""
        for node, slot in self.consumers.get(self.origin.get(weight, weight), []):
            if node.op_type in ("Conv", "ConvTranspose") and slot == 1:
                return node
        raise VitsLoadError(f"no Conv node consumes {weight}")


def _read_graph(model: onnx.ModelProto) -> _Graph:
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if name in tensors:
                consumers.setdefault(name, []).append((node, slot))
    return _Graph(tensors, consumers, {i.name for i in model.graph.input})


def _torch_name_of_conv_node(node: onnx.NodeProto, slot: int) -> str:
    # "/flow/flows.6/enc/in_layers.0/Conv" -> "flow.flows.6.enc.in_layers.0.weight"
    parts = node.name.strip("/").split("/")
    if len(parts) < 2 or parts[-1] not in ("Conv", "ConvTranspose"):
        raise VitsLoadError(f"cannot name the kernel of node {node.name!r}")
    return ".".join(parts[:-1]) + (".weight" if slot == 1 else ".bias")


def _rename(graph: _Graph, report: MappingReport) -> dict[str, npt.NDArray[Any]]:
    """Give every parameter initializer its torch name; collect graph constants separately.

    Fills ``graph.origin`` (torch name -> ONNX name) for later look-ups of node attributes.
    """
    state: dict[str, npt.NDArray[Any]] = {}

    def put(name: str, value: npt.NDArray[Any]) -> None:
        if name in state:
            raise VitsLoadError(f"two ONNX tensors map to {name}")
        state[name] = value
        graph.origin[name] = onnx_name

    gathers = {
        slot_name: node
        for consumers in graph.consumers.values()
        for node, slot in consumers
        if node.op_type == "Gather" and slot == 0
        for slot_name in node.input[1:2]
    }
    emb_node = gathers.get("input")
    if emb_node is None:
        raise VitsLoadError("no Gather on the graph input 'input': not a Piper VITS export")
    sid_node = gathers.get("sid") if "sid" in graph.inputs else None

    for name, value in graph.tensors.items():
        onnx_name = name
        if emb_node.input[0] == name:
            put("enc_p.emb.weight", value)
            report.text_embedding = name
        elif sid_node is not None and sid_node.input[0] == name:
            put("emb_g.weight", value)
            report.speaker_embedding = name
        elif name.startswith("onnx::Conv_"):
            node, slot = next(
                ((n, s) for n, s in graph.consumers.get(name, []) if n.op_type == "Conv"),
                (None, 0),
            )
            if node is None or slot not in (1, 2):
                raise VitsLoadError(f"{name} is not the kernel or bias of a Conv node")
            torch_name = _torch_name_of_conv_node(node, slot)
            put(torch_name, value)
            report.by_consumer[name] = torch_name
        elif m := re.fullmatch(r"/(.+)/Exp_output_0", name):
            # ElementwiseAffine.reverse computes (x - m) * exp(-logs); the export folded the whole
            # exp(-logs) into a constant named after the Exp node's output.
            torch_name = m.group(1).replace("/", ".") + ".logs"
            if value.dtype != np.float32 or np.any(value <= 0):
                raise VitsLoadError(f"{name} is not a positive float tensor exp(-logs)")
            put(torch_name, (-np.log(value.astype(np.float64))).astype(np.float32))
            report.exp_inverted[name] = torch_name
        elif name.startswith("onnx::Exp_"):
            # Same parameter from an exporter that folded only the negation: -logs feeds Exp.
            node = next((n for n, _ in graph.consumers.get(name, []) if n.op_type == "Exp"), None)
            if node is None or not node.name.endswith("/Exp"):
                raise VitsLoadError(f"{name} does not feed an Exp node")
            torch_name = node.name.strip("/").removesuffix("/Exp").replace("/", ".") + ".logs"
            put(torch_name, -value)
            report.exp_inverted[name] = torch_name
        elif not _PARAM_NAME.fullmatch(name):
            # Shape, index and scalar constants of the graph. A float tensor of more than one
            # element here would be a folded parameter this loader does not know: refuse it.
            if value.dtype.kind == "f" and value.size > 1:
                raise VitsLoadError(f"unrecognised folded parameter {name} {list(value.shape)}")
            report.constants.append(name)
        else:
            put(name, value)
            report.by_name.append(name)
    return state


def _indices(state: dict[str, Any], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for k in state if (m := rx.match(k))})


def _shape(state: dict[str, npt.NDArray[Any]], name: str) -> tuple[int, ...]:
    if name not in state:
        raise VitsLoadError(f"missing tensor {name}: not a Piper VITS export")
    return tuple(int(d) for d in state[name].shape)


def _infer_arch(graph: _Graph, state: dict[str, npt.NDArray[Any]]) -> VitsArch:
    n_vocab, hidden = _shape(state, "enc_p.emb.weight")
    inter = _shape(state, "enc_p.proj.weight")[0] // 2
    filter_channels, _, kernel_size = _shape(state, "enc_p.encoder.ffn_layers.0.conv_1.weight")
    n_layers = len(_indices(state, r"enc_p\.encoder\.attn_layers\.(\d+)\.conv_q\.weight$"))
    heads_rel, window_2p1, k_channels = _shape(state, "enc_p.encoder.attn_layers.0.emb_rel_k")
    if heads_rel != 1:
        raise VitsLoadError("relative attention with per-head embeddings is not supported")

    # HiFi-GAN generator: kernels from shapes, strides and dilations from the graph's nodes.
    up_idx = _indices(state, r"dec\.ups\.(\d+)\.weight$")
    up_kernels, up_rates = [], []
    for i in up_idx:
        w = f"dec.ups.{i}.weight"
        node = graph.conv_of(w)
        stride = int(graph.attr(node, "strides")[0])
        k = _shape(state, w)[2]
        if list(graph.attr(node, "pads")) != [(k - stride) // 2] * 2:
            raise VitsLoadError(f"{w}: padding is not (k - u) // 2")
        up_kernels.append(k)
        up_rates.append(stride)
    resblock = "1" if any(k.startswith("dec.resblocks.0.convs1.") for k in state) else "2"
    conv_list = "convs1" if resblock == "1" else "convs"
    n_res = len(_indices(state, r"dec\.resblocks\.(\d+)\.convs1?\.0\.weight$"))
    if not up_idx or n_res % len(up_idx):
        raise VitsLoadError(f"{n_res} resblocks do not divide among {len(up_idx)} upsamples")
    res_kernels, res_dilations = [], []
    for j in range(n_res // len(up_idx)):
        convs = _indices(state, rf"dec\.resblocks\.{j}\.{conv_list}\.(\d+)\.weight$")
        names = [f"dec.resblocks.{j}.{conv_list}.{c}.weight" for c in convs]
        res_kernels.append(_shape(state, names[0])[2])
        dilations = (int(graph.attr(graph.conv_of(n), "dilations")[0]) for n in names)
        res_dilations.append(tuple(dilations))

    flows = _indices(state, r"flow\.flows\.(\d+)\.pre\.weight$")
    if flows != list(range(0, 2 * len(flows), 2)):
        raise VitsLoadError(f"unexpected flow layout {flows}")
    flow_hidden, _, _ = _shape(state, "flow.flows.0.pre.weight")
    flow_layers = len(_indices(state, r"flow\.flows\.0\.enc\.in_layers\.(\d+)\.weight$"))
    flow_kernel = _shape(state, "flow.flows.0.enc.in_layers.0.weight")[2]
    flow_rate = 1
    if flow_layers > 1:
        node = graph.conv_of("flow.flows.0.enc.in_layers.1.weight")
        flow_rate = int(graph.attr(node, "dilations")[0])

    use_sdp = "dp.flows.0.m" in state
    if use_sdp:
        dp_filter = _shape(state, "dp.pre.weight")[0]
        dp_kernel = _shape(state, "dp.convs.convs_sep.0.weight")[2]
        conv_flows = _indices(state, r"dp\.flows\.(\d+)\.pre\.weight$")
        # Flow list is [affine, (ConvFlow, Flip) * n]: ConvFlows sit at odd indices 1..2n-1
        # (flows.1 itself is never exported).
        dp_n_flows = (max(conv_flows) + 1) // 2 if conv_flows else 0
        if len(_indices(state, r"dp\.convs\.convs_sep\.(\d+)\.weight$")) != 3:
            raise VitsLoadError("duration predictor DDSConv must have 3 layers")
        if conv_flows and _shape(state, f"dp.flows.{conv_flows[0]}.proj.weight")[0] != 29:
            raise VitsLoadError("duration predictor ConvFlow must use 10 bins")
    else:
        dp_filter, _, dp_kernel = _shape(state, "dp.conv_1.weight")
        dp_n_flows = 0

    n_speakers, gin = (1, 0)
    if "emb_g.weight" in state:
        n_speakers, gin = _shape(state, "emb_g.weight")

    return VitsArch(
        n_vocab=n_vocab,
        inter_channels=inter,
        hidden_channels=hidden,
        filter_channels=filter_channels,
        n_heads=hidden // k_channels,
        n_layers=n_layers,
        kernel_size=kernel_size,
        window_size=(window_2p1 - 1) // 2,
        resblock=resblock,
        resblock_kernel_sizes=tuple(res_kernels),
        resblock_dilation_sizes=tuple(res_dilations),
        upsample_rates=tuple(up_rates),
        upsample_initial_channel=_shape(state, "dec.conv_pre.weight")[0],
        upsample_kernel_sizes=tuple(up_kernels),
        n_speakers=n_speakers,
        gin_channels=gin,
        flow_n_flows=len(flows),
        flow_hidden_channels=flow_hidden,
        flow_kernel_size=flow_kernel,
        flow_dilation_rate=flow_rate,
        flow_n_layers=flow_layers,
        use_sdp=use_sdp,
        dp_filter_channels=dp_filter,
        dp_kernel_size=dp_kernel,
        dp_n_flows=dp_n_flows,
    )


def _build(arch: VitsArch, device: str = "meta") -> Any:
    """Piper's SynthesizerTrn with ``arch``, on the meta device (no memory, no random init)."""
    models, modules, attentions = _vits_models, _vits_modules, _vits_attentions
    with warnings.catch_warnings():
        # torch.nn.utils.weight_norm is deprecated in favour of parametrizations; Piper uses it.
        warnings.simplefilter("ignore", FutureWarning)
        with torch.device(device):
            net = models.SynthesizerTrn(
                n_vocab=arch.n_vocab,
                spec_channels=1,  # only enc_q (training only, deleted below) uses it
                segment_size=1,
                inter_channels=arch.inter_channels,
                hidden_channels=arch.hidden_channels,
                filter_channels=arch.filter_channels,
                n_heads=arch.n_heads,
                n_layers=arch.n_layers,
                kernel_size=arch.kernel_size,
                p_dropout=0.0,
                resblock=arch.resblock,
                resblock_kernel_sizes=arch.resblock_kernel_sizes,
                resblock_dilation_sizes=arch.resblock_dilation_sizes,
                upsample_rates=arch.upsample_rates,
                upsample_initial_channel=arch.upsample_initial_channel,
                upsample_kernel_sizes=arch.upsample_kernel_sizes,
                n_speakers=arch.n_speakers,
                gin_channels=arch.gin_channels,
                use_sdp=arch.use_sdp,
            )
            del net.enc_q  # posterior encoder: training only, not in the export
            # SynthesizerTrn hard-codes these sub-modules' sizes (and the text encoder's attention
            # window); rebuild them from what the weights say so other trainings load too.
            net.enc_p.encoder = attentions.Encoder(
                arch.hidden_channels,
                arch.filter_channels,
                arch.n_heads,
                arch.n_layers,
                arch.kernel_size,
                0.0,
                window_size=arch.window_size,
            )
            net.flow = models.ResidualCouplingBlock(
                arch.inter_channels,
                arch.flow_hidden_channels,
                arch.flow_kernel_size,
                arch.flow_dilation_rate,
                arch.flow_n_layers,
                n_flows=arch.flow_n_flows,
                gin_channels=arch.gin_channels,
            )
            if arch.use_sdp:
                net.dp = models.StochasticDurationPredictor(
                    arch.hidden_channels,
                    arch.dp_filter_channels,
                    arch.dp_kernel_size,
                    0.0,
                    n_flows=arch.dp_n_flows,
                    gin_channels=arch.gin_channels,
                )
            else:
                net.dp = models.DurationPredictor(
                    arch.hidden_channels,
                    arch.dp_filter_channels,
                    arch.dp_kernel_size,
                    0.0,
                    gin_channels=arch.gin_channels,
                )
            if arch.use_sdp:
                # Never run at inference, never exported: the posterior flows (training only),
                # and flows[1], which the reverse pass skips. Identity keeps the list's indices.
                del net.dp.post_pre, net.dp.post_proj, net.dp.post_convs, net.dp.post_flows
                net.dp.flows[1] = torch.nn.Identity()
            # The export holds the effective (weight-norm-folded) kernels.
            net.dec.remove_weight_norm()
            for layer in net.flow.flows:
                if isinstance(layer, modules.ResidualCouplingLayer):
                    layer.enc.remove_weight_norm()
    return net


def load_vits_from_onnx(
    source: str | Path | onnx.ModelProto,
) -> tuple[Any, VitsArch, MappingReport]:
    """Build Piper's ``SynthesizerTrn`` (eval mode, float32, CPU) from an ONNX voice.

    ``source`` is the ``.onnx`` path or an already parsed model (the voice's, to parse it once).
    Raises :class:`VitsLoadError` when a tensor is left over, missing or of the wrong shape.
    """
    model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
    graph = _read_graph(model)
    report = MappingReport()
    state = _rename(graph, report)
    arch = _infer_arch(graph, state)
    net = _build(arch)

    expected = dict(net.state_dict())
    unused = sorted(set(state) - set(expected))
    if unused:
        raise VitsLoadError(f"ONNX tensors not consumed by the model: {unused}")
    wrong = [
        f"{k}: onnx {list(v.shape)} vs torch {list(expected[k].shape)}"
        for k, v in state.items()
        if tuple(v.shape) != tuple(expected[k].shape)
    ]
    if wrong:
        raise VitsLoadError("shape mismatch: " + "; ".join(wrong))
    missing = sorted(set(expected) - set(state))
    if missing:
        raise VitsLoadError(f"model tensors missing from the ONNX file: {missing}")

    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}
    net.load_state_dict(tensors, strict=True, assign=True)
    net.eval()
    return net, arch, report


# ---------------------------------------------------------------------------------------------
# Inference pieces (the same arithmetic as SynthesizerTrn.infer, split at the latent z).


def encode(
    net: Any,
    phoneme_ids: torch.Tensor,
    noise_scale: float = 0.0,
    length_scale: float = 1.0,
    noise_w: float = 0.0,
    duration_noise: torch.Tensor | None = None,
    latent_noise: Callable[[int], torch.Tensor] | None = None,
    speaker_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Text encoder + duration predictor + reverse flow for one utterance.

    Same arithmetic as ``SynthesizerTrn.infer`` up to the latent, except that the standard-normal
    noise comes from the caller, so a seeded numpy generator gives the same voice on every
    backend: ``duration_noise`` ``[1, 2, N]`` and ``latent_noise(frames)`` ``[1, C, frames]``
    (called once the frame count is known); ``None`` means zeros. ``phoneme_ids`` is ``[1, N]``
    int64 on the model's device. Returns ``z`` ``[1, C, T]`` and the frames of each phoneme
    (``[N]`` int64, summing to ``T``). The caller provides ``torch.inference_mode()``.
    """
    lengths = torch.tensor([phoneme_ids.shape[1]], device=phoneme_ids.device)
    x, m_p, logs_p, x_mask = net.enc_p(phoneme_ids, lengths)
    g = speaker_embedding(net, speaker_id, phoneme_ids.device)
    if net.use_sdp:
        noise = torch.zeros_like(x[:, :2]) if duration_noise is None else duration_noise
        logw = _sdp_reverse(net.dp, x, x_mask, g, noise.to(x.dtype) * noise_w)
    else:
        logw = net.dp(x, x_mask, g=g)
    w_ceil = torch.ceil(torch.exp(logw) * x_mask * length_scale)  # [1, 1, N]
    frames = int(max(1.0, float(w_ceil.sum())))
    y_mask = torch.ones(1, 1, frames, dtype=x_mask.dtype, device=x_mask.device)
    attn = _vits_models.commons.generate_path(w_ceil, x_mask.unsqueeze(2) * y_mask.unsqueeze(-1))
    path = attn.squeeze(1)  # [1, T, N]
    m_p = torch.matmul(path, m_p.transpose(1, 2)).transpose(1, 2)
    z_p = m_p
    if latent_noise is not None:
        logs_p = torch.matmul(path, logs_p.transpose(1, 2)).transpose(1, 2)
        z_p = m_p + latent_noise(frames).to(m_p.dtype) * torch.exp(logs_p) * noise_scale
    z = net.flow(z_p, y_mask, g=g, reverse=True)
    return z, w_ceil.reshape(-1).long()


def _sdp_reverse(
    dp: Any,
    x: torch.Tensor,
    x_mask: torch.Tensor,
    g: torch.Tensor | None,
    noise: torch.Tensor,
) -> torch.Tensor:
    """``StochasticDurationPredictor.forward(reverse=True)`` with its (scaled) noise passed in."""
    x = dp.pre(x)
    if g is not None:
        x = x + dp.cond(g)
    x = dp.convs(x, x_mask)
    x = dp.proj(x) * x_mask
    flows = list(reversed(dp.flows))
    flows = [*flows[:-2], flows[-1]]  # as Piper: the reverse pass skips flows[1]
    z = noise
    for flow in flows:
        z = flow(z, x_mask, g=x, reverse=True)
    return z[:, :1]  # logw


def speaker_embedding(net: Any, speaker_id: int, device: torch.device) -> torch.Tensor | None:
    """``g`` ``[1, gin, 1]`` for a multi-speaker voice (``None`` for a single-speaker one)."""
    if net.n_speakers <= 1:
        return None
    if not 0 <= speaker_id < net.n_speakers:
        raise ValueError(f"speaker id {speaker_id} outside 0..{net.n_speakers - 1}")
    return net.emb_g(torch.tensor([speaker_id], device=device)).unsqueeze(-1)  # type: ignore[no-any-return]


def decode(
    dec: Any,
    z: torch.Tensor,
    lengths: Sequence[int] | None = None,
    g: torch.Tensor | None = None,
) -> torch.Tensor:
    """HiFi-GAN decode of ``z`` ``[B, C, T]`` to audio ``[B, T * hop]``.

    ``g`` is the speaker embedding of a multi-speaker voice (``[1 or B, gin, 1]``).

    With ``lengths`` (frames of each batch item; the rest is padding) every layer's input is
    zeroed past the item's end, so each item's audio equals decoding it alone: a convolution then
    sees the same zeros beyond the end as its own zero padding would give. Audio past
    ``lengths[i] * hop`` is padding and must be cut by the caller.
    """
    if g is not None and g.shape[0] != z.shape[0]:
        g = g.expand(z.shape[0], -1, -1)
    if lengths is None or all(n == z.shape[2] for n in lengths):
        return dec(z, g=g).squeeze(1)  # type: ignore[no-any-return]
    frames = torch.arange(z.shape[2], device=z.device)
    mask = (frames[None, :] < torch.tensor(list(lengths), device=z.device)[:, None]).to(z.dtype)
    mask = mask.unsqueeze(1)  # [B, 1, T]
    x = dec.conv_pre(z * mask)
    if g is not None:
        x = x + dec.cond(g)
    for i, up in enumerate(dec.ups):
        x = F.leaky_relu(x, _LRELU_SLOPE) * mask
        x = up(x)
        mask = mask.repeat_interleave(int(up.stride[0]), dim=2)
        xs: torch.Tensor | None = None
        for j in range(dec.num_kernels):
            y = dec.resblocks[i * dec.num_kernels + j](x, mask)
            xs = y if xs is None else xs + y
        assert xs is not None
        x = xs / dec.num_kernels
    x = F.leaky_relu(x) * mask
    return torch.tanh(dec.conv_post(x)).squeeze(1)


def encode_batch(
    net: Any,
    phoneme_ids: Sequence[Sequence[int]],
    noise_scale: float = 0.0,
    length_scale: float = 1.0,
    noise_w: float = 0.0,
    duration_noise: Sequence[torch.Tensor] | None = None,
    latent_noise: Sequence[Callable[[int], torch.Tensor]] | None = None,
    speaker_id: int = 0,
    device: torch.device | str = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`encode` of several sentences as one padded batch (issue 16).

    Item ``i`` gets ``duration_noise[i]`` ``[2, N_i]`` and ``latent_noise[i](frames)``
    ``[C, frames]`` (called in item order once all durations are known). Every layer of the
    text encoder, the duration predictor and the flow multiplies by its sequence mask, and the
    attention fills masked scores with -1e4 (exp underflows to exactly 0), so item ``i`` sees
    nothing of the others or of the padding: the same arithmetic as encoding it alone, up to
    float summation order. Returns ``(z [C, T_i], durations [N_i])`` per item.
    """
    dev = torch.device(device)
    lengths = [len(ids) for ids in phoneme_ids]
    if not lengths or min(lengths) < 1:
        raise ValueError("encode_batch: every sentence needs at least one phoneme id")
    batch, n_max = len(lengths), max(lengths)
    ids = torch.zeros(batch, n_max, dtype=torch.long)
    for i, row in enumerate(phoneme_ids):
        ids[i, : lengths[i]] = torch.tensor(list(row), dtype=torch.long)
    ids = ids.to(dev)
    x_lengths = torch.tensor(lengths, device=dev)
    x, m_p, logs_p, x_mask = net.enc_p(ids, x_lengths)
    g = speaker_embedding(net, speaker_id, dev)
    if net.use_sdp:
        noise = torch.zeros(batch, 2, n_max, dtype=x.dtype, device=dev)
        if duration_noise is not None:
            for i, n in enumerate(duration_noise):
                noise[i, :, : lengths[i]] = n.to(dev, x.dtype)
        logw = _sdp_reverse(net.dp, x, x_mask, g, noise * noise_w)
    else:
        logw = net.dp(x, x_mask, g=g)
    w_ceil = torch.ceil(torch.exp(logw) * x_mask * length_scale)  # [B, 1, N]
    frames = [int(max(1.0, float(f))) for f in w_ceil.sum(dim=(1, 2)).cpu()]
    t_max = max(frames)
    y_mask = (
        torch.arange(t_max, device=dev)[None, :] < torch.tensor(frames, device=dev)[:, None]
    ).to(x_mask.dtype)[:, None, :]  # [B, 1, T]
    attn = _vits_models.commons.generate_path(w_ceil, x_mask.unsqueeze(2) * y_mask.unsqueeze(-1))
    path = attn.squeeze(1)  # [B, T, N]
    m_p = torch.matmul(path, m_p.transpose(1, 2)).transpose(1, 2)
    z_p = m_p
    if latent_noise is not None:
        logs_p = torch.matmul(path, logs_p.transpose(1, 2)).transpose(1, 2)
        noise_z = torch.zeros_like(m_p)
        for i, draw in enumerate(latent_noise):
            noise_z[i, :, : frames[i]] = draw(frames[i]).to(dev, m_p.dtype)
        z_p = m_p + noise_z * torch.exp(logs_p) * noise_scale
    z = net.flow(z_p, y_mask, g=g, reverse=True)
    durations = w_ceil[:, 0, :].long()
    return [(z[i, :, : frames[i]], durations[i, : lengths[i]]) for i in range(batch)]


def decode_masked(
    dec: Any, z: torch.Tensor, lengths: torch.Tensor, g: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`decode` with ``lengths`` as a device tensor ``[B]`` (int64): no host values, no
    branch on the data, so the whole call can be captured in a CUDA graph and replayed for any
    lengths. A row of length 0 is all padding (rows that fill a batch up to a captured size)."""
    if g is not None and g.shape[0] != z.shape[0]:
        g = g.expand(z.shape[0], -1, -1)
    frames = torch.arange(z.shape[2], device=z.device)
    mask = (frames[None, :] < lengths[:, None]).to(z.dtype).unsqueeze(1)  # [B, 1, T]
    x = dec.conv_pre(z * mask)
    if g is not None:
        x = x + dec.cond(g)
    for i, up in enumerate(dec.ups):
        x = F.leaky_relu(x, _LRELU_SLOPE) * mask
        x = up(x)
        mask = mask.repeat_interleave(int(up.stride[0]), dim=2)
        xs: torch.Tensor | None = None
        for j in range(dec.num_kernels):
            y = dec.resblocks[i * dec.num_kernels + j](x, mask)
            xs = y if xs is None else xs + y
        assert xs is not None
        x = xs / dec.num_kernels
    x = F.leaky_relu(x) * mask
    return torch.tanh(dec.conv_post(x)).squeeze(1)
