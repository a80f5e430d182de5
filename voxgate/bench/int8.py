"""``python -m voxgate.bench.int8``: would an int8 decoder buy the synthesis RTF? (issue 17)

The RTF target (≤ 0.05) is missed on both CPU kinds with the fp32 Piper graph, and the decoder
(HiFi-GAN) is two thirds of the engine's time. This measures the one lever left after threads,
session options and the chunk schedule: the decoder statically quantised to int8
(onnxruntime's QDQ, per-channel weights, ``reduce_range`` because the EPYC has no VNNI and
AVX2's ``vpmaddubsw`` saturates on full-range u8 x s8 products).

The same decoder graph the engine runs (:func:`synth.engines.onnx_engine.split_piper_graph`,
with its 2-D NCHWc rewrites) is quantised with activation ranges calibrated on the latent
windows of :data:`CALIBRATION` prompts, then compared with its fp32 self on other sentences:

- *speed*: decoder ms per latent frame on one window of ``chunk + context`` frames (the
  schedule's steady-state width), fp32 and int8 alternated in one process, one intra-op
  thread; and what the saving would make of the engine's RTF;
- *quality*: the whole engine (front, flow, tails, gain) with one seed, once per decoder, so
  the only difference is the decoder's arithmetic. SNR of the int8 audio against the fp32
  audio, wideband and after the telephone chain at 8 kHz (what a caller hears; for scale,
  G.711 μ-law's own quantisation is ~38 dB); and with ``--wer``, the bundled speech
  recogniser's word error rate on both after a G.711 round trip.

Nothing here changes the engine: it prints figures for a decision (docs/bench-report/
cpu-models.md has the one taken).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate.bench.util import cpu_model

CALIBRATION = (
    "Thank you for calling Acme Bank. How can I help you today?",
    "Please say or enter your account number, followed by the pound key.",
    "To hear these options again, press 9. To speak with an agent, press 0.",
    "Great, I've updated your address. Is there anything else I can help you with?",
)
# Held out from the calibration; plain words, so a transcript compares with the text.
SENTENCES = (
    "I would like to check the balance on my account.",
    "Please transfer me to somebody in billing.",
    "The internet at my house keeps dropping every evening.",
    "Could you repeat the opening hours please?",
    "My password does not work anymore.",
    "What is the status of my insurance claim?",
    "I lost my card and want to block it.",
    "Thank you, that answers my question, goodbye.",
)
SEED = 7


@dataclass(frozen=True, slots=True)
class Int8Report:
    cpu: str
    window_frames: int
    fp32_ms_per_frame: float
    int8_ms_per_frame: float
    speedup: float
    decoder_share: float  # of the engine's one-shot time, fp32
    rtf_fp32: float  # engine one-shot, the held-out sentences
    rtf_int8: float
    snr_db: float  # int8 vs fp32 engine audio, 22.05 kHz
    snr_8k_db: float  # the same after the telephone chain
    worst_sentence_snr_8k_db: float
    wer_fp32: float | None
    wer_int8: float | None
    calibration_windows: int
    sentences: int


def _windows(zs: list[npt.NDArray[np.float32]], width: int) -> Iterator[dict[str, Any]]:
    # Fixed-width windows: onnxruntime's histogram calibrators need one shape.
    for z in zs:
        for a in range(0, z.shape[-1] - width + 1, width // 3):
            yield {"z": np.ascontiguousarray(z[:, :, a : a + width])}


def quantize_decoder(
    decoder: Any, calibration: list[npt.NDArray[np.float32]], z_name: str, out: Path
) -> int:
    """Write the int8 QDQ decoder to ``out``; returns the calibration windows used."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    src = out.with_name("decoder_fp32.onnx")
    onnx.save(decoder, str(src))
    feeds = [{z_name: f["z"]} for f in _windows(calibration, 64)]
    if not feeds:
        raise ValueError("no calibration window: the calibration sentences are too short")

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

    quantize_static(
        str(src), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        op_types_to_quantize=["Conv"],
    )  # fmt: skip
    return len(feeds)


def _snr_db(ref: npt.NDArray[Any], test: npt.NDArray[Any]) -> float:
    n = min(len(ref), len(test))
    r, t = ref[:n].astype(np.float64), test[:n].astype(np.float64)
    noise = float(((r - t) ** 2).sum())
    return float("inf") if noise == 0 else 10.0 * float(np.log10((r**2).sum() / noise))


def _wer(texts: tuple[str, ...], calls: list[npt.NDArray[np.float32]], rate: int) -> float:
    from dsp.g711 import ulaw_decode, ulaw_encode
    from dsp.pcm import float_to_s16
    from gateway.stt.base import to_stt_rate
    from gateway.stt.wer import edit_distance, words
    from gateway.stt.whisper import WhisperStt

    stt = WhisperStt()
    errors = total = 0
    for text, x in zip(texts, calls, strict=True):
        pcm = ulaw_decode(ulaw_encode(float_to_s16(x)))
        hyp = stt.transcribe(to_stt_rate(pcm, rate)).text
        errors += edit_distance(words(text), words(hyp))
        total += len(words(text))
    return errors / total


def _decoder_ms_per_frame(
    sessions: dict[str, Any], z_name: str, width: int, rounds: int
) -> dict[str, float]:
    z = np.random.default_rng(0).standard_normal((1, 192, width)).astype(np.float32)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():
        s.run(None, {z_name: z})
    for _ in range(rounds):
        for k, s in sessions.items():  # alternated: the same noise on both
            t = time.perf_counter()
            s.run(None, {z_name: z})
            times[k].append((time.perf_counter() - t) * 1000.0 / width)
    return {k: statistics.median(v) for k, v in times.items()}


def run(*, rounds: int = 20, sentences: int = len(SENTENCES), wer: bool = False) -> Int8Report:
    import onnxruntime as ort

    from dsp.telephone import telephone
    from synth.engines.onnx_engine import (
        OnnxBackend,
        OnnxEngine,
        make_session_options,
        split_piper_graph,
    )

    engine = OnnxEngine("", 1, seed=SEED)
    backend = engine.backend
    assert isinstance(backend, OnnxBackend)
    split = split_piper_graph(backend.voice.model)
    captured: list[npt.NDArray[np.float32]] = []
    decode = backend.decode

    def capture(z: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        captured.append(np.ascontiguousarray(z[None], dtype=np.float32))
        return decode(z)

    backend.decode = capture  # type: ignore[method-assign]
    for text in CALIBRATION:
        engine.synthesize(text, seed=SEED)
    backend.decode = decode  # type: ignore[method-assign]

    with tempfile.TemporaryDirectory(prefix="vg-int8-") as tmp:
        path = Path(tmp) / "decoder_int8.onnx"
        windows = quantize_decoder(split.decoder, captured, split.z_name, path)
        opts = make_session_options(1)
        int8 = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    fp32 = backend._decoder  # the engine's own (cached, optimised) fp32 session
    cfg = engine.config
    width = cfg.step_size(10) + cfg.left_context + cfg.right_context
    speed = _decoder_ms_per_frame({"fp32": fp32, "int8": int8}, split.z_name, width, rounds)

    texts = SENTENCES[:sentences]
    outputs: dict[str, list[npt.NDArray[np.float32]]] = {"fp32": [], "int8": []}
    spent = {"fp32": 0.0, "int8": 0.0}
    in_decoder = {"fp32": 0.0, "int8": 0.0}
    for kind, session in (("fp32", fp32), ("int8", int8)):
        backend._decoder = session

        def timed(z: npt.NDArray[np.float32], kind: str = kind) -> npt.NDArray[np.float32]:
            t = time.perf_counter()
            audio = decode(z)
            in_decoder[kind] += time.perf_counter() - t
            return audio

        backend.decode = timed  # type: ignore[method-assign]
        for text in texts:
            t0 = time.perf_counter()
            outputs[kind].append(engine.synthesize(text, seed=SEED))
            spent[kind] += time.perf_counter() - t0
    backend._decoder = fp32
    backend.decode = decode  # type: ignore[method-assign]
    audio_s = sum(len(x) for x in outputs["fp32"]) / engine.sample_rate
    rate = engine.sample_rate
    snr = _snr_db(np.concatenate(outputs["fp32"]), np.concatenate(outputs["int8"]))
    phone = {k: [telephone(x, rate) for x in v] for k, v in outputs.items()}
    per = [_snr_db(a, b) for a, b in zip(phone["fp32"], phone["int8"], strict=True)]
    snr8 = _snr_db(np.concatenate(phone["fp32"]), np.concatenate(phone["int8"]))
    wer_fp32 = wer_int8 = None
    if wer:
        wer_fp32, wer_int8 = _wer(texts, phone["fp32"], 8000), _wer(texts, phone["int8"], 8000)
    return Int8Report(
        cpu=cpu_model(), window_frames=width,
        fp32_ms_per_frame=speed["fp32"], int8_ms_per_frame=speed["int8"],
        speedup=speed["fp32"] / speed["int8"],
        decoder_share=in_decoder["fp32"] / spent["fp32"],
        rtf_fp32=spent["fp32"] / audio_s, rtf_int8=spent["int8"] / audio_s,
        snr_db=snr, snr_8k_db=snr8, worst_sentence_snr_8k_db=min(per),
        wer_fp32=wer_fp32, wer_int8=wer_int8, calibration_windows=windows,
        sentences=len(texts),
    )  # fmt: skip


def format_report(r: Int8Report) -> str:
    wer = (
        f"  WER (bundled recogniser, G.711): fp32 {r.wer_fp32:.3f}, int8 {r.wer_int8:.3f}"
        if r.wer_fp32 is not None and r.wer_int8 is not None
        else "  WER: not measured (--wer)"
    )
    return "\n".join([
        f"int8 decoder vs fp32 — {r.cpu}, 1 intra-op thread, window {r.window_frames} frames, "
        f"{r.calibration_windows} calibration windows",
        f"  decoder ms/frame (median, alternated): fp32 {r.fp32_ms_per_frame:.3f}, "
        f"int8 {r.int8_ms_per_frame:.3f} ({r.speedup:.2f}x)",
        f"  engine RTF, one-shot, {r.sentences} held-out sentences: fp32 {r.rtf_fp32:.4f}, "
        f"int8 {r.rtf_int8:.4f} (decoder ~{r.decoder_share * 100:.0f} % of fp32's time)",
        f"  int8 against fp32: SNR {r.snr_db:.1f} dB at 22.05 kHz, {r.snr_8k_db:.1f} dB after "
        f"the telephone chain (worst sentence {r.worst_sentence_snr_8k_db:.1f}; G.711's own "
        "~38 dB)",
        wer,
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m voxgate.bench.int8", description=__doc__)
    p.add_argument("--rounds", type=int, default=20, help="timed decoder runs per precision")
    p.add_argument("--sentences", type=int, default=len(SENTENCES))
    p.add_argument("--wer", action="store_true", help="also the recogniser's word error rate")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = run(rounds=a.rounds, sentences=max(1, min(a.sentences, len(SENTENCES))), wer=a.wer)
    print(json.dumps(asdict(r), indent=2) if a.json else format_report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
