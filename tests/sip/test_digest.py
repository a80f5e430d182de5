"""Digest against the RFCs' worked examples, and the 401/407 retry logic."""

from __future__ import annotations

from gateway.sip.digest import (
    Challenge,
    DigestAuthenticator,
    build_authorization,
    choose_challenge,
    digest_response,
    parse_challenges,
)
from gateway.sip.helpers import make_response
from gateway.sip.message import parse

from .util import request

# RFC 7616 §3.9.1 (HTTP, but the arithmetic is the same for SIP per RFC 8760).
RFC7616_CHALLENGES = (
    'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=SHA-256, '
    'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", '
    'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS", '
    'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=MD5, '
    'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", '
    'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
)
RFC7616_CNONCE = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"


def test_rfc7616_sha256_and_md5_examples() -> None:
    sha, md5 = parse_challenges(RFC7616_CHALLENGES)
    assert (sha.algorithm, md5.algorithm) == ("SHA-256", "MD5")
    assert sha.qop_options == ("auth", "auth-int")
    args = {
        "username": "Mufasa", "password": "Circle of Life", "method": "GET",
        "uri": "/dir/index.html", "cnonce": RFC7616_CNONCE, "nc": 1, "qop": "auth",
    }  # fmt: skip
    assert digest_response(sha, **args) == (  # type: ignore[arg-type]
        "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
    )
    assert digest_response(md5, **args) == "8ca523f5e9506fed4657c9700eebdbec"  # type: ignore[arg-type]
    assert choose_challenge([md5, sha]) is sha  # prefer SHA-256 whatever the order


def test_rfc2617_example() -> None:
    (c,) = parse_challenges(
        'Digest realm="testrealm@host.com", qop="auth,auth-int", '
        'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"'
    )
    value = build_authorization(
        c, username="Mufasa", password="Circle Of Life", method="GET",
        uri="/dir/index.html", cnonce="0a4f113b", nc=1,
    )  # fmt: skip
    assert value == (
        'Digest username="Mufasa", realm="testrealm@host.com", '
        'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", '
        'response="6629fae49393a05397450978507c4ef1", cnonce="0a4f113b", qop=auth, '
        'nc=00000001, opaque="5ccc069c403ebaf9f0171e9517f40e41"'
    )


def test_challenge_without_qop_uses_rfc2069_form() -> None:
    c = Challenge("Digest", (("realm", "r"), ("nonce", "n")))
    value = build_authorization(c, username="u", password="p", method="REGISTER", uri="sip:r")
    assert "qop" not in value and "nc=" not in value and "cnonce" not in value


def test_unsupported_challenges_are_skipped() -> None:
    cs = parse_challenges('Digest realm="r", nonce="n", algorithm=AKAv1-MD5, Basic realm="x"')
    assert [c.scheme for c in cs] == ["Digest", "Basic"]
    assert choose_challenge(cs) is None


def challenge_response(status: int, header: str, stale: bool = False, nonce: str = "n1") -> bytes:
    inv = request("INVITE")
    extra = f'Digest realm="sip.example.com", nonce="{nonce}", qop="auth", algorithm=SHA-256'
    if stale:
        extra += ", stale=TRUE"
    return bytes(make_response(inv, status, to_tag="x", headers=[(header, extra)]))


def test_authenticator_retries_once_and_handles_stale() -> None:
    auth = DigestAuthenticator("alice", "secret")
    inv = request("INVITE")
    resp = parse(challenge_response(407, "Proxy-Authenticate"))
    retry = auth.authorize(inv, resp)  # type: ignore[arg-type]
    assert retry is not None
    assert retry.cseq.seq == 2 and retry.top_via.branch != inv.top_via.branch
    value = retry.headers.get("Proxy-Authorization")
    assert value is not None and 'realm="sip.example.com"' in value and "nc=00000001" in value
    assert "algorithm=SHA-256" in value
    assert inv.headers.get("Proxy-Authorization") is None  # original untouched
    # Same realm challenged again, not stale: the credentials were refused. Give up.
    assert auth.authorize(retry, resp) is None  # type: ignore[arg-type]
    # stale=true: retry with the new nonce, replacing the old credentials.
    stale = parse(challenge_response(407, "Proxy-Authenticate", stale=True, nonce="n2"))
    again = auth.authorize(retry, stale)  # type: ignore[arg-type]
    assert again is not None and again.cseq.seq == 3
    (only,) = again.headers.get_all("Proxy-Authorization")
    assert 'nonce="n2"' in only


def test_authenticator_401_and_other_statuses() -> None:
    auth = DigestAuthenticator("alice", "secret")
    reg = request("REGISTER")
    retry = auth.authorize(reg, parse(challenge_response(401, "WWW-Authenticate")))  # type: ignore[arg-type]
    assert retry is not None and retry.headers.get("Authorization") is not None
    assert auth.authorize(reg, make_response(reg, 403)) is None
