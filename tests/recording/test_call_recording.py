"""Recording a real ``Call`` (memory bus, the real manager and writer thread) driven tick by tick
as a leg drives it, its control API over real HTTP (token required) and its metrics."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.recordings import recording_routes
from gateway.api.routes import make_app
from gateway.call.calls import Call
from gateway.call.control import (
    BadRequest,
    Conflict,
    Event,
    RecordingEvent,
    Unavailable,
    UnknownCall,
    UnknownRecording,
)
from gateway.call.manager import CallManager
from gateway.media.recording import Recordings
from gateway.metrics import GatewayMetrics
from tests.waiting import wait_for
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import RecordingConfig

N = 160
TOKEN = "s3cret-token"


class FakeLeg:
    def __init__(self, call: Call) -> None:
        self.call = call

    async def hangup(self, reason: str) -> None:
        await self.call.ended(reason)

    async def send_dtmf(self, digits: str) -> None:
        pass

    def media_stats(self) -> dict[str, float]:
        return {}


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[CallManager]:
    bus = MemoryBus()
    await bus.start()
    m = CallManager(bus, None, max_calls=4)
    cfg = RecordingConfig(dir=str(tmp_path / "rec"))
    recordings = m.recordings = Recordings(cfg, poll_s=0.02)
    yield m
    await recordings.close()
    await bus.close()


def events_of(manager: CallManager) -> list[Event]:
    seen: list[Event] = []

    async def collect() -> None:
        async for e in manager.subscribe_events():
            seen.append(e)

    asyncio.get_running_loop().create_task(collect())
    return seen


def recording_event(seen: list[Event], state: str) -> RecordingEvent | None:
    return next((e for e in seen if isinstance(e, RecordingEvent) and e.state == state), None)


async def answered(manager: CallManager, remote: str = "sip:+15550100@example.com") -> Call:
    call = manager.new_call("sip", "inbound", remote, "sip:ivr@gw")
    call.leg = FakeLeg(call)
    call.set_state("answered")
    await call.start(None)
    return call


def tone(n: int, hz: float = 440.0, amp: float = 8000.0) -> npt.NDArray[np.int16]:
    t = np.arange(n) / 8000.0
    return np.rint(amp * np.sin(2 * np.pi * hz * t)).astype(np.int16)


async def run_ticks(
    call: Call, first: int, count: int, caller: npt.NDArray[np.int16], lost: set[int]
) -> list[npt.NDArray[np.int16]]:
    """Ticks as a SIP leg makes them: pull the agent's frame at media time k·N, then hand over
    the caller's (none for a lost packet); returns what the agent sent."""
    sent = []
    for k in range(first, first + count):
        sent.append(call.pull_audio(N, k * N).copy())
        if k not in lost:
            call.on_caller_audio(caller[k * N : (k + 1) * N])
        if k % 10 == 0:
            await asyncio.sleep(0)
    return sent


async def test_a_call_recorded_between_start_and_hangup(manager: CallManager) -> None:
    seen = events_of(manager)
    call = await answered(manager)
    caller = np.arange(200 * N, dtype=np.int64).astype(np.int16) % 1000 - 500
    # Before the recording: not in the file.
    await run_ticks(call, 0, 20, caller.astype(np.int16), set())
    call.play_audio("u1", tone(60 * N))  # the agent's own audio, through the playout
    call.end_audio("u1")
    info = manager.start_recording(call.id, "both")
    assert info["state"] == "starting" and info["channels"] == "both"
    with pytest.raises(Conflict, match="already being recorded"):
        manager.start_recording(call.id)
    lost = {30, 31, 32, 77}  # RTP packets that never came
    sent = await run_ticks(call, 20, 80, caller.astype(np.int16), lost)
    await wait_for(lambda: recording_event(seen, "started"), timeout=5)
    await call.hangup("test")  # hang-up flushes and finalises
    await wait_for(lambda: recording_event(seen, "stopped"), timeout=5)
    stopped = recording_event(seen, "stopped")
    assert stopped is not None and stopped.recording_id == info["id"]
    assert stopped.duration_s == 80 * N / 8000
    with wave.open(stopped.path) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 8000)
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16).reshape(-1, 2)
    assert len(pcm) == 80 * N
    # Right: exactly what went to the wire, tick by tick.
    assert np.array_equal(pcm[:, 1], np.concatenate(sent))
    assert np.abs(pcm[:, 1]).max() > 7000  # the agent's tone is in it
    # Left: the caller, silence where the packets were lost, in the same ticks.
    want = caller[20 * N : 100 * N].astype(np.int16).copy()
    for k in lost:
        want[(k - 20) * N : (k - 19) * N] = 0
    assert np.array_equal(pcm[:, 0], want)
    # Listed after the call ended.
    listed = manager.list_recordings(call.id)
    assert [r["state"] for r in listed] == ["stopped"]
    assert manager.recording_file(call.id, str(info["id"])) == stopped.path


async def test_recording_errors(manager: CallManager) -> None:
    call = await answered(manager)
    with pytest.raises(BadRequest, match="channels"):
        call.start_recording("left")
    with pytest.raises(Conflict, match="not being recorded"):
        manager.stop_recording(call.id)
    with pytest.raises(UnknownCall):
        manager.start_recording("nope")
    with pytest.raises(UnknownCall):
        manager.list_recordings("nope")
    rid = call.start_recording("caller")
    with pytest.raises(UnknownRecording):
        manager.recording_file(call.id, "nope")
    call.stop_recording()
    call.stop_recording()  # nothing to stop: a no-op for agents
    assert call.start_recording() != rid  # a new one after a stop
    await call.hangup("test")
    with pytest.raises(Conflict, match="ended"):
        call.start_recording()
    assert manager.recordings is not None
    manager.recordings = None
    other = await answered(manager)
    with pytest.raises(Unavailable):
        other.start_recording()


async def test_record_all_starts_with_the_call(tmp_path: Path) -> None:
    bus = MemoryBus()
    await bus.start()
    manager = CallManager(bus, None)
    cfg = RecordingConfig(dir=str(tmp_path), record_all=True, channels="caller")
    manager.recordings = Recordings(cfg, poll_s=0.02)
    try:
        call = await answered(manager)
        assert call.recorder is not None and call.recorder.channels == "caller"
        await run_ticks(call, 0, 10, np.ones(10 * N, np.int16), set())
        await call.hangup("test")
        await wait_for(lambda: call.recorder is None and manager.recordings is not None
                       and manager.recordings.active == 0, timeout=5)  # fmt: skip
        (rec,) = manager.list_recordings(call.id)
        assert (rec["state"], rec["duration_s"]) == ("stopped", 10 * N / 8000)
    finally:
        await manager.recordings.close()
        await bus.close()


@pytest.fixture
async def client(manager: CallManager) -> AsyncIterator[TestClient[Any, Any]]:
    app = make_app(manager, token=TOKEN, max_text_chars=100,
                   extra_routes=recording_routes(manager))  # fmt: skip
    c: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await c.start_server()
    yield c
    await c.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_rest_api(manager: CallManager, client: TestClient[Any, Any]) -> None:
    seen = events_of(manager)
    call = await answered(manager)
    base = f"/api/calls/{call.id}/recordings"
    for method, path in (("GET", base), ("POST", base), ("POST", base + "/stop"),
                         ("DELETE", base), ("GET", base + "/x")):  # fmt: skip
        r = await client.request(method, path)
        assert r.status == 401, (method, path)
    r = await client.post(base, json={"channels": "left"}, headers=AUTH)
    assert r.status == 422 and "channels" in (await r.json())["error"]["message"]
    r = await client.post(base, json={"chanels": "both"}, headers=AUTH)
    assert r.status == 422
    r = await client.post(base, data="channels=both", headers=AUTH)
    assert r.status == 415
    r = await client.post(base, json={}, headers=AUTH)
    assert r.status == 201
    started = await r.json()
    assert r.headers["Location"] == f"{base}/{started['id']}"
    r = await client.post(base, json={}, headers=AUTH)
    assert r.status == 409
    await run_ticks(call, 0, 50, np.full(50 * N, 100, np.int16), set())
    await wait_for(lambda: recording_event(seen, "started"), timeout=5)
    r = await client.get(base, headers=AUTH)
    (listed,) = (await r.json())["recordings"]
    assert listed["id"] == started["id"] and listed["state"] == "recording"
    r = await client.post(base + "/stop", headers=AUTH)
    assert r.status == 204
    r = await client.delete(base, headers=AUTH)
    assert r.status == 409
    await wait_for(lambda: recording_event(seen, "stopped"), timeout=5)
    r = await client.get(f"{base}/{started['id']}", headers=AUTH)
    assert r.status == 200 and r.headers["Content-Type"] == "audio/wav"
    body = await r.read()
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getnchannels(), w.getnframes()) == (2, 50 * N)
    r = await client.get(base, headers=AUTH)
    (listed,) = (await r.json())["recordings"]
    assert listed["state"] == "stopped" and listed["bytes"] == len(body)
    assert listed["name"].endswith(f"-{call.id}-+15550100.wav")
    # A second recording, stopped with DELETE.
    r = await client.post(base, json={"channels": "caller"}, headers=AUTH)
    assert r.status == 201
    r = await client.delete(base, headers=AUTH)
    assert r.status == 204

    def stops() -> list[RecordingEvent]:
        return [e for e in seen if isinstance(e, RecordingEvent) and e.state == "stopped"]

    await wait_for(lambda: len(stops()) == 2, timeout=5)
    assert stops()[0].path != stops()[1].path  # within a second: numbered, not overwritten
    r = await client.get(f"{base}/nope", headers=AUTH)
    assert r.status == 404 and (await r.json())["error"]["code"] == "unknown_recording"
    r = await client.get("/api/calls/nope/recordings", headers=AUTH)
    assert r.status == 404 and (await r.json())["error"]["code"] == "unknown_call"
    # The file removed behind the gateway's back (retention): 404, not a 500.
    Path(listed["path"]).unlink()
    r = await client.get(f"{base}/{started['id']}", headers=AUTH)
    assert r.status == 404 and "gone" in (await r.json())["error"]["message"]


async def test_metrics(manager: CallManager) -> None:
    metrics = GatewayMetrics(manager, manager.bus)
    assert manager.recordings is not None
    call = await answered(manager)
    call.start_recording()
    await run_ticks(call, 0, 25, np.zeros(25 * N, np.int16), set())
    await wait_for(lambda: manager.recordings is not None and manager.recordings.bytes_written
                   and manager.recordings.active, timeout=5)  # fmt: skip
    manager.recordings.errors["disk_full"] += 1  # as the writer counts a failed recording

    got = {}
    for fam in text_string_to_metric_families((await metrics.render()).decode()):
        if "recording" in fam.name:
            for s in fam.samples:
                got[(s.name, s.labels.get("code", ""))] = s.value
    assert got[("voxgate_recordings_active", "")] == 1
    assert got[("voxgate_recording_written_bytes_total", "")] > 0
    assert got[("voxgate_recording_errors_total", "disk_full")] == 1
    assert got[("voxgate_recording_errors_total", "permission")] == 0
    assert got[("voxgate_recording_dropped_frames_total", "")] == 0
    await metrics.close()
