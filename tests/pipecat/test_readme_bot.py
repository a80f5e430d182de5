"""The README's pipecat bot (voxgate's voice in a Twilio phone bot) is code that runs: it is
taken from the README as written and served to a Twilio-like caller, whose greeting arrives."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from dsp.g711 import ulaw_decode
from synth.engines import load_engine
from synth.worker import Worker
from voxgate.contract.bus.redis_bus import RedisBus

README = Path(__file__).resolve().parents[2] / "README.md"
REDIS = "redis://127.0.0.1:6379/0"


def readme_bot() -> str:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    bots = [b for b in blocks if "VoxgateTTSService" in b and "TwilioFrameSerializer" in b]
    assert len(bots) == 1, "the README has one pipecat phone bot example"
    code: str = bots[0]
    assert len(code.strip().splitlines()) <= 32, "the example stays short"
    return code


def test_the_readme_bot_is_short_and_declares_its_websocket() -> None:
    ns: dict[str, Any] = {}
    exec(compile(readme_bot(), "README.md", "exec"), ns)
    paths = [getattr(r, "path", None) for r in ns["app"].routes]
    assert "/ws" in paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.redis
async def test_the_readme_bot_greets_a_twilio_like_caller() -> None:
    import uvicorn

    prefix = f"vg-readme-{time.time_ns()}"
    bus = RedisBus(REDIS, prefix=prefix)
    try:
        await bus.start()
    except Exception as exc:  # pragma: no cover - make test starts Redis
        pytest.skip(f"no Redis: {exc}")
    ns: dict[str, Any] = {}
    code = readme_bot().replace(
        f'redis_url="{REDIS}"', f'redis_url="{REDIS}", bus_prefix="{prefix}"'
    )
    assert prefix in code
    exec(compile(code, "README.md", "exec"), ns)
    stop = asyncio.Event()
    worker = Worker(bus, load_engine("onnx"), name="readme", concurrency=1)
    worker_task = asyncio.create_task(worker.run(stop))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(ns["app"], host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        heard = 0
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                try:
                    ws = await session.ws_connect(f"ws://127.0.0.1:{port}/ws")
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            sid = "MZ" + "1" * 32
            await ws.send_str(json.dumps({"event": "connected", "protocol": "Call"}))
            await ws.send_str(
                json.dumps(
                    {
                        "event": "start",
                        "streamSid": sid,
                        "start": {
                            "streamSid": sid,
                            "callSid": "CA" + "2" * 32,
                            "accountSid": "AC" + "3" * 32,
                            "customParameters": {},
                            "mediaFormat": {
                                "encoding": "audio/x-mulaw",
                                "sampleRate": 8000,
                                "channels": 1,
                            },
                        },
                    }
                )
            )
            deadline = time.monotonic() + 60
            while heard < 8000 and time.monotonic() < deadline:
                msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
                data = json.loads(msg.data)
                if data.get("event") == "media":
                    pcm = ulaw_decode(base64.b64decode(data["media"]["payload"]))
                    heard += int(np.count_nonzero(np.abs(pcm.astype(np.int32)) > 300))
            await ws.send_str(json.dumps({"event": "stop", "streamSid": sid}))
            await ws.close()
        assert heard >= 8000, "the greeting (a second of audible samples) arrived"
    finally:
        server.should_exit = True
        thread.join(10)
        stop.set()
        await worker_task
        await bus.close()
