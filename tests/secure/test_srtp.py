"""SRTP on the RTP path: gateway.rtp.srtp round trips against libsrtp sessions of the test's own
(pylibsrtp used directly, not through our wrapper), counts what it drops, and an RtpEndpoint
with negotiated keys puts SRTP on a real UDP socket and plays what arrives protected."""

from __future__ import annotations

import asyncio
import secrets
import socket

import numpy as np
import pylibsrtp
import pytest

from gateway.rtp.codecs import get_codec
from gateway.rtp.endpoint import RtpEndpoint
from gateway.rtp.packet import RtpPacket, pack_rtp
from gateway.rtp.srtp import SrtpContext, srtp_for
from gateway.sdp import MediaParams
from gateway.sdp_crypto import SrtpParams

SUITES = {
    "AES_CM_128_HMAC_SHA1_80": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 10),
    "AES_CM_128_HMAC_SHA1_32": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 4),
}


def peer_sessions(suite: str, ours: SrtpParams) -> tuple[pylibsrtp.Session, pylibsrtp.Session]:
    """The far end's (tx, rx): it sends with the key we receive with, and vice versa."""
    profile, _ = SUITES[suite]
    tx = pylibsrtp.Session(
        pylibsrtp.Policy(
            key=ours.recv_key, srtp_profile=profile, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND
        )
    )
    rx = pylibsrtp.Session(
        pylibsrtp.Policy(
            key=ours.send_key, srtp_profile=profile, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND
        )
    )
    return tx, rx


def params(suite: str = "AES_CM_128_HMAC_SHA1_80") -> SrtpParams:
    return SrtpParams(suite, send_key=secrets.token_bytes(30), recv_key=secrets.token_bytes(30))


def rtp(seq: int, payload: bytes = b"\xff" * 160, ssrc: int = 0x1234) -> bytes:
    return pack_rtp(0, False, seq, seq * 160, ssrc, payload)


@pytest.mark.parametrize("suite", list(SUITES))
def test_round_trip_both_ways(suite: str) -> None:
    p = params(suite)
    ctx = SrtpContext(p)
    tx, rx = peer_sessions(suite, p)
    _, tag = SUITES[suite]
    for seq in range(100, 110):
        plain = rtp(seq, bytes([seq]) * 160)
        out = ctx.protect(plain)
        assert out is not None and len(out) == len(plain) + tag
        assert out[12:172] != plain[12:172]  # the payload is encrypted
        assert rx.unprotect(out) == plain
        assert ctx.unprotect(tx.protect(plain)) == plain
    # SRTCP (rtcp-mux): a receiver report from the peer comes out plain (80-bit tag always).
    rr = bytes([0x80, 201, 0, 1]) + (0x5678).to_bytes(4, "big")
    assert ctx.unprotect(tx.protect_rtcp(rr)) == rr
    assert ctx.stats.auth_failures == ctx.stats.replays == ctx.stats.errors == 0


def test_drops_are_counted_never_raised() -> None:
    p = params()
    ctx = SrtpContext(p)
    tx, _ = peer_sessions("AES_CM_128_HMAC_SHA1_80", p)
    first = tx.protect(rtp(1))
    assert ctx.unprotect(first) is not None
    assert ctx.unprotect(first) is None  # the same packet again
    assert ctx.stats.replays == 1
    tampered = bytearray(tx.protect(rtp(2)))
    tampered[20] ^= 0x01
    assert ctx.unprotect(bytes(tampered)) is None
    wrong_key, _ = peer_sessions("AES_CM_128_HMAC_SHA1_80", params())
    assert ctx.unprotect(wrong_key.protect(rtp(3))) is None
    assert ctx.unprotect(rtp(4)) is None  # plain RTP: no valid tag
    assert ctx.stats.auth_failures == 3
    assert ctx.unprotect(b"\x80\x00") is None  # too short to be anything
    assert ctx.unprotect(b"\x80" * 3000) is None  # longer than libsrtp's buffer
    rtcp_forged = bytes([0x80, 200, 0, 6]) + b"\0" * 30
    assert ctx.unprotect(rtcp_forged) is None
    assert ctx.stats.errors + ctx.stats.auth_failures == 6
    # And it still works for the next good packet.
    assert ctx.unprotect(tx.protect(rtp(5))) == rtp(5)


def test_rekey_keeps_an_unchanged_direction() -> None:
    p = params()
    ctx = SrtpContext(p)
    tx, rx = peer_sessions("AES_CM_128_HMAC_SHA1_80", p)
    assert ctx.unprotect(tx.protect(rtp(1))) is not None
    # The peer rekeys its direction (a re-INVITE with a new a=crypto key); ours stays.
    new = SrtpParams(p.suite, send_key=p.send_key, recv_key=secrets.token_bytes(30))
    assert srtp_for(new, ctx) is ctx
    tx2, _ = peer_sessions(p.suite, new)
    assert ctx.unprotect(tx2.protect(rtp(2))) is not None
    assert ctx.unprotect(tx.protect(rtp(3))) is None  # the old key no longer works
    assert rx.unprotect(ctx.protect(rtp(7)) or b"") == rtp(7)  # same outbound session
    assert srtp_for(None, ctx) is None


def _media_params(port: int, srtp: SrtpParams | None) -> MediaParams:
    return MediaParams("127.0.0.1", port, 0, "PCMU", dtmf_pt=None, srtp=srtp)


async def test_endpoint_sends_srtp_on_the_wire_and_plays_what_arrives() -> None:
    p = params()
    tx, rx = peer_sessions(p.suite, p)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    ep = await RtpEndpoint.open("127.0.0.1", (30000, 32000))
    loop = asyncio.get_running_loop()
    try:
        session = ep.configure(_media_params(peer.getsockname()[1], p))
        tone = (8000 * np.sin(np.arange(160) * 2 * np.pi * 440 / 8000)).astype(np.int16)
        session.pacer.source = lambda n, _at: tone[:n]
        session.start(loop.time())
        now = loop.time()
        for _ in range(5):
            ep.tick(now)
            now += 0.02
        packets = []
        for _ in range(50):
            try:
                packets.append(peer.recv(2048))
            except BlockingIOError:
                if len(packets) >= 3:
                    break
                await asyncio.sleep(0.02)
        assert len(packets) >= 3
        codec = get_codec("PCMU")
        for wire in packets:
            header = RtpPacket.parse(wire)  # the RTP header is in the clear (RFC 3711 §3.1)
            assert len(header.payload) == 160 + 10  # ciphertext + 80-bit tag
            plain = RtpPacket.parse(rx.unprotect(wire))
            assert plain.payload != header.payload[:160]
            assert np.abs(codec.decode(plain.payload)).max() > 5000  # the tone, decrypted
        # Inbound: protected packets are played, forged ones dropped and counted.
        for seq in range(10, 16):
            peer.sendto(tx.protect(rtp(seq, codec.encode(tone))), ("127.0.0.1", ep.local_port))
        peer.sendto(rtp(16, codec.encode(tone)), ("127.0.0.1", ep.local_port))  # plain
        for _ in range(100):
            if session.jitter.stats().received >= 6 and ep.srtp and ep.srtp.stats.auth_failures:
                break
            await asyncio.sleep(0.01)
        assert session.jitter.stats().received == 6
        assert ep.srtp is not None and ep.srtp.stats.auth_failures == 1
        assert session.invalid == 0
    finally:
        ep.close()
        peer.close()
