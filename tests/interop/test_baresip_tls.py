"""baresip (a real softphone, headless) and the gateway over SIP/TLS with SRTP required
(issue 15 part 1): the caller hears the greeting, decrypted at baresip's side.

The gateway runs ``srtp = "required"`` with a TLS listener; the PKI is made for the test
(``tests.secure.certs``). baresip's account says ``transport=tls`` and ``mediaenc=srtp-mand``
(RTP/SAVP with a=crypto; its ``srtp.so`` drops any packet that does not decrypt), and its
``sndfile`` recording of the decoded audio must hold the greeting, as in ``test_baresip``.

* inbound: baresip dials ``sip:ivr@127.0.0.1:<tls>;transport=tls``;
* outbound: POST /api/calls to ``sip:tester@127.0.0.1:<baresip tls>;transport=tls``: the
  gateway opens the TLS connection and verifies baresip's certificate (from the test CA,
  for 127.0.0.1) against ``tls_ca_file``;
* a baresip without SRTP gets 488 from the same gateway.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import EventFeed, GatewayProc, need, port_block, start_gateway
from tests.interop.test_baresip import baresip, check_greeting, frame_rms, write_silence
from tests.secure.certs import Pki, make_pki

pytestmark = [pytest.mark.slow, pytest.mark.interop]

GREETING = "Thank you for calling voxgate. This is the secure test line."
CALL_S = 8


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_gateway(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[GatewayProc]:
    need("baresip")
    tls_port = port_block(1)[0]
    gw = start_gateway(
        tmp_path_factory.mktemp("tls-gw"),
        "--ivr-greeting",
        GREETING,
        "--ivr-idle-timeout-s",
        "60",
        "--gateway-tls-listen",
        f"127.0.0.1:{tls_port}",
        "--gateway-tls-cert",
        str(pki.server.cert),
        "--gateway-tls-key",
        str(pki.server.key),
        "--gateway-tls-ca-file",
        str(pki.ca),
        "--gateway-srtp",
        "required",
    )
    gw.tls_port = tls_port  # type: ignore[attr-defined]
    try:
        yield gw
    finally:
        gw.stop()
    problems = gw.log_problems()
    assert not problems, f"gateway logged errors:\n{gw.log()[-6000:]}"


def baresip_tls_config(
    root: Path, pki: Pki, *, answer: str, mediaenc: str | None = "srtp-mand"
) -> tuple[Path, int]:
    """A baresip config dir with TLS (its certificate from the test CA) and SRTP; returns it
    and baresip's TLS port (libre listens for TLS one above ``sip_listen``)."""
    cfg, rec = root / "baresip", root / "rec"
    cfg.mkdir()
    rec.mkdir()
    mic = root / "silence.wav"
    write_silence(mic, 30)
    sip_port = port_block(2)[0]
    rtp = port_block(20)
    lines = [
        "poll_method epoll",
        f"sip_listen 127.0.0.1:{sip_port}",
        f"sip_certificate {pki.server.combined}",
        f"sip_cafile {pki.ca}",
        f"rtp_ports {rtp[0]}-{rtp[1]}",
        "audio_player aubridge,nowhere",
        "audio_alert aubridge,nowhere",
        f"audio_source aufile,{mic}",
        "ausrc_srate 8000",
        "auplay_srate 8000",
        "ausrc_channels 1",
        "auplay_channels 1",
        "module_path /usr/lib/baresip/modules",
        "module g711.so",
        "module aufile.so",
        "module aubridge.so",
        "module sndfile.so",
        "module srtp.so",
        "module menu.so",
        "module_app account.so",
        f"snd_path {rec}",
    ]
    (cfg / "config").write_text("\n".join(lines) + "\n")
    enc = f";mediaenc={mediaenc}" if mediaenc else ""
    (cfg / "accounts").write_text(
        f"<sip:tester@127.0.0.1:{sip_port};transport=tls>;regint=0;answermode={answer};"
        f"audio_codecs=PCMU{enc}\n"
    )
    (cfg / "contacts").write_text("")
    return cfg, sip_port + 1


@pytest.mark.parametrize("direction", ["inbound", "outbound"])
async def test_baresip_over_tls_with_srtp_hears_the_greeting(
    tls_gateway: GatewayProc, pki: Pki, tmp_path: Path, direction: str
) -> None:
    gw = tls_gateway
    tls_port: int = gw.tls_port  # type: ignore[attr-defined]
    cfg, baresip_tls = baresip_tls_config(
        tmp_path, pki, answer="auto" if direction == "outbound" else "manual"
    )
    log = tmp_path / "baresip.log"
    commands = (
        [f"/dial sip:ivr@127.0.0.1:{tls_port};transport=tls"] if direction == "inbound" else []
    )
    async with EventFeed(gw.http) as feed, baresip(cfg, log, *commands, seconds=CALL_S) as proc:
        if direction == "outbound":
            await asyncio.sleep(1.0)  # baresip binds its SIP sockets
            to = f"sip:tester@127.0.0.1:{baresip_tls};transport=tls"
            cid = (await asyncio.to_thread(_post_call, gw, to))["id"]
        else:
            cid = (await feed.wait_for("call.state", state="ringing", timeout=10))["call_id"]
        await feed.wait_for("call.state", call_id=cid, state="answered", timeout=10)
        await asyncio.wait_for(proc.wait(), CALL_S + 10)
        ended = await feed.wait_for("call.state", call_id=cid, state="ended", timeout=10)
        text = log.read_text(errors="replace")
        assert "Call established" in text, text[-3000:]
        # baresip's BYE came back over TLS to the Contact we gave (transport=tls).
        assert ended["reason"] == "remote hangup", ended
        finished = await feed.wait_for("utterance.finished", call_id=cid)
        assert finished["outcome"] == "done", finished
    # SRTP on both sides: baresip's srtp-mand decrypted every packet it played.
    assert "SRTP is Enabled (cryptosuite=AES_CM_128_HMAC_SHA1_80)" in text, text[-3000:]
    assert "failed to decrypt" not in text, text[-3000:]
    (dec,) = sorted((tmp_path / "rec").glob("dump-*-dec.wav"))
    check_greeting(frame_rms(dec))
    metrics = await asyncio.to_thread(_metrics, gw)
    assert 'voxgate_srtp_auth_failures_total{leg="sip"} 0.0' in metrics
    assert 'voxgate_sip_tls_failures_total{reason="certificate"} 0.0' in metrics
    await gw.wait_no_calls()


async def test_baresip_without_srtp_gets_488(
    tls_gateway: GatewayProc, pki: Pki, tmp_path: Path
) -> None:
    gw = tls_gateway
    tls_port: int = gw.tls_port  # type: ignore[attr-defined]
    cfg, _ = baresip_tls_config(tmp_path, pki, answer="manual", mediaenc=None)
    log = tmp_path / "baresip.log"
    dial = f"/dial sip:ivr@127.0.0.1:{tls_port};transport=tls"
    async with baresip(cfg, log, dial, seconds=3) as proc:
        await asyncio.wait_for(proc.wait(), 15)
    text = log.read_text(errors="replace")
    assert "488 Not Acceptable Here" in text, text[-3000:]
    assert "Call established" not in text
    await gw.wait_no_calls()


def _post_call(gw: GatewayProc, to: str) -> dict[str, Any]:
    req = urllib.request.Request(
        gw.http + "/api/calls",
        data=json.dumps({"to": to}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.loads(resp.read())
    assert isinstance(body, dict)
    return body


def _metrics(gw: GatewayProc) -> str:
    with urllib.request.urlopen(gw.http + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())
