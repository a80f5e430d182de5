"""The pipecat bot of :mod:`voxgate.bench.pipecat_bot` as a child process, for the stream
bridge's end-to-end tests (a SIP caller in ``tests/gateway_e2e/test_stream_bridge.py``, a
browser in ``tests/browser/test_stream_bridge_browser.py``): started, waited for until its
``/health`` answers, its JSON-lines event log read back, and stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxgate.bench.localgw import free_port

ROOT = Path(__file__).resolve().parents[2]
# The bot builds pipecat, Silero and Piper on its first call; its start alone is quick.
START_TIMEOUT_S = 90.0


def free_tcp_port() -> int:
    return free_port(socket.SOCK_STREAM)


@dataclass
class BotProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    out: Path

    def url(self, path: str = "/ws") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(OSError):
            for line in self.log.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    e = json.loads(line)
                    if name is None or e["event"] == name:
                        out.append(e)
        return out

    async def wait_for(self, name: str, count: int = 1, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while len(found := self.events(name)) < count:
            if time.monotonic() > deadline:
                tail = self.out.read_text(errors="replace")[-2000:]
                raise TimeoutError(f"the bot logged no {name!r} #{count}; its output: {tail}")
            await asyncio.sleep(0.05)
        return found[count - 1]


@contextlib.contextmanager
def run_bot(
    work: Path, *, base_url: str | None = None, auth_token: str | None = None
) -> Iterator[BotProcess]:
    """The bot on a free port, its log and output in ``work``; ``base_url`` / ``auth_token``
    are where its ``/ws-rest`` route hangs up through the Twilio REST API."""
    port = free_tcp_port()
    log, out = work / "events.jsonl", work / "bot.log"
    cmd = [sys.executable, "-m", "voxgate.bench.pipecat_bot", "--port", str(port),
           "--log", str(log)]  # fmt: skip
    if base_url is not None:
        cmd += ["--base-url", base_url]
    if auth_token is not None:
        cmd += ["--auth-token", auth_token]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(out, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the bot exited: {out.read_text(errors='replace')[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError("the bot did not start") from None
                time.sleep(0.2)
        yield BotProcess(proc, port, log, out)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
