"""A whole gateway (in process, real worker) with SIP over TLS and srtp = "required", called by
a UAC of the test's own: TLS from Python's ``ssl``, SRTP from ``pylibsrtp`` used directly (not
through gateway.rtp.srtp), our SIP message classes for the text.

* a ``sips:`` INVITE over TLS with an RTP/SAVP offer is answered over the connection with a
  ``sips:`` Contact at the TLS port; the RTP on the wire is SRTP (its payload, read as PCMU, is
  noise where the decrypted audio is silence), and the decrypted audio holds the greeting;
  BYE goes over the same connection;
* the keys appear in no log record and not in /api/calls;
* a plain RTP/AVP offer (UDP) gets 488 with a Warning that says SRTP is required.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator

import numpy as np
import pylibsrtp
import pytest

from gateway import sdp
from gateway.rtp.codecs import get_codec
from gateway.rtp.packet import RtpError, RtpPacket
from gateway.sdp_crypto import offer_attributes, parse_crypto
from gateway.sip import (
    Dialog,
    Headers,
    Request,
    Response,
    StreamFramer,
    generate_branch,
    generate_call_id,
    generate_tag,
    parse_uri,
)
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.secure.certs import Pki, make_pki
from voxgate.bench.localgw import LocalGateway, local_gateway
from voxgate.bench.sipclient import SipClient

pytestmark = pytest.mark.slow

GREETING = "Thank you for calling voxgate over a secure line."


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def secure_gateway(engine: Engine, pki: Pki) -> AsyncIterator[LocalGateway]:
    overrides = {
        "gateway.tls_listen": "127.0.0.1:0",
        "gateway.tls_cert": str(pki.server.cert),
        "gateway.tls_key": str(pki.server.key),
        "gateway.tls_ca_file": str(pki.ca),
        "gateway.srtp": "required",
        "ivr.greeting": GREETING,
    }
    async with local_gateway(engine, name="secure", overrides=overrides) as local:
        yield local


class TlsUac:
    """One call over one TLS connection, SIP messages framed as on any stream (§18.3)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.framer = StreamFramer()
        self.inbox: list[Request | Response] = []
        host, port = writer.get_extra_info("sockname")[:2]
        self.sent_by = f"{host}:{port}"

    def send(self, msg: Request | Response) -> None:
        self.writer.write(bytes(msg))

    async def response(self, method: str, timeout: float = 10.0) -> Response:
        """The next final response to ``method``."""
        while True:
            for i, m in enumerate(self.inbox):
                if isinstance(m, Response) and m.cseq.method == method and m.status >= 200:
                    del self.inbox[i]
                    return m
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            assert data, "the gateway closed the TLS connection"
            for item in self.framer.feed(data):
                assert isinstance(item, Request | Response), item
                self.inbox.append(item)


def invite(uac: TlsUac, target: str, offer: sdp.SessionDescription) -> Request:
    h = Headers()
    h.add("Via", f"SIP/2.0/TLS {uac.sent_by};branch={generate_branch()};rport")
    h.add("Max-Forwards", "70")
    h.add("From", f"<sips:caller@{uac.sent_by}>;tag={generate_tag()}")
    h.add("To", f"<{target}>")
    h.add("Call-ID", generate_call_id("127.0.0.1"))
    h.add("CSeq", "1 INVITE")
    h.add("Contact", f"<sips:caller@{uac.sent_by}>")
    h.add("Content-Type", "application/sdp")
    return Request("INVITE", parse_uri(target), h, bytes(offer))


async def test_tls_srtp_call_hears_the_greeting_encrypted_on_the_wire(
    secure_gateway: LocalGateway, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    local = secure_gateway
    tls_port = local.gw.ua.transport.tls_port
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    media.setblocking(False)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", tls_port, ssl=ctx, server_hostname="127.0.0.1"
    )
    uac = TlsUac(reader, writer)
    ours = offer_attributes()
    offer = sdp.make_offer("127.0.0.1", media.getsockname()[1], srtp="required", dtmf_pt=None)
    offer.media[0].attributes = [(k, v) for k, v in offer.media[0].attributes if k != "crypto"]
    offer.media[0].attributes[-1:-1] = [("crypto", str(a)) for a in ours]
    target = f"sips:ivr@127.0.0.1:{tls_port}"
    inv = invite(uac, target, offer)
    try:
        uac.send(inv)
        ok = await uac.response("INVITE")
        assert ok.status == 200, ok
        # Over TLS, a sips: Request-URI gets a sips: Contact at the TLS port (§8.1.1.8).
        assert str(ok.headers.get("Contact")) == f"<sips:ivr@127.0.0.1:{tls_port}>"
        assert (ok.headers.get("Via") or "").startswith("SIP/2.0/TLS ")
        answer = sdp.parse(ok.body)
        (m,) = answer.media
        assert m.proto == "RTP/SAVP"
        (theirs_value,) = m.attribute_values("crypto")
        theirs = parse_crypto(theirs_value)
        mine = next(a for a in ours if a.tag == theirs.tag)
        dialog = Dialog.from_uac_response(inv, ok)
        uac.send(dialog.create_ack(inv, sent_by=uac.sent_by, transport="TLS"))
        profile = {
            "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
            "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
        }[theirs.suite]
        rx = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=theirs.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile
            )
        )
        tx = pylibsrtp.Session(
            pylibsrtp.Policy(
                key=mine.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile
            )
        )
        # Receive ~3 s of the gateway's stream; send SRTP silence back so it latches and
        # hears a caller (its SRTP must authenticate ours: no auth failure counted).
        codec = get_codec("PCMU")
        loop = asyncio.get_running_loop()
        wire: list[bytes] = []
        dest = (answer.media_connection(m).host, m.port)  # type: ignore[union-attr]
        silence = codec.encode(np.zeros(160, np.int16))
        seq, end = 1000, loop.time() + 3.0
        while loop.time() < end:
            plain = RtpPacket(
                payload_type=0,
                sequence_number=seq,
                timestamp=seq * 160,
                ssrc=0xC0FFEE,
                payload=silence,
            )
            media.sendto(tx.protect(bytes(plain)), dest)
            seq += 1
            await asyncio.sleep(0.02)
            while True:
                try:
                    wire.append(media.recv(2048))
                except BlockingIOError:
                    break
        assert len(wire) > 100
        loud = quiet = quiet_noise = 0
        for data in wire:
            enc = RtpPacket.parse(data)
            try:
                dec = RtpPacket.parse(rx.unprotect(data))
            except (pylibsrtp.Error, RtpError) as exc:
                raise AssertionError(f"a packet from the gateway does not decrypt: {exc}") from exc
            pcm = codec.decode(dec.payload).astype(np.float64)
            as_plain = codec.decode(enc.payload[: len(dec.payload)]).astype(np.float64)
            rms, raw_rms = np.sqrt((pcm**2).mean()), np.sqrt((as_plain**2).mean())
            loud += rms > 300
            quiet += rms < 30
            quiet_noise += rms < 30 and raw_rms > 1000  # silence encrypted looks like noise
        assert loud >= 50, f"only {loud} loud frames of {len(wire)}: no greeting heard"
        # Every silent frame is noise as it crossed the wire: nothing went out in the clear.
        assert quiet > 0 and quiet_noise == quiet, (quiet, quiet_noise)
        call_id = next(iter(local.gw.manager.calls))
        leg = local.gw.manager.calls[call_id].leg
        stats = leg.media_stats()  # type: ignore[union-attr]
        assert stats["srtp_auth_failures"] == 0 and stats["packets_received"] > 50, stats
        # /api/calls and the logs carry no key.
        listed = await asyncio.to_thread(_get, local.http + "/api/calls")
        assert "inline" not in listed and "crypto" not in listed
        # BYE over the same connection.
        bye = dialog.create_request("BYE", sent_by=uac.sent_by, transport="TLS")
        uac.send(bye)
        assert (await uac.response("BYE")).status == 200
    finally:
        writer.close()
        media.close()
    for _ in range(100):
        if not local.gw.manager.calls:
            break
        await asyncio.sleep(0.05)
    secrets_b64 = [base64.b64encode(a.key).decode() for a in (*ours, theirs)]
    for record in caplog.records:
        text = record.getMessage()
        assert not any(k in text for k in secrets_b64), text


async def test_plain_offer_gets_488_when_srtp_is_required(secure_gateway: LocalGateway) -> None:
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(secure_gateway.sip)
        assert call.status == 488
        assert call.response is not None
        warning = call.response.headers.get("Warning") or ""
        assert "SRTP is required" in warning, warning
    finally:
        client.close()
    assert not secure_gateway.gw.manager.calls


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())
