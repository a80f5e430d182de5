"""Campaign durability end to end: real gateway processes (``voxgate gateway`` over a real Redis
bus, one ``voxgate worker`` beside them) dial a sipp UAS that answers and hangs up
(``sip-fixtures/campaign/answer_hangup.xml``) through the real :class:`CallDialer`. The INVITEs
are counted at sipp's side (``-trace_msg``), one Call-ID per call, by the contact's user part.

- Two gateways share one campaign made on the first: everybody is called, nobody twice.
- A gateway SIGKILLed mid-campaign and started again with the same owner id finishes it: nobody
  is called twice, and the attempts the kill cut off are closed ``failed``/``interrupted``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from tests.campaign.conftest import REDIS_URL
from tests.interop.conftest import Sipp, free_port, need, port_block

pytestmark = [pytest.mark.interop, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
UAS = ROOT / "sip-fixtures" / "campaign" / "answer_hangup.xml"
READY_S = 120.0


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    http: str = ""
    sip_port: int = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _spawn(workdir: Path, name: str, *args: str) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env["PYTHONUNBUFFERED"] = "1"
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxgate.cli", *args], cwd=workdir, env=env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    return Proc(proc, log_path)


class Cluster:
    """A worker and gateways on one Redis prefix; everything is stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.prefix = f"vgcamp-{uuid.uuid4().hex[:8]}"
        self.bus = ["--redis", REDIS_URL, "--bus-prefix", self.prefix]
        self.procs: list[Proc] = []
        self.worker = _spawn(workdir, "worker", "worker", *self.bus, "--worker-name", "camp-w")
        self.procs.append(self.worker)

    def gateway(self, owner: str) -> Proc:
        sip, http = free_port(), free_port()
        lo, hi = port_block(120)
        p = _spawn(
            self.workdir, f"gateway-{owner}-{sip}", "gateway", *self.bus,
            "--sip-listen", f"127.0.0.1:{sip}", "--http-listen", f"127.0.0.1:{http}",
            "--gateway-rtp-port-min", str(lo), "--gateway-rtp-port-max", str(hi),
            "--campaign-owner", owner, "--campaign-scan-s", "1", "--log-level", "debug",
        )  # fmt: skip
        p.http, p.sip_port = f"http://127.0.0.1:{http}", sip
        self.procs.append(p)
        deadline = time.monotonic() + READY_S
        while True:
            if p.proc.poll() is not None or self.worker.proc.poll() is not None:
                raise AssertionError(
                    f"exited:\n{p.log()[-3000:]}\n--- worker ---\n{self.worker.log()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(p.http + "/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return p
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"not ready:\n{p.log()[-3000:]}"
            time.sleep(0.3)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        r = Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _api(gw: Proc, method: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(gw.http + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=15) as resp:
        return json.loads(resp.read())


async def _aapi(gw: Proc, method: str, path: str, body: object | None = None) -> Any:
    return await asyncio.to_thread(_api, gw, method, path, body)


async def _wait_done(gw: Proc, cid: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = await _aapi(gw, "GET", f"/api/campaigns/{cid}")
        if body["state"] == "done":
            return body
        assert time.monotonic() < deadline, f"campaign not done: {body['totals']}"
        await asyncio.sleep(0.5)


_BLOCK = re.compile(r"message received \[\d+\] bytes :\s*\n\s*\n(.*?)(?=\n-{20,}|\Z)", re.S)


def invites(messages: str) -> dict[str, set[str]]:
    """Contact user part -> the Call-IDs of the INVITEs sipp received for it (retransmissions
    share a Call-ID: one call, one Call-ID)."""
    seen: dict[str, set[str]] = {}
    for block in _BLOCK.findall(messages):
        first = block.lstrip().split("\n", 1)[0]
        m = re.match(r"INVITE sip:([^@]+)@", first)
        cid = re.search(r"^Call-ID:\s*(\S+)", block, re.M | re.I)
        if m and cid:
            seen.setdefault(m[1], set()).add(cid[1])
    return seen


def _contacts(n: int, port: int) -> list[dict[str, Any]]:
    return [{"to": f"sip:c{i}@127.0.0.1:{port}", "vars": {"i": str(i)}} for i in range(n)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    need("sipp")
    try:
        Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


async def test_two_gateways_share_a_campaign_and_call_nobody_twice(
    cluster: Cluster, sipp: Sipp, tmp_path: Path
) -> None:
    a = cluster.gateway("gw-a")
    b = cluster.gateway("gw-b")
    port = free_port()
    proc, tag = await sipp.start(
        str(UAS), target=None, sip_port=port, args=["-d", "1000"], timeout_s=300
    )
    n = 20
    body = {"id": "share", "agent": {"kind": "ivr"}, "cps": 4, "max_concurrent": 6,
            "contacts": _contacts(n, port)}  # fmt: skip
    created = await _aapi(a, "POST", "/api/campaigns", body)
    assert created["state"] == "running"
    done = await _wait_done(b, "share")  # b reads the campaign a made from the shared store
    assert done["totals"]["outcomes"] == {"human": n}, done["totals"]

    messages = (tmp_path / f"{tag}.msg").read_text(errors="replace")
    calls = invites(messages)
    assert set(calls) == {f"c{i}" for i in range(n)}, sorted(calls)  # everybody was called
    twice = {user: ids for user, ids in calls.items() if len(ids) != 1}
    assert not twice, twice  # nobody twice
    # Which gateway placed each call (the INVITE's Via names its SIP port): printed, and both
    # must have run the campaign (b learnt of it from the store alone).
    vias = Counter(re.findall(r"^INVITE .*?\nVia: SIP/2\.0/UDP 127\.0\.0\.1:(\d+)", messages, re.M))
    print(f"INVITEs by gateway SIP port (a={a.sip_port}, b={b.sip_port}): {dict(vias)}")
    assert sum(vias.values()) == n
    assert vias[str(b.sip_port)] >= 1, vias  # b learnt of the campaign from the store alone
    assert proc.returncode is None  # the UAS is still serving


async def test_a_gateway_killed_mid_campaign_resumes_and_calls_nobody_twice(
    cluster: Cluster, sipp: Sipp, tmp_path: Path
) -> None:
    g1 = cluster.gateway("gw-restart")
    port = free_port()
    _, tag = await sipp.start(
        str(UAS), target=None, sip_port=port, args=["-d", "3000"], timeout_s=300
    )
    n = 16
    body = {"id": "crash", "agent": {"kind": "ivr"}, "cps": 4, "max_concurrent": 4,
            "contacts": _contacts(n, port)}  # fmt: skip
    await _aapi(g1, "POST", "/api/campaigns", body)
    deadline = time.monotonic() + 60
    while True:  # mid-campaign: some calls done, some up
        totals = (await _aapi(g1, "GET", "/api/campaigns/crash"))["totals"]
        if totals["attempts"] >= 6 and totals["in_flight"] >= 2:
            break
        assert time.monotonic() < deadline, totals
        await asyncio.sleep(0.1)
    g1.proc.kill()  # SIGKILL: no outcome recorded, no BYE sent, claims left behind
    g1.proc.wait(10)

    g2 = cluster.gateway("gw-restart")  # the same owner: its old claims are settled at once
    done = await _wait_done(g2, "crash")
    messages = (tmp_path / f"{tag}.msg").read_text(errors="replace")
    calls = invites(messages)
    twice = {user: ids for user, ids in calls.items() if len(ids) > 1}
    assert not twice, twice  # nobody was called twice, across the crash

    interrupted = []
    for c in done["contacts"]:
        user = f"c{c['index']}"
        assert len(c["attempts"]) == 1, c  # never re-dialled
        attempt = c["attempts"][0]
        if c["outcome"] == "human":
            assert len(calls.get(user, ())) == 1, (user, c)
        else:
            # Cut off by the kill: its INVITE may or may not have left before the kill.
            assert (c["outcome"], attempt["outcome"], attempt["reason"]) == (
                "failed", "failed", "interrupted",
            ), c  # fmt: skip
            assert len(calls.get(user, ())) <= 1
            interrupted.append(user)
    assert 1 <= len(interrupted) <= 4, interrupted  # the calls up at the kill (max_concurrent 4)
    assert done["totals"]["outcomes"] == {"human": n - len(interrupted), "failed": len(interrupted)}
    assert f"{len(interrupted)} interrupted claim(s) of gw-restart" in g2.log()
