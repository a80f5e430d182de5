"""Per-source admission limits (gateway.sip.limits) on a fake clock, alone and in front of the
transaction layer (no transaction, no event for a refused request)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.legs.sip.transport import SipTransport
from gateway.sip.events import RequestReceived
from gateway.sip.helpers import make_response
from gateway.sip.layer import TransactionLayer, quick_refusal
from gateway.sip.limits import (
    LimitSettings,
    LruTable,
    Rate,
    Refusal,
    SourceLimits,
    TokenBucket,
    _is_power_of_ten,
    peek_method,
)
from gateway.sip.message import Response, parse
from tests.sip.util import ALICE, BOB, drain, request, transmits
from voxgate.contract.config import ConfigError, GatewayConfig

EVE = ("198.51.100.7", 5060)


def settings(**kw: object) -> LimitSettings:
    base: dict[str, object] = {
        "rates": (("INVITE", Rate(10.0, 5)), ("REGISTER", Rate(2.0, 2)), ("OPTIONS", Rate(0, 0))),
    }
    base.update(kw)
    return LimitSettings(**base)  # type: ignore[arg-type]


def check(
    limits: SourceLimits,
    ip: str,
    method: str,
    now: float,
    *,
    new_dialog: bool = True,
    transactions: int = 0,
) -> str | None:
    """The refusal's reason, None when admitted."""
    refusal = limits.check(ip, method, new_dialog=new_dialog, now=now, transactions=transactions)
    return None if refusal is None else refusal.reason


# --- the pieces ---------------------------------------------------------------------------------
def test_token_bucket_burst_then_rate() -> None:
    b = TokenBucket(3, now=0.0)
    assert [b.take(2.0, 3, 0.0) for _ in range(4)] == [True, True, True, False]
    assert not b.take(2.0, 3, 0.4)  # 0.8 of a token back
    assert b.take(2.0, 3, 0.5)  # one whole token
    assert not b.take(2.0, 3, 0.5)
    # A long quiet spell refills to the burst, never beyond it.
    assert [b.take(2.0, 3, 100.0) for _ in range(4)] == [True, True, True, False]


def test_lru_table_forgets_least_recent() -> None:
    t: LruTable[str, int] = LruTable(2)
    t.put("a", 1)
    t.put("b", 2)
    assert t.get("a") == 1  # a is now the most recent
    t.put("c", 3)
    assert "b" not in t and "a" in t and "c" in t
    assert len(t) == 2 and t.evicted == 1
    with pytest.raises(ValueError):
        LruTable(0)


def test_power_of_ten() -> None:
    assert [n for n in range(1, 2001) if _is_power_of_ten(n)] == [1, 10, 100, 1000]


# --- rate limits ------------------------------------------------------------------------------
def test_rate_limit_per_source_and_method() -> None:
    limits = SourceLimits(settings())
    a, e = ALICE[0], EVE[0]
    assert [check(limits, e, "INVITE", 0.0) for _ in range(6)] == [None] * 5 + ["rate"]
    # Another source, another method, and methods without a limit are untouched.
    assert check(limits, a, "INVITE", 0.0) is None
    assert check(limits, e, "REGISTER", 0.0) is None
    assert check(limits, e, "BYE", 0.0) is None
    assert all(check(limits, e, "OPTIONS", 0.0) is None for _ in range(100))  # rate 0: off
    # 10/s: a token every 100 ms.
    assert check(limits, e, "INVITE", 0.05) == "rate"
    assert check(limits, e, "INVITE", 0.1) is None
    assert limits.refused_counts() == {"rate": 2, "calls": 0, "lockout": 0, "table": 0}


def test_refusal_carries_the_action() -> None:
    for action, drop in (("reject", False), ("drop", True)):
        limits = SourceLimits(settings(action=action, retry_after_s=7))
        for _ in range(5):
            limits.check(EVE[0], "INVITE", new_dialog=True, now=0.0)
        refusal = limits.check(EVE[0], "INVITE", new_dialog=True, now=0.0)
        assert refusal is not None
        assert (refusal.reason, refusal.drop, refusal.retry_after_s) == ("rate", drop, 7)


def test_spoofed_sources_cannot_grow_the_tables() -> None:
    limits = SourceLimits(settings(max_sources=100))
    for i in range(10000):
        ip = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        check(limits, ip, "INVITE", i / 1000)
        limits.auth_failed(ip, i / 1000)
    assert limits.tracked <= 200  # buckets + auth records, each table at most 100


def test_transaction_table_bound() -> None:
    limits = SourceLimits(settings(max_transactions=50))
    assert check(limits, ALICE[0], "BYE", 0.0, transactions=49) is None
    assert check(limits, ALICE[0], "BYE", 0.0, transactions=50) == "table"


# --- calls per source -------------------------------------------------------------------------
def test_call_cap_per_source() -> None:
    limits = SourceLimits(settings(calls_per_source=2, rates=()))
    ip = EVE[0]
    limits.call_started(ip)
    limits.call_started(ip)
    assert check(limits, ip, "INVITE", 0.0) == "calls"
    # A re-INVITE (To tag) in a call already up is not a new call.
    assert check(limits, ip, "INVITE", 0.0, new_dialog=False) is None
    assert check(limits, ALICE[0], "INVITE", 0.0) is None
    limits.call_ended(ip)
    assert limits.calls(ip) == 1
    assert check(limits, ip, "INVITE", 0.0) is None
    limits.call_ended(ip)
    limits.call_ended(ip)  # one too many never goes negative
    assert limits.calls(ip) == 0
    uncapped = SourceLimits(settings(calls_per_source=0))
    for _ in range(1000):
        uncapped.call_started(ip)
    assert uncapped.call_admitted(ip)


# --- failed-auth lockout ------------------------------------------------------------------------
def test_lockout_after_failures_then_expiry() -> None:
    limits = SourceLimits(settings(auth_failures=3, auth_window_s=10.0, lockout_s=60.0))
    ip = EVE[0]
    assert not limits.auth_failed(ip, 0.0)
    assert not limits.auth_failed(ip, 1.0)
    assert limits.auth_failed(ip, 2.0)
    assert check(limits, ip, "INVITE", 3.0) == "lockout"
    assert check(limits, ip, "OPTIONS", 3.0) == "lockout"
    assert check(limits, ip, "MESSAGE", 3.0) == "lockout"
    # What ends or acknowledges a call already up still gets through.
    for method in ("ACK", "CANCEL", "BYE"):
        assert check(limits, ip, method, 3.0) is None
    assert check(limits, ALICE[0], "INVITE", 3.0) is None
    assert limits.locked_out(ip, 61.9)
    assert not limits.locked_out(ip, 62.0)
    assert check(limits, ip, "INVITE", 62.0) is None
    assert limits.refused["lockout"] == 3


def test_failures_outside_the_window_do_not_add_up() -> None:
    limits = SourceLimits(settings(auth_failures=3, auth_window_s=10.0))
    ip = EVE[0]
    for t in (0.0, 5.0, 20.0, 25.0, 40.0):
        assert not limits.auth_failed(ip, t)
    limits.auth_succeeded(ip)
    assert not limits.auth_failed(ip, 41.0)
    assert not limits.auth_failed(ip, 42.0)  # the success wiped the earlier failure
    assert not limits.locked_out(ip, 42.0)
    off = SourceLimits(settings(auth_failures=0))
    assert not any(off.auth_failed(ip, 0.0) for _ in range(100))


# --- config -----------------------------------------------------------------------------------
def test_settings_from_config_and_validation() -> None:
    cfg = GatewayConfig(limit_action="drop", limit_invite_rate=5.0, limit_invite_burst=8,
                        limit_calls_per_source=3, max_transactions=99)  # fmt: skip
    cfg.validate()
    s = LimitSettings.from_config(cfg)
    assert s.action == "drop" and dict(s.rates)["INVITE"] == Rate(5.0, 8)
    assert s.calls_per_source == 3 and s.max_transactions == 99
    for bad in (
        {"limit_action": "ignore"},
        {"limit_invite_rate": -1.0},
        {"limit_options_burst": 0},
        {"limit_calls_per_source": -1},
        {"max_transactions": 0},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            GatewayConfig(**bad).validate()  # type: ignore[arg-type]


def test_defaults_allow_a_call_centre() -> None:
    """100 new calls a second from one trunk, for a minute, are never refused."""
    limits = SourceLimits(LimitSettings.from_config(GatewayConfig()))
    refused = [check(limits, "127.0.0.1", "INVITE", i / 100) for i in range(6000)]
    assert refused.count(None) == 6000
    # A burst of 200 at once is taken too; the 201st waits for the bucket.
    burst = SourceLimits(LimitSettings.from_config(GatewayConfig()))
    assert [check(burst, "192.0.2.1", "INVITE", 0.0) for _ in range(201)].count(None) == 200


# --- in front of the transaction layer ------------------------------------------------------------
def invite_bytes(i: int, sent_by: str = "198.51.100.7:5060") -> bytes:
    return bytes(request("INVITE", branch=f"z9hG4bKflood{i}", sent_by=sent_by,
                         call_id=f"flood-{i}@x", from_tag=f"t{i}"))  # fmt: skip


def layer_with(limits: SourceLimits) -> TransactionLayer:
    return TransactionLayer(limits=limits)


def test_layer_refuses_without_a_transaction() -> None:
    limits = SourceLimits(settings(retry_after_s=9))
    layer = layer_with(limits)
    for i in range(200):
        layer.receive(invite_bytes(i), EVE, 0.0)
    events = drain(layer)
    admitted = [e for e in events if isinstance(e, RequestReceived)]
    assert len(admitted) == 5
    assert layer.transaction_count == 5
    replies = [parse(t.data) for t in transmits(events)]
    refusals = [r for r in replies if isinstance(r, Response) and r.status == 503]
    assert len(refusals) == 195
    assert all(r.headers.get("Retry-After") == "9" and r.to_addr.tag for r in refusals)
    assert limits.refused["rate"] == 195
    # While the source is over its rate even a retransmission is shed (it is flooding) ...
    layer.receive(invite_bytes(0), EVE, 0.0)
    assert limits.refused["rate"] == 196
    # ... once it has tokens again a retransmission is absorbed by its transaction, spending
    # none: five new INVITEs still fit in the refilled burst.
    layer.receive(invite_bytes(0), EVE, 1.0)
    assert not any(isinstance(e, RequestReceived) for e in drain(layer))
    for i in range(300, 306):
        layer.receive(invite_bytes(i), EVE, 1.0)
    assert len([e for e in drain(layer) if isinstance(e, RequestReceived)]) == 5
    assert limits.refused["rate"] == 197
    assert layer.transaction_count == 10
    # The ACK for a refused INVITE's 503 matches nothing and creates nothing.
    ack = request("ACK", branch="z9hG4bKflood7", sent_by="198.51.100.7:5060",
                  call_id="flood-7@x", from_tag="t7", to_tag="x")  # fmt: skip
    layer.receive(bytes(ack), EVE, 0.0)
    drain(layer)
    assert layer.transaction_count == 10
    # Another source is served meanwhile.
    layer.receive(invite_bytes(1000, "192.0.2.10:5060"), ALICE, 0.0)
    assert any(isinstance(e, RequestReceived) for e in drain(layer))


def test_layer_drop_sends_nothing() -> None:
    layer = layer_with(SourceLimits(settings(action="drop")))
    for i in range(50):
        layer.receive(invite_bytes(i), EVE, 0.0)
    events = drain(layer)
    statuses = [m.status for m in map(parse, (t.data for t in transmits(events)))
                if isinstance(m, Response)]  # fmt: skip
    assert statuses == [100] * 5  # the admitted INVITEs' 100 Trying, nothing else


def test_layer_table_bound_holds_under_many_sources() -> None:
    limits = SourceLimits(settings(max_transactions=100, max_sources=50))
    layer = layer_with(limits)
    for i in range(2000):
        ip = f"10.0.{i >> 8 & 255}.{i & 255}"
        layer.receive(invite_bytes(i, f"{ip}:5060"), (ip, 5060), i / 1000)
    drain(layer)
    assert layer.transaction_count == 100
    assert limits.refused["table"] == 1900
    assert limits.tracked <= 100
    # Without a hook the layer is as before.
    plain = TransactionLayer()
    plain.receive(bytes(request("OPTIONS")), BOB, 0.0)
    assert any(isinstance(e, RequestReceived) for e in drain(plain))


def test_peek_method() -> None:
    assert peek_method(invite_bytes(1)) == "INVITE"
    assert peek_method(b"\r\n\r\nOPTIONS sip:x SIP/2.0\r\n") == "OPTIONS"
    assert peek_method(b"SIP/2.0 200 OK\r\n") is None
    assert peek_method(b"garbage") is None
    assert peek_method(b" INVITE") is None


def test_quick_refusal_copies_the_fields() -> None:
    req = request("INVITE", extra=(("Via", "SIP/2.0/UDP 10.0.0.1;branch=z9hG4bKsecond"),),
                  body=b"v=0\r\n")  # fmt: skip
    refusal = Refusal("rate", drop=False, retry_after_s=3)
    reply = quick_refusal(bytes(req), refusal)
    assert reply is not None
    resp = parse(reply)
    assert isinstance(resp, Response)
    assert (resp.status, resp.headers.get("Retry-After")) == (503, "3")
    assert resp.headers.values("Via") == req.headers.values("Via")
    for name in ("From", "Call-ID", "CSeq"):
        assert resp.headers.get(name) == req.headers.get(name)
    assert resp.to_addr.tag and resp.body == b""
    # A To tag already there is kept; compact forms and bare LF line ends are understood.
    compact = (b"INVITE sip:a@b SIP/2.0\nv: SIP/2.0/UDP h;branch=z9hG4bK1\nf: <sip:a@b>;tag=1\n"
               b"t: <sip:c@d>;tag=keep\ni: cid\nCSeq: 2 INVITE\n\n")  # fmt: skip
    reply = quick_refusal(compact, refusal)
    assert reply is not None
    resp = parse(reply)
    assert isinstance(resp, Response) and resp.to_addr.tag == "keep"
    assert resp.call_id == "cid"
    # Something missing: nothing to answer with (dropped).
    assert quick_refusal(b"INVITE sip:a@b SIP/2.0\r\nVia: x\r\n\r\n", refusal) is None


def test_timer_is_kept_right_across_refusals() -> None:
    """The layer caches its next deadline: refused requests leave it alone, real work moves it
    (compared with a layer without limits fed the same admitted requests)."""
    layer = layer_with(SourceLimits(settings(action="drop")))
    plain = TransactionLayer()
    assert layer.get_timer() is None
    for lay in (layer, plain):
        for i in range(5):
            lay.receive(invite_bytes(i), EVE, 0.0)
        drain(lay)
        assert lay.get_timer() is None  # Proceeding: no timer yet
        tid = next(iter(lay._transactions))
        lay.send_response(tid, make_response(lay._transactions[tid].request, 486, to_tag="x"), 1.0)
        drain(lay)
    first = layer.get_timer()
    assert first is not None and first == plain.get_timer()  # Timer G
    for i in range(5, 100):  # all shed
        layer.receive(invite_bytes(i), EVE, 1.0)
    drain(layer)
    assert layer.get_timer() == first
    for lay in (layer, plain):
        lay.handle_timer(first)
        drain(lay)
    assert layer.get_timer() == plain.get_timer() != first


# --- the TCP connection table (the asyncio adapter, real sockets) ---------------------------------
async def _closed_by_peer(reader: asyncio.StreamReader, wait: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), wait) == b""
    except TimeoutError:
        return False


async def test_tcp_connections_per_source_are_bounded() -> None:
    transport = SipTransport(TransactionLayer(), lambda event: None)
    await transport.listen("127.0.0.1", 0)
    transport.max_tcp_per_source = 3
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(4):
            conns.append(await asyncio.open_connection("127.0.0.1", transport.port))
        # The fourth is closed by the gateway at once; the first three stay.
        assert await _closed_by_peer(conns[3][0], 5.0)
        assert not any([await _closed_by_peer(r, 0.2) for r, _ in conns[:3]])
        assert transport.tcp_refused == 1
        # One goes away: there is room for another from the same source.
        conns[0][1].close()
        for _ in range(100):
            if len(transport._conns) < 3:
                break
            await asyncio.sleep(0.02)
        conns.append(await asyncio.open_connection("127.0.0.1", transport.port))
        assert not await _closed_by_peer(conns[-1][0], 0.3)
        # The whole table is bounded too, whoever connects.
        transport.max_tcp_connections = 3
        conns.append(await asyncio.open_connection("127.0.0.1", transport.port))
        assert await _closed_by_peer(conns[-1][0], 5.0)
        assert transport.tcp_refused == 2
    finally:
        for _, w in conns:
            w.close()
        await transport.close()
