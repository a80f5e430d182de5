"""Who may call (issue 15 part 2), against a real ``voxgate serve`` with accounts, a trunk
allow-list and the registrar, driven by real peers:

- sipp without credentials gets 401 with a SHA-256 then an MD5 challenge, no call is made;
- sipp with ``-au``/``-ap`` answers the challenge, is answered, and the greeting's RTP
  reaches the port its SDP named (a socket of this test, so the audio is checked here);
- a wrong password, call after call, gets 401 until the lockout's threshold, then 403, while
  the same account from another address still gets through;
- an allow-listed source (127.0.0.2) is answered without credentials while 127.0.0.3 is
  challenged;
- baresip registers with an account (digest), ``POST /api/calls {"to": "alice"}`` rings it
  at its registered contact and it answers (auto-answer); an unregistered AOR is 404.

Every source address is a distinct 127.0.0.x so the lockout of one never touches the others.
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import (
    EventFeed,
    GatewayProc,
    Sipp,
    free_port,
    need,
    start_gateway,
)
from tests.interop.test_baresip import SPEECH_RMS, baresip, baresip_config, frame_rms

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ACCOUNTS = [
    # sipp 3.6 answers MD5 only, and only the first challenge: this account is offered MD5.
    {"username": "sippuser", "password": "s1pp-Pa55", "algorithms": "MD5"},
    # libre (baresip 1.0) refuses a 401 holding an algorithm it lacks: MD5 for alice too.
    {"username": "alice", "password": "al1ce-Pa55", "algorithms": "MD5"},
]
TRUNKS = [{"name": "lab-sbc", "allow": ["127.0.0.2/32"]}]
FAILURES = 3  # gateway.limit_auth_failures


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    need("sipp")
    gateway = start_gateway(
        tmp_path_factory.mktemp("auth-gw"),
        "--gateway-accounts", json.dumps(ACCOUNTS), "--gateway-trunks", json.dumps(TRUNKS),
        "--gateway-limit-auth-failures", str(FAILURES),
        "--ivr-greeting", "Thank you for calling voxgate. You are authenticated.",
    )  # fmt: skip
    try:
        yield gateway
    finally:
        gateway.stop()
    problems = gateway.log_problems()
    assert not problems, f"gateway logged errors:\n{gateway.log()[-6000:]}"


@pytest.fixture
def sipp(tmp_path: Path) -> Iterator[Sipp]:
    need("sipp")
    runner = Sipp(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


def statuses(messages: str) -> list[int]:
    """The final statuses sipp received, in order (its message trace)."""
    return [int(m) for m in re.findall(r"^SIP/2\.0 ([2-6]\d\d) ", messages, re.M)]


def from_ip(ip: str) -> list[str]:
    # The fixture's -i 127.0.0.1 comes first; sipp takes the last -i (and -mi) given.
    return ["-i", ip, "-mi", ip]


async def test_unauthenticated_invite_gets_both_challenges(gw: GatewayProc, sipp: Sipp) -> None:
    result = await sipp.run("auth_challenge.xml", target=gw.sip, args=[
        "-m", "1", "-s", "stranger", *from_ip("127.0.0.5")])  # fmt: skip
    result.assert_ok()  # the scenario's regexp checks both challenges and their order
    assert statuses(result.messages) == [401], result.describe()
    assert await gw.acalls() == []


class RtpSink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.payload = bytearray()
        self.packets = 0

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if len(data) > 12 and data[1] & 0x7F == 0:  # PCMU
            self.packets += 1
            self.payload += data[12:]


async def test_authenticated_invite_is_answered_and_hears_the_greeting(
    gw: GatewayProc, sipp: Sipp
) -> None:
    loop = asyncio.get_running_loop()
    rtp_port = free_port()
    transport, sink = await loop.create_datagram_endpoint(
        RtpSink, local_addr=("127.0.0.1", rtp_port), family=socket.AF_INET
    )
    try:
        async with EventFeed(gw.http) as feed:
            result = await sipp.run("auth_call.xml", target=gw.sip, args=[
                "-m", "1", "-d", "4000", "-au", "sippuser", "-ap", "s1pp-Pa55",
                "-set", "user", "sippuser", "-set", "rtp_port", str(rtp_port),
            ])  # fmt: skip
            result.assert_ok()
            assert statuses(result.messages) == [401, 200, 200], result.describe()
            (answered,) = [e for e in feed.of("call.state") if e["state"] == "answered"]
            started = await feed.wait_for("utterance.started", call_id=answered["call_id"])
            assert started["text"].startswith("Thank you for calling voxgate"), started
    finally:
        transport.close()
    (auth,) = re.findall(r"^Authorization: (.*)$", result.messages, re.M)
    assert auth.startswith('Digest username="sippuser"') and "algorithm=MD5" in auth, auth
    # ~4 s of call: 20 ms packets, and speech in them (not G.711 silence).
    assert sink.packets >= 150, sink.packets
    pcm = audioop.ulaw2lin(bytes(sink.payload), 2)
    assert audioop.rms(pcm, 2) > 300, audioop.rms(pcm, 2)
    await gw.wait_no_calls()


def access_counts(gw: GatewayProc) -> dict[str, float]:
    """The gateway's voxgate_sip_access counters, by outcome, as /metrics shows them."""
    with urllib.request.urlopen(gw.http + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(r'^voxgate_sip_access_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {k: float(v) for k, v in found}


async def test_wrong_password_locks_the_source_out(gw: GatewayProc, sipp: Sipp) -> None:
    before = await asyncio.to_thread(access_counts, gw)
    calls = FAILURES + 2
    result = await sipp.run("auth_wrong.xml", target=gw.sip, args=[
        "-m", str(calls), "-l", "1", "-au", "sippuser", "-ap", "wrong-password",
        "-set", "user", "sippuser", *from_ip("127.0.0.4"),
    ])  # fmt: skip
    result.assert_ok(calls)
    # Each call: a challenge, then the wrong answer is challenged again; the third wrong
    # answer locks the source out (403), and from then on its INVITEs get 403 at once.
    expected = [401, 401] * (FAILURES - 1) + [401, 403] + [403] * (calls - FAILURES)
    assert statuses(result.messages) == expected, result.describe()
    # Locked out even with the right password now; the same account elsewhere is fine.
    locked = await sipp.run("auth_wrong.xml", target=gw.sip, args=[
        "-m", "1", "-au", "sippuser", "-ap", "s1pp-Pa55", "-set", "user", "sippuser",
        *from_ip("127.0.0.4"),
    ])  # fmt: skip
    assert statuses(locked.messages) == [403], locked.describe()
    elsewhere = await sipp.run("auth_wrong.xml", target=gw.sip, args=[
        "-m", "1", "-au", "sippuser", "-ap", "wrong-again", "-set", "user", "sippuser",
        *from_ip("127.0.0.6"),
    ])  # fmt: skip
    assert statuses(elsewhere.messages) == [401, 401], elsewhere.describe()
    assert "locked out for" in gw.log()
    assert await gw.acalls() == []
    # The operator sees it on /metrics: the wrong answers, the lockout, the challenges.
    after = await asyncio.to_thread(access_counts, gw)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["failed"] >= FAILURES + 1, delta  # 3 at 127.0.0.4, 1 at 127.0.0.6
    assert delta["locked_out"] >= 1 and delta["challenged"] >= FAILURES + 1, delta
    assert delta["admitted_user"] == 0, delta


async def test_allow_listed_source_needs_no_credentials(gw: GatewayProc, sipp: Sipp) -> None:
    trunk = await sipp.run("basic_call.xml", target=gw.sip, args=[
        "-m", "1", "-d", "1000", "-s", "ivr", *from_ip("127.0.0.2")])  # fmt: skip
    trunk.assert_ok()
    assert statuses(trunk.messages) == [200, 200], trunk.describe()
    other = await sipp.run("auth_challenge.xml", target=gw.sip, args=[
        "-m", "1", "-s", "sipp", *from_ip("127.0.0.3")])  # fmt: skip
    other.assert_ok()
    assert statuses(other.messages) == [401], other.describe()
    await gw.wait_no_calls()


def _post_call(gw: GatewayProc, to: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        gw.http + "/api/calls", data=json.dumps({"to": to}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_baresip_registers_and_is_called_by_its_aor(gw: GatewayProc, tmp_path: Path) -> None:
    need("baresip")
    status, body = await asyncio.to_thread(_post_call, gw, "alice")
    assert (status, body["error"]["code"]) == (404, "not_registered"), body
    sip_port = free_port()
    cfg = baresip_config(tmp_path, sip_port, "auto")
    # Registers to the gateway (regint: the binding's lifetime, >= registrar_min_expires_s).
    (cfg / "accounts").write_text(
        f"<sip:alice@{gw.sip}>;auth_pass=al1ce-Pa55;regint=600;answermode=auto;audio_codecs=PCMU\n"
    )
    log = tmp_path / "baresip.log"
    async with EventFeed(gw.http) as feed, baresip(cfg, log, seconds=10) as proc:
        deadline = time.monotonic() + 8
        while "200 OK" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"no registration:\n{log.read_text()[-3000:]}"
            assert proc.returncode is None, log.read_text()[-3000:]
            await asyncio.sleep(0.1)
        status, info = await asyncio.to_thread(_post_call, gw, "alice")
        assert status == 201, info
        cid = info["id"]
        assert f"@127.0.0.1:{sip_port}" in info["remote"], info  # its registered contact
        await feed.wait_for("call.state", call_id=cid, state="answered", timeout=10)
        await feed.wait_for("utterance.started", call_id=cid, timeout=10)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(_delete_call, gw, cid)
        await feed.wait_for("call.state", call_id=cid, state="ended", timeout=10)
        # Let baresip exit by its own -t timer: killed, it leaves the dump's RIFF header
        # unfinished (sizes 0), and the recording cannot be read.
        await asyncio.wait_for(proc.wait(), 15)
    text = log.read_text(errors="replace")
    assert "Call established" in text, text[-3000:]
    assert "incoming rtp for 'audio' established" in text, text[-3000:]
    (dec,) = sorted((tmp_path / "rec").glob("dump-*-dec.wav"))
    rms = frame_rms(dec)
    assert (rms > SPEECH_RMS).sum() * 0.02 >= 0.5, rms  # the greeting, heard by the phone
    await gw.wait_no_calls()


def _delete_call(gw: GatewayProc, cid: str) -> None:
    req = urllib.request.Request(gw.http + f"/api/calls/{cid}", method="DELETE")
    with contextlib.closing(urllib.request.urlopen(req, timeout=10)):
        pass
