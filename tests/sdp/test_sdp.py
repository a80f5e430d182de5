"""SDP parse/serialize (RFC 8866) and offer/answer (RFC 3264)."""

from __future__ import annotations

import pytest

from gateway.sdp import (
    Connection,
    MediaParams,
    SdpError,
    SdpNegotiationError,
    SdpProblem,
    SessionDescription,
    answer,
    choose_ptime,
    make_offer,
    negotiated,
    offer_changed,
    parse,
)


def sdp(*lines: str) -> str:
    return "".join(line + "\r\n" for line in lines)


HEAD = (
    "v=0",
    "o=alice 2890844526 2890844526 IN IP4 198.51.100.1",
    "s=-",
    "c=IN IP4 198.51.100.1",
    "t=0 0",
)


def offer_of(*media: str, head: tuple[str, ...] = HEAD) -> SessionDescription:
    return parse(sdp(*head, *media))


PCMU_PCMA_TE = (
    "m=audio 49170 RTP/AVP 0 8 101",
    "a=rtpmap:0 PCMU/8000",
    "a=rtpmap:8 PCMA/8000",
    "a=rtpmap:101 telephone-event/8000",
    "a=fmtp:101 0-16",
    "a=ptime:20",
    "a=sendrecv",
)

# RFC 4317 §2.1-style offer with audio and video (a real-world shape).
RFC4317_AV = sdp(
    "v=0",
    "o=alice 2890844526 2890844526 IN IP4 host.atlanta.example.com",
    "s=",
    "c=IN IP4 host.atlanta.example.com",
    "t=0 0",
    "m=audio 49170 RTP/AVP 0 8 97",
    "a=rtpmap:0 PCMU/8000",
    "a=rtpmap:8 PCMA/8000",
    "a=rtpmap:97 iLBC/8000",
    "m=video 51372 RTP/AVP 31 32",
    "a=rtpmap:31 H261/90000",
    "a=rtpmap:32 MPV/90000",
)


# -- parse / serialize -----------------------------------------------------------------------


def test_round_trip_canonical_is_byte_exact() -> None:
    text = sdp(*HEAD, *PCMU_PCMA_TE)
    s = parse(text)
    assert str(s) == text
    assert parse(str(s)) == s
    assert bytes(s) == text.encode()


def test_round_trip_rfc4317_and_fields() -> None:
    s = parse(RFC4317_AV)
    assert str(s) == RFC4317_AV
    assert s.name == ""
    assert s.origin.address == "host.atlanta.example.com"
    assert [m.media for m in s.media] == ["audio", "video"]
    assert s.media[1].rtpmaps[31].clock_rate == 90000


def test_round_trip_all_session_fields() -> None:
    text = sdp(
        "v=0",
        "o=- 1 2 IN IP6 2001:db8::1",
        "s=call",
        "i=info",
        "u=http://example.com/",
        "e=ops@example.com",
        "p=+1 555 0100",
        "c=IN IP6 2001:db8::1",
        "b=AS:64",
        "t=3034423619 3042462419",
        "r=604800 3600 0 90000",
        "t=0 0",
        "z=2882844526 -1h",
        "a=recvonly",
        "m=audio 5004/2 RTP/AVPF 0",
        "i=voice",
        "c=IN IP6 2001:db8::2",
        "b=TIAS:64000",
        "a=rtcp-fb:* nack",
    )
    s = parse(text)
    assert str(s) == text
    assert s.times[0][1] == ["604800 3600 0 90000"]
    assert s.media[0].port_count == 2
    assert s.direction == "recvonly"
    assert s.media_connection(s.media[0]) == Connection("IN", "IP6", "2001:db8::2")


def test_lf_only_and_unknown_letters_tolerated() -> None:
    text = (
        "v=0\no=- 1 1 IN IP4 10.0.0.1\ns=-\nc=IN IP4 10.0.0.1\nt=0 0\ny=0123\n"
        "m=audio 4000 RTP/AVP 0\n"
    )
    s = parse(text)
    assert s.media[0].port == 4000
    assert str(s).endswith("m=audio 4000 RTP/AVP 0\r\n")


def test_session_lines_out_of_rfc_order_accepted() -> None:
    s = parse(sdp("v=0", "s=-", "o=- 1 1 IN IP4 1.2.3.4", "t=0 0", "c=IN IP4 1.2.3.4"))
    assert s.connection == Connection("IN", "IP4", "1.2.3.4")
    assert str(s) == sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "s=-", "c=IN IP4 1.2.3.4", "t=0 0")


def test_derived_views() -> None:
    s = offer_of(*PCMU_PCMA_TE[:-2], "a=ptime:30", "a=maxptime:40", "a=inactive")
    m = s.media[0]
    assert m.rtpmaps[101].encoding == "telephone-event"
    assert m.fmtp == {101: "0-16"}
    assert m.ptime == 30
    assert m.maxptime == 40
    assert m.direction == "inactive"
    assert s.media_direction(m) == "inactive"


def test_static_payload_types_without_rtpmap() -> None:
    s = offer_of("m=audio 4000 RTP/AVP 8 0 13")
    maps = s.media[0].rtpmaps
    assert (maps[8].encoding, maps[0].encoding, maps[13].encoding) == ("PCMA", "PCMU", "CN")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty SDP"),
        (sdp("o=- 1 1 IN IP4 1.2.3.4", "v=0"), "SDP must start with a v= line"),
        (sdp("v=1", "o=- 1 1 IN IP4 1.2.3.4", "s=-", "t=0 0"), "unsupported SDP version: '1'"),
        (sdp("v=0", "s=-", "t=0 0"), "missing o= line"),
        (sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "t=0 0"), "missing s= line"),
        (sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "s=-"), "missing t= line"),
        (
            sdp("v=0", "o=- 1 IN IP4 1.2.3.4", "s=-", "t=0 0"),
            "invalid o= line: '- 1 IN IP4 1.2.3.4'",
        ),
        (
            sdp("v=0", "o=- 1 x IN IP4 1.2.3.4", "s=-", "t=0 0"),
            "invalid o= line: '- 1 x IN IP4 1.2.3.4'",
        ),
        (sdp(*HEAD[:3], "c=IN IP4 999.1.1.1", "t=0 0"), "invalid c= line: 'IN IP4 999.1.1.1'"),
        (sdp(*HEAD[:3], "c=IN IP4 2001:db8::1", "t=0 0"), "invalid c= line: 'IN IP4 2001:db8::1'"),
        (sdp(*HEAD[:3], "c=IN IP6 10.0.0.1", "t=0 0"), "invalid c= line: 'IN IP6 10.0.0.1'"),
        (sdp(*HEAD[:3], "c=IN IP4", "t=0 0"), "invalid c= line: 'IN IP4'"),
        (sdp(*HEAD[:3], "c=IN IPX 1.2.3.4", "t=0 0"), "invalid c= line: 'IN IPX 1.2.3.4'"),
        (sdp(*HEAD[:4], "t=now 0"), "invalid t= line: 'now 0'"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP"), "invalid m= line: 'audio 4000 RTP/AVP'"),
        (sdp(*HEAD, "m=audio 70000 RTP/AVP 0"), "invalid m= line: 'audio 70000 RTP/AVP 0'"),
        (sdp(*HEAD, "m=audio x RTP/AVP 0"), "invalid m= line: 'audio x RTP/AVP 0'"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0 abc"), "invalid RTP payload type in m= line: 'abc'"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 200"), "invalid RTP payload type in m= line: '200'"),
        (
            sdp(*HEAD, "m=audio 4000 RTP/AVP 96", "a=rtpmap:96 opus"),
            "invalid a=rtpmap value: '96 opus'",
        ),
        (
            sdp(*HEAD, "m=audio 4000 RTP/AVP 96", "a=rtpmap:x PCMU/8000"),
            "invalid a=rtpmap value: 'x PCMU/8000'",
        ),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a=ptime:abc"), "invalid a=ptime value: 'abc'"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a=maxptime:0"), "invalid a=maxptime value: '0'"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a=fmtp:x 0-15"), "invalid a=fmtp value: 'x 0-15'"),
        (
            sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a=sendonly", "a=recvonly"),
            "more than one direction attribute",
        ),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a=sendonly:1"), "a=sendonly takes no value"),
        (sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "a= ptime"), "invalid a= line: ' ptime'"),
        (
            sdp(*HEAD, "m=audio 4000 RTP/AVP 0", "s=again"),
            "s= line not allowed in a media section: 's=again'",
        ),
        (sdp(*HEAD, "garbage"), "invalid SDP line 6: 'garbage'"),
        (
            sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "o=- 1 1 IN IP4 1.2.3.4", "s=-", "t=0 0"),
            "duplicate o= line",
        ),
    ],
)
def test_malformed_exact_messages(text: str, message: str) -> None:
    with pytest.raises(SdpError) as info:
        parse(text)
    assert str(info.value) == message
    assert info.value.status_code == 400


def test_non_utf8_is_a_400() -> None:
    with pytest.raises(SdpError, match="not valid UTF-8"):
        parse(b"v=0\r\ns=\xff\r\n")


# -- answer ----------------------------------------------------------------------------------


def audio(s: SessionDescription, i: int = 0) -> tuple[list[str], dict[str, str | None]]:
    m = s.media[i]
    return m.formats, dict(m.attributes)


def test_answer_pcmu_pcma_te_picks_first_offered() -> None:
    a = answer(offer_of(*PCMU_PCMA_TE), "203.0.113.5", 10000)
    text = str(a)
    assert "c=IN IP4 203.0.113.5\r\n" in text
    assert "m=audio 10000 RTP/AVP 0 101\r\n" in text
    assert a.media[0].attribute_values("rtpmap") == ["0 PCMU/8000", "101 telephone-event/8000"]
    assert a.media[0].fmtp == {101: "0-16"}
    assert a.media[0].ptime == 20
    assert a.media[0].direction == "sendrecv"
    assert a.origin.address == "203.0.113.5" and a.origin.session_version == 1
    assert parse(str(a)) == a


def test_answer_prefer_overrides_offer_order() -> None:
    a = answer(offer_of(*PCMU_PCMA_TE), "203.0.113.5", 10000, prefer="PCMA")
    assert a.media[0].formats == ["8", "101"]


def test_answer_pcma_only_and_pcmu_only() -> None:
    a = answer(offer_of("m=audio 4000 RTP/AVP 8"), "203.0.113.5", 10000)
    assert a.media[0].formats == ["8"]
    b = answer(offer_of("m=audio 4000 RTP/AVP 0"), "203.0.113.5", 10000, prefer="PCMA")
    assert b.media[0].formats == ["0"]
    with pytest.raises(SdpNegotiationError, match="no common codec"):
        answer(offer_of("m=audio 4000 RTP/AVP 8"), "203.0.113.5", 10000, supported=("PCMU",))


def test_answer_order_follows_offer_pcma_first() -> None:
    a = answer(offer_of("m=audio 4000 RTP/AVP 8 0"), "203.0.113.5", 10000)
    assert a.media[0].formats == ["8"]


def test_answer_dynamic_pt_g711_by_name() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 96 97", "a=rtpmap:96 opus/48000/2", "a=rtpmap:97 pcmu/8000")
    a = answer(o, "203.0.113.5", 10000)
    assert a.media[0].formats == ["97"]
    assert a.media[0].attribute_values("rtpmap") == ["97 pcmu/8000"]
    p = negotiated(o, a)
    assert (p.codec, p.payload_type, p.recv_payload_type) == ("PCMU", 97, 97)


@pytest.mark.parametrize(("pt", "events"), [(101, "0-16"), (96, "0-15"), (127, "0-15,16")])
def test_answer_telephone_event_at_offered_pt(pt: int, events: str) -> None:
    o = offer_of(
        f"m=audio 4000 RTP/AVP 0 {pt}",
        f"a=rtpmap:{pt} telephone-event/8000",
        f"a=fmtp:{pt} {events}",
    )
    a = answer(o, "203.0.113.5", 10000)
    assert a.media[0].formats == ["0", str(pt)]
    assert a.media[0].fmtp == {pt: events}
    assert negotiated(o, a).dtmf_pt == pt


def test_answer_telephone_event_default_fmtp_and_wrong_rate_ignored() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0 101", "a=rtpmap:101 telephone-event/8000")
    assert answer(o, "203.0.113.5", 10000).media[0].fmtp == {101: "0-15"}
    o16 = offer_of("m=audio 4000 RTP/AVP 0 101", "a=rtpmap:101 telephone-event/16000")
    assert answer(o16, "203.0.113.5", 10000).media[0].formats == ["0"]


def test_no_common_codec_is_488_and_distinct() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 9 18", "a=rtpmap:9 G722/8000", "a=rtpmap:18 G729/8000")
    with pytest.raises(SdpNegotiationError) as info:
        answer(o, "203.0.113.5", 10000)
    assert str(info.value) == "no common codec: we support PCMU, PCMA"
    assert info.value.status_code == 488
    assert isinstance(info.value, SdpProblem) and not isinstance(info.value, SdpError)


def test_no_audio_stream_is_488() -> None:
    o = offer_of("m=video 4000 RTP/AVP 31")
    with pytest.raises(SdpNegotiationError, match="no audio stream in the offer"):
        answer(o, "203.0.113.5", 10000)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ((), 20),
        (("a=ptime:20",), 20),
        (("a=ptime:10",), 10),
        (("a=ptime:30",), 30),
        (("a=ptime:40",), 40),
        (("a=ptime:60",), 20),
        (("a=ptime:25",), 20),
        (("a=ptime:40", "a=maxptime:30"), 20),
        (("a=maxptime:10",), 10),
        (("a=ptime:30", "a=maxptime:60"), 30),
    ],
)
def test_answer_ptime(attrs: tuple[str, ...], expected: int) -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0", *attrs)
    a = answer(o, "203.0.113.5", 10000)
    assert a.media[0].ptime == expected
    assert negotiated(o, a).ptime_ms == expected


def test_choose_ptime_edges() -> None:
    assert choose_ptime(None, None) == 20
    assert choose_ptime(None, 5) == 10


@pytest.mark.parametrize(
    ("offered", "answered", "ours"),
    [
        ("sendrecv", "sendrecv", "sendrecv"),
        ("sendonly", "recvonly", "recvonly"),
        ("recvonly", "sendonly", "sendonly"),
        ("inactive", "inactive", "inactive"),
    ],
)
def test_direction_mirrors(offered: str, answered: str, ours: str) -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0", f"a={offered}")
    a = answer(o, "203.0.113.5", 10000)
    assert a.media[0].direction == answered
    p = negotiated(o, a)
    assert p.direction == ours
    assert p.on_hold == (ours in ("recvonly", "inactive"))


def test_session_level_direction_applies_and_media_level_wins() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0", head=(*HEAD, "a=sendonly"))
    assert answer(o, "203.0.113.5", 10000).media[0].direction == "recvonly"
    o2 = offer_of("m=audio 4000 RTP/AVP 0", "a=sendrecv", head=(*HEAD, "a=sendonly"))
    assert answer(o2, "203.0.113.5", 10000).media[0].direction == "sendrecv"


def test_hold_rfc2543_zero_address() -> None:
    head = (*HEAD[:3], "c=IN IP4 0.0.0.0", "t=0 0")
    o = offer_of("m=audio 4000 RTP/AVP 0", head=head)
    a = answer(o, "203.0.113.5", 10000)
    assert a.media[0].direction == "recvonly"
    p = negotiated(o, a)
    assert p.on_hold and p.direction == "recvonly" and p.remote_addr == "0.0.0.0"
    o2 = offer_of("m=audio 4000 RTP/AVP 0", "a=recvonly", head=head)
    assert answer(o2, "203.0.113.5", 10000).media[0].direction == "inactive"


def test_media_level_c_overrides_session_level() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0", "c=IN IP4 192.0.2.99")
    assert negotiated(o, answer(o, "203.0.113.5", 10000)).remote_addr == "192.0.2.99"
    no_session_c = (HEAD[0], HEAD[1], HEAD[2], "t=0 0")
    o2 = offer_of("m=audio 4000 RTP/AVP 0", "c=IN IP4 192.0.2.7", head=no_session_c)
    assert negotiated(o2).remote_addr == "192.0.2.7"
    o3 = offer_of("m=audio 4000 RTP/AVP 0", head=no_session_c)
    with pytest.raises(SdpError, match="no c= line"):
        answer(o3, "203.0.113.5", 10000)


def test_ipv6_offer_and_answer() -> None:
    head = ("v=0", "o=- 5 5 IN IP6 2001:db8::5", "s=-", "c=IN IP6 2001:db8::5", "t=0 0")
    o = offer_of("m=audio 4000 RTP/AVP 8", head=head)
    a = answer(o, "2001:db8::1", 10002)
    assert "c=IN IP6 2001:db8::1\r\n" in str(a)
    assert a.origin.addrtype == "IP6"
    p = negotiated(o, a)
    assert (p.remote_addr, p.remote_port, p.codec) == ("2001:db8::5", 4000, "PCMA")


def test_multiple_m_lines_video_rejected_order_kept() -> None:
    o = parse(RFC4317_AV)
    a = answer(o, "203.0.113.5", 10000)
    assert [(m.media, m.port) for m in a.media] == [("audio", 10000), ("video", 0)]
    assert a.media[1].formats == ["31", "32"]
    assert "m=video 0 RTP/AVP 31 32\r\n" in str(a)


def test_video_first_then_two_audio_streams() -> None:
    o = offer_of(
        "m=video 5000 RTP/AVP 96",
        "a=rtpmap:96 H264/90000",
        "m=audio 4000 RTP/SAVP 0",
        "m=audio 0 RTP/AVP 0",
        "m=audio 4002 RTP/AVP 8",
        "m=audio 4004 RTP/AVP 0",
        "m=application 9 UDP/BFCP *",
    )
    a = answer(o, "203.0.113.5", 10000)
    assert [(m.media, m.port) for m in a.media] == [
        ("video", 0),
        ("audio", 0),  # SRTP: not ours
        ("audio", 0),  # already rejected in the offer
        ("audio", 10000),
        ("audio", 0),  # one audio stream only
        ("application", 0),
    ]
    assert negotiated(o, a).remote_port == 4002


def test_reoffer_version_increments_and_unchanged_keeps_it() -> None:
    o = offer_of(*PCMU_PCMA_TE)
    a1 = answer(o, "203.0.113.5", 10000)
    a2 = answer(o, "203.0.113.5", 10000, previous=a1)
    assert a2.origin == a1.origin  # identical body: same version (RFC 3264 §8)
    hold = offer_of(*PCMU_PCMA_TE[:-1], "a=sendonly")
    a3 = answer(hold, "203.0.113.5", 10000, previous=a2)
    assert a3.origin.session_id == a1.origin.session_id
    assert a3.origin.session_version == a1.origin.session_version + 1
    assert a3.media[0].direction == "recvonly"


def test_offer_changed() -> None:
    o1 = offer_of(*PCMU_PCMA_TE)
    assert not offer_changed(o1, offer_of(*PCMU_PCMA_TE))
    bumped = ("v=0", "o=alice 2890844526 2890844527 IN IP4 198.51.100.1", *HEAD[2:])
    assert offer_changed(o1, offer_of(*PCMU_PCMA_TE, head=bumped))


def test_comfort_noise_only_when_asked() -> None:
    o = offer_of("m=audio 4000 RTP/AVP 0 13 101", "a=rtpmap:101 telephone-event/8000")
    assert answer(o, "203.0.113.5", 10000).media[0].formats == ["0", "101"]
    a = answer(o, "203.0.113.5", 10000, comfort_noise=True)
    assert a.media[0].formats == ["0", "101", "13"]
    assert negotiated(o, a).cn_pt == 13


def test_avpf_accepted_with_same_proto() -> None:
    a = answer(offer_of("m=audio 4000 RTP/AVPF 0"), "203.0.113.5", 10000)
    assert a.media[0].proto == "RTP/AVPF"


# -- offer (outbound) ------------------------------------------------------------------------


def test_make_offer_and_remote_answer() -> None:
    off = make_offer("203.0.113.5", 10000, ("PCMA", "PCMU"), 20)
    text = str(off)
    assert "m=audio 10000 RTP/AVP 8 0 101\r\n" in text
    assert "a=fmtp:101 0-16\r\n" in text and "a=ptime:20\r\n" in text
    assert parse(text) == off
    remote = offer_of(
        "m=audio 30000 RTP/AVP 0 96",
        "a=rtpmap:96 telephone-event/8000",
        "a=fmtp:96 0-15",
        "a=ptime:30",
        head=("v=0", "o=bob 1 1 IN IP4 192.0.2.20", "s=-", "c=IN IP4 192.0.2.20", "t=0 0"),
    )
    p = negotiated(remote, off)
    assert p == MediaParams(
        remote_addr="192.0.2.20",
        remote_port=30000,
        payload_type=0,
        codec="PCMU",
        clock_rate=8000,
        dtmf_pt=96,
        ptime_ms=30,
        direction="sendrecv",
        recv_payload_type=0,
        recv_dtmf_pt=101,
        cn_pt=None,
    )
    assert negotiated(remote).codec == "PCMU"


def test_make_offer_hold_reoffer_and_validation() -> None:
    first = make_offer("203.0.113.5", 10000)
    hold = make_offer("203.0.113.5", 10000, direction="sendonly", previous=first)
    assert hold.origin.session_version == first.origin.session_version + 1
    assert hold.media[0].direction == "sendonly"
    with pytest.raises(ValueError, match="ptime"):
        make_offer("203.0.113.5", 10000, ptime=25)
    with pytest.raises(ValueError, match="codecs"):
        make_offer("203.0.113.5", 10000, ("G729",))


def test_negotiated_dtmf_only_if_both_sides() -> None:
    off = make_offer("203.0.113.5", 10000, dtmf_pt=None)
    remote = offer_of("m=audio 30000 RTP/AVP 0 101", "a=rtpmap:101 telephone-event/8000")
    assert negotiated(remote, off).dtmf_pt is None


def test_negotiated_rejected_audio() -> None:
    with pytest.raises(SdpNegotiationError, match="no active audio stream"):
        negotiated(offer_of("m=audio 0 RTP/AVP 0"))
