"""Opus encoding of the agent's voice for browser legs, inline on the media tick.

aiortc's own Opus path encodes every 20 ms frame on a thread pool (a thread hand-off per frame
per call), upmixes to stereo and resamples first; measured here: 135–210 µs of encoding per
frame plus the hand-offs, ~7 % of a core per browser call in all. The agent is one mono voice,
and RFC 7587 §7 lets a sender put a mono stream in the always-"opus/48000/2" RTP format, so
this encodes mono at the call's own rate (libopus takes 8/12/16/24/48 kHz input natively) in
~85 µs, and hands aiortc finished packets, which its sender only packetises.

State: the libopus encoder (its look-ahead and bit reservoir) lives as long as the call's
stream; one frame in, one packet out.
"""

from __future__ import annotations

import fractions
from typing import Any

import av
import numpy as np
import numpy.typing as npt

# Wideband speech is transparent well below this; 32 kbit/s keeps 48 kHz fullband voice clean.
BITRATE = 32000
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


class MonoOpusEncoder:
    def __init__(self, rate: int, bitrate: int = BITRATE) -> None:
        if rate not in OPUS_RATES:
            raise ValueError(f"Opus cannot encode {rate} Hz input (needs one of {OPUS_RATES})")
        self.rate = rate
        self.time_base = fractions.Fraction(1, rate)
        codec = av.CodecContext.create("libopus", "w")
        codec.bit_rate = bitrate
        codec.format = "s16"
        codec.layout = "mono"
        codec.sample_rate = rate
        codec.time_base = self.time_base
        # "voip" mode: speech-tuned, with in-band FEC available to the receiver (RFC 6716 §2.1.7).
        codec.options = {"application": "voip"}
        self._codec = codec
        self._silence: bytes | None = None

    def encode(self, pcm: npt.NDArray[np.int16], pts: int) -> av.Packet[Any]:
        """One 20 ms frame → one packet stamped ``pts`` (samples at ``rate``)."""
        frame = _frame(pcm, self.rate)
        frame.pts = pts
        packets = self._codec.encode(frame)
        # libopus emits one packet per whole frame; the fallback only guards that contract.
        packet = packets[0] if packets else av.Packet(self.silence())
        packet.pts = pts
        packet.time_base = self.time_base
        return packet

    def silence(self) -> bytes:
        if self._silence is None:
            spare = MonoOpusEncoder(self.rate)
            zeros = np.zeros(self.rate // 50, np.int16)
            self._silence = bytes(spare._codec.encode(_frame(zeros, self.rate))[0])
        return self._silence


def _frame(pcm: npt.NDArray[np.int16], rate: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = 0
    frame.time_base = fractions.Fraction(1, rate)
    return frame
