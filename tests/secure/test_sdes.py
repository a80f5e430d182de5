"""SDES (RFC 4568 a=crypto) parsing and the SRTP offer/answer in gateway.sdp, per srtp mode."""

from __future__ import annotations

import base64

import pytest

from gateway import sdp
from gateway.sdp_crypto import (
    CryptoAttribute,
    CryptoError,
    SrtpMode,
    answer_stream,
    offer_attributes,
    pair,
    parse_crypto,
    redact_keys,
)

KEY = bytes(range(30))
B64 = base64.b64encode(KEY).decode()  # AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd
KEY2 = bytes(range(100, 130))
B64_2 = base64.b64encode(KEY2).decode()


def offer_sdp(proto: str = "RTP/SAVP", *crypto: str) -> sdp.SessionDescription:
    lines = [
        "v=0", "o=- 1 1 IN IP4 192.0.2.5", "s=-", "c=IN IP4 192.0.2.5", "t=0 0",
        f"m=audio 4000 {proto} 0 101", "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15",
        *[f"a=crypto:{c}" for c in crypto], "a=sendrecv",
    ]  # fmt: skip
    return sdp.parse("\r\n".join(lines) + "\r\n")


# --- the attribute -----------------------------------------------------------------------------
def test_parse_and_write_back() -> None:
    a = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}|2^20")
    assert (a.tag, a.suite, a.key, a.lifetime) == (1, "AES_CM_128_HMAC_SHA1_80", KEY, 1 << 20)
    assert str(a) == f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}|2^20"
    assert parse_crypto(str(a)) == a
    b = parse_crypto(f"7 AES_CM_128_HMAC_SHA1_32 inline:{B64}|1048576 WSH=128 -FOO=1")
    assert (b.lifetime, b.wsh) == (1 << 20, 128)  # "-" marks an optional parameter (§6.3.7)
    assert parse_crypto(f"2 AES_CM_128_HMAC_SHA1_80 INLINE:{B64} KDR=0").key == KEY


def test_repr_never_shows_the_key() -> None:
    a = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}")
    assert B64 not in repr(a) and repr(KEY) not in repr(a)
    assert "key" not in repr(a)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1 AES_CM_128_HMAC_SHA1_80", "needs a tag"),
        ("x AES_CM_128_HMAC_SHA1_80 inline:" + B64, "tag must be 1-9 digits"),
        ("1234567890 AES_CM_128_HMAC_SHA1_80 inline:" + B64, "tag must be 1-9 digits"),
        ("1 F8_128_HMAC_SHA1_80 inline:" + B64, "F8_128_HMAC_SHA1_80 is not supported"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64[:-4] + "!!!!", "not valid base64"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64[:-4], "needs a 30-byte key and salt, got 27"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|2^20|1:4", "MKI is not supported"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|1:4", "MKI is not supported"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}|1:4;inline:{B64}|2:4", "several master keys"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|2^49", "exceeds 2^48"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|0", "must be 1..2^48"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|2^x", "malformed key lifetime"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + "|2^" + "9" * 30, "malformed key lifetime"),
        ("1 AES_CM_128_HMAC_SHA1_80 uri:http://example.com/key", "only the inline key method"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + " KDR=24", "key derivation rate"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + " UNENCRYPTED_SRTP", "UNENCRYPTED_SRTP"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + " WSH=10", "WSH must be"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + B64 + " SOMETHING", "unknown session parameter"),
    ],
)
def test_unusable_attributes_say_why_without_the_key(value: str, reason: str) -> None:
    with pytest.raises(CryptoError, match=reason.replace("^", r"\^")) as info:
        parse_crypto(value)
    assert B64 not in str(info.value) and B64[:-4] not in str(info.value)


def test_redact_keys() -> None:
    text = f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{B64}|2^20 and inline:{B64_2}"
    out = redact_keys(text)
    assert B64 not in out and B64_2 not in out
    assert out == "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:[redacted]|2^20 and inline:[redacted]"


# --- the answerer's choice (RFC 4568 §7.1.2) ----------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "proto", "crypto", "accept", "encrypted"),
    [
        ("off", "RTP/SAVP", True, False, False),
        ("off", "RTP/AVP", True, True, False),  # a=crypto ignored: plain answer
        ("off", "RTP/AVP", False, True, False),
        ("optional", "RTP/SAVP", True, True, True),
        ("optional", "RTP/SAVP", False, False, False),
        ("optional", "RTP/AVP", True, True, True),  # best-effort SRTP
        ("optional", "RTP/AVP", False, True, False),
        ("required", "RTP/SAVP", True, True, True),
        ("required", "RTP/AVP", True, True, True),
        ("required", "RTP/AVP", False, False, False),
        ("required", "RTP/SAVPF", True, True, True),
    ],
)
def test_answer_stream_per_mode(
    mode: SrtpMode, proto: str, crypto: bool, accept: bool, encrypted: bool
) -> None:
    values = [f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}"] if crypto else []
    d = answer_stream(proto, values, mode)
    assert d.accept == accept, d
    assert (d.attribute is not None) == encrypted
    if not accept:
        assert d.reason


def test_answer_takes_the_first_acceptable_and_a_fresh_key() -> None:
    values = [
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}|2^20|1:4",  # MKI: skipped
        f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64}",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_2}",
    ]
    d = answer_stream("RTP/SAVP", values, "required")
    assert d.attribute is not None
    assert (d.attribute.tag, d.attribute.suite) == (2, "AES_CM_128_HMAC_SHA1_32")
    assert len(d.attribute.key) == 30 and d.attribute.key not in (KEY, KEY2)
    again = answer_stream("RTP/SAVP", values, "required")
    assert again.attribute is not None and again.attribute.key != d.attribute.key
    # A re-answer with the same suite keeps our key (§7.1.4), another suite gets a new one.
    kept = answer_stream("RTP/SAVP", values, "required", previous=d.attribute)
    assert kept.attribute is not None and kept.attribute.key == d.attribute.key
    other = CryptoAttribute(9, "AES_CM_128_HMAC_SHA1_80", KEY2)
    assert answer_stream("RTP/SAVP", values, "required", previous=other).attribute.key != KEY2  # type: ignore[union-attr]


def test_pair_matches_by_tag_either_way() -> None:
    offered = [f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}", f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64}"]
    answered = [f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_2}"]
    p = pair(remote=answered, local=offered)  # our offer, their answer
    assert (p.suite, p.send_key, p.recv_key) == ("AES_CM_128_HMAC_SHA1_32", KEY, KEY2)
    q = pair(remote=offered, local=answered)  # their offer, our answer
    assert (q.suite, q.send_key, q.recv_key) == ("AES_CM_128_HMAC_SHA1_32", KEY2, KEY)
    with pytest.raises(CryptoError, match="matches no offered"):
        pair([f"5 AES_CM_128_HMAC_SHA1_80 inline:{B64_2}"], offered)
    with pytest.raises(CryptoError, match="crypto-suite differs"):
        pair([f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_2}"], offered)
    assert "key" not in repr(p)


def test_offer_attributes_keep_their_keys_on_a_reoffer() -> None:
    first = offer_attributes()
    assert [(a.tag, a.suite) for a in first] == [
        (1, "AES_CM_128_HMAC_SHA1_80"), (2, "AES_CM_128_HMAC_SHA1_32")]  # fmt: skip
    assert first[0].key != first[1].key
    assert offer_attributes(first) == first
    assert offer_attributes()[0].key != first[0].key


# --- through gateway.sdp ------------------------------------------------------------------------
def test_srtp_required_answers_savp_with_one_crypto_and_pairs_keys() -> None:
    offer = offer_sdp("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}",
                      f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_2}")  # fmt: skip
    ans = sdp.answer(offer, "203.0.113.5", 10000, srtp="required")
    (m,) = ans.media
    assert m.proto == "RTP/SAVP"
    (value,) = m.attribute_values("crypto")
    mine = parse_crypto(value)
    assert (mine.tag, mine.suite) == (1, "AES_CM_128_HMAC_SHA1_80")
    assert m.attributes[-1] == ("sendrecv", None)  # the direction stays last
    params = sdp.negotiated(offer, ans)
    assert params.srtp is not None
    assert params.srtp.recv_key == KEY and params.srtp.send_key == mine.key
    assert sdp.parse(str(ans)) == ans  # round-trips


def test_srtp_required_refuses_a_plain_offer_488() -> None:
    with pytest.raises(sdp.SdpNegotiationError, match="SRTP is required") as info:
        sdp.answer(offer_sdp("RTP/AVP"), "203.0.113.5", 10000, srtp="required")
    assert info.value.status_code == 488


def test_srtp_off_refuses_savp_488_and_plain_is_unchanged() -> None:
    offer = offer_sdp("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}")
    with pytest.raises(sdp.SdpNegotiationError, match="SRTP is off"):
        sdp.answer(offer, "203.0.113.5", 10000)
    plain = offer_sdp("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}")
    ans = sdp.answer(plain, "203.0.113.5", 10000)
    assert not ans.media[0].attribute_values("crypto")
    assert sdp.negotiated(plain, ans).srtp is None


def test_bad_base64_is_488_and_the_reason_names_no_key() -> None:
    bad = f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64[:-4]}@@@@"
    with pytest.raises(sdp.SdpNegotiationError, match="not valid base64") as info:
        sdp.answer(offer_sdp("RTP/SAVP", bad), "203.0.113.5", 10000, srtp="optional")
    assert info.value.status_code == 488
    assert B64[:-4] not in str(info.value)


def test_savp_stream_skipped_for_a_plain_one_when_srtp_is_off() -> None:
    # An offer with an SRTP stream and a plain one: the plain one is answered (index pairing).
    text = str(offer_sdp("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}"))
    text += "m=audio 4002 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    offer = sdp.parse(text)
    ans = sdp.answer(offer, "203.0.113.5", 10000)
    assert [m.port for m in ans.media] == [0, 10000]
    params = sdp.negotiated(offer, ans)
    assert (params.remote_port, params.srtp) == (4002, None)


def test_sdp_errors_never_carry_keys() -> None:
    with pytest.raises(sdp.SdpError) as info:
        sdp.parse(f"v=0\r\no=- 1 1 IN IP4 1.2.3.4\r\ns=-\r\nt=0 0\r\na=crypto 1 X inline:{B64}\r\n")
    assert B64 not in str(info.value) and "inline:[redacted]" in str(info.value)


@pytest.mark.parametrize("mode", ["optional", "required"])
def test_outbound_offer_and_the_answer_to_it(mode: SrtpMode) -> None:
    offer = sdp.make_offer("192.0.2.1", 10000, srtp=mode)
    (m,) = offer.media
    assert m.proto == ("RTP/SAVP" if mode == "required" else "RTP/AVP")
    assert len(m.attribute_values("crypto")) == 2
    # A callee with SRTP answers with one of our tags: both keys are known.
    theirs = sdp.answer(offer, "198.51.100.7", 20000, srtp="optional")
    params = sdp.negotiated(theirs, offer)
    assert params.srtp is not None
    ours = {parse_crypto(v).tag: parse_crypto(v).key for v in m.attribute_values("crypto")}
    answered = parse_crypto(theirs.media[0].attribute_values("crypto")[0])
    assert params.srtp.send_key == ours[answered.tag] and params.srtp.recv_key == answered.key
    # A callee without SRTP answers plain: fine when optional, unusable when required.
    plain = sdp.answer(sdp.make_offer("192.0.2.1", 10000), "198.51.100.7", 20000)
    plain.media[0].proto = m.proto
    if mode == "optional":
        assert sdp.negotiated(plain, offer).srtp is None
    else:
        with pytest.raises(sdp.SdpNegotiationError, match="without a=crypto"):
            sdp.negotiated(plain, offer)
    # A re-offer keeps our keys.
    again = sdp.make_offer("192.0.2.1", 10000, srtp=mode, previous=offer)
    assert again.media[0].attribute_values("crypto") == m.attribute_values("crypto")


def test_reinvite_answer_keeps_our_key() -> None:
    offer = offer_sdp("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64}")
    a1 = sdp.answer(offer, "203.0.113.5", 10000, srtp="required")
    rekeyed = offer_sdp("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_2}")
    a2 = sdp.answer(rekeyed, "203.0.113.5", 10000, srtp="required", previous=a1)
    assert a2.media[0].attribute_values("crypto") == a1.media[0].attribute_values("crypto")
    p2 = sdp.negotiated(rekeyed, a2)
    assert p2.srtp is not None and p2.srtp.recv_key == KEY2
