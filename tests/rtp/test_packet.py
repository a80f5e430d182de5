"""RtpPacket against hand-built bytes (RFC 3550 §5.1 layout) and exact error messages."""

from __future__ import annotations

import pytest

from gateway.rtp.packet import (
    RtpError,
    RtpPacket,
    SequenceUnwrapper,
    TimestampUnwrapper,
    is_rtcp,
    pack_rtp,
    random_sequence,
    random_ssrc,
    random_timestamp,
    seq_diff,
    ts_diff,
)

# V=2 P=0 X=0 CC=0 | M=1 PT=0 | seq 0x1234 | ts 0x00000140 | ssrc 0xDEADBEEF | 4 payload bytes
SIMPLE = bytes.fromhex("80 80 1234 00000140 deadbeef ff7f0001")
# V=2 P=1 X=1 CC=2 | M=0 PT=8 | seq 65535 | ts 0xFFFFFFFF | ssrc 1 | CSRC 2, 3 |
# ext profile 0xBEDE len 1 word 0x10AA0000 | payload 01 02 | padding 00 00 03
FULL = bytes.fromhex(
    "b2 08 ffff ffffffff 00000001 00000002 00000003 bede 0001 10aa0000 0102 000003"
)
# First packet of sipp's dtmf_2833_1.pcap (digit 1, 101, marker), typed in from the capture.
SIPP_DTMF_FIRST = bytes.fromhex("80e5 1f30 000033e0 0e05384e 010a0000")


def test_parse_simple() -> None:
    p = RtpPacket.parse(SIMPLE)
    assert (p.version, p.padding, p.extension, p.marker) == (2, False, False, True)
    assert (p.payload_type, p.sequence_number, p.timestamp, p.ssrc) == (0, 0x1234, 320, 0xDEADBEEF)
    assert p.payload == b"\xff\x7f\x00\x01"
    assert p.csrc == []
    assert bytes(p) == SIMPLE


def test_parse_full_header() -> None:
    p = RtpPacket.parse(FULL)
    assert (p.padding, p.extension, p.marker, p.payload_type) == (True, True, False, 8)
    assert (p.sequence_number, p.timestamp, p.ssrc) == (65535, 0xFFFFFFFF, 1)
    assert p.csrc == [2, 3]
    assert (p.extension_profile, p.extension_value) == (0xBEDE, bytes.fromhex("10aa0000"))
    assert p.payload == b"\x01\x02"
    assert p.padding_size == 3
    assert bytes(p) == FULL


def test_parse_sipp_dtmf_packet() -> None:
    p = RtpPacket.parse(SIPP_DTMF_FIRST)
    assert (p.marker, p.payload_type, p.sequence_number, p.timestamp) == (True, 101, 0x1F30, 0x33E0)
    assert bytes(p) == SIPP_DTMF_FIRST


def test_serialize_matches_fast_path() -> None:
    p = RtpPacket(
        payload_type=8, marker=True, sequence_number=70000, timestamp=-1, ssrc=5, payload=b"ab"
    )
    assert bytes(p) == pack_rtp(8, True, 70000, -1, 5, b"ab")
    assert bytes(p)[2:8] == bytes.fromhex("1170 ffffffff")  # seq and ts wrap to their widths


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "RTP packet length is less than 12 bytes"),
        (SIMPLE[:11], "RTP packet length is less than 12 bytes"),
        (bytes([0x40]) + SIMPLE[1:], "RTP packet has invalid version"),
        (bytes([0x00]) + SIMPLE[1:], "RTP packet has invalid version"),
        (bytes([0x82]) + SIMPLE[1:12] + b"\x00\x00\x00\x01", "RTP packet has truncated CSRC"),
        (
            bytes([0x90]) + SIMPLE[1:12] + b"\xbe\xde",
            "RTP packet has truncated extension profile / length",
        ),
        (
            bytes([0x90]) + SIMPLE[1:12] + b"\xbe\xde\x00\x02\x00\x00\x00\x00",
            "RTP packet has truncated extension value",
        ),
        (bytes([0xA0]) + SIMPLE[1:12] + b"\x00", "RTP packet padding length is invalid"),
        (bytes([0xA0]) + SIMPLE[1:12] + b"\x00\x05", "RTP packet padding length is invalid"),
        (bytes([0xA0]) + SIMPLE[1:12], "RTP packet padding length is invalid"),
    ],
)
def test_parse_errors(data: bytes, message: str) -> None:
    with pytest.raises(RtpError) as info:
        RtpPacket.parse(data)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("packet", "message"),
    [
        (RtpPacket(payload_type=128), "RTP payload type must be within 0-127"),
        (RtpPacket(csrc=list(range(16))), "RTP packet has more than 15 CSRCs"),
        (
            RtpPacket(extension_profile=1, extension_value=b"abc"),
            "RTP extension value must be a multiple of 4 bytes",
        ),
        (RtpPacket(padding_size=256), "RTP padding size must be within 0-255"),
    ],
)
def test_serialize_errors(packet: RtpPacket, message: str) -> None:
    with pytest.raises(RtpError) as info:
        bytes(packet)
    assert str(info.value) == message


def test_padding_only_packet_and_empty_payload() -> None:
    p = RtpPacket(payload_type=0, padding_size=4)
    data = bytes(p)
    assert data[-4:] == b"\x00\x00\x00\x04" and len(data) == 16
    q = RtpPacket.parse(data)
    assert q.payload == b"" and q.padding_size == 4


def test_rtcp_detection() -> None:
    assert is_rtcp(bytes.fromhex("80c8 0006"))  # SR, PT 200
    assert not is_rtcp(SIMPLE)
    assert not is_rtcp(b"\x80")


def test_wrap_arithmetic() -> None:
    assert seq_diff(0, 65535) == 1
    assert seq_diff(65535, 0) == -1
    assert seq_diff(100, 100) == 0
    assert ts_diff(5, 0xFFFFFFFF) == 6
    assert ts_diff(0xFFFFFFF0, 0x10) == -32
    u = SequenceUnwrapper()
    assert [u.unwrap(s) for s in (65534, 65535, 0, 65533, 1, 2)] == [
        65534,
        65535,
        65536,
        65533,
        65537,
        65538,
    ]
    t = TimestampUnwrapper()
    assert [t.unwrap(x) for x in (0xFFFFFF00, 0x40, 0xFFFFFFF0)] == [
        0xFFFFFF00,
        0x100000040,
        0xFFFFFFF0,
    ]


def test_random_initial_values_vary() -> None:
    assert len({random_ssrc() for _ in range(20)}) > 15
    assert all(0 <= random_sequence() < 65536 for _ in range(50))
    assert all(0 <= random_timestamp() < 2**32 for _ in range(50))


def test_the_common_packet_fast_path_reads_every_field() -> None:
    """V=2 with no padding, extension or CSRC (first octet 0x80) skips the general parser:
    every field as the header says, and the bytes round-trip."""
    import random

    rnd = random.Random(3)
    for _ in range(200):
        pt, marker = rnd.randrange(128), rnd.random() < 0.5
        seq, ts, ssrc = rnd.randrange(1 << 16), rnd.randrange(1 << 32), rnd.randrange(1 << 32)
        payload = rnd.randbytes(rnd.choice((0, 1, 160, 320)))
        data = bytes([0x80, pt | (0x80 if marker else 0)])
        data += seq.to_bytes(2, "big") + ts.to_bytes(4, "big") + ssrc.to_bytes(4, "big")
        p = RtpPacket.parse(data + payload)
        assert (p.payload_type, p.marker, p.sequence_number, p.timestamp, p.ssrc) == (
            pt, marker, seq, ts, ssrc,
        )  # fmt: skip
        assert type(p.marker) is bool and type(p.payload) is bytes
        assert p.payload == payload and p.csrc == [] and not p.extension and not p.padding
        assert bytes(p) == data + payload
