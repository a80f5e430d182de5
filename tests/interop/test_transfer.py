"""SIP transfer against real peers: sipp scenarios (``sip-fixtures/scenarios/refer_*.xml``,
``uas_bridge.xml``) and a real ``voxgate serve``.

- blind transfer: the test asks ``POST /api/calls/{id}/transfer``; sipp, the transferee,
  gets the REFER, answers 202, NOTIFYs 100 Trying then 200 OK, and the gateway BYEs its call
  (several calls in a row: REFER → call ended is printed as p50/p95);
- a transferee whose final NOTIFY comes after the transfer's timeout: "failed", the call
  stays with the gateway, and the late NOTIFY gets 481;
- REFER declined with 603: the outcome is "refused" and the call goes on; with
  ``fallback: bridge`` the gateway dials the target through its trunk (a second sipp) and
  bridges the two calls' audio, checked byte for byte both ways by RTP peers in the test
  (PCMU on both legs: pass-through; PCMA on the second: transcoded);
- REFERs sent to the gateway: declined by default (400 without Refer-To, 603 with one), and
  followed with ``gateway.accept_refer`` (202, NOTIFYs, the referred call placed).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any, cast

import numpy as np
import pytest

from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from tests.interop.conftest import (
    EventFeed,
    GatewayFactory,
    GatewayProc,
    Sipp,
    free_port,
    port_block,
)
from tests.interop.test_sipp import api, in_state, until_calls

pytestmark = [pytest.mark.slow, pytest.mark.interop]

TARGET = "sip:agent@example.test"


def _ms(a: dict[str, Any], b: dict[str, Any]) -> float:
    return (float(b["ts"]) - float(a["ts"])) * 1000


# 1 ----------------------------------------------------------------------------------------------
async def test_blind_transfer_refer_notify_then_bye(gateway: GatewayProc, sipp: Sipp) -> None:
    runs = 5
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "refer_blind.xml", target=gateway.sip, args=["-m", str(runs), "-l", "1", "-s", "ivr"]
        )
        done: list[str] = []
        round_trips: list[float] = []
        while len(done) < runs:
            calls = await until_calls(
                gateway, lambda cs: any(c["state"] == "answered" and c["id"] not in done
                                        for c in cs),
            )  # fmt: skip
            (call,) = [c for c in calls if c["state"] == "answered" and c["id"] not in done]
            cid = call["id"]
            t0 = time.monotonic()
            status, outcome = await api(
                gateway, "POST", f"/api/calls/{cid}/transfer", {"target": TARGET}
            )
            round_trips.append((time.monotonic() - t0) * 1000)
            assert status == 200, outcome
            assert outcome == {
                "result": "completed", "status": 200, "reason": "OK", "bridged_call": None,
            }, outcome  # fmt: skip
            ended = await feed.wait_for("call.state", call_id=cid, state="ended")
            assert ended["reason"] == "transferred", ended
            done.append(cid)
        result = await sipp.wait(run)
        result.assert_ok(calls=runs)
        refer_to_end: list[float] = []
        for cid in done:
            steps = [(e["state"], e["method"], e["status"]) for e in feed.of("transfer", cid)]
            assert steps == [
                ("started", "refer", None),
                ("progress", "refer", 202),
                ("progress", "refer", 100),
                ("completed", "refer", 200),
            ], steps
            started = feed.of("transfer", cid)[0]
            assert started["target"] == TARGET and started["mode"] == "blind"
            ended = feed.of("call.state", cid)[-1]
            refer_to_end.append(_ms(started, ended))
        record = await asyncio.to_thread(gateway.get, f"/api/calls/{done[0]}")
        assert record["end_reason"] == "transferred"
        (transfer,) = record["transfers"]
        assert (transfer["result"], transfer["target"], transfer["method"]) == (
            "completed", TARGET, "refer",
        )  # fmt: skip
    # The REFER carried the target and the gateway's tag; sipp checked it (ereg check_it).
    assert f"Refer-To: <{TARGET}>" in result.messages
    refer_to_end.sort()
    print(
        f"\nREFER -> call ended over {runs} transfers (sipp answers 202 + NOTIFY 100 + NOTIFY "
        f"200 at once): p50 {statistics.median(refer_to_end):.1f} ms, max "
        f"{refer_to_end[-1]:.1f} ms; POST /transfer round trip p50 "
        f"{statistics.median(round_trips):.1f} ms; {os.cpu_count()} CPUs"
    )
    await gateway.wait_no_calls()


# 2 ----------------------------------------------------------------------------------------------
async def test_refer_declined_603_is_refused_and_the_call_goes_on(
    gateway: GatewayProc, sipp: Sipp
) -> None:
    sink = port_block(2)[0]
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "refer_decline.xml", target=gateway.sip,
            args=["-m", "1", "-s", "ivr", "-d", "1500", "-set", "rtpport", str(sink)],
        )  # fmt: skip
        (call,) = await until_calls(gateway, in_state("answered"))
        status, outcome = await api(
            gateway, "POST", f"/api/calls/{call['id']}/transfer", {"target": TARGET}
        )
        assert status == 200
        assert outcome == {
            "result": "refused", "status": 603, "reason": "Decline", "bridged_call": None,
        }, outcome  # fmt: skip
        # Refused: the call (and its agent) go on until the caller hangs up.
        (still,) = await gateway.acalls()
        assert still["id"] == call["id"] and still["state"] == "answered"
        (await sipp.wait(run)).assert_ok()
        ended = await feed.wait_for("call.state", call_id=call["id"], state="ended")
        assert ended["reason"] == "remote hangup"
        states = [e["state"] for e in feed.of("transfer", call["id"])]
        assert states == ["started", "refused"], states
    await gateway.wait_no_calls()


async def test_no_final_notify_in_time_fails_and_the_late_one_gets_481(
    gateway: GatewayProc, sipp: Sipp
) -> None:
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "refer_stalled.xml", target=gateway.sip, args=["-m", "1", "-s", "ivr"]
        )
        (call,) = await until_calls(gateway, in_state("answered"))
        status, outcome = await api(
            gateway, "POST", f"/api/calls/{call['id']}/transfer", {"target": TARGET, "timeout_s": 1}
        )
        assert status == 200
        assert outcome == {
            "result": "failed",
            "status": None,
            "reason": "no final NOTIFY within 1 s of the REFER",
            "bridged_call": None,
        }, outcome
        (still,) = await gateway.acalls()
        assert still["state"] == "answered"  # the caller stays with the gateway
        # sipp's late final NOTIFY is answered 481: the subscription is gone (checked by sipp).
        (await sipp.wait(run)).assert_ok()
        ended = await feed.wait_for("call.state", call_id=call["id"], state="ended")
        assert ended["reason"] == "remote hangup"
        steps = [(e["state"], e["status"]) for e in feed.of("transfer", call["id"])]
        assert steps == [("started", None), ("progress", 202), ("progress", 100), ("failed", None)]
    await gateway.wait_no_calls()


# 3 ----------------------------------------------------------------------------------------------
class RtpPeer(asyncio.DatagramProtocol):
    """One phone's media: once the gateway's RTP arrives it answers to that address
    (symmetric RTP) with 20 ms packets of random G.711 payload, and keeps every audio payload
    it receives."""

    def __init__(self, pt: int, seed: int) -> None:
        self.pt = pt
        self.rng = np.random.default_rng(seed)
        self.transport: asyncio.DatagramTransport | None = None
        self.remote: tuple[str, int] | None = None
        self.got_remote = asyncio.Event()
        self.received: list[bytes] = []
        self.sent: list[tuple[float, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if len(data) < 12 or data[0] >> 6 != 2:
            return
        if self.remote is None:
            self.remote = (addr[0], addr[1])
            self.got_remote.set()
        if data[1] & 0x7F == self.pt:
            self.received.append(data[12:])

    def payload(self) -> bytes:
        p = bytes(self.rng.integers(0, 256, 160, dtype=np.uint8))
        # μ-law's negative zero comes back as 0xFF from any encoder: send the canonical one.
        return p.replace(b"\x7f", b"\xff") if self.pt == 0 else p

    async def talk(self, seconds: float) -> None:
        await asyncio.wait_for(self.got_remote.wait(), 10)
        assert self.transport is not None and self.remote is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        ssrc, seq, ts = 0x1234 + self.pt, 1000, 5000
        for n in range(int(seconds / 0.02)):
            await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))
            p = self.payload()
            header = bytes([0x80, self.pt | (0x80 if n == 0 else 0)])
            header += ((seq + n) & 0xFFFF).to_bytes(2, "big") + (ts + 160 * n).to_bytes(4, "big")
            self.transport.sendto(header + ssrc.to_bytes(4, "big") + p, self.remote)
            self.sent.append((time.monotonic(), p))


def _crossed(sent: list[bytes], received: list[bytes]) -> float:
    """Share of ``sent`` payloads found, byte for byte, among ``received``."""
    got = set(received)
    return sum(p in got for p in sent) / max(len(sent), 1)


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
async def test_refused_refer_falls_back_to_a_bridged_second_leg(
    gateway_factory: GatewayFactory, sipp: Sipp, codec: str
) -> None:
    """REFER → 603 → the gateway dials the target through its trunk (a second sipp, the
    UAS) and crosses the audio: what the caller's RTP peer sends arrives at the target's and
    back. Same law on both legs: the very bytes (pass-through); PCMU caller with a PCMA
    target: transcoded sample by sample. The caller hangs up; the gateway ends the target."""
    loop = asyncio.get_running_loop()
    trunk_port = free_port()
    gw = gateway_factory("--gateway-trunk", f"sip:127.0.0.1:{trunk_port}")
    pt = 0 if codec == "PCMU" else 8
    port_a, port_b = port_block(2)[0], port_block(2)[0]
    ta, caller = await loop.create_datagram_endpoint(
        lambda: RtpPeer(0, 1), local_addr=("127.0.0.1", port_a)
    )
    tb, target = await loop.create_datagram_endpoint(
        lambda: RtpPeer(pt, 2), local_addr=("127.0.0.1", port_b)
    )
    try:
        uas = await sipp.start(
            "uas_bridge.xml", target=None, sip_port=trunk_port,
            args=["-m", "1", "-set", "rtpport", str(port_b), "-set", "codec", codec,
                  "-set", "pt", str(pt)],
        )  # fmt: skip
        await asyncio.sleep(0.5)  # sipp binds its socket
        async with EventFeed(gw.http) as feed:
            uac = await sipp.start(
                "refer_decline.xml", target=gw.sip,
                args=["-m", "1", "-s", "ivr", "-d", "4000", "-set", "rtpport", str(port_a)],
            )  # fmt: skip
            (call,) = await until_calls(gw, in_state("answered"))
            cid = call["id"]
            talk_a = asyncio.create_task(caller.talk(3.0))  # ends before the BYE
            status, outcome = await api(
                gw, "POST", f"/api/calls/{cid}/transfer",
                {"target": TARGET, "fallback": "bridge", "timeout_s": 10},
            )  # fmt: skip
            bridged_at = time.monotonic()
            assert status == 200
            assert outcome["result"] == "completed" and outcome["reason"] == "bridged", outcome
            second = outcome["bridged_call"]
            talk_b = asyncio.create_task(target.talk(2.5))
            calls = {c["id"]: c for c in await gw.acalls()}
            assert calls[second]["direction"] == "outbound" and calls[second]["codec"] == codec
            assert calls[second]["remote"] == TARGET
            await talk_b
            await asyncio.gather(sipp.wait(uac), sipp.wait(uas), talk_a)
            for started in (uac, uas):
                (await sipp.wait(started)).assert_ok()
            first_end = await feed.wait_for("call.state", call_id=cid, state="ended")
            second_end = await feed.wait_for("call.state", call_id=second, state="ended")
            assert first_end["reason"] == "remote hangup", first_end
            assert second_end["reason"] == "bridged call ended", second_end
            steps = [(e["state"], e["method"], e["status"]) for e in feed.of("transfer", cid)]
            assert steps == [
                ("started", "refer", None),
                ("refused", "refer", 603),
                ("started", "bridge", None),
                ("completed", "bridge", 200),
            ], steps
            # The second leg ran no agent: nothing was said on it.
            assert feed.of("utterance.started", second) == []
        record = await asyncio.to_thread(gw.get, f"/api/calls/{cid}")
        assert [t["method"] for t in record["transfers"]] == ["refer", "bridge"]
    finally:
        ta.close()
        tb.close()
    # Audio both ways, after the bridge was up (what the caller said before went to the agent).
    from_caller = [p for t, p in caller.sent if t > bridged_at + 0.1]
    from_target = [p for _, p in target.sent]
    assert len(from_caller) > 100 and len(from_target) > 100
    if codec == "PCMU":
        at_target, at_caller = from_caller, from_target  # pass-through: the same bytes
    else:
        at_target = [alaw_encode(ulaw_decode(p)) for p in from_caller]
        at_caller = [ulaw_encode(alaw_decode(p)) for p in from_target]
    # A few frames at each edge go to the jitter buffers' start and the hang-up.
    print(f"\n{codec}: crossed {_crossed(at_target, target.received):.3f} caller->target of "
          f"{len(at_target)}, {_crossed(at_caller, caller.received):.3f} target->caller of "
          f"{len(at_caller)}")  # fmt: skip
    assert _crossed(at_target, target.received) > 0.95, _crossed(at_target, target.received)
    assert _crossed(at_caller, caller.received) > 0.95, _crossed(at_caller, caller.received)
    await gw.wait_no_calls()


# 4 ----------------------------------------------------------------------------------------------
async def test_inbound_refer_declined_by_default(gateway: GatewayProc, sipp: Sipp) -> None:
    """sipp REFERs the gateway: 400 without Refer-To, 603 Decline (with a Warning) with one;
    a NOTIFY for no subscription 481, of another package 489; the call goes on."""
    async with EventFeed(gateway.http) as feed:
        result = await sipp.run("refer_inbound_decline.xml", target=gateway.sip,
                                args=["-m", "1", "-s", "ivr"])  # fmt: skip
        result.assert_ok()
        answered = await feed.wait_for("call.state", state="answered")
        ended = await feed.wait_for("call.state", call_id=answered["call_id"], state="ended")
        assert ended["reason"] == "remote hangup"
        assert feed.of("transfer") == []  # nothing was transferred
    assert '399 voxgate "transfer by REFER is not accepted here"' in result.messages
    await gateway.wait_no_calls()


async def test_inbound_refer_accepted_places_the_referred_call(
    gateway_factory: GatewayFactory, sipp: Sipp
) -> None:
    """``gateway.accept_refer``: 202, NOTIFY 100 Trying, the referred call through the trunk
    (answered by a second sipp), NOTIFY 200 OK terminated; the referrer hangs up its call and
    the referred one goes on with the gateway's agent."""
    trunk_port = free_port()
    gw = gateway_factory(
        "--gateway-trunk", f"sip:127.0.0.1:{trunk_port}", "--gateway-accept-refer", "true"
    )
    sink = port_block(2)[0]
    uas = await sipp.start(
        "uas_bridge.xml", target=None, sip_port=trunk_port,
        args=["-m", "1", "-set", "rtpport", str(sink), "-set", "codec", "PCMU", "-set", "pt", "0"],
    )  # fmt: skip
    await asyncio.sleep(0.5)
    async with EventFeed(gw.http) as feed:
        result = await sipp.run("refer_inbound_accept.xml", target=gw.sip,
                                args=["-m", "1", "-s", "ivr"])  # fmt: skip
        result.assert_ok()
        (referred,) = await until_calls(gw, in_state("answered"))
        assert (
            referred["direction"] == "outbound" and referred["remote"] == "sip:carol@example.test"
        )
        await feed.wait_for("utterance.started", call_id=referred["id"])  # its agent greets
        status, _ = await api(gw, "DELETE", f"/api/calls/{referred['id']}")
        assert status == 204
        (await sipp.wait(uas)).assert_ok()
    await gw.wait_no_calls()
