"""Symmetric RTP latching and its anti-hijack rule."""

from __future__ import annotations

from gateway.rtp.latch import SymmetricLatch
from gateway.rtp.packet import RtpPacket

SDP = ("192.0.2.10", 4000)  # what the phone advertised
NAT = ("198.51.100.7", 61000)  # where its packets really come from
EVIL = ("203.0.113.66", 5555)


def pkt(ssrc: int = 1, seq: int = 0, pt: int = 0) -> RtpPacket:
    return RtpPacket(payload_type=pt, sequence_number=seq, ssrc=ssrc)


def test_sends_to_sdp_until_first_valid_packet_then_latches() -> None:
    latch = SymmetricLatch(SDP, {0, 101})
    assert latch.remote == SDP
    assert not latch.accept(pkt(pt=96), NAT, 0.0)  # wrong PT never latches
    assert latch.remote == SDP
    assert latch.accept(pkt(), NAT, 0.1)
    assert latch.remote == NAT and latch.ssrc == 1


def test_no_hijack_while_the_source_is_alive() -> None:
    latch = SymmetricLatch(SDP, {0})
    latch.accept(pkt(ssrc=1, seq=1), NAT, 0.0)
    for i in range(10):
        assert not latch.accept(pkt(ssrc=666, seq=100 + i), EVIL, 0.02 * i)
        assert latch.accept(pkt(ssrc=1, seq=2 + i), NAT, 0.02 * i)
    assert latch.remote == NAT and latch.rejected == 10


def test_nat_rebinding_with_same_ssrc_relatches_at_once() -> None:
    latch = SymmetricLatch(SDP, {0})
    latch.accept(pkt(ssrc=1), NAT, 0.0)
    moved = ("198.51.100.7", 61002)
    assert latch.accept(pkt(ssrc=1, seq=1), moved, 0.02)
    assert latch.remote == moved and latch.relatches == 1


def test_new_ssrc_elsewhere_after_silence_needs_probation() -> None:
    latch = SymmetricLatch(SDP, {0}, relatch_after=1.0, probation=2)
    latch.accept(pkt(ssrc=1), NAT, 0.0)
    new = ("198.51.100.9", 40000)
    assert not latch.accept(pkt(ssrc=2, seq=10), new, 0.5)  # source still recent
    assert not latch.accept(pkt(ssrc=2, seq=11), new, 1.5)  # silent long enough: candidate
    assert not latch.accept(pkt(ssrc=2, seq=20), new, 1.52)  # not consecutive: start over
    assert latch.accept(pkt(ssrc=2, seq=21), new, 1.54)  # second in a row: re-latch
    assert latch.remote == new and latch.ssrc == 2


def test_same_address_new_ssrc_is_a_restart() -> None:
    latch = SymmetricLatch(SDP, {0})
    latch.accept(pkt(ssrc=1), NAT, 0.0)
    assert latch.accept(pkt(ssrc=9), NAT, 0.02)
    assert latch.ssrc == 9


def test_reset_for_reinvite_and_hold_without_address() -> None:
    latch = SymmetricLatch(None, {0})
    assert latch.remote is None
    latch.accept(pkt(), NAT, 0.0)
    assert latch.remote == NAT
    latch.reset(("192.0.2.50", 7000), {8})
    assert latch.remote == ("192.0.2.50", 7000)
    assert not latch.accept(pkt(pt=0), NAT, 1.0)
    assert latch.accept(pkt(pt=8), NAT, 1.0)
