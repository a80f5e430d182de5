"""Offer checks (sans-I/O): every refusal names its reason."""

from __future__ import annotations

import pytest

from gateway.legs.webrtc.offer import OfferError, check_offer

# A browser-shaped offer (Chromium's layout, trimmed): audio with Opus + G.711, a data channel.
CHROME = "\r\n".join(
    [
        "v=0",
        "o=- 4611731400430051336 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "a=group:BUNDLE 0 1",
        "a=extmap-allow-mixed",
        "a=msid-semantic: WMS 1d2c",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
        "c=IN IP4 0.0.0.0",
        "a=rtcp:9 IN IP4 0.0.0.0",
        "a=candidate:1 1 udp 2122260223 192.0.2.2 50000 typ host generation 0",
        "a=ice-ufrag:abcd",
        "a=ice-pwd:abcdefghijklmnopqrstuvwx",
        "a=ice-options:trickle",
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
        "a=setup:actpass",
        "a=mid:0",
        "a=sendrecv",
        "a=msid:1d2c 7f1e",
        "a=rtcp-mux",
        "a=rtpmap:111 opus/48000/2",
        "a=rtcp-fb:111 transport-cc",
        "a=fmtp:111 minptime=10;useinbandfec=1",
        "a=rtpmap:63 red/48000/2",
        "a=rtpmap:9 G722/8000",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:13 CN/8000",
        "a=rtpmap:110 telephone-event/48000",
        "a=rtpmap:126 telephone-event/8000",
        "a=ssrc:1234 cname:x",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "c=IN IP4 0.0.0.0",
        "a=ice-ufrag:abcd",
        "a=ice-pwd:abcdefghijklmnopqrstuvwx",
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
        "a=setup:actpass",
        "a=mid:1",
        "a=sctp-port:5000",
        "",
    ]
)


def offer(sdp: str = CHROME, **extra: object) -> dict[str, object]:
    return {"sdp": sdp, "type": "offer", **extra}


def test_browser_offer_is_accepted_with_opus() -> None:
    checked = check_offer(offer())
    assert checked.codec == "opus"
    assert checked.has_datachannel
    assert checked.sends_audio


def test_g711_only_offer_falls_back() -> None:
    sdp = CHROME.replace("111 63 9 0 8 13 110 126", "0 8 126").replace(
        "a=rtpmap:111 opus/48000/2\r\n", ""
    )
    assert check_offer(offer(sdp)).codec == "pcmu"
    # Static payload type without an rtpmap line (RFC 3551) still counts.
    sdp2 = sdp.replace("0 8 126", "8 126").replace("a=rtpmap:8 PCMA/8000\r\n", "")
    assert check_offer(offer(sdp2)).codec == "pcma"


def test_recvonly_offer_does_not_send_audio() -> None:
    assert not check_offer(offer(CHROME.replace("a=sendrecv", "a=recvonly"))).sends_audio


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"sdp": CHROME}, "'type' must be \"offer\""),
        ({"sdp": CHROME, "type": "answer"}, "'type' must be \"offer\""),
        ({"type": "offer"}, "'sdp' must be a non-empty string"),
        ({"sdp": 42, "type": "offer"}, "'sdp' must be a non-empty string"),
        (offer(candidate="x"), "unknown field 'candidate'"),
        (offer("hello"), "malformed SDP"),
        (offer("v=0\r\nm=audio\r\n"), "malformed SDP"),
        (offer("x" * 70000), "over 65536 bytes"),
    ],
)
def test_bad_bodies(body: dict[str, object], reason: str) -> None:
    with pytest.raises(OfferError, match=reason.replace("(", r"\(")):
        check_offer(body)


def without_audio(sdp: str) -> str:
    head, _, rest = sdp.partition("m=audio")
    return head + "m=application" + rest.partition("m=application")[2]


@pytest.mark.parametrize(
    ("sdp", "reason"),
    [
        (without_audio(CHROME), "no audio m-line"),
        (CHROME.replace("m=audio 9 ", "m=audio 0 "), "no audio m-line"),
        (CHROME.replace("UDP/TLS/RTP/SAVPF", "RTP/AVP"), "DTLS-SRTP"),
        (CHROME.replace("a=ice-ufrag:abcd\r\n", ""), "no ICE credentials"),
        (CHROME.replace("a=fingerprint:", "a=x-fingerprint:"), "no DTLS fingerprint"),
        (
            CHROME.replace("111 63 9 0 8 13 110 126", "9 13").replace(
                "a=rtpmap:0 PCMU/8000\r\n", ""
            ),
            "no common audio codec: offered .*G722",
        ),
    ],
)
def test_unusable_offers(sdp: str, reason: str) -> None:
    with pytest.raises(OfferError, match=reason):
        check_offer(offer(sdp))


def test_session_level_ice_and_fingerprint_are_enough() -> None:
    # RFC 8839 §5.4: credentials may sit at session level instead.
    lines = CHROME.split("\r\n")
    moved = [ln for ln in lines if ln.startswith(("a=ice-ufrag", "a=ice-pwd", "a=fingerprint"))]
    rest = [ln for ln in lines if ln not in moved]
    at = rest.index("t=0 0") + 1
    sdp = "\r\n".join([*rest[:at], *dict.fromkeys(moved), *rest[at:]])
    assert check_offer(offer(sdp)).codec == "opus"
