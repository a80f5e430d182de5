"""The inline mono Opus encoder: one packet per 20 ms frame, stamped with our media time, and
the decoded audio is the speech that went in (not just "some packets")."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest

from gateway.legs.webrtc.opus import MonoOpusEncoder


def decode(packets: list[bytes], rate: int) -> np.ndarray:
    dec = av.CodecContext.create("libopus", "r")
    dec.sample_rate = 48000
    dec.layout = "mono"
    out = []
    for i, data in enumerate(packets):
        p = av.Packet(data)
        p.pts = i * 960
        p.time_base = fractions.Fraction(1, 48000)
        for f in dec.decode(p):
            out.append(f.to_ndarray().reshape(-1))
    y = np.concatenate(out)
    return y if y.dtype == np.int16 else (y * 32767).astype(np.int16)


@pytest.mark.parametrize("rate", [48000, 16000])
def test_round_trip_keeps_the_signal(rate: int) -> None:
    enc = MonoOpusEncoder(rate)
    n = rate // 50
    t = np.arange(n * 100) / rate
    # A voiced-speech stand-in: 180 Hz with harmonics, amplitude-modulated at 4 Hz.
    x = sum(np.sin(2 * np.pi * 180 * k * t) / k for k in range(1, 12))
    pcm = (x * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) * 6000).astype(np.int16)
    packets = []
    for i in range(100):
        p = enc.encode(pcm[i * n : (i + 1) * n], i * n)
        assert p.pts == i * n and p.time_base == fractions.Fraction(1, rate)
        packets.append(bytes(p))
    assert all(0 < len(p) < 200 for p in packets)  # ~32 kbit/s: 80 bytes a frame
    y = decode(packets, rate).astype(np.float64)
    # Decoded at 48 kHz: compare levels and the 180 Hz fundamental's share, after the codec's
    # start-up (first 100 ms).
    y = y[4800:]
    ref = np.interp(np.arange(len(y)) / 48000, t, pcm.astype(np.float64))[: len(y)]
    level = np.sqrt(np.mean(y**2)) / np.sqrt(np.mean(ref**2))
    assert 0.7 < level < 1.3
    spec = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / 48000)
    assert abs(freqs[int(np.argmax(spec))] - 180) < 5


def test_silence_packet_and_bad_rate() -> None:
    enc = MonoOpusEncoder(48000)
    assert 0 < len(enc.silence()) < 64
    with pytest.raises(ValueError, match="cannot encode 44100"):
        MonoOpusEncoder(44100)
