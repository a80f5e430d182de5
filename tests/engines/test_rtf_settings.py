"""Issue 17's RTF settings: the decoder's 2-D rewrite and numpy's BLAS on one thread.

The rewrite is checked on small hand-built graphs (every Conv/ConvTranspose attribute it maps,
and the graphs it must refuse) and on joe-medium's real decoder against the 1-D one, on
onnxruntime with its full optimisation (the NCHWc kernels the rewrite is for).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from synth.engines import graph_cache
from synth.engines.backend import limit_blas_threads
from synth.engines.graph_cache import cache_key
from synth.engines.onnx_engine import (
    OnnxBackend,
    decoder_as_2d,
    make_session_options,
    split_from_meta,
    split_meta,
    split_piper_graph,
)
from synth.engines.voice import Voice


def run(model: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(
        model.SerializeToString(), make_session_options(1), providers=["CPUExecutionProvider"]
    )
    return np.asarray(session.run(None, feed)[0])


def conv_graph(*, extra: list[Any] | None = None, opset: int = 17) -> Any:
    """z [1, 8, T] → Conv (stride 1, dilation 3, asymmetric pads) → LeakyRelu → ConvTranspose
    (stride 4, output_padding 1) → Add(residual-free scalar) → Div by a scalar → Tanh →
    Conv to one channel → Unsqueeze(axes [1]) → output, like a HiFi-GAN tail."""
    rng = np.random.default_rng(3)
    scale = np.float32(0.1)  # activations of a trained net's size, not saturated
    inits = [
        numpy_helper.from_array(scale * rng.standard_normal((16, 8, 5)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(scale * rng.standard_normal((16, 8, 8)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b2"),
        numpy_helper.from_array(scale * rng.standard_normal((1, 8, 7)).astype(np.float32), "w3"),
        numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["z", "w1", "b1"], ["c1"], kernel_shape=[5], dilations=[3], pads=[5, 7]
        ),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
        helper.make_node(
            "ConvTranspose",
            ["l1", "w2", "b2"],
            ["u1"],
            kernel_shape=[8],
            strides=[4],
            pads=[2, 1],
            output_padding=[1],
        ),
        helper.make_node("Add", ["u1", "quarter"], ["a1"]),
        helper.make_node("Div", ["a1", "two"], ["d1"]),
        *(extra or []),
        helper.make_node("Conv", ["d1", "w3"], ["c2"], kernel_shape=[7], pads=[3, 3]),
        helper.make_node("Tanh", ["c2"], ["t1"]),
        helper.make_node("Unsqueeze", ["t1", "axes"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tail",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, "T"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("frames", [1, 7, 40])
def test_2d_rewrite_computes_the_same_as_1d(frames: int) -> None:
    model = conv_graph()
    rewritten = decoder_as_2d(model)
    assert rewritten is not None
    convs = [n for n in rewritten.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert len(convs) == 3
    inits = {t.name: t for t in rewritten.graph.initializer}
    assert all(len(inits[n.input[1]].dims) == 4 for n in convs)
    z = np.random.default_rng(frames).standard_normal((1, 8, frames)).astype(np.float32)
    want, got = run(model, {"z": z}), run(rewritten, {"z": z})
    assert want.shape == got.shape  # [1, 1, 1, samples]: the final Unsqueeze became Identity
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_2d_rewrite_before_opset_13_uses_the_axes_attribute() -> None:
    model = conv_graph(opset=11)
    for node in model.graph.node:  # Unsqueeze's axes were an attribute before opset 13
        if node.op_type == "Unsqueeze":
            del node.input[1:]
            node.attribute.append(helper.make_attribute("axes", [1]))
    rewritten = decoder_as_2d(model)
    assert rewritten is not None
    z = np.random.default_rng(0).standard_normal((1, 8, 9)).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, {"z": z}), run(model, {"z": z}), atol=1e-5)


def test_2d_rewrite_leaves_graphs_it_does_not_know() -> None:
    # An op whose meaning depends on the rank (a transpose of the time and channel axes).
    transpose = helper.make_node("Transpose", ["d1"], ["d1t"], perm=[0, 2, 1])
    assert decoder_as_2d(conv_graph(extra=[transpose])) is None
    # A constant [C, 1] that broadcasts per channel in 1-D but would not in 2-D.
    model = conv_graph()
    model.graph.initializer.append(
        numpy_helper.from_array(np.ones((8, 1), np.float32), "per_channel")
    )
    for node in model.graph.node:
        if node.op_type == "Add":
            node.input[1] = "per_channel"
    assert decoder_as_2d(model) is None
    # A weight shared by two convolutions cannot be reshaped for one of them only.
    model = conv_graph()
    model.graph.node.append(helper.make_node("Conv", ["z", "w1"], ["spare"], kernel_shape=[5]))
    assert decoder_as_2d(model) is None


@pytest.fixture(scope="module")
def backend() -> OnnxBackend:
    return OnnxBackend(Voice.load(""), 1)


def test_joe_medium_decoder_runs_2d_and_matches_1d(backend: OnnxBackend) -> None:
    split = backend.split
    assert split.decoder_2d
    weights = {t.name: t for t in split.decoder.graph.initializer}
    convs = [n for n in split.decoder.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert convs and all(len(weights[n.input[1]].dims) == 4 for n in convs)
    # The 1-D decoder, for reference: the graph as cut from the voice, before any rewrite
    # (test_onnx_engine compares with the whole model too).
    one_d = split_piper_graph(backend.voice.model, rewrite=False)
    assert not one_d.decoder_2d and not one_d.decoder_passes
    assert not one_d.front_b_2d and not one_d.front_a_2d
    rng = np.random.default_rng(5)
    for frames in (32, 44, 184):
        z = rng.standard_normal((192, frames)).astype(np.float32)
        want = run(one_d.decoder, {split.z_name: z[None]}).reshape(-1)
        got = backend.decode(z)
        assert got.shape == want.shape == (frames * backend.hop_length,)
        assert float(np.max(np.abs(got - want))) <= 1e-5


def test_split_meta_keeps_the_decoder_layout(backend: OnnxBackend) -> None:
    split = backend.split
    meta = split_meta(split)
    assert meta["decoder_2d"] is True
    assert meta["decoder_passes"] == list(split.decoder_passes) and split.decoder_passes
    assert meta["front_b_2d"] is True and meta["front_a_2d"] is True
    models = {"front_a": None, "front_b": None, "decoder": None}
    restored = split_from_meta(meta, models)
    assert restored.decoder_2d is True and restored.front_b_2d is True
    assert restored.decoder_passes == split.decoder_passes


@pytest.mark.parametrize("old_format", [1, 2, 3])
def test_graphs_cached_before_the_rewrite_are_not_used(
    monkeypatch: pytest.MonkeyPatch, old_format: int
) -> None:
    """An entry of split format 1 holds a 1-D decoder, of format 2 a 2-D decoder without the
    NCHWc passes and a 1-D flow, of format 3 a 1-D front_a: their keys must differ."""
    today = cache_key("a" * 64, ort.__version__, "cpu", "all")
    monkeypatch.setattr(graph_cache, "SPLIT_FORMAT", old_format)
    assert cache_key("a" * 64, ort.__version__, "cpu", "all") != today


GETTERS: tuple[str, ...] = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
GETTERS += ("openblas_get_num_threads64_", "openblas_get_num_threads")
SETTERS = tuple(name.replace("_get_", "_set_") for name in GETTERS)


def _openblas_threads() -> dict[str, int]:
    """Threads of every OpenBLAS in this process, by library file name."""
    import numpy  # noqa: F401

    with open("/proc/self/maps", encoding="utf-8") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    found: dict[str, int] = {}
    for path in sorted(p for p in paths if p.startswith("/")):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        for name in GETTERS:
            getter = getattr(lib, name, None)
            if getter is not None:
                getter.restype = ctypes.c_int
                found[os.path.basename(path)] = int(getter())
                break
    return found


def _set_openblas_threads(n: int) -> None:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    for path in (p for p in paths if p.startswith("/")):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        for name in SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter(n)
                break


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's memory map")
def test_blas_limited_to_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = _openblas_threads()
    if not before:
        pytest.skip("this numpy is not built on OpenBLAS")
    _set_openblas_threads(2)
    try:
        assert set(_openblas_threads().values()) == {2}
        changed = limit_blas_threads(1)
        assert set(changed) == set(before)
        assert set(_openblas_threads().values()) == {1}
        # An operator's explicit choice wins: nothing is changed.
        _set_openblas_threads(2)
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
        assert limit_blas_threads(1) == []
        assert set(_openblas_threads().values()) == {2}
    finally:
        _set_openblas_threads(1)
