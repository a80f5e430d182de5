"""Hostile input on the wire: RFC 4475 torture messages and random bytes over UDP and TCP at a
live gateway, while a real call is up. Malformed requests get a 4xx/5xx with a reason, nothing
crashes, and the call in progress keeps its audio."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import pytest

from gateway.sip import parse
from tests.gateway_e2e.conftest import LiveGateway
from voxgate.bench.sipclient import SipClient

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "sip-fixtures" / "rfc4475"
INVALID = ["badinv01", "clerr", "bcl01", "bext01", "ltgtruri", "lwsruri", "escruri", "quotbal",
           "insuf", "badvers", "mismatch02", "unkscm", "novelsc", "ncl"]  # fmt: skip


def udp_exchange(addr: tuple[str, int], data: bytes, timeout: float = 1.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(data, addr)
        try:
            return s.recv(65535)
        except TimeoutError:
            return None


async def test_torture_and_garbage_do_not_disturb_a_live_call(live_gateway: LiveGateway) -> None:
    client = await SipClient.open("127.0.0.1")
    call = await client.invite(live_gateway.sip, codecs=("PCMU",))
    assert call.status == 200 and call.media is not None
    await call.media.wait_for_audio(timeout=10)
    loop = asyncio.get_running_loop()
    statuses: dict[str, int | None] = {}
    for name in INVALID:
        path = FIXTURES / f"{name}.dat"
        if not path.exists():
            continue
        raw = await loop.run_in_executor(None, udp_exchange, live_gateway.sip, path.read_bytes())
        if raw is None:
            statuses[name] = None
            continue
        # Only the status line: the answer echoes the request's (malformed) Via back.
        version, code, reason = raw.split(b"\r\n", 1)[0].split(b" ", 2)
        assert version == b"SIP/2.0" and reason.strip(), raw[:200]
        statuses[name] = int(code)
    # Most torture messages carry a Via without rport, so the answer goes where their Via
    # says (RFC 3261 §18.2.2), not back to this socket; those that reach us are errors.
    answered = {k: v for k, v in statuses.items() if v is not None}
    assert answered and all(400 <= v < 600 for v in answered.values()), statuses
    assert statuses.get("badvers") in (None, 505), statuses
    # A malformed request that asks for rport is answered here, 400 with the reason.
    bad = (
        b"INVITE sip:ivr@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKbad1;rport"
        b"\r\nFrom: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:ivr@127.0.0.1>\r\nCall-ID: bad-1\r\n"
        b"CSeq: many INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
    raw = await loop.run_in_executor(None, udp_exchange, live_gateway.sip, bad)
    assert raw is not None and raw.startswith(b"SIP/2.0 400 "), raw
    assert b"CSeq" in raw.split(b"\r\n", 1)[0], raw[:120]
    rng = random.Random(7)
    for _ in range(300):
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 1500)))
        await loop.run_in_executor(None, udp_exchange, live_gateway.sip, junk, 0.01)
    # TCP: garbage, a half message, a bogus huge Content-Length, then the socket just drops.
    for payload in (b"\x00\xff" * 500, b"INVITE sip:x@y SIP/2.0\r\nVia: SIP/2.0/TCP a\r\n",
                    b"OPTIONS sip:a@b SIP/2.0\r\nContent-Length: 99999999\r\n\r\nxx"):  # fmt: skip
        _reader, writer = await asyncio.open_connection(*live_gateway.sip)
        writer.write(payload)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()
    # The call kept its audio and the gateway still answers.
    since = loop.time()
    await call.media.wait_for_audio(after=0.0, timeout=5)
    assert call.media.received[-1].arrival > 0
    options = await loop.run_in_executor(
        None,
        udp_exchange,
        live_gateway.sip,
        b"OPTIONS sip:ivr@127.0.0.1 SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKhost1;rport\r\n"
        b"From: <sip:t@127.0.0.1>;tag=1\r\nTo: <sip:ivr@127.0.0.1>\r\nCall-ID: hostile-1\r\n"
        b"CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
    )
    assert options is not None and parse(options).status == 200  # type: ignore[union-attr]
    assert len(live_gateway.gw.manager.calls) == 1
    assert loop.time() - since < 10
    assert await call.bye() == 200
    client.close()
