"""SIP over TLS in the transport adapter, on real sockets with a PKI made in the test: a TLS
client is answered over its connection; plaintext on the TLS port, an untrusted, expired or
misnamed certificate, a missing client certificate (mutual TLS) and a stalled handshake are
counted by reason and close only that connection, while another TLS client carries on."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import gateway.legs.sip.transport as transport_mod
from gateway.legs.sip import tls
from gateway.legs.sip.transport import SipTransport
from gateway.sip import (
    Request,
    RequestReceived,
    Response,
    ResponseReceived,
    SipEvent,
    StreamFramer,
    TransactionLayer,
    TransportError,
    make_response,
)
from gateway.sip.message import Address
from tests.secure.certs import Issued, Pki, make_pki
from tests.sip.util import request
from voxgate.contract.config import ConfigError, GatewayConfig


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def gateway_cfg(pki: Pki, server: Issued | None = None, **extra: object) -> GatewayConfig:
    cert = server or pki.server
    cfg = GatewayConfig(
        tls_listen="127.0.0.1:0",
        tls_cert=str(cert.cert),
        tls_key=str(cert.key),
        tls_ca_file=str(pki.ca),
    )
    for key, value in extra.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


@dataclass
class Uas:
    """A bare transport that answers every request 200 and records what it saw."""

    transport: SipTransport
    events: list[SipEvent] = field(default_factory=list)

    @property
    def tls_addr(self) -> Address:
        return ("127.0.0.1", self.transport.tls_port)


@contextlib.asynccontextmanager
async def uas(cfg: GatewayConfig) -> AsyncIterator[Uas]:
    layer = TransactionLayer()
    holder: list[Uas] = []

    def handler(event: SipEvent) -> None:
        me = holder[0]
        me.events.append(event)
        tid = event.transaction_id if isinstance(event, RequestReceived) else None
        if isinstance(event, RequestReceived) and tid is not None:
            me.transport.send_response(tid, make_response(event.request, 200))

    t = SipTransport(layer, handler)
    holder.append(Uas(t))
    # TLS only: listen() would bind UDP on a random port and then TCP on the same number,
    # which another process may hold (a flaky test, not a TLS one).
    server, client = tls.contexts(cfg)
    await t.listen_tls("127.0.0.1", 0, server, client)
    try:
        yield holder[0]
    finally:
        await t.close()


def client_ctx(pki: Pki, *, ca: Path | None = None, cert: Issued | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca or pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def options(port: int, branch: str) -> bytes:
    return bytes(
        request(
            "OPTIONS",
            branch=branch,
            transport="TLS",
            sent_by=f"127.0.0.1:{port}",
            uri="sip:gw@127.0.0.1",
        )
    )


async def roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, branch: str
) -> Response:
    writer.write(options(writer.get_extra_info("sockname")[1], branch))
    framer = StreamFramer()
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, "connection closed before the response"
        for item in framer.feed(data):
            assert isinstance(item, Response), item
            return item


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 5) == b""
    except (ConnectionError, ssl.SSLError):
        return True


# --- inbound ---------------------------------------------------------------------------------
async def test_tls_client_is_answered_over_its_connection(pki: Pki) -> None:
    async with uas(gateway_cfg(pki)) as u:
        reader, writer = await asyncio.open_connection(
            *u.tls_addr, ssl=client_ctx(pki), server_hostname="localhost"
        )
        try:
            assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
            resp = await roundtrip(reader, writer, "z9hG4bKtls1")
            assert resp.status == 200
            assert (resp.headers.get("Via") or "").startswith("SIP/2.0/TLS ")
            (req,) = [e for e in u.events if isinstance(e, RequestReceived)]
            assert u.transport.via_transport(req.addr) == "TLS"
            assert u.transport.connection_open(req.addr)
            assert sum(u.transport.tls_failures.values()) == 0
        finally:
            writer.close()


async def test_plaintext_on_the_tls_port_is_refused_and_counted(pki: Pki) -> None:
    async with uas(gateway_cfg(pki)) as u:
        good_r, good_w = await asyncio.open_connection(
            *u.tls_addr, ssl=client_ctx(pki), server_hostname="localhost"
        )
        bad_r, bad_w = await asyncio.open_connection(*u.tls_addr)
        try:
            bad_w.write(options(bad_w.get_extra_info("sockname")[1], "z9hG4bKplain"))
            assert await closed_by_peer(bad_r)
            await wait_until(lambda: u.transport.tls_failures["plaintext"] == 1)
            # Nothing of it reached the SIP layer; the TLS client beside it is served.
            assert not [e for e in u.events if isinstance(e, RequestReceived)]
            assert (await roundtrip(good_r, good_w, "z9hG4bKgood")).status == 200
        finally:
            good_w.close()
            bad_w.close()


@pytest.mark.parametrize(
    ("server", "client_ca", "hostname"),
    [
        ("rogue", None, "localhost"),
        ("expired", None, "localhost"),
        ("server", None, "sip.example.org"),
    ],
    ids=["untrusted", "expired", "wrong-name"],
)
async def test_a_client_refusing_our_certificate_is_counted(
    pki: Pki, server: str, client_ca: Path | None, hostname: str
) -> None:
    issued = {"rogue": pki.rogue, "expired": pki.expired, "server": pki.server}[server]
    async with uas(gateway_cfg(pki, issued)) as u:
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection(
                *u.tls_addr, ssl=client_ctx(pki), server_hostname=hostname
            )
        # The client's alert (bad/unknown certificate) ends the handshake on our side.
        await wait_until(lambda: sum(u.transport.tls_failures.values()) == 1)
        assert u.transport.tls_failures["certificate"] + u.transport.tls_failures["closed"] == 1


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(pki: Pki) -> None:
    async with uas(gateway_cfg(pki, tls_verify_client=True)) as u:
        # A trunk with a certificate from the CA: served.
        r, w = await asyncio.open_connection(
            *u.tls_addr, ssl=client_ctx(pki, cert=pki.client), server_hostname="localhost"
        )
        try:
            assert (await roundtrip(r, w, "z9hG4bKmtls")).status == 200
        finally:
            w.close()
        # Without a certificate, or with one from another CA: no connection. (TLS 1.3 sends
        # the server's verdict after the client's handshake is done: the first read fails.)
        for cert in (None, pki.rogue):
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                r, w = await asyncio.open_connection(
                    *u.tls_addr, ssl=client_ctx(pki, cert=cert), server_hostname="localhost"
                )
                w.write(options(w.get_extra_info("sockname")[1], "z9hG4bKnocert"))
                assert await closed_by_peer(r)
                w.close()
        await wait_until(lambda: u.transport.tls_failures["certificate"] == 2)
        assert len([e for e in u.events if isinstance(e, RequestReceived)]) == 1


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_tls_below_1_2_is_refused(pki: Pki) -> None:
    async with uas(gateway_cfg(pki)) as u:
        old = client_ctx(pki)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
        with contextlib.suppress(ssl.SSLError):
            old.set_ciphers("DEFAULT:@SECLEVEL=0")  # let OpenSSL even try TLS 1.1
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.open_connection(*u.tls_addr, ssl=old, server_hostname="localhost")
        await wait_until(lambda: sum(u.transport.tls_failures.values()) >= 1)
        assert u.transport.tls_failures["protocol"] == 1, u.transport.tls_failures


async def test_a_stalled_handshake_times_out(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_mod, "HANDSHAKE_TIMEOUT_S", 0.3)
    async with uas(gateway_cfg(pki)) as u:
        r, w = await asyncio.open_connection(*u.tls_addr)  # TCP, then nothing
        try:
            assert await closed_by_peer(r)
            assert u.transport.tls_failures["timeout"] == 1
            assert not u.transport._handshaking  # the slot it held is free again
        finally:
            w.close()


# --- outbound --------------------------------------------------------------------------------
async def _request_over_tls(client: Uas, server: Uas, hostname: str) -> list[SipEvent]:
    """``client`` opens a verified TLS connection to ``server`` and sends an OPTIONS."""
    t = client.transport
    t.connect_tls(server.tls_addr, hostname)
    assert t.via_transport(server.tls_addr) == "TLS"  # Via says TLS while it connects
    req: Request = request(
        "OPTIONS",
        branch="z9hG4bKout1",
        transport="TLS",
        sent_by=f"127.0.0.1:{t.tls_port}",
        uri="sips:gw@127.0.0.1",
    )
    t.send_request(req, server.tls_addr)
    await wait_until(
        lambda: any(isinstance(e, ResponseReceived | TransportError) for e in client.events)
    )
    return client.events


async def test_outbound_tls_verifies_the_peer_and_its_name(pki: Pki) -> None:
    async with uas(gateway_cfg(pki)) as server, uas(gateway_cfg(pki)) as client:
        events = await _request_over_tls(client, server, "localhost")
        (resp,) = [e for e in events if isinstance(e, ResponseReceived)]
        assert resp.response.status == 200
        (got,) = [e for e in server.events if isinstance(e, RequestReceived)]
        assert server.transport.via_transport(got.addr) == "TLS"
        assert client.transport.via_transport(server.tls_addr) == "TLS"


@pytest.mark.parametrize(
    ("server_cert", "hostname"),
    [("rogue", "localhost"), ("expired", "localhost"), ("server", "sip.example.org")],
    ids=["untrusted", "expired", "wrong-name"],
)
async def test_outbound_tls_refuses_a_bad_certificate(
    pki: Pki, server_cert: str, hostname: str
) -> None:
    issued = {"rogue": pki.rogue, "expired": pki.expired, "server": pki.server}[server_cert]
    async with uas(gateway_cfg(pki, issued)) as server, uas(gateway_cfg(pki)) as client:
        events = await _request_over_tls(client, server, hostname)
        # The UAC's transaction fails at once (no response, no timer run-out).
        assert any(isinstance(e, TransportError) for e in events), events
        assert not any(isinstance(e, ResponseReceived) for e in events)
        assert client.transport.tls_failures["certificate"] == 1
        assert not [e for e in server.events if isinstance(e, RequestReceived)]
        assert client.transport.via_transport(server.tls_addr) == "UDP"  # nothing left open


# --- configuration ---------------------------------------------------------------------------
def test_tls_config_is_checked(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("gateway.tls_cert: needed")):
        GatewayConfig(tls_listen="0.0.0.0:5061").validate()
    with pytest.raises(ConfigError, match=re.escape("gateway.tls_verify_client")):
        GatewayConfig(
            tls_listen="0.0.0.0:5061",
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.server.key),
            tls_verify_client=True,
        ).validate()
    with pytest.raises(ConfigError, match="no such file"):
        GatewayConfig(tls_ca_file=str(tmp_path / "nope.pem")).validate()
    with pytest.raises(ConfigError, match=re.escape("gateway.srtp")):
        GatewayConfig(srtp="maybe").validate()
    # A key that does not belong to the certificate: one line naming the keys, at start.
    mismatched = GatewayConfig(
        tls_listen="127.0.0.1:0", tls_cert=str(pki.server.cert), tls_key=str(pki.client.key)
    )
    mismatched.validate()
    with pytest.raises(ConfigError, match=re.escape("gateway.tls_cert/tls_key")):
        tls.contexts(mismatched)


def test_contexts_refuse_anything_below_tls_1_2(pki: Pki) -> None:
    server, client = tls.contexts(gateway_cfg(pki))
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    assert server.verify_mode == ssl.CERT_NONE
    mutual, _ = tls.contexts(gateway_cfg(pki, tls_verify_client=True))
    assert mutual.verify_mode == ssl.CERT_REQUIRED
