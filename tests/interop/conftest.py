"""Interop fixtures: a real ``voxgate serve`` process on free ports, driven by real SIP peers
(sipp scenarios from ``sip-fixtures/scenarios``, baresip).

Every process started here is killed by a finalizer. Ports: SIP/HTTP come from the kernel
(bind to port 0); RTP ranges and sipp media ports come from a block below the Linux ephemeral
range (32768+) that is handed out once per session, so concurrent peers never share a port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "sip-fixtures" / "scenarios"
SIPP_PCAPS = Path("/usr/share/sip-tester")
READY_TIMEOUT_S = 90.0
RTP_PORTS = 240  # 120 calls per gateway


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop: drives a real voxgate process with real SIP peers")


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (deploy/ensure-test-tools.sh installs it)")
    return path


# --- ports ------------------------------------------------------------------------------------
_next_port = [20000]


def _bindable(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def port_block(size: int) -> tuple[int, int]:
    """``size`` consecutive free ports (UDP and TCP), never handed out twice in a session."""
    while True:
        start = _next_port[0]
        _next_port[0] += size
        if start + size > 32000:
            raise RuntimeError("ran out of test port blocks")
        if all(_bindable(p) for p in range(start, start + size)):
            return start, start + size - 1


def free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (SIP listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if _bindable(port):
            return port
    raise RuntimeError("no free port")


# --- the gateway --------------------------------------------------------------------------------
@dataclass
class GatewayProc:
    proc: subprocess.Popen[bytes]
    sip_port: int
    http_port: int
    rtp_range: tuple[int, int]
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def sip(self) -> str:
        return f"127.0.0.1:{self.sip_port}"

    def log(self, since: int = 0) -> str:
        with self.log_path.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_problems(self, since: int = 0) -> list[str]:
        """Tracebacks and ERROR lines the gateway logged (none is expected in any test)."""
        return [
            line
            for line in self.log(since).splitlines()
            if "Traceback" in line or " ERROR " in line or " CRITICAL " in line
        ]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.http + path, timeout=10) as resp:
            return json.loads(resp.read())

    def calls(self) -> list[dict[str, Any]]:
        body = self.get("/api/calls")
        calls = body["calls"] if isinstance(body, dict) else body
        assert isinstance(calls, list)
        return calls

    async def acalls(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.calls)

    async def wait_no_calls(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while (calls := await self.acalls()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert calls == [], f"calls left on the gateway: {calls}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_gateway(workdir: Path, *extra: str) -> GatewayProc:
    sip_port, http_port = free_port(), free_port()
    while http_port == sip_port:
        http_port = free_port()
    rtp = port_block(RTP_PORTS)  # RTP + RTCP: two ports a call
    log_path = workdir / f"voxgate-{sip_port}.log"
    args = [
        sys.executable, "-m", "voxgate.cli", "serve",
        "--sip-listen", f"127.0.0.1:{sip_port}", "--http-listen", f"127.0.0.1:{http_port}",
        "--gateway-rtp-port-min", str(rtp[0]), "--gateway-rtp-port-max", str(rtp[1]),
        "--log-level", "debug", *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
    gw = GatewayProc(proc, sip_port, http_port, rtp, log_path, args)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"voxgate exited {proc.returncode}:\n{gw.log()[-4000:]}")
        try:
            with urllib.request.urlopen(gw.http + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return gw
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    gw.stop()
    raise AssertionError(f"voxgate not ready in {READY_TIMEOUT_S} s:\n{gw.log()[-4000:]}")


class GatewayFactory:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[GatewayProc] = []

    def __call__(self, *extra: str) -> GatewayProc:
        gw = start_gateway(self.workdir, *extra)
        self.started.append(gw)
        return gw

    def close(self) -> None:
        for gw in self.started:
            gw.stop()
        for gw in self.started:
            problems = gw.log_problems()
            assert not problems, f"gateway logged errors:\n{gw.log()[-6000:]}"


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[GatewayFactory]:
    need("sipp")
    factory = GatewayFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    """One plain gateway shared by the tests that need nothing special (saves start-ups)."""
    need("sipp")
    gw = start_gateway(tmp_path_factory.mktemp("gateway"))
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(autouse=True)
def _gateway_log_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared gateway: it logged no error or traceback."""
    if "gateway" not in request.fixturenames:
        yield
        return
    gw: GatewayProc = request.getfixturevalue("gateway")
    mark = gw.log_size()
    yield
    problems = gw.log_problems(mark)
    assert not problems, f"gateway logged errors:\n{gw.log(mark)[-6000:]}"
    assert gw.alive(), "the gateway died"


# --- sipp ------------------------------------------------------------------------------------
@dataclass
class SippResult:
    rc: int
    stats: dict[str, str]
    output: str
    errors: str
    messages: str

    def count(self, name: str) -> int:
        return int(self.stats.get(f"{name}(C)", "0") or 0)

    @property
    def successful(self) -> int:
        return self.count("SuccessfulCall")

    @property
    def failed(self) -> int:
        return self.count("FailedCall")

    def describe(self) -> str:
        interesting = {k: v for k, v in self.stats.items() if k.endswith("(C)") and v not in "0"}
        return (
            f"sipp rc={self.rc} stats={interesting}\n--- errors ---\n{self.errors[-3000:]}"
            f"\n--- output ---\n{self.output[-2500:]}\n--- messages ---\n{self.messages[-4000:]}"
        )

    def assert_ok(self, calls: int = 1) -> None:
        assert self.rc == 0, self.describe()
        assert self.successful == calls, self.describe()
        assert self.failed == 0, self.describe()


def _read_stats(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    if len(lines) < 2:
        return {}
    return dict(zip(lines[0].split(";"), lines[-1].split(";"), strict=False))


class Sipp:
    """Runs sipp as a subprocess (asyncio, so a test can query the gateway meanwhile)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[asyncio.subprocess.Process] = []
        self._n = 0

    def _common(self, tag: str, sip_port: int, media_port: int) -> list[str]:
        return [
            "-nostdin", "-i", "127.0.0.1", "-p", str(sip_port),
            "-mi", "127.0.0.1", "-mp", str(media_port),
            "-trace_stat", "-stf", str(self.workdir / f"{tag}.csv"), "-fd", "1",
            "-trace_err", "-error_file", str(self.workdir / f"{tag}.err"),
            "-trace_msg", "-message_file", str(self.workdir / f"{tag}.msg"),
        ]  # fmt: skip

    async def start(
        self,
        scenario: str,
        *,
        target: str | None,
        args: Sequence[str] = (),
        sip_port: int | None = None,
        timeout_s: int = 60,
    ) -> tuple[asyncio.subprocess.Process, str]:
        self._n += 1
        tag = f"{Path(scenario).stem}-{self._n}"
        media = port_block(8)[0]
        path = scenario if scenario.startswith("-") else str(SCENARIOS / scenario)
        cmd = ["sipp"]
        cmd += ["-sn", path[1:]] if scenario.startswith("-") else ["-sf", path]
        if target is not None:
            cmd.append(target)
        cmd += self._common(tag, sip_port or free_port(), media)
        cmd += ["-timeout", f"{timeout_s}s", "-timeout_error", *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=self.workdir, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc, tag

    async def wait(self, started: tuple[asyncio.subprocess.Process, str]) -> SippResult:
        proc, tag = started
        out, _ = await proc.communicate()
        rc = proc.returncode if proc.returncode is not None else -1

        def text(suffix: str) -> str:
            p = self.workdir / f"{tag}.{suffix}"
            return p.read_text(errors="replace") if p.exists() else ""

        return SippResult(
            rc, _read_stats(self.workdir / f"{tag}.csv"), out.decode(errors="replace"),
            text("err"), text("msg"),
        )  # fmt: skip

    async def run(
        self,
        scenario: str,
        *,
        target: str | None,
        args: Sequence[str] = (),
        sip_port: int | None = None,
        timeout_s: int = 60,
    ) -> SippResult:
        started = await self.start(
            scenario, target=target, args=args, sip_port=sip_port, timeout_s=timeout_s
        )
        return await self.wait(started)

    def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()


@pytest.fixture
def sipp(tmp_path: Path) -> Iterator[Sipp]:
    need("sipp")
    runner = Sipp(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


# --- the event feed ----------------------------------------------------------------------------
class EventFeed:
    """Collects every ``/api/events`` message in the background."""

    def __init__(self, http: str) -> None:
        self.url = http.replace("http://", "ws://") + "/api/events"
        self.events: list[dict[str, Any]] = []
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventFeed:
        self._session = aiohttp.ClientSession()
        ws = await self._session.ws_connect(self.url, heartbeat=None)
        self._task = asyncio.create_task(self._read(ws))
        return self

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(msg.data)
                if isinstance(data, dict):
                    self.events.append(data)

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._session is not None:
            await self._session.close()

    def of(self, type_: str, call_id: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("type") == type_ and (call_id is None or e.get("call_id") == call_id)
        ]

    async def wait_count(
        self, n: int, type_: str, timeout: float = 10.0, **match: object
    ) -> list[dict[str, Any]]:
        """The events matching once there are ``n`` of them (the websocket delivers an event
        a moment after the state it reports shows in the REST API); all there are at the
        deadline otherwise, for the caller's assertion to show."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.of(type_) if all(e.get(k) == v for k, v in match.items())]
            if len(found) >= n or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.05)

    async def wait_for(self, type_: str, timeout: float = 15.0, **match: object) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("type") == type_ and all(e.get(k) == v for k, v in match.items()):
                    return e
            if time.monotonic() > deadline:
                raise AssertionError(f"no {type_} event matching {match}; got {self.events}")
            await asyncio.sleep(0.05)
