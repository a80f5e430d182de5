"""RTP packet wire type (RFC 3550 §5.1) and sequence/timestamp arithmetic.

``RtpPacket.parse(data)`` / ``bytes(packet)`` in the style of aiortc's ``rtp.py``; errors are
:class:`RtpError` with fixed messages so callers and tests can match them exactly.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field

RTP_VERSION = 2
HEADER_SIZE = 12
SEQ_MOD = 1 << 16
TS_MOD = 1 << 32

_HEADER = struct.Struct("!BBHII")
_EXT_HEADER = struct.Struct("!HH")


class RtpError(ValueError):
    """A datagram that is not a valid RTP packet."""


@dataclass(slots=True)
class RtpPacket:
    """One RTP packet.

    ``extension_profile``/``extension_value`` hold the RFC 3550 §5.3.1 header extension
    (``extension_value`` a multiple of 4 bytes); ``padding_size`` is the number of padding
    octets including the final count octet (§5.1, P bit), 0 for none.
    """

    payload_type: int = 0
    marker: bool = False
    sequence_number: int = 0
    timestamp: int = 0
    ssrc: int = 0
    payload: bytes = b""
    csrc: list[int] = field(default_factory=list)
    extension_profile: int | None = None
    extension_value: bytes = b""
    padding_size: int = 0

    @property
    def version(self) -> int:
        return RTP_VERSION

    @property
    def padding(self) -> bool:
        return self.padding_size > 0

    @property
    def extension(self) -> bool:
        return self.extension_profile is not None

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        if len(data) < HEADER_SIZE:
            raise RtpError("RTP packet length is less than 12 bytes")
        b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        if b0 == 0x80:
            # The common packet (V=2; no padding, extension or CSRC): the payload is the rest.
            # Positional and without the checks below, as it comes ~50 times a second a call.
            return cls(b1 & 0x7F, b1 > 0x7F, seq, ts, ssrc, bytes(data[HEADER_SIZE:]))
        if b0 >> 6 != RTP_VERSION:
            raise RtpError("RTP packet has invalid version")
        cc = b0 & 0x0F
        pos = HEADER_SIZE + 4 * cc
        if len(data) < pos:
            raise RtpError("RTP packet has truncated CSRC")
        csrc = list(struct.unpack_from(f"!{cc}I", data, HEADER_SIZE)) if cc else []
        ext_profile: int | None = None
        ext_value = b""
        if b0 & 0x10:
            if len(data) < pos + 4:
                raise RtpError("RTP packet has truncated extension profile / length")
            ext_profile, ext_words = _EXT_HEADER.unpack_from(data, pos)
            pos += 4
            end = pos + 4 * ext_words
            if len(data) < end:
                raise RtpError("RTP packet has truncated extension value")
            ext_value = bytes(data[pos:end])
            pos = end
        padding = 0
        end = len(data)
        if b0 & 0x20:
            padding = data[-1]
            # §5.1: the last octet counts itself, so 0 is invalid, and padding cannot eat
            # into the header.
            if padding == 0 or end - padding < pos:
                raise RtpError("RTP packet padding length is invalid")
            end -= padding
        return cls(
            payload_type=b1 & 0x7F,
            marker=bool(b1 & 0x80),
            sequence_number=seq,
            timestamp=ts,
            ssrc=ssrc,
            payload=bytes(data[pos:end]),
            csrc=csrc,
            extension_profile=ext_profile,
            extension_value=ext_value,
            padding_size=padding,
        )

    def __bytes__(self) -> bytes:
        if not 0 <= self.payload_type <= 127:
            raise RtpError("RTP payload type must be within 0-127")
        if len(self.csrc) > 15:
            raise RtpError("RTP packet has more than 15 CSRCs")
        if len(self.extension_value) % 4:
            raise RtpError("RTP extension value must be a multiple of 4 bytes")
        if not 0 <= self.padding_size <= 255:
            raise RtpError("RTP padding size must be within 0-255")
        b0 = (
            (RTP_VERSION << 6)
            | (0x20 if self.padding_size else 0)
            | (0x10 if self.extension_profile is not None else 0)
            | len(self.csrc)
        )
        b1 = (0x80 if self.marker else 0) | self.payload_type
        parts = [
            _HEADER.pack(
                b0, b1, self.sequence_number & 0xFFFF, self.timestamp & 0xFFFFFFFF, self.ssrc
            )
        ]
        if self.csrc:
            parts.append(struct.pack(f"!{len(self.csrc)}I", *self.csrc))
        if self.extension_profile is not None:
            parts.append(_EXT_HEADER.pack(self.extension_profile, len(self.extension_value) // 4))
            parts.append(self.extension_value)
        parts.append(self.payload)
        if self.padding_size:
            parts.append(bytes(self.padding_size - 1) + bytes([self.padding_size]))
        return b"".join(parts)


def pack_rtp(
    payload_type: int, marker: bool, seq: int, ts: int, ssrc: int, payload: bytes
) -> bytes:
    """Fast path for the common packet (no CSRC, extension or padding): one struct call."""
    b1 = (0x80 if marker else 0) | payload_type
    return _HEADER.pack(0x80, b1, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc) + payload


def is_rtcp(data: bytes) -> bool:
    """RFC 5761 §4: with rtcp-mux, packet types 192-223 in the second octet are RTCP."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def seq_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` between 16-bit sequence numbers (wraparound aware)."""
    d = (a - b) & 0xFFFF
    return d - SEQ_MOD if d >= SEQ_MOD // 2 else d


def ts_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` between 32-bit RTP timestamps (wraparound aware)."""
    d = (a - b) & 0xFFFFFFFF
    return d - TS_MOD if d >= TS_MOD // 2 else d


def random_ssrc() -> int:
    """RFC 3550 §8.1: the SSRC is chosen at random."""
    return secrets.randbits(32)


def random_sequence() -> int:
    """RFC 3550 §5.1: the initial sequence number SHOULD be random (known-plaintext)."""
    return secrets.randbits(16)


def random_timestamp() -> int:
    """RFC 3550 §5.1: the initial timestamp SHOULD be random."""
    return secrets.randbits(32)


class SequenceUnwrapper:
    """Extends 16-bit sequence numbers to a monotonic int space (RFC 3550 §A.1 idea).

    Each value is placed within ±32768 of the highest seen so far, so reordering across the
    65535→0 wrap comes out in the right order.
    """

    __slots__ = ("highest",)

    def __init__(self) -> None:
        self.highest: int | None = None

    def unwrap(self, seq: int) -> int:
        if self.highest is None:
            self.highest = seq
            return seq
        ext = self.highest + seq_diff(seq, self.highest & 0xFFFF)
        self.highest = max(self.highest, ext)
        return ext


class TimestampUnwrapper:
    """Same for 32-bit RTP timestamps."""

    __slots__ = ("highest",)

    def __init__(self) -> None:
        self.highest: int | None = None

    def unwrap(self, ts: int) -> int:
        if self.highest is None:
            self.highest = ts
            return ts
        ext = self.highest + ts_diff(ts, self.highest & 0xFFFFFFFF)
        self.highest = max(self.highest, ext)
        return ext
