"""Real ``voxgate gateway`` and ``voxgate worker`` processes on a private Redis, for fault tests.

Each process runs in its own session (its pid is its process group), logs to a file in the
test's directory, and is stopped (SIGTERM, then SIGKILL) at the end. Tests kill them on
purpose with :meth:`Proc.kill`. Everything talks to one private ``redis-server``
(:class:`tests.faults.redis_server.PrivateRedis`) under one key prefix.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gateway.sip import parse
from gateway.sip.message import Response
from tests.faults.redis_server import PrivateRedis
from tests.interop.conftest import free_port, port_block

ROOT = Path(__file__).resolve().parents[2]
READY_S = 90.0


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    http: str = ""
    sip: tuple[str, int] = ("127.0.0.1", 0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL (no clean-up of any kind); returns the time.time() of the kill."""
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return at

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Cluster:
    workdir: Path
    redis: PrivateRedis
    # Short TTLs so a test can watch what a killed gateway leaves behind expire.
    ttl_s: float = 3.0
    claim_idle_ms: int = 1000
    prefix: str = field(default_factory=lambda: f"vgfault-{uuid.uuid4().hex[:8]}")
    workers: dict[str, Proc] = field(default_factory=dict)
    gateway: Proc | None = None
    _logs: int = 0

    @property
    def bus_args(self) -> list[str]:
        return [
            "--redis", self.redis.url, "--bus-prefix", self.prefix,
            "--bus-audio-ttl-s", str(self.ttl_s), "--bus-cancel-ttl-s", str(self.ttl_s),
        ]  # fmt: skip

    def _spawn(self, name: str, *args: str) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
        env["PYTHONUNBUFFERED"] = "1"
        self._logs += 1
        log_path = self.workdir / f"{name}-{self._logs}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "voxgate.cli", *args], cwd=ROOT, env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return Proc(name, proc, log_path)

    def start_worker(self, name: str) -> Proc:
        p = self._spawn(
            name, "worker", *self.bus_args, "--worker-name", name,
            "--worker-claim-idle-ms", str(self.claim_idle_ms), "--worker-http-listen", "",
        )  # fmt: skip
        self.workers[name] = p
        return p

    def start_gateway(self) -> Proc:
        sip, http = free_port(), free_port()
        lo, hi = port_block(120)
        p = self._spawn(
            "gateway", "gateway", *self.bus_args,
            "--sip-listen", f"127.0.0.1:{sip}", "--http-listen", f"127.0.0.1:{http}",
            "--gateway-rtp-port-min", str(lo), "--gateway-rtp-port-max", str(hi),
            "--ivr-idle-timeout-s", "0",
        )  # fmt: skip
        p.http, p.sip = f"http://127.0.0.1:{http}", ("127.0.0.1", sip)
        self.gateway = p
        return p

    def ensure(self, workers: list[str]) -> Proc:
        """The named workers and a gateway running, and the gateway ready (blocking)."""
        for name in workers:
            w = self.workers.get(name)
            if w is None or not w.alive:
                self.start_worker(name)
        gw = self.gateway
        if gw is None or not gw.alive:
            gw = self.start_gateway()
        deadline = time.monotonic() + READY_S
        while True:
            dead = [p for p in [gw, *self.workers.values()] if p.name in [*workers, "gateway"]
                    and not p.alive]  # fmt: skip
            if dead:
                raise AssertionError(f"{dead[0].name} exited:\n{dead[0].log()[-3000:]}")
            ready = self.readyz()
            if ready is not None and ready.get("ready") and ready.get("workers", 0) >= len(workers):
                return gw
            assert time.monotonic() < deadline, f"not ready: {ready}\n{gw.log()[-3000:]}"
            time.sleep(0.2)

    def readyz(self) -> dict[str, Any] | None:
        assert self.gateway is not None
        try:
            with urllib.request.urlopen(self.gateway.http + "/readyz", timeout=2) as r:
                body: dict[str, Any] = json.loads(r.read())
                return body
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
            return body
        except (urllib.error.URLError, OSError):
            return None

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for w in self.workers.values():
            w.stop()


def options(addr: tuple[str, int], timeout: float = 2.0) -> int:
    """Send one out-of-dialog OPTIONS (RFC 3261 §11) and return the response's status."""
    tag = uuid.uuid4().hex[:10]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.settimeout(timeout)
        s.sendto(
            (f"OPTIONS sip:ivr@{addr[0]} SIP/2.0\r\n"
             f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{tag};rport\r\n"
             f"From: <sip:probe@127.0.0.1>;tag={tag}\r\nTo: <sip:ivr@{addr[0]}>\r\n"
             f"Call-ID: probe-{tag}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
             "Content-Length: 0\r\n\r\n").encode(),
            addr,
        )  # fmt: skip
        reply = parse(s.recv(65535))
    assert isinstance(reply, Response)
    return reply.status


async def options_until(addr: tuple[str, int], status: int, timeout: float) -> float:
    """Probe every 100 ms (inside the OPTIONS rate limit) until ``status``; its time.time()."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(options, addr)
        if got == status:
            return time.time()
        assert time.monotonic() < deadline, f"OPTIONS still {got}, not {status}"
        await asyncio.sleep(0.1)


class Events:
    """The gateway's /api/events, recorded with their arrival as they come."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, http: aiohttp.ClientSession, base: str) -> None:
        ws = await http.ws_connect(f"{base}/api/events")

        async def pump() -> None:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self.items.append(json.loads(msg.data))

        self._task = asyncio.create_task(pump())
        self._ws = ws

    async def close(self) -> None:
        await self._ws.close()
        if self._task is not None:
            self._task.cancel()

    def of(self, kind: str, **match: object) -> list[dict[str, Any]]:
        return [e for e in self.items
                if e["type"] == kind and all(e.get(k) == v for k, v in match.items())]  # fmt: skip

    async def wait(self, kind: str, timeout: float = 15.0, **match: object) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (found := self.of(kind, **match)):
            assert time.monotonic() < deadline, f"no {kind} {match}"
            await asyncio.sleep(0.02)
        return found[0]


def lines(text: str, pattern: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.search(pattern, ln)]
