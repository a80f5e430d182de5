"""RFC 4733 telephone-events: decoder robustness, encoder train, sipp capture fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.rtp.dtmf import (
    DtmfDecoder,
    DtmfDigit,
    TelephoneEvent,
    TelephoneEventError,
    dtmf_train,
    event_code,
)
from gateway.rtp.packet import RtpPacket
from tests.rtp.pcap import SIPP_DIR, read_udp


def ev_packet(
    seq: int, ts: int, event: int, duration: int, *, end: bool = False, marker: bool = False
) -> RtpPacket:
    return RtpPacket(
        101, marker, seq & 0xFFFF, ts, 42, bytes(TelephoneEvent(event, end, 10, duration))
    )


def press(event: int, ts: int, seq0: int, updates: int = 5, step: int = 160) -> list[RtpPacket]:
    """A typical press: marker, growing durations, three end packets (new seq each)."""
    out = [ev_packet(seq0 + i, ts, event, step * (i + 1), marker=i == 0) for i in range(updates)]
    total = step * (updates + 1)
    out += [ev_packet(seq0 + updates + i, ts, event, total, end=True) for i in range(3)]
    return out


def feed_all(dec: DtmfDecoder, pkts: list[RtpPacket]) -> list[DtmfDigit]:
    out: list[DtmfDigit] = []
    for i, p in enumerate(pkts):
        out += dec.feed(p, i * 0.02)
    return out


def test_payload_wire_format() -> None:
    ev = TelephoneEvent.parse(bytes.fromhex("018a08c0"))
    assert ev == TelephoneEvent(event=1, end=True, volume=10, duration=2240)
    assert bytes(ev) == bytes.fromhex("018a08c0")
    assert bytes(TelephoneEvent(11, False, 63, 65535)) == bytes.fromhex("0b3fffff")
    assert TelephoneEvent.parse(bytes.fromhex("05c00010")).volume == 0  # R bit ignored
    with pytest.raises(TelephoneEventError, match="shorter than 4 bytes"):
        TelephoneEvent.parse(b"\x01\x0a\x00")


def test_one_report_per_press_with_marker() -> None:
    dec = DtmfDecoder()
    assert feed_all(dec, press(5, 1000, 10)) == [DtmfDigit("5", 120, 1000)]


def test_without_marker_bit() -> None:
    pkts = press(9, 1000, 10)
    pkts = [
        RtpPacket(p.payload_type, False, p.sequence_number, p.timestamp, p.ssrc, p.payload)
        for p in pkts
    ]
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("9", 120, 1000)]


def test_end_retransmissions_with_same_seq_are_deduped() -> None:
    pkts = press(11, 1000, 10)
    pkts[-2].sequence_number = pkts[-1].sequence_number = pkts[-3].sequence_number
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("#", 120, 1000)]


def test_start_packets_lost() -> None:
    pkts = press(0, 1000, 10)[3:]  # marker and two updates lost
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("0", 120, 1000)]


def test_only_end_packet_received() -> None:
    pkts = press(10, 1000, 10)[-1:]
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("*", 120, 1000)]


def test_all_end_packets_lost_reported_at_next_event_or_timeout() -> None:
    first = press(1, 1000, 10)[:-3]
    second = press(2, 5000, 18)
    out = feed_all(DtmfDecoder(), first + second)
    assert out == [DtmfDigit("1", 100, 1000), DtmfDigit("2", 120, 5000)]
    dec = DtmfDecoder(timeout=0.5)
    assert feed_all(dec, first) == []
    assert dec.poll(0.3) == []
    assert dec.poll(0.7) == [DtmfDigit("1", 100, 1000)]
    assert dec.poll(2.0) == []


def test_reordered_durations_and_late_duplicates() -> None:
    pkts = press(4, 1000, 10)
    pkts[1], pkts[2] = pkts[2], pkts[1]
    pkts.append(pkts[0])  # a stray late copy of the first packet after the end
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("4", 120, 1000)]


def test_same_digit_twice_is_two_presses() -> None:
    out = feed_all(DtmfDecoder(), press(7, 1000, 10) + press(7, 3000, 18))
    assert [d.digit for d in out] == ["7", "7"]


def test_long_event_segments_join() -> None:
    # §2.5.1.5: a press longer than the 16-bit duration continues in a new segment.
    seg1 = [ev_packet(10, 1000, 3, 40000), ev_packet(11, 1000, 3, 65535)]
    seg2 = [ev_packet(12, 1000 + 65535, 3, 8000), ev_packet(13, 1000 + 65535, 3, 8000, end=True)]
    out = feed_all(DtmfDecoder(), seg1 + seg2)
    assert out == [DtmfDigit("3", round((65535 + 8000) / 8), 1000)]


def test_flash_and_tone_events() -> None:
    out = feed_all(
        DtmfDecoder(), [ev_packet(1, 10, 16, 800, end=True), ev_packet(2, 20, 66, 800, end=True)]
    )
    assert out == [DtmfDigit("!", 100, 10)]


def test_invalid_payload_counted() -> None:
    dec = DtmfDecoder()
    assert dec.feed(RtpPacket(101, False, 1, 1, 1, b"\x01"), 0.0) == []
    assert dec.invalid == 1


def test_train_shape() -> None:
    train = dtmf_train("5", 100, ptime_ms=20)
    evs = [TelephoneEvent.parse(p) for _, p in train]
    assert [m for m, _ in train] == [True] + [False] * 6
    assert [e.duration for e in evs] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in evs] == [False] * 4 + [True] * 3
    assert all(e.event == 5 and e.volume == 10 for e in evs)


def test_train_shorter_than_one_packet_and_errors() -> None:
    train = dtmf_train("#", 20, ptime_ms=20)
    assert len(train) == 3 and train[0][0] and TelephoneEvent.parse(train[0][1]).end
    with pytest.raises(ValueError, match="not a DTMF digit"):
        dtmf_train("x")
    with pytest.raises(ValueError, match="duration"):
        dtmf_train("1", 9000)
    assert event_code("a") == 12 and event_code("!") == 16


@pytest.mark.parametrize("digit", list("0123456789*#ABCD"))
def test_encode_decode_round_trip(digit: str) -> None:
    train = dtmf_train(digit, 160, ptime_ms=30)
    pkts = [RtpPacket(101, m, 100 + i, 8000, 1, p) for i, (m, p) in enumerate(train)]
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit(digit, 160, 8000)]


SIPP_NAMES = [f"dtmf_2833_{d}" for d in "0123456789"] + ["dtmf_2833_star", "dtmf_2833_pound"]


@pytest.mark.skipif(not SIPP_DIR.is_dir(), reason="sipp pcaps not installed (apt sip-tester)")
@pytest.mark.parametrize("name", SIPP_NAMES)
def test_sipp_dtmf_pcaps(name: str) -> None:
    digit = {"star": "*", "pound": "#"}.get(name.rsplit("_", 1)[1], name[-1])
    records = read_udp(SIPP_DIR / f"{name}.pcap")
    pkts = [RtpPacket.parse(r.payload) for r in records]
    assert all(p.payload_type == 101 for p in pkts)
    assert all(bytes(p) == r.payload for p, r in zip(pkts, records, strict=True))
    out = []
    dec = DtmfDecoder()
    for r, p in zip(records, pkts, strict=True):
        out += dec.feed(p, r.time)
    # sipp's capture: 8 packets, marker first, three identical end packets, 2240 units.
    assert out == [DtmfDigit(digit, 280, pkts[0].timestamp)]
    assert dec.poll(records[-1].time + 10) == []


def test_sipp_first_packet_bytes_inline() -> None:
    """The same fixture typed in, so the test runs without sip-tester installed."""
    data = [
        "80e51f30000033e00e05384e010a0000",
        "80651f31000033e00e05384e010a0140",
        "80651f37000033e00e05384e018a08c0",
        "80651f37000033e00e05384e018a08c0",
        "80651f37000033e00e05384e018a08c0",
    ]
    pkts = [RtpPacket.parse(bytes.fromhex(h)) for h in data]
    assert feed_all(DtmfDecoder(), pkts) == [DtmfDigit("1", 280, 0x33E0)]


def test_pcap_reader_rejects_non_pcap(tmp_path: Path) -> None:
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"\x00" * 24)
    with pytest.raises(ValueError, match="not a classic pcap"):
        read_udp(bad)
