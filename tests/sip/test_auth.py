"""Inbound digest authentication (gateway.sip.auth) on a fake clock: RFC 7616 §3.9.1 vectors,
challenges, our own UAC (gateway.sip.digest) answering them with either algorithm, nonce
expiry (stale=true), nonce-count replays, the bounded replay table, and broken Authorization
headers (a verdict, never an exception)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sip.auth import (
    Account,
    AccountError,
    DigestServer,
    NonceCounts,
    NonceIssuer,
    parse_users_file,
)
from gateway.sip.digest import (
    Challenge,
    DigestAuthenticator,
    build_authorization,
    hash_hex,
    parse_challenges,
    response_from_ha1,
)
from gateway.sip.message import Request, Response
from tests.sip.util import request

REALM = "voxgate"
URI = "sip:ivr@192.0.2.20"


def server(*accounts: Account, **kw: object) -> DigestServer:
    accounts = accounts or (Account.with_password("alice", REALM, "secret"),)
    return DigestServer(accounts, realm=REALM, **kw)  # type: ignore[arg-type]


def invite(cseq: int = 1, *, authorization: str | None = None, from_user: str = "alice") -> Request:
    req = request("INVITE", uri=URI, cseq=cseq)
    req.headers.set("From", f"<sip:{from_user}@example.com>;tag=fromtag1")
    if authorization is not None:
        req.headers.add("Authorization", authorization)
    return req


def challenges_of(resp: Response) -> list[Challenge]:
    out: list[Challenge] = []
    for value in resp.headers.get_all("WWW-Authenticate"):
        out.extend(parse_challenges(value))
    return out


def answer(
    srv: DigestServer, now: float, *, password: str = "secret", algorithm: str = "SHA-256",
    user: str = "alice", nc: int = 1, uri: str = URI, req: Request | None = None,
) -> Request:  # fmt: skip
    """The INVITE again with credentials for the chosen challenge of a fresh 401."""
    first = req or invite()
    resp = srv.response(first, srv.verify(first, now), now)
    (chosen,) = [c for c in challenges_of(resp) if c.algorithm == algorithm]
    value = build_authorization(chosen, username=user, password=password, method="INVITE",
                                uri=uri, nc=nc)  # fmt: skip
    return invite(2, authorization=value)


# --- vectors --------------------------------------------------------------------------------------
def test_rfc7616_vectors_from_ha1() -> None:
    """RFC 7616 §3.9.1, from a stored HA1 rather than the password (what the server keeps)."""
    args = {
        "nonce": "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", "method": "GET",
        "uri": "/dir/index.html", "cnonce": "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
        "nc": 1, "qop": "auth",
    }  # fmt: skip
    for alg, expected in (
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ):
        ha1 = hash_hex(alg, "Mufasa:http-auth@example.org:Circle of Life")
        assert response_from_ha1(alg, ha1, **args) == expected  # type: ignore[arg-type]


def test_rfc7616_vector_is_a_right_digest_with_a_foreign_nonce() -> None:
    """The RFC's own Authorization, against a server holding Mufasa: the digest checks out
    (so it is "stale", not "failed": the nonce is not one of ours), and with another password
    on file it fails."""
    value = (
        'Digest username="Mufasa", realm="http-auth@example.org", uri="sip:ivr@192.0.2.20", '
        'algorithm=SHA-256, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001,'
        ' cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="{}", '
        'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
    )
    ha1 = hash_hex("SHA-256", "Mufasa:http-auth@example.org:Circle of Life")
    resp = response_from_ha1("SHA-256", ha1, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
                             method="INVITE", uri=URI, nc=1, qop="auth",
                             cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ")  # fmt: skip
    right = Account.with_password("Mufasa", "http-auth@example.org", "Circle of Life")
    wrong = Account.with_password("Mufasa", "http-auth@example.org", "circle of life")
    req = invite(authorization=value.format(resp))
    assert server(right).verify(req, 0.0).outcome == "stale"
    assert server(wrong).verify(req, 0.0).outcome == "failed"


# --- challenges -----------------------------------------------------------------------------------
def test_401_offers_sha256_then_md5_with_one_nonce() -> None:
    srv = server()
    req = invite(from_user="stranger")
    verdict = srv.verify(req, 5.0)
    assert (verdict.outcome, verdict.is_failure) == ("missing", False)
    resp = srv.response(req, verdict, 5.0)
    assert resp.status == 401 and resp.to_addr.tag
    found = challenges_of(resp)
    assert [c.algorithm for c in found] == ["SHA-256", "MD5"]
    assert {c.nonce for c in found} == {found[0].nonce}
    assert all(c.realm == REALM and c.qop_options == ("auth",) and not c.stale for c in found)


@pytest.mark.parametrize("algorithm", ["SHA-256", "MD5"])
def test_our_uac_authenticates_with_either_algorithm(algorithm: str) -> None:
    srv = server()
    verdict = srv.verify(answer(srv, 1.0, algorithm=algorithm), 1.5)
    assert (verdict.outcome, verdict.username) == ("ok", "alice")


def test_the_uac_picks_sha256_from_our_401() -> None:
    srv = server()
    first = invite()
    resp = srv.response(first, srv.verify(first, 0.0), 0.0)
    retry = DigestAuthenticator("alice", "secret").authorize(first, resp)
    assert retry is not None
    assert "algorithm=SHA-256" in (retry.headers.get("Authorization") or "")
    assert srv.verify(retry, 0.1).ok


def test_wrong_password_and_unknown_user_fail() -> None:
    srv = server()
    bad = srv.verify(answer(srv, 0.0, password="guess"), 0.1)
    assert (bad.outcome, bad.is_failure, bad.username) == ("failed", True, "alice")
    nobody = srv.verify(answer(srv, 0.0, user="mallory"), 0.1)
    assert (nobody.outcome, nobody.is_failure) == ("failed", True)
    again = srv.response(invite(), bad, 0.2)
    assert again.status == 401 and not any(c.stale for c in challenges_of(again))


def test_an_md5_only_user_is_challenged_with_md5_only() -> None:
    """An htdigest account (MD5 HA1) or one with algorithms=MD5 gets one MD5 challenge when
    the request names it (old clients read only the first challenge); an answer with an
    algorithm it has no secret for gets that challenge again, not a failure."""
    ha1 = hash_hex("MD5", f"bob:{REALM}:pw")
    srv = server(Account.with_ha1("bob", REALM, md5=ha1),
                 Account.with_password("carol", REALM, "pw", algorithms=("MD5",)),
                 Account.with_password("alice", REALM, "secret"))  # fmt: skip
    for user in ("bob", "carol"):
        first = invite(from_user=user)
        found = challenges_of(srv.response(first, srv.verify(first, 0.0), 0.0))
        assert [c.algorithm for c in found] == ["MD5"], user
    # bob answers a SHA-256 challenge (from a 401 that did not name him):
    sha = answer(srv, 0.0, user="bob", password="pw", algorithm="SHA-256")
    verdict = srv.verify(sha, 0.1)
    assert (verdict.outcome, verdict.is_failure, verdict.username) == ("missing", False, "bob")
    assert [c.algorithm for c in challenges_of(srv.response(sha, verdict, 0.1))] == ["MD5"]
    assert srv.verify(answer(srv, 0.0, user="bob", password="pw", algorithm="MD5"), 0.1).ok


# --- nonces ---------------------------------------------------------------------------------------
def test_expired_nonce_is_stale_only_with_the_right_password() -> None:
    srv = server(nonce_ttl_s=300.0)
    right = answer(srv, 0.0)
    assert srv.verify(right, 300.0).ok
    late = answer(srv, 0.0, nc=1)
    verdict = srv.verify(late, 300.5)
    assert (verdict.outcome, verdict.is_failure) == ("stale", False)
    resp = srv.response(late, verdict, 300.5)
    assert resp.status == 401 and all(c.stale for c in challenges_of(resp))
    # The fresh nonce of that 401 works at once.
    assert srv.verify(answer(srv, 300.5, req=late), 301.0).ok
    # A wrong password with an expired nonce is a failure, never stale.
    assert srv.verify(answer(srv, 0.0, password="guess"), 400.0).outcome == "failed"


def test_nonces_are_signed() -> None:
    issuer = NonceIssuer(b"k" * 32, ttl_s=60)
    nonce = issuer.issue(12.345)
    assert issuer.issued_ms(nonce) == 12345
    flipped = nonce[:-2] + ("A" if nonce[-2] != "A" else "B") + nonce[-1]
    for bad in (flipped, nonce[:-1], nonce + "A", "", "x" * 43, "é" * 43):
        assert issuer.issued_ms(bad) is None, bad
    assert NonceIssuer(b"j" * 32).issued_ms(nonce) is None  # another gateway's
    assert not issuer.expired(12345, 72.3) and issuer.expired(12345, 72.4)


def test_a_nonce_from_another_gateway_is_stale_not_failed() -> None:
    """A phone that authenticated with a gateway since restarted (or a sibling behind the
    same dispatcher) carries a nonce we cannot verify: a silent retry, no lockout."""
    other = server(secret=b"1" * 32)
    req = answer(other, 0.0)
    assert server(secret=b"2" * 32).verify(req, 0.1).outcome == "stale"


def test_a_replayed_nonce_count_is_rejected() -> None:
    srv = server()
    first = invite()
    resp = srv.response(first, srv.verify(first, 0.0), 0.0)
    (sha,) = [c for c in challenges_of(resp) if c.algorithm == "SHA-256"]

    def with_nc(nc: int) -> Request:
        value = build_authorization(sha, username="alice", password="secret", method="INVITE",
                                    uri=URI, nc=nc, cnonce="fixedcnonce")  # fmt: skip
        return invite(nc + 1, authorization=value)

    assert srv.verify(with_nc(1), 1.0).ok
    replay = srv.verify(with_nc(1), 1.1)
    assert (replay.outcome, replay.is_failure) == ("replayed", False)
    assert srv.response(with_nc(1), replay, 1.1).status == 401
    assert srv.verify(with_nc(5), 1.2).ok
    assert srv.verify(with_nc(3), 1.3).ok  # out of order within the window: fine
    assert srv.verify(with_nc(3), 1.4).outcome == "replayed"
    assert srv.verify(with_nc(100), 1.5).ok
    assert srv.verify(with_nc(37), 1.6).ok  # 63 below the top: the window's oldest slot
    assert srv.verify(with_nc(36), 1.7).outcome == "replayed"  # below the window: refused


def test_a_qop_less_answer_is_good_once() -> None:
    """RFC 2069 style (no qop, no nc): the nonce cannot be counted, so it is single-use."""
    srv = server()
    first = invite()
    resp = srv.response(first, srv.verify(first, 0.0), 0.0)
    (md5,) = [c for c in challenges_of(resp) if c.algorithm == "MD5"]
    plain = Challenge(md5.scheme, tuple((n, v) for n, v in md5.params if n != "qop"))
    value = build_authorization(plain, username="alice", password="secret", method="INVITE",
                                uri=URI)  # fmt: skip
    assert "qop" not in value
    assert srv.verify(invite(2, authorization=value), 0.1).ok
    assert srv.verify(invite(3, authorization=value), 0.2).outcome == "replayed"


def test_the_replay_table_is_bounded_and_fails_closed() -> None:
    counts = NonceCounts(size=2)
    assert counts.use("n1", 10, 1) and counts.use("n2", 20, 1) and counts.use("n3", 30, 1)
    assert len(counts) == 2 and counts.evicted == 1 and counts.watermark_ms == 10
    # n1's counts are forgotten: any use of it could be a replay, so it is refused ...
    assert not counts.use("n1", 10, 2)
    # ... while nonces issued after the watermark are still counted.
    assert counts.use("n4", 40, 1) and counts.use("n4", 40, 2) and not counts.use("n4", 40, 2)
    counts.forget_expired(oldest_ms=35)
    assert len(counts) == 1


def test_the_replay_table_holds_through_a_server() -> None:
    srv = server(max_nonces=1)
    a = answer(srv, 0.0)
    b = answer(srv, 0.1)  # a second nonce pushes the first out
    assert srv.verify(a, 0.2).ok and srv.verify(b, 0.3).ok
    assert srv.verify(a, 0.4).outcome == "replayed"


# --- broken input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        ("Digest", "malformed"),
        ('Digest username="alice', "malformed"),
        ("Digest =x", "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}"', "malformed"),
        (f'Digest username="alice", username="bob", realm="{REALM}"', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}", response="00",'
         ' qop=auth-int, nc=00000001, cnonce="c"', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}", response="00",'
         ' qop=auth, nc=1, cnonce="c"', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}", response="00",'
         ' qop=auth, nc=00000000, cnonce="c"', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}", response="zz",'
         ' algorithm=MD5', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="sip:x@evil.example",'
         f' response="{"0" * 32}", algorithm=MD5', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}",'
         f' response="{"0" * 32}", userhash=true', "malformed"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}",'
         f' response="{"0" * 32}", algorithm=MD5-sess', "missing"),
        ("Basic YWxpY2U6c2VjcmV0", "missing"),
        ('Digest username="alice", realm="elsewhere", nonce="n", uri="x", response="0"',
         "missing"),
        (f'Digest username="alice", realm="{REALM}", nonce="n", uri="{URI}",'
         f' response="{"0" * 32}", algorithm=MD5', "failed"),
    ],
)  # fmt: skip
def test_broken_credentials_get_a_verdict(value: str, outcome: str) -> None:
    srv = server()
    req = invite(authorization=value)
    verdict = srv.verify(req, 0.0)
    assert verdict.outcome == outcome, verdict
    resp = srv.response(req, verdict, 0.0)
    assert resp.status == (400 if outcome == "malformed" else 401)
    assert resp.reason.isprintable() and resp.to_addr.tag


_PARAMS = ["username", "realm", "nonce", "uri", "response", "qop", "nc", "cnonce", "algorithm",
           "opaque", "userhash", "stale", "x"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.lists(
            st.tuples(st.sampled_from(_PARAMS),
                      st.one_of(st.text(max_size=40), st.sampled_from([REALM, URI, "auth"])),
                      st.booleans()),
            max_size=10,
        ).map(lambda ps: "Digest " + ", ".join(
            f'{n}="{v}"' if quoted else f"{n}={v}" for n, v, quoted in ps)),
    )
)  # fmt: skip
def test_any_authorization_value_gets_a_verdict(value: str) -> None:
    srv = server()
    req = invite()
    req.headers.add("Authorization", value)
    verdict = srv.verify(req, 0.0)
    assert verdict.outcome in ("missing", "failed", "malformed", "stale")
    assert srv.response(req, verdict, 0.0).status in (400, 401)


# --- accounts -------------------------------------------------------------------------------------
def test_users_file_formats() -> None:
    md5 = hash_hex("MD5", f"bob:{REALM}:pw")
    sha = hash_hex("SHA-256", "carol:other:pw")
    text = f"# people\n\nalice:secret\nbob::{md5}\ncarol:other::{sha}\n"
    alice, bob, carol = parse_users_file(text, REALM)
    assert (alice.username, alice.realm, alice.secret("MD5")) == (
        "alice", REALM, hash_hex("MD5", f"alice:{REALM}:secret"))  # fmt: skip
    assert (bob.realm, bob.secret("MD5"), bob.secret("SHA-256")) == (REALM, md5, None)
    assert (carol.realm, carol.secret("MD5"), carol.secret("SHA-256")) == ("other", None, sha)
    srv = server(alice, bob, carol)
    assert srv.realms == (REALM, "other")
    carol_first = invite(from_user="carol")
    found = challenges_of(srv.response(carol_first, srv.verify(carol_first, 0.0), 0.0))
    assert [(c.realm, c.algorithm) for c in found] == [("other", "SHA-256")]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("alice:secret\nbob\n", "line 2"),
        ("a:b:c:d:e\n", "line 1"),
        ("bob:voxgate:nothex\n", "line 1"),
        ("bob:voxgate::\n", "line 1"),
        ('"x:secret\n', "line 1"),
        ("alice:\n", "line 1"),
    ],
)
def test_users_file_errors_name_the_line(text: str, where: str) -> None:
    with pytest.raises(AccountError, match=where):
        parse_users_file(text, REALM)


def test_server_refuses_unusable_accounts() -> None:
    alice = Account.with_password("alice", REALM, "x")
    with pytest.raises(AccountError, match="twice"):
        DigestServer([alice, alice], realm=REALM)
    md5_only = Account.with_ha1("bob", REALM, md5="0" * 32)
    with pytest.raises(AccountError, match="no secret"):
        DigestServer([md5_only], realm=REALM, algorithms=("SHA-256",))
    with pytest.raises(AccountError, match="unsupported"):
        DigestServer([alice], realm=REALM, algorithms=("SHA-1",))
