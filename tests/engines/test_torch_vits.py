"""Piper's VITS in torch, filled from the ONNX voice, against onnxruntime on the same ids."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from synth.engines import torch_vits  # noqa: E402
from synth.engines.voice import Voice, find_conv_pre  # noqa: E402

TEXT = "Thank you for calling. Your appointment is on Tuesday, at three thirty."


def snr_db(ref: np.ndarray[Any, Any], x: np.ndarray[Any, Any]) -> float:
    err = float(np.sum((ref.astype(np.float64) - x) ** 2))
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)))


@pytest.fixture(scope="module")
def voice() -> Voice:
    return Voice.load()


@pytest.fixture(scope="module")
def loaded(voice: Voice) -> tuple[Any, torch_vits.VitsArch, torch_vits.MappingReport]:
    torch.set_num_threads(2)
    return torch_vits.load_vits_from_onnx(voice.model)


@pytest.fixture(scope="module")
def ids(voice: Voice) -> list[int]:
    return [i for s in voice.phonemize(TEXT) for i in s.phoneme_ids]


def test_mapping_rules(loaded: tuple[Any, torch_vits.VitsArch, torch_vits.MappingReport]) -> None:
    _, arch, report = loaded
    # DESIGN.md: 316 by name, 32 flow convs named from their consumer, the text embedding
    # exported as "sid", and the duration predictor's logs folded to exp(-logs).
    assert len(report.by_name) == 316
    assert len(report.by_consumer) == 32
    assert all(t.startswith("flow.flows.") for t in report.by_consumer.values())
    assert report.text_embedding == "sid"
    assert report.exp_inverted == {"/dp/flows.0/Exp_output_0": "dp.flows.0.logs"}
    assert report.n_mapped == 350
    # Read from the weights and the graph (en_US-joe-medium).
    assert (arch.n_vocab, arch.hidden_channels, arch.inter_channels) == (256, 192, 192)
    assert (arch.filter_channels, arch.n_heads, arch.n_layers, arch.window_size) == (768, 2, 6, 4)
    assert arch.upsample_rates == (8, 8, 4) and arch.upsample_kernel_sizes == (16, 16, 8)
    assert arch.resblock == "2" and arch.resblock_kernel_sizes == (3, 5, 7)
    assert arch.resblock_dilation_sizes == ((1, 2), (2, 6), (3, 12))
    assert (arch.flow_n_flows, arch.flow_n_layers, arch.flow_kernel_size) == (4, 4, 5)
    assert arch.hop_length == 256 and arch.n_speakers == 1


def _onnx_full(voice: Voice, ids: list[int]) -> np.ndarray[Any, Any]:
    sess = ort.InferenceSession(voice.model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(
        None,
        {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
        },
    )
    return np.asarray(out[0]).reshape(-1)


def test_full_model_matches_onnxruntime(voice: Voice, loaded: Any, ids: list[int]) -> None:
    net, arch, _ = loaded
    ref = _onnx_full(voice, ids)
    with torch.inference_mode():
        z, durations = torch_vits.encode(net, torch.tensor([ids]))
        audio = torch_vits.decode(net.dec, z).reshape(-1).numpy()
    assert durations.shape == (len(ids),) and int(durations.sum()) == z.shape[2]
    assert audio.shape == ref.shape == (z.shape[2] * arch.hop_length,)
    assert snr_db(ref, audio) >= 60.0
    # Piper's own infer() on the filled model agrees as well.
    with torch.inference_mode():
        o = net.infer(
            torch.tensor([ids]),
            torch.tensor([len(ids)]),
            noise_scale=0.0,
            length_scale=1.0,
            noise_scale_w=0.0,
        )[0]
    assert snr_db(ref, o.reshape(-1).numpy()) >= 60.0


def test_decoder_matches_onnxruntime(voice: Voice, loaded: Any, ids: list[int]) -> None:
    net, _, _ = loaded
    z_name = find_conv_pre(voice.model).input[0]
    dec_model = onnx.utils.Extractor(voice.model).extract_model([z_name], ["output"])
    sess = ort.InferenceSession(dec_model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    z = rng.standard_normal((1, 192, 37)).astype(np.float32)
    ref = np.asarray(sess.run(None, {z_name: z})[0]).reshape(-1)
    with torch.inference_mode():
        audio = torch_vits.decode(net.dec, torch.from_numpy(z)).reshape(-1).numpy()
    assert snr_db(ref, audio) >= 60.0


def test_noise_is_passed_in(loaded: Any, ids: list[int]) -> None:
    net, _, _ = loaded
    x = torch.tensor([ids])
    dn = torch.randn(1, 2, len(ids), generator=torch.Generator().manual_seed(1))

    def latent(t: int) -> torch.Tensor:
        return torch.full((1, 192, t), 0.3)

    with torch.inference_mode():
        z0, d0 = torch_vits.encode(net, x)
        z1, d1 = torch_vits.encode(net, x, noise_w=0.8, duration_noise=dn)
        z2, d2 = torch_vits.encode(net, x, noise_w=0.8, duration_noise=dn)
        z3, _ = torch_vits.encode(
            net, x, noise_scale=0.667, noise_w=0.8, duration_noise=dn, latent_noise=latent
        )
        z4, d4 = torch_vits.encode(net, x, noise_w=0.0, duration_noise=dn, latent_noise=latent)
    assert not torch.equal(d0, d1) and torch.equal(d1, d2) and torch.equal(z1, z2)
    assert z3.shape == z1.shape and not torch.equal(z3, z1)
    # Zero scales silence the noise whatever is passed.
    assert torch.equal(d4, d0) and torch.equal(z4, z0)


def _edited(voice: Voice, edit: Any) -> onnx.ModelProto:
    model = copy.deepcopy(voice.model)
    edit(model.graph)
    out: onnx.ModelProto = model
    return out


def test_refuses_leftover_missing_and_misshapen_tensors(voice: Voice) -> None:
    def add_extra(g: Any) -> None:
        g.initializer.append(
            onnx.numpy_helper.from_array(np.zeros((4, 4), np.float32), "dec.extra.weight")
        )

    def drop(g: Any) -> None:
        g.initializer.remove(next(t for t in g.initializer if t.name == "dec.conv_post.weight"))

    def reshape(g: Any) -> None:
        t = next(t for t in g.initializer if t.name == "enc_p.proj.bias")
        g.initializer.remove(t)
        g.initializer.append(onnx.numpy_helper.from_array(np.zeros(383, np.float32), t.name))

    def folded(g: Any) -> None:
        g.initializer.append(
            onnx.numpy_helper.from_array(np.ones((3, 3), np.float32), "/dec/Mystery_output_0")
        )

    for edit, message in [
        (add_extra, "not consumed"),
        (drop, "missing"),
        (reshape, "shape mismatch"),
        (folded, "unrecognised folded parameter"),
    ]:
        with pytest.raises(torch_vits.VitsLoadError, match=message):
            torch_vits.load_vits_from_onnx(_edited(voice, edit))


@pytest.mark.slow
def test_other_architecture_multi_speaker(tmp_path: Any) -> None:
    """A differently shaped voice loads too: a small random Piper model (resblock "1", four
    upsamplers, 64 channels, 3 speakers) exported like Piper exports (legacy exporter)."""
    import warnings

    models: Any = torch_vits._vits_models
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = models.SynthesizerTrn(
            n_vocab=60, spec_channels=65, segment_size=8, inter_channels=64, hidden_channels=64,
            filter_channels=128, n_heads=2, n_layers=2, kernel_size=3, p_dropout=0.0,
            resblock="1", resblock_kernel_sizes=(3, 7), resblock_dilation_sizes=((1, 3, 5),) * 2,
            upsample_rates=(8, 4, 2, 2), upsample_initial_channel=64,
            upsample_kernel_sizes=(16, 8, 4, 4), n_speakers=3, gin_channels=16,
        )  # fmt: skip
        with torch.no_grad():
            for p in net.parameters():  # some layers start at zero: make every one matter
                p.add_(torch.randn_like(p) * 0.02)
            net.eval()
            net.dec.remove_weight_norm()

        def forward(x: Any, lengths: Any, scales: Any, sid: Any) -> Any:
            o = net.infer(x, lengths, sid, scales[0], scales[1], scales[2])[0]
            return o.unsqueeze(1)

        net.forward = forward
        path = tmp_path / "multi.onnx"
        args = (torch.randint(0, 60, (1, 20)), torch.LongTensor([20]), torch.zeros(3),
                torch.LongTensor([0]))  # fmt: skip
        try:
            torch.onnx.export(
                net, args, str(path), opset_version=15, dynamo=False,
                input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
                dynamic_axes={"input": {0: "b", 1: "p"}, "input_lengths": {0: "b"},
                              "output": {0: "b", 2: "t"}},
            )  # fmt: skip
        except Exception as exc:  # the legacy exporter may leave a future torch
            pytest.skip(f"torch cannot export like Piper does: {exc}")

    loaded, arch, report = torch_vits.load_vits_from_onnx(path)
    assert arch.resblock == "1" and arch.upsample_rates == (8, 4, 2, 2) and arch.hop_length == 128
    assert (arch.n_speakers, arch.gin_channels, arch.hidden_channels) == (3, 16, 64)
    assert report.speaker_embedding == "emb_g.weight" and len(report.exp_inverted) == 1
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 60, (1, 30))
    for sid in (0, 2):
        ref = sess.run(None, {
            "input": ids, "input_lengths": np.array([30]),
            "scales": np.array([0, 1, 0], np.float32), "sid": np.array([sid]),
        })[0].reshape(-1)  # fmt: skip
        with torch.inference_mode():
            g = torch_vits.speaker_embedding(loaded, sid, torch.device("cpu"))
            z, _ = torch_vits.encode(loaded, torch.from_numpy(ids), speaker_id=sid)
            audio = torch_vits.decode(loaded.dec, z, g=g).reshape(-1).numpy()
            # Batched with a shorter, padded second item: each equals its own decode.
            short = z.shape[2] - 5
            both = torch_vits.decode(loaded.dec, torch.cat([z, z]), [z.shape[2], short], g)
            alone = torch_vits.decode(loaded.dec, z[:, :, :short], g=g).reshape(-1).numpy()
        assert snr_db(ref, audio) >= 60.0
        assert snr_db(audio, both[0].numpy()) >= 60.0
        assert snr_db(alone, both[1, : short * arch.hop_length].numpy()) >= 60.0
