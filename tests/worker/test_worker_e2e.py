"""End to end: `voxgate worker` processes with the real onnx engine over a real Redis.

These are the separate-process deployments: a client (standing in for the gateway) talks to
workers only through Redis Streams. One worker is killed with SIGKILL mid-utterance and another
claims its request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REDIS_URL
from voxgate.bench.localgw import free_port
from voxgate.contract.bus.redis_bus import RedisBus
from voxgate.contract.bus.schema import (
    AudioChunk,
    AudioMessage,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def prefix() -> str:
    return f"vge2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def bus(prefix: str) -> AsyncIterator[RedisBus]:
    b = RedisBus(REDIS_URL, prefix=prefix)
    await b.start()
    yield b
    await b.close()
    import redis.asyncio as aioredis

    r = aioredis.from_url(REDIS_URL)
    keys = [k async for k in r.scan_iter(f"{prefix}:*")]
    if keys:
        await r.delete(*keys)
    await r.aclose()


class Workers:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, claim_idle_ms: int = 1000) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "voxgate.cli", "worker", "--redis", REDIS_URL,
            "--bus-prefix", self.prefix, "--worker-name", name,
            "--worker-claim-idle-ms", str(claim_idle_ms), "--concurrency", "2",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
        self.procs[name] = proc
        return proc

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def workers(prefix: str) -> Iterator[Workers]:
    w = Workers(prefix)
    yield w
    w.stop_all()


async def wait_ready(bus: RedisBus, name: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if any(w.get("worker") == name for w in await bus.ready_workers()):
            return
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"worker {name} exited with {proc.returncode}: {err[-2000:]}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"worker {name} never became ready")


async def read_until_end(sub: object, timeout: float = 30) -> list[AudioMessage]:
    out: list[AudioMessage] = []
    while True:
        m = await sub.get(timeout)  # type: ignore[attr-defined]
        assert m is not None, f"no end after {len(out)} messages"
        out.append(m)
        if isinstance(m, UtteranceEnd | UtteranceError):
            return out


async def test_worker_process_speaks_over_redis(bus: RedisBus, workers: Workers) -> None:
    proc = workers.start("w1")
    await wait_ready(bus, "w1", proc)
    req = SpeakRequest(
        call_id="call-e2e", utterance_id=uuid.uuid4().hex,
        text="Thank you for calling. Your balance is $42.50.", trace_id="trace-1",
    )  # fmt: skip
    sub = await bus.subscribe(req.call_id)
    await bus.submit(req)
    msgs = await read_until_end(sub)
    await sub.close()
    end = msgs[-1]
    assert isinstance(end, UtteranceEnd) and end.reason == "done", end
    chunks = [m for m in msgs if isinstance(m, AudioChunk)]
    assert all(c.rate == 8000 and c.trace_id == "trace-1" for c in chunks)
    pcm = np.frombuffer(b"".join(c.data for c in chunks), "<i2").astype(np.float64) / 32768
    assert end.samples == len(pcm)
    assert 2.0 < len(pcm) / 8000 < 8.0  # two short sentences of speech
    # Speech energy where the words are, and at least 8 of the 11 spoken words marked.
    words = [w for c in chunks for w in c.words]
    assert len(words) >= 8
    levels = []
    for w in words:
        seg = pcm[w.start : w.end]
        assert len(seg), w
        levels.append(20 * np.log10(np.sqrt(np.mean(seg**2)) + 1e-9))
    # Every marked word carries sound (quiet ones like "is" sit near -40 dBFS narrowband), and
    # speech sits at a telephone level overall (about -20 dBFS active).
    assert min(levels) > -50, list(zip(words, levels, strict=True))
    assert float(np.median(levels)) > -30
    assert np.abs(pcm).max() < 0.95  # the limiter keeps G.711 from clipping

    # SIGTERM: the worker retires its heartbeat and exits cleanly.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert not [w for w in await bus.ready_workers() if w.get("worker") == "w1"]


async def test_killed_workers_request_is_finished_by_another(
    bus: RedisBus, workers: Workers
) -> None:
    w1 = workers.start("w1")
    await wait_ready(bus, "w1", w1)
    text = " ".join(["Please listen carefully, as our menu options have changed."] * 6)
    req = SpeakRequest(call_id="call-kill", utterance_id=uuid.uuid4().hex, text=text)
    sub = await bus.subscribe(req.call_id)
    await bus.submit(req)
    first = await sub.get(30)
    assert isinstance(first, AudioChunk)
    w1.send_signal(signal.SIGKILL)
    w1.wait(10)
    assert (await bus.pending())[1] == 1  # delivered to w1, never acknowledged
    w2 = workers.start("w2")
    await wait_ready(bus, "w2", w2)
    msgs = await read_until_end(sub, timeout=60)
    await sub.close()
    end = msgs[-1]
    assert isinstance(end, UtteranceEnd) and end.reason == "done", end
    # w2 re-rendered the utterance from its start (seq 0 again); the gateway plays only the
    # next seq it expects, so the restart is harmless to the caller.
    seqs = [m.seq for m in msgs if isinstance(m, AudioChunk)]
    restart = len(seqs) - 1 - seqs[::-1].index(0)
    assert seqs[restart:] == list(range(len(seqs) - restart))
    assert end.samples == sum(m.samples for m in msgs[restart:] if isinstance(m, AudioChunk))
    deadline = time.monotonic() + 10  # the ack follows the end message
    while await bus.pending() != (0, 0):
        assert time.monotonic() < deadline, await bus.pending()
        await asyncio.sleep(0.05)


async def test_bad_requests_do_not_disturb_other_calls(bus: RedisBus, workers: Workers) -> None:
    proc = workers.start("w1")
    await wait_ready(bus, "w1", proc)
    good = SpeakRequest(call_id="good", utterance_id="u-good", text="Your call is important to us.")
    bad = SpeakRequest(call_id="bad", utterance_id="u-bad", text="x" * 6000)
    s_good, s_bad = await bus.subscribe("good"), await bus.subscribe("bad")
    await bus.submit(bad)
    await bus.submit(good)
    await bus._redis.xadd(bus.request_stream, {"v": "1", "call": "bad", "utt": "u-x"})
    bad_msgs = [await s_bad.get(30), await s_bad.get(30)]
    good_msgs = await read_until_end(s_good)
    codes = sorted(m.code for m in bad_msgs if isinstance(m, UtteranceError))
    assert codes == ["bad_request", "text_too_long"]
    assert isinstance(good_msgs[-1], UtteranceEnd) and good_msgs[-1].reason == "done"
    await s_good.close()
    await s_bad.close()
    assert proc.poll() is None


def _serve_then_sigterm(extra: list[str], ready: str, delay: float = 0.0) -> tuple[int, str]:
    """Start ``voxgate serve`` (ports picked by the OS), wait for the stderr line holding
    ``ready``, wait ``delay`` s, SIGTERM it: (exit status, what it logged while stopping)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxgate.cli", "serve", *extra, "--sip-listen", "127.0.0.1:0",
         "--http-listen", "127.0.0.1:0"], cwd=ROOT, env=env,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 90
        seen = ""
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
            if ready in line:
                break
        assert ready in seen, seen
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()  # what it logged while stopping: the reason if it fails
        return proc.wait(30), rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_starts_ready_and_stops_on_sigterm() -> None:
    rc, rest = _serve_then_sigterm([], " ready ")
    assert rc == 0, rest[-3000:]


def test_sigterm_while_the_background_renders_exits_cleanly(tmp_path: Path) -> None:
    # A SIGTERM while a pool thread was inside the engine (background warm-up, prerender)
    # aborted the process at exit: "terminate called without an active exception", rc -6.
    # The prompts to prerender keep the background busy for seconds after ready.
    prompts = ", ".join(
        f'"Thank you for calling, this is prompt number {n} of the menu, please hold."'
        for n in range(6)
    )
    cfg = tmp_path / "voxgate.toml"
    cfg.write_text(f"[synth]\nprerender = [{prompts}]\n")
    for delay in (0.3, 0.6, 0.9):
        rc, rest = _serve_then_sigterm(["--config", str(cfg)], " ready (engine=", delay)
        assert rc == 0, rest[-3000:]
        assert "terminate called" not in rest


def _options(sip_port: int, sock: socket.socket) -> str:
    """One SIP OPTIONS (RFC 3261 §11) from ``sock``: the status line and any Retry-After, or
    "" without an answer within 0.3 s."""
    branch = "z9hG4bK" + uuid.uuid4().hex[:12]
    port = sock.getsockname()[1]
    msg = (
        f"OPTIONS sip:127.0.0.1:{sip_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch={branch};rport\r\nMax-Forwards: 70\r\n"
        f"From: <sip:probe@127.0.0.1>;tag=p1\r\nTo: <sip:127.0.0.1:{sip_port}>\r\n"
        f"Call-ID: {uuid.uuid4().hex}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    )
    sock.sendto(msg.encode(), ("127.0.0.1", sip_port))
    try:
        lines = sock.recv(4096).decode(errors="replace").split("\r\n")
    except TimeoutError:
        return ""
    retry = [v for v in lines if v.lower().startswith("retry-after:")]
    return " | ".join([lines[0], *retry])


def test_serve_answers_503_on_sip_while_its_engine_loads(tmp_path: Path) -> None:
    # A cold graph cache: the engine splits and optimises the voice's graph (seconds). The
    # gateway listens first and says "not yet" (503 + Retry-After) the whole time; it used to
    # load the engine first, and its SIP port answered nothing until then.
    sip_port = free_port(both=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxgate.cli", "serve", "--sip-listen",
             f"127.0.0.1:{sip_port}", "--http-listen", "127.0.0.1:0", "--worker-http-listen", "",
             "--synth-graph-cache-dir", str(tmp_path / "graphs")], cwd=ROOT, env=env, stderr=err,
        )  # fmt: skip
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.3)
    answers: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
            answers and answers[-1].startswith("SIP/2.0 200")
        ):
            assert proc.poll() is None, log.read_text()[-3000:]
            if answer := _options(sip_port, sock):
                answers.append(answer)
            else:
                time.sleep(0.1)
        text = log.read_text()
        assert answers and "200" in answers[-1][:12], (answers, text[-3000:])
        # Listening before the engine was loaded, not after (the log's order, not timing):
        assert text.index("SIP listening") < text.index("onnx engine: voice"), text[-3000:]
        unready = [a for a in answers if a.startswith("SIP/2.0 503")]
        assert unready and all("Retry-After:" in a for a in unready), answers
        assert set(answers) <= {*unready, answers[-1]}, answers  # 503s, then 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
