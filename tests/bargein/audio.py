"""Deterministic test audio for the barge-in detector: agent and caller speech at 8 kHz, and an
echo path model.

Both voices come from the project's own TTS (seeded, so bit-reproducible): the agent is Piper's
joe through the telephone chain; the caller is the same model speaking other texts, played 18 %
fast (the chain is told the audio is at 1.18 × its real rate), which raises pitch and formants
into a different-sounding, higher voice.  The echo path is a delay, a short dispersive hybrid
response and a weak reverberant tail, scaled to the wanted echo return loss, then the whole
near-end signal goes through a G.711 μ-law round trip like a real phone leg.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from dsp.g711 import ulaw_decode, ulaw_encode
from dsp.pcm import float_to_s16
from dsp.telephone import telephone

RATE = 8000
FRAME = 80  # 10 ms
FloatArray = npt.NDArray[np.float64]
Int16Array = npt.NDArray[np.int16]

AGENT_TEXTS = (
    "Thank you for calling Northwind support. I can help you with orders, returns and "
    "billing questions. To get started, please tell me the order number printed on your "
    "receipt, or say the name on the account.",
    "Your package left our warehouse on Tuesday morning and is expected to arrive by Friday "
    "afternoon. If you are not home, the driver will leave it with a neighbour or at the "
    "nearest pickup point.",
    "I have found three open invoices on this account. The oldest one is from March and "
    "includes a late fee, which I can remove as a courtesy if you pay the balance today.",
    "Before we continue, I need to confirm a few security details. Please have your card "
    "ready, and remember that we will never ask for your full password over the phone.",
)
CALLER_TEXTS = (
    "Hi, yes, I want to cancel my order.",
    "No, no, that is wrong.",
    "Can I talk to a real person please?",
    "Wait, stop, I already paid that.",
    "Sorry, what was that again?",
    "Okay, the number is four five seven.",
)


@functools.cache
def _engine():  # type: ignore[no-untyped-def]
    from synth.engines import load_engine

    return load_engine("onnx")


def _tts(text: str, seed: int, caller: bool) -> FloatArray:
    audio = _engine().synthesize(text, seed=seed)
    # The caller's voice: the same samples declared to be at 26000 Hz instead of 22050 (1.18 ×,
    # and a rate pair with a short resampling filter: 8000/26000 = 4/13).
    in_rate = 26000 if caller else 22050
    return np.asarray(telephone(audio, in_rate), dtype=np.float64)


def active_rms_db(x: FloatArray) -> float:
    """Active speech level: RMS over 10 ms frames within 30 dB of the loudest frame."""
    n = x.size // FRAME * FRAME
    frames = x[:n].reshape(-1, FRAME)
    ms = np.mean(frames**2, axis=1)
    active = ms > ms.max() * 1e-3
    return float(10 * np.log10(np.mean(ms[active])))


def at_level(x: FloatArray, level_db: float) -> FloatArray:
    return x * 10 ** ((level_db - active_rms_db(x)) / 20)


@functools.cache
def agent_speech() -> FloatArray:
    """About 45 s of agent speech at -18 dBFS active level (float, 8 kHz)."""
    parts = [_tts(t, seed=i, caller=False) for i, t in enumerate(AGENT_TEXTS)]
    gap = np.zeros(int(0.4 * RATE))
    joined = np.concatenate([p for part in parts for p in (part, gap)])
    return at_level(joined, -18.0)


@functools.cache
def caller_utterances() -> tuple[FloatArray, ...]:
    """Short caller utterances, each trimmed to start at its first active frame, at -20 dBFS
    active level."""
    out = []
    for i, text in enumerate(CALLER_TEXTS):
        x = _tts(text, seed=100 + i, caller=True)
        x = x[true_onset(x) :]
        out.append(at_level(x, -20.0))
    return tuple(out)


def true_onset(x: FloatArray, rel_db: float = -35.0) -> int:
    """First sample of the first 5 ms block within ``rel_db`` of the signal's loudest block: the
    reference onset the detector's estimate is compared with."""
    blk = 40
    n = x.size // blk * blk
    ms = np.mean(x[:n].reshape(-1, blk) ** 2, axis=1)
    return int(np.argmax(ms > ms.max() * 10 ** (rel_db / 10)) * blk)


def echo_path(delay_ms: float, erl_db: float, seed: int = 0) -> FloatArray:
    """Impulse response at 8 kHz: pure delay, an 8 ms dispersive hybrid response and a
    reverberant tail 20 dB down (T60 ≈ 150 ms), scaled so the energy gain is -erl_db."""
    rng = np.random.default_rng(seed)
    d = round(delay_ms * RATE / 1000)
    hybrid = np.array([1.0, -0.45, 0.3, -0.12, 0.08]) * np.exp(-np.arange(5) / 3)
    hybrid = np.convolve(hybrid, np.exp(-np.arange(64) / 12) * rng.standard_normal(64) * 0.15)
    t = np.arange(int(0.15 * RATE))
    tail = rng.standard_normal(t.size) * np.exp(-t * 6.9 / t.size)
    tail *= np.sqrt(np.sum(hybrid**2) * 0.01 / np.sum(tail**2))
    h = np.zeros(d + hybrid.size + 40 + tail.size)
    h[d : d + hybrid.size] += hybrid
    h[d + 40 : d + 40 + tail.size] += tail
    scaled: FloatArray = h * float(np.sqrt(10 ** (-erl_db / 10) / np.sum(h**2)))
    return scaled


def noise(n: int, level_db: float, seed: int) -> FloatArray:
    return np.random.default_rng(seed).standard_normal(n) * 10 ** (level_db / 20)


def phone_leg(x: FloatArray) -> Int16Array:
    """What the gateway decodes: the signal through a G.711 μ-law round trip."""
    return ulaw_decode(ulaw_encode(float_to_s16(x)))


def to_s16(x: FloatArray) -> Int16Array:
    return float_to_s16(x)


def echo_of(far: FloatArray, delay_ms: float, erl_db: float, seed: int = 0) -> FloatArray:
    return np.convolve(far, echo_path(delay_ms, erl_db, seed))[: far.size]


def true_offset(x: FloatArray, rel_db: float = -35.0) -> int:
    """End of the last 5 ms block within ``rel_db`` of the loudest block (reference offset)."""
    return x.size - true_onset(x[::-1].copy(), rel_db)
