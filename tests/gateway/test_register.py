"""REGISTER with a trunk over real UDP sockets: digest challenge, refresh, unregister."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.legs.sip.register import Registrar
from gateway.legs.sip.transport import SipTransport
from gateway.sip import Request, TransactionLayer, make_response, parse, parse_challenges
from gateway.sip.digest import digest_response

CHALLENGE = 'Digest realm="voxgate.test", nonce="n0nce", qop="auth", algorithm=SHA-256'


class FakeRegistrar(asyncio.DatagramProtocol):
    """A registrar built from the project's message classes: challenges, checks the digest."""

    def __init__(self, password: str, expires: int) -> None:
        self.password = password
        self.expires = expires
        self.requests: list[Request] = []
        self.authorized: list[bool] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        req = parse(data)
        assert isinstance(req, Request) and req.method == "REGISTER"
        self.requests.append(req)
        auth = req.headers.get("Authorization")
        if auth is None:
            resp = make_response(req, 401, headers=[("WWW-Authenticate", CHALLENGE)])
        else:
            (chal,) = parse_challenges(CHALLENGE)
            (given,) = parse_challenges(auth)
            expected = digest_response(
                chal, username=given.get("username") or "", password=self.password,
                method="REGISTER", uri=given.get("uri") or "", cnonce=given.get("cnonce") or "",
                nc=int(given.get("nc") or "0", 16), qop=given.get("qop"),
            )  # fmt: skip
            ok = given.get("response") == expected and given.get("username") == "alice"
            self.authorized.append(ok)
            expires = req.headers.get("Expires") or "0"
            granted = 0 if expires.strip() == "0" else self.expires
            contact = f"{req.headers.get('Contact')};expires={granted}"
            resp = make_response(req, 200 if ok else 403, headers=[("Contact", contact)])
        assert self.transport is not None
        self.transport.sendto(bytes(resp), addr)


async def setup(password: str, expires: int) -> tuple[FakeRegistrar, Registrar, SipTransport]:
    loop = asyncio.get_running_loop()
    fake = FakeRegistrar("s3cret", expires)
    t, _ = await loop.create_datagram_endpoint(lambda: fake, local_addr=("127.0.0.1", 0))
    port = t.get_extra_info("sockname")[1]
    reg: Registrar | None = None

    def handler(event: object) -> None:
        assert reg is not None
        reg.on_event(event)  # type: ignore[arg-type]

    transport = SipTransport(TransactionLayer(), handler)
    await transport.listen("127.0.0.1", 0)
    reg = Registrar(
        transport, registrar=f"sip:127.0.0.1:{port}", peer=("127.0.0.1", port), user="alice",
        local_ip="127.0.0.1", expires_s=600, username="alice", password=password,
    )  # fmt: skip
    return fake, reg, transport


async def test_registers_with_digest_refreshes_and_unregisters() -> None:
    fake, reg, transport = await setup("s3cret", expires=2)
    await reg.start()
    assert await reg.wait(5)
    assert reg.granted_s == 2 and fake.authorized == [True]
    assert fake.requests[0].headers.get("Authorization") is None  # challenged first
    # Refreshed before the 2 s binding runs out, with the same Call-ID and a higher CSeq.
    await asyncio.sleep(1.6)
    assert len(fake.authorized) >= 2 and all(fake.authorized)
    call_ids = {r.call_id for r in fake.requests}
    assert len(call_ids) == 1
    seqs = [r.cseq.seq for r in fake.requests]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    await reg.close()
    assert fake.requests[-1].headers.get("Expires") == "0"
    assert not reg.registered
    await transport.close()


async def test_wrong_password_is_not_registered_and_retries_later() -> None:
    fake, reg, transport = await setup("wrong", expires=60)
    await reg.start()
    assert not await reg.wait(5)
    assert reg.last_status == 403 and reg.failures == 1
    assert fake.authorized == [False]
    await reg.close()
    await transport.close()


@pytest.mark.parametrize("uri", ["tel:+1555", "http://x"])
async def test_registrar_must_be_a_sip_uri(uri: str) -> None:
    transport = SipTransport(TransactionLayer(), lambda e: None)
    with pytest.raises(ValueError, match="sip: URI"):
        Registrar(transport, registrar=uri, peer=("127.0.0.1", 5060), user="a",
                  local_ip="127.0.0.1", expires_s=60)  # fmt: skip
