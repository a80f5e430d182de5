"""The bridge's audio crossing (sans-I/O): each side hears the other, bounded, silence where
nothing came, G.711 bytes unchanged through decode/encode, rates converted."""

from __future__ import annotations

import numpy as np

from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from gateway.call.bridge import CrossedAudio

FRAME = 160  # 20 ms at 8 kHz


def test_each_side_hears_the_other_in_order() -> None:
    x = CrossedAudio((8000, 8000))
    a = [np.full(FRAME, i, dtype=np.int16) for i in range(1, 4)]
    b = [np.full(FRAME, -i, dtype=np.int16) for i in range(1, 4)]
    for fa, fb in zip(a, b, strict=True):
        x.push(0, fa)
        x.push(1, fb)
        assert np.array_equal(x.pull(1, FRAME), fa)  # side 1 sends what side 0 said
        assert np.array_equal(x.pull(0, FRAME), fb)
    assert x.stats() == {"dropped_0to1": 0, "missing_0to1": 0, "dropped_1to0": 0, "missing_1to0": 0}


def test_nothing_said_is_silence_and_a_side_running_ahead_is_bounded() -> None:
    x = CrossedAudio((8000, 8000), max_ms=40)
    assert not x.pull(1, FRAME).any()
    assert x.stats()["missing_0to1"] == FRAME
    # Side 0 pushes five frames without side 1 pulling (side 1 stalled): only the newest
    # 40 ms are kept, so the delay does not creep.
    for i in range(5):
        x.push(0, np.full(FRAME, i + 1, dtype=np.int16))
    assert x.stats()["dropped_0to1"] == 3 * FRAME
    assert x.pull(1, FRAME)[0] == 4 and x.pull(1, FRAME)[0] == 5
    assert not x.pull(1, FRAME).any()


def test_g711_payloads_cross_unchanged() -> None:
    """Both legs PCMU (or both PCMA): decoding what one side sent and encoding it for the
    other gives back the same bytes: a pass-through."""
    rng = np.random.default_rng(7)
    for decode, encode in ((ulaw_decode, ulaw_encode), (alaw_decode, alaw_encode)):
        x = CrossedAudio((8000, 8000))
        payloads = [bytes(rng.integers(0, 256, FRAME, dtype=np.uint8)) for _ in range(50)]
        # μ-law has two zeros (0x7F and 0xFF); the encoder writes 0xFF for both.
        payloads = [p.replace(b"\x7f", b"\xff") for p in payloads]
        out = []
        for p in payloads:
            x.push(0, decode(p))
            out.append(encode(x.pull(1, FRAME)))
        assert out == payloads


def test_different_laws_are_transcoded() -> None:
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(FRAME) / 8000)).astype(np.int16)
    pcma = alaw_encode(tone)
    x = CrossedAudio((8000, 8000))
    x.push(0, alaw_decode(pcma))  # a PCMA leg's caller
    pcmu = ulaw_encode(x.pull(1, FRAME))  # sent on a PCMU leg
    assert pcmu != pcma
    err = ulaw_decode(pcmu).astype(np.float64) - tone
    snr_db = 10 * np.log10(np.sum(tone.astype(np.float64) ** 2) / np.sum(err**2))
    assert snr_db > 30  # two G.711 quantisations (each ~38 dB on a sine)


def test_rates_are_converted_both_ways() -> None:
    """A 48 kHz browser leg with an 8 kHz phone: a 1 kHz tone crosses as a 1 kHz tone, and a
    20 ms frame in gives 20 ms out, at the listener's rate."""
    x = CrossedAudio((8000, 48000))
    n = np.arange(8000)
    tone8 = (6000 * np.sin(2 * np.pi * 1000 * n / 8000)).astype(np.int16)
    heard = []
    for i in range(50):
        x.push(0, tone8[i * FRAME : (i + 1) * FRAME])
        heard.append(x.pull(1, 960))
    wide = np.concatenate(heard)[4800:]  # past the filter's start
    spectrum = np.abs(np.fft.rfft(wide.astype(np.float64)))
    peak_hz = np.argmax(spectrum) * 48000 / len(wide)
    assert abs(peak_hz - 1000) < 20
    assert x.stats()["dropped_0to1"] == 0
    # And back: 48 kHz frames in, 8 kHz frames out.
    n48 = np.arange(48000)
    tone48 = (6000 * np.sin(2 * np.pi * 700 * n48 / 48000)).astype(np.int16)
    back = []
    for i in range(50):
        x.push(1, tone48[i * 960 : (i + 1) * 960])
        back.append(x.pull(0, FRAME))
    narrow = np.concatenate(back)[800:]
    spectrum = np.abs(np.fft.rfft(narrow.astype(np.float64)))
    assert abs(np.argmax(spectrum) * 8000 / len(narrow) - 700) < 20
