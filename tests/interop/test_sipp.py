"""sipp scenarios (``sip-fixtures/scenarios``) against a real ``voxgate serve`` process.

Each test asserts on sipp's exit status and statistics (successful/failed calls; the scenarios
check the answers' SDP and headers with ``<ereg check_it="true">``, so a wrong answer fails the
call) and on what the gateway reports: ``GET /api/calls`` during the call and the
``/api/events`` WebSocket feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.interop.conftest import (
    EventFeed,
    GatewayFactory,
    GatewayProc,
    Sipp,
    free_port,
    port_block,
)

pytestmark = [pytest.mark.slow, pytest.mark.interop]

Calls = list[dict[str, Any]]


async def until_calls(
    gw: GatewayProc, pred: Callable[[Calls], bool], timeout: float = 15.0
) -> Calls:
    """Poll ``GET /api/calls`` until ``pred(calls)`` holds; returns those calls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        calls = await gw.acalls()
        if pred(calls):
            return calls
        if loop.time() > deadline:
            raise AssertionError(f"calls never matched: {calls}")
        await asyncio.sleep(0.1)


def in_state(state: str) -> Callable[[Calls], bool]:
    return lambda calls: any(c["state"] == state for c in calls)


def _request(gw: GatewayProc, method: str, path: str, body: object = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(gw.http + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None


async def api(gw: GatewayProc, method: str, path: str, body: object = None) -> tuple[int, Any]:
    return await asyncio.to_thread(_request, gw, method, path, body)


# 1 ----------------------------------------------------------------------------------------------
async def test_basic_call(gateway: GatewayProc, sipp: Sipp) -> None:
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "basic_call.xml", target=gateway.sip, args=["-m", "1", "-d", "3000", "-s", "ivr"]
        )
        (call,) = await until_calls(gateway, in_state("answered"))
        assert call["direction"] == "inbound" and call["codec"] == "PCMU", call
        assert call["remote"].startswith("sip:sipp@127.0.0.1"), call
        result = await sipp.wait(run)
        result.assert_ok()
        await feed.wait_for("call.state", call_id=call["id"], state="ended", reason="remote hangup")
        started = await feed.wait_for("utterance.started", call_id=call["id"])
        assert started["text"].startswith("Thank you for calling voxgate"), started
    await gateway.wait_no_calls()


@pytest.mark.parametrize("transport", ["u1", "t1"])
async def test_info_dtmf_and_gateway_hangup(
    gateway: GatewayProc, sipp: Sipp, transport: str
) -> None:
    """INFO digits reach the IVR; digit 0 makes it say goodbye and send BYE (over the
    transport the call came in on, with that transport in its Via)."""
    async with EventFeed(gateway.http) as feed:
        result = await sipp.run(
            "info_goodbye.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr", "-t", transport]
        )
        result.assert_ok()
        (answered,) = [e for e in feed.of("call.state") if e["state"] == "answered"]
        cid = answered["call_id"]
        ended = await feed.wait_for("call.state", call_id=cid, state="ended")
        assert ended["reason"] == "ivr", ended
        digits = [(d["digit"], d["source"]) for d in feed.of("dtmf", cid)]
        assert digits == [("2", "info"), ("0", "info")], digits
        texts = [e["text"] for e in feed.of("utterance.started", cid)]
        assert texts[-1] == "Thank you for calling. Goodbye.", texts
    via = "SIP/2.0/TCP" if transport == "t1" else "SIP/2.0/UDP"
    bye = result.messages[result.messages.index("\nBYE ") :]
    assert bye.splitlines()[2].startswith(f"Via: {via} "), bye[:400]
    await gateway.wait_no_calls()


# 2 ----------------------------------------------------------------------------------------------
async def test_g711_speech_and_rfc4733_dtmf_from_pcap(gateway: GatewayProc, sipp: Sipp) -> None:
    async with EventFeed(gateway.http) as feed:
        result = await sipp.run("dtmf_pcap.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"])
        result.assert_ok()
        (answered,) = [e for e in feed.of("call.state") if e["state"] == "answered"]
        cid = answered["call_id"]
        await feed.wait_for("call.state", call_id=cid, state="ended")
        digits = feed.of("dtmf", cid)
        # One key press, one event: the three end packets (E bit) are one digit.
        assert [(d["digit"], d["source"]) for d in digits] == [("1", "rfc4733")], digits
        # The IVR acted on it: the menu-1 prompt started after the digit.
        prompts = [e["text"] for e in feed.of("utterance.started", cid)]
        assert any(p.startswith("We are open") for p in prompts), prompts


# 3 ----------------------------------------------------------------------------------------------
async def test_cancel_before_answer(gateway_factory: GatewayFactory, sipp: Sipp) -> None:
    gw = gateway_factory("--gateway-answer-delay-ms", "2000", "--gateway-max-calls", "1")
    async with EventFeed(gw.http) as feed:
        run = await sipp.start("cancel.xml", target=gw.sip, args=["-m", "1", "-s", "ivr"])
        (call,) = await until_calls(gw, in_state("ringing"))
        result = await sipp.wait(run)
        result.assert_ok()
        ended = await feed.wait_for("call.state", call_id=call["id"], state="ended")
        assert ended["reason"] == "cancelled", ended
        assert not feed.of("utterance.started", call["id"]), "a cancelled call was greeted"
    await gw.wait_no_calls()

    # Bonus on the same gateway (max 1 call): a second call while one rings gets 503.
    ringing = await sipp.start(
        "basic_call.xml", target=gw.sip, args=["-m", "1", "-d", "500", "-s", "ivr"]
    )
    await until_calls(gw, in_state("ringing"))
    busy = await sipp.run("busy.xml", target=gw.sip, args=["-m", "1", "-s", "ivr"])
    busy.assert_ok()
    (await sipp.wait(ringing)).assert_ok()
    await gw.wait_no_calls()


async def test_cancel_crossing_the_200_leaves_the_call_up(gateway: GatewayProc, sipp: Sipp) -> None:
    async with EventFeed(gateway.http) as feed:
        result = await sipp.run(
            "cancel_after_200.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"]
        )
        result.assert_ok()
        (ringing,) = feed.of("call.state")[:1]
        cid = ringing["call_id"]
        await feed.wait_for("call.state", call_id=cid, state="ended")
        states = [(e["state"], e["reason"]) for e in feed.of("call.state", cid)]
        assert states == [("ringing", None), ("answered", None), ("ended", "remote hangup")]
    await gateway.wait_no_calls()


# 4 ----------------------------------------------------------------------------------------------
class RtpSink(asyncio.DatagramProtocol):
    """Counts the gateway's RTP packets: (arrival time, payload type, SSRC, sequence number)."""

    def __init__(self) -> None:
        self.packets: list[tuple[float, int, int, int]] = []

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if len(data) >= 12 and data[0] >> 6 == 2:
            seq = int.from_bytes(data[2:4], "big")
            ssrc = int.from_bytes(data[8:12], "big")
            self.packets.append((time.monotonic(), data[1] & 0x7F, ssrc, seq))

    def between(self, t0: float, t1: float) -> list[tuple[float, int, int, int]]:
        return [p for p in self.packets if t0 <= p[0] <= t1]


async def test_reinvite_hold_and_unhold(gateway: GatewayProc, sipp: Sipp) -> None:
    loop = asyncio.get_running_loop()
    rtp_port = port_block(2)[0]
    transport, sink = await loop.create_datagram_endpoint(
        RtpSink, local_addr=("127.0.0.1", rtp_port)
    )
    try:
        run = await sipp.start(
            "hold_unhold.xml", target=gateway.sip,
            args=["-m", "1", "-s", "ivr", "-set", "rtpport", str(rtp_port)],
        )  # fmt: skip
        (call,) = await until_calls(gateway, in_state("answered"))
        t_up = time.monotonic()
        held = await until_calls(gateway, in_state("held"))
        t_held = time.monotonic()
        assert held[0]["id"] == call["id"]
        resumed = await until_calls(gateway, in_state("answered"))
        t_resumed = time.monotonic()
        assert resumed[0]["id"] == call["id"]
        (await sipp.wait(run)).assert_ok()
    finally:
        transport.close()
    # Media before the hold, none while held (we answered recvonly), media again after.
    before = sink.between(t_up, t_held - 0.3)
    during = sink.between(t_held + 0.3, t_resumed - 0.3)
    after = sink.between(t_resumed + 0.2, t_resumed + 0.8)
    assert len(before) >= 20, f"{len(before)} packets before the hold"
    assert during == [], f"{len(during)} RTP packets sent while held"
    assert len(after) >= 10, f"{len(after)} packets after the unhold"
    assert {p[1] for p in sink.packets} <= {0, 101}, "payload types other than PCMU/DTMF"
    # The same RTP stream goes on after the hold (RFC 3550: one SSRC per source).
    assert before[0][2] == after[0][2], "the SSRC changed across the hold"
    await gateway.wait_no_calls()


# 5 ----------------------------------------------------------------------------------------------
async def test_options_out_of_dialog(gateway: GatewayProc, sipp: Sipp) -> None:
    result = await sipp.run("options.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"])
    result.assert_ok()
    assert await gateway.acalls() == []


async def test_unknown_dialog_481_and_unknown_method_405(gateway: GatewayProc, sipp: Sipp) -> None:
    result = await sipp.run(
        "unknown_dialog_and_method.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"]
    )
    result.assert_ok()


# 6 ----------------------------------------------------------------------------------------------
async def test_pcma_only_offer(gateway: GatewayProc, sipp: Sipp) -> None:
    run = await sipp.start(
        "pcma_only.xml",
        target=gateway.sip,
        args=["-m", "1", "-d", "2000", "-s", "ivr", "-rtp_echo"],
    )
    (call,) = await until_calls(gateway, in_state("answered"))
    assert call["codec"] == "PCMA", call
    (await sipp.wait(run)).assert_ok()
    await gateway.wait_no_calls()


async def test_late_offer_answer_in_ack(gateway: GatewayProc, sipp: Sipp) -> None:
    run = await sipp.start(
        "late_offer.xml",
        target=gateway.sip,
        args=["-m", "1", "-d", "2000", "-s", "ivr", "-rtp_echo"],
    )
    (call,) = await until_calls(gateway, lambda calls: any(c["codec"] for c in calls))
    assert call["codec"] == "PCMA" and call["state"] == "answered", call
    (await sipp.wait(run)).assert_ok()
    await gateway.wait_no_calls()


# 7 ----------------------------------------------------------------------------------------------
async def test_no_common_codec_488(gateway: GatewayProc, sipp: Sipp) -> None:
    async with EventFeed(gateway.http) as feed:
        result = await sipp.run(
            "no_common_codec.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"]
        )
        result.assert_ok()
        assert feed.of("call.state") == [], "a rejected offer must not create a call"
    assert await gateway.acalls() == []


# 8 ----------------------------------------------------------------------------------------------
async def test_outbound_call_with_digest_auth(gateway_factory: GatewayFactory, sipp: Sipp) -> None:
    trunk_port = free_port()
    user, password = "voxgate-trunk", "s3cret-Pa55"
    gw = gateway_factory(
        "--gateway-trunk", f"sip:127.0.0.1:{trunk_port}",
        "--gateway-trunk-username", user, "--gateway-trunk-password", password,
    )  # fmt: skip
    uas = await sipp.start(
        "uas_digest.xml", target=None, sip_port=trunk_port,
        args=["-m", "1", "-rtp_echo", "-set", "user", user, "-set", "pass", password],
    )  # fmt: skip
    await asyncio.sleep(0.5)  # sipp binds its socket
    async with EventFeed(gw.http) as feed:
        status, info = await api(gw, "POST", "/api/calls", {"to": "sip:alice@example.test"})
        assert status == 201, info
        cid = info["id"]
        assert info["direction"] == "outbound", info
        await feed.wait_for("call.state", call_id=cid, state="answered", timeout=20)
        (call,) = await gw.acalls()
        assert call["id"] == cid and call["codec"] == "PCMU", call
        # The agent runs on outbound calls too.
        await feed.wait_for("utterance.started", call_id=cid)
        await asyncio.sleep(1.0)
        status, _ = await api(gw, "DELETE", f"/api/calls/{cid}")
        assert status == 204
        await feed.wait_for("call.state", call_id=cid, state="ended")
    (await sipp.wait(uas)).assert_ok()
    await gw.wait_no_calls()


async def test_outbound_cancel_crossing_a_200_gets_ack_and_bye(
    gateway: GatewayProc, sipp: Sipp
) -> None:
    """DELETE a ringing outbound call; the callee's 200 crosses the CANCEL. The gateway must
    ACK it and BYE the dialog (RFC 3261 §9.1), or the callee keeps a call nobody is on."""
    port = free_port()
    uas = await sipp.start("uas_answer_after_cancel.xml", target=None, sip_port=port,
                           args=["-m", "1"])  # fmt: skip
    await asyncio.sleep(0.5)
    async with EventFeed(gateway.http) as feed:
        status, info = await api(gateway, "POST", "/api/calls", {"to": f"sip:bob@127.0.0.1:{port}"})
        assert status == 201, info
        await asyncio.sleep(0.5)  # ringing
        status, _ = await api(gateway, "DELETE", f"/api/calls/{info['id']}")
        assert status == 204
        await feed.wait_for("call.state", call_id=info["id"], state="ended")
        (await sipp.wait(uas)).assert_ok()
        states = [e["state"] for e in feed.of("call.state", info["id"])]
        assert states == ["ringing", "ended"], states
    await gateway.wait_no_calls()


def _messages(trace: str) -> list[str]:
    """sipp's -trace_msg log as a list of "sent"/"received" message texts."""
    blocks = trace.split("-----------------------------------------------")
    return [b for b in blocks if "message sent" in b or "message received" in b]


async def test_2xx_retransmitted_until_ack(gateway: GatewayProc, sipp: Sipp) -> None:
    result = await sipp.run("ack_late.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"])
    result.assert_ok()
    msgs = _messages(result.messages)
    ack = next(i for i, m in enumerate(msgs) if "\nACK " in m)
    oks = [i for i, m in enumerate(msgs) if "SIP/2.0 200" in m and "CSeq: 1 INVITE" in m]
    assert len([i for i in oks if i < ack]) >= 2, "the 200 was not retransmitted (§13.3.1.4)"
    assert [i for i in oks if i > ack] == [], "the 200 was retransmitted after the ACK"
    await gateway.wait_no_calls()


# 9 ----------------------------------------------------------------------------------------------
async def test_load_50_concurrent_calls(gateway: GatewayProc, sipp: Sipp) -> None:
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "basic_call.xml", target=gateway.sip,
            args=["-m", "50", "-l", "50", "-r", "10", "-d", "5000", "-s", "ivr"],
            timeout_s=90,
        )  # fmt: skip
        peak = 0
        while run[0].returncode is None:
            peak = max(peak, len(await gateway.acalls()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(run[0].wait()), 0.5)
        result = await sipp.wait(run)
        result.assert_ok(calls=50)
        await gateway.wait_no_calls(timeout=30)
        ended = await feed.wait_count(50, "call.state", state="ended")
        answered = {e["call_id"] for e in feed.of("call.state") if e["state"] == "answered"}
        assert len(answered) == 50
        assert len(ended) == 50 and all(e["reason"] == "remote hangup" for e in ended), ended
    assert peak >= 30, f"calls never overlapped much (peak {peak})"
