"""RtpSession (sans-I/O) wired from a real offer/answer, two sessions talking with a fake clock."""

from __future__ import annotations

import numpy as np

from dsp.g711 import alaw_decode, alaw_encode
from gateway.rtp.dtmf import DtmfDigit
from gateway.rtp.packet import RtpPacket
from gateway.rtp.session import RtpSession
from gateway.sdp import answer, make_offer, negotiated, parse

A_IP, B_IP = "192.0.2.1", "192.0.2.2"
B_NAT = ("198.51.100.9", 62000)  # B's packets really come from here


def pair(ptime: int = 20) -> tuple[RtpSession, RtpSession]:
    offer = make_offer(B_IP, 20000, ("PCMA", "PCMU"), ptime)  # B calls out to A
    offer = parse(str(offer))
    ans = answer(offer, A_IP, 10000)
    a = RtpSession(negotiated(offer, ans))  # A answered
    b = RtpSession(negotiated(ans, offer))
    return a, b


def test_sessions_exchange_audio_dtmf_and_latch() -> None:
    a, b = pair()
    assert (a.params.codec, a.params.payload_type, a.params.dtmf_pt) == ("PCMA", 8, 101)
    assert a.remote == (B_IP, 20000)
    t0 = 10.0
    a.start(t0)
    b.start(t0 + 0.005)
    pcm = (6000 * np.sin(np.arange(8000) * 2 * np.pi * 300 / 8000)).astype(np.int16)
    b.pacer.enqueue(pcm)
    b.pacer.end_utterance()
    heard: list[np.ndarray] = []
    digits: list[DtmfDigit] = []
    dtmf_sent = False
    while True:
        now = min(a.next_due, b.next_due)
        if now > t0 + 1.6:
            break
        if not dtmf_sent and now > t0 + 0.4:
            b.pacer.send_dtmf("7", duration_ms=120)
            dtmf_sent = True
        if a.next_due <= now:
            res = a.tick(now)
            if res.frame.kind == "audio":
                heard.append(res.frame.pcm)
            digits += res.digits
            if res.packet is not None:
                b.receive(res.packet, (A_IP, 10000), now + 0.001)
        if b.next_due <= now:
            res = b.tick(now)
            if res.packet is not None:
                digits += a.receive(res.packet, B_NAT, now + 0.001)
    assert a.remote == B_NAT  # latched to the real source, not the SDP address
    got = np.concatenate(heard)
    ref = alaw_decode(alaw_encode(pcm))
    # A hears B's utterance intact (the DTMF train holds B's audio back but loses none)
    assert np.array_equal(got[: ref.size], ref)
    assert digits == [DtmfDigit("7", 120, digits[0].start_ts)]
    st = a.stats()
    assert st["inbound"]["lost"] == 0 and st["latch"]["latched"]


def test_garbage_rtcp_and_foreign_packets_ignored() -> None:
    a, _ = pair()
    assert a.receive(b"\x00\x01", ("1.2.3.4", 1), 0.0) == []
    assert a.receive(bytes.fromhex("80c80006") + bytes(20), ("1.2.3.4", 1), 0.0) == []
    foreign = bytes(RtpPacket(payload_type=96, sequence_number=1, ssrc=5, payload=b"x"))
    assert a.receive(foreign, ("1.2.3.4", 1), 0.0) == []
    s = a.stats()
    assert (s["invalid"], s["rtcp"], s["latch"]["rejected"], s["latch"]["latched"]) == (
        1,
        1,
        1,
        False,
    )


def test_remote_hold_stops_sending_and_resume() -> None:
    offer = make_offer(B_IP, 20000)
    a = RtpSession(negotiated(offer, answer(offer, A_IP, 10000)))
    a.start(0.0)
    assert a.tick(0.0).packet is not None and a.remote is not None
    hold = make_offer(B_IP, 20000, direction="sendonly", previous=offer)
    a.update(negotiated(hold, answer(hold, A_IP, 10000)))
    assert a.remote is None
    assert a.tick(0.02).packet is None
    a.update(negotiated(offer, answer(offer, A_IP, 10000)))
    assert a.tick(0.04).packet is not None
