"""Gateway and worker as separate processes over a real Redis, with a real SIP peer (sipp).

`voxgate gateway --redis` and `voxgate worker --redis` share nothing but Redis Streams; sipp
places a call; the control API's event stream shows the greeting being played.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def voxgate(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "voxgate.cli", *args], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def wait_ready(
    http: aiohttp.ClientSession, gw: subprocess.Popen[bytes], base: str, timeout: float = 90
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert gw.poll() is None, (gw.stderr.read() if gw.stderr else b"").decode()[-2000:]
        try:
            async with http.get(f"{base}/readyz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        assert time.monotonic() < deadline, "gateway+worker never became ready"
        await asyncio.sleep(0.2)


@pytest.mark.skipif(shutil.which("sipp") is None, reason="sipp (Debian sip-tester) not installed")
async def test_sip_call_through_separate_gateway_and_worker(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    prefix = f"vgsplit-{uuid.uuid4().hex[:8]}"
    sip_port, http_port = free_port(), free_port(socket.SOCK_STREAM)
    bus = ["--redis", REDIS_URL, "--bus-prefix", prefix]
    procs.append(voxgate("worker", *bus, "--worker-name", "split-w1"))
    gw = voxgate("gateway", *bus, "--sip-listen", f"127.0.0.1:{sip_port}",
                 "--http-listen", f"127.0.0.1:{http_port}")  # fmt: skip
    procs.append(gw)
    base = f"http://127.0.0.1:{http_port}"
    async with aiohttp.ClientSession() as http:
        await wait_ready(http, gw, base)
        events: list[dict[str, object]] = []
        async with http.ws_connect(f"{base}/api/events") as ws:
            sipp = await asyncio.create_subprocess_exec(
                "sipp", "-sn", "uac", f"127.0.0.1:{sip_port}", "-m", "1", "-d", "6000",
                "-timeout", "30", "-nostdin", "-trace_err",
                cwd="/tmp", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                while True:
                    msg = await ws.receive(timeout=30)
                    assert msg.type == aiohttp.WSMsgType.TEXT, msg
                    ev = json.loads(msg.data)
                    events.append(ev)
                    if ev["type"] == "call.state" and ev["state"] == "ended":
                        break
            finally:
                rc = await asyncio.wait_for(sipp.wait(), 30)
        assert rc == 0, (await sipp.stderr.read()).decode() if sipp.stderr else rc
        kinds = [(e["type"], e.get("state")) for e in events]
        assert ("call.state", "answered") in kinds
        started = [e for e in events if e["type"] == "utterance.started"]
        assert started and "Thank you for calling" in str(started[0]["text"])
        async with http.get(f"{base}/api/calls") as r:
            assert (await r.json())["calls"] == []


async def test_browser_call_through_separate_gateway_and_worker(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """A WebRTC call whose wideband audio is synthesised by a worker in another process."""
    from voxgate.bench.webrtc_client import WebRtcClient

    prefix = f"vgsplit-{uuid.uuid4().hex[:8]}"
    http_port = free_port(socket.SOCK_STREAM)
    bus = ["--redis", REDIS_URL, "--bus-prefix", prefix]
    procs.append(voxgate("worker", *bus, "--worker-name", "split-w2"))
    gw = voxgate("gateway", *bus, "--sip-listen", f"127.0.0.1:{free_port()}",
                 "--http-listen", f"127.0.0.1:{http_port}")  # fmt: skip
    procs.append(gw)
    base = f"http://127.0.0.1:{http_port}"
    async with aiohttp.ClientSession() as http:
        await wait_ready(http, gw, base)
        client = WebRtcClient(base)
        try:
            await client.connect()
            await client.wait_audio(timeout=15)
            await asyncio.sleep(1.5)
            # Wideband speech at a normal level: energy above 4 kHz is there (no phone band).
            import numpy as np

            pcm = client.heard.pcm().astype(np.float64)
            assert float(np.sqrt(np.mean(pcm**2))) > 500
            # All of it (~1.5 s of the greeting): how much lies above 4.5 kHz varies with the
            # words (0.8-3e-3 of the energy in one second of it); a 3.8 kHz telephone chain
            # leaves < 1e-6, so 1e-4 tells the two apart with a 10x margin either side.
            spectrum = np.abs(np.fft.rfft(pcm)) ** 2
            freqs = np.fft.rfftfreq(pcm.size, 1 / 48000)
            high = spectrum[(freqs > 4500) & (freqs < 8000)].sum() / spectrum.sum()
            assert high > 1e-4, high
            client.press("1")
            await client.wait_message("dtmf", digit="1")
        finally:
            await client.hangup()
        deadline = time.monotonic() + 5
        while True:
            async with http.get(f"{base}/api/calls") as r:
                if (await r.json())["calls"] == []:
                    break
            assert time.monotonic() < deadline, "the browser call was not cleaned up"
            await asyncio.sleep(0.1)
