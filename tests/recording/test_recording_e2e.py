"""End to end: real SIP calls from the project's UAC to an in-process gateway (memory bus, the
real onnx worker) that records them; the WAV is fetched over the token-protected API and
checked against what crossed the wire and what the call heard.

Alignment is checked on the gateway's media clock, the one both channels are defined on: the
agent's channel against the RTP the caller received (its timestamps are the gateway's media
time), the caller's channel against the frames ``Call.on_caller_audio`` was handed (observed,
not replaced), each placed by cross-correlation; the two placements must agree within 20 ms
(they agree to the sample)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import subprocess
import time
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import pytest

from gateway.app import Gateway
from gateway.call.calls import Call
from gateway.call.control import Event, RecordingEvent
from gateway.media.recording import BinaryFile
from gateway.rtp.codecs import get_codec
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway
from voxgate.bench.sipclient import ClientCall, SipClient, frame_rms

pytestmark = pytest.mark.slow

TOKEN = "rec-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEECH_RMS = 300.0
N = 160
PCMU = get_codec("PCMU")
Int16Array = npt.NDArray[np.int16]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@contextlib.asynccontextmanager
async def recording_gateway(
    engine: Engine, directory: Path, **overrides: object
) -> AsyncIterator[tuple[Gateway, str, tuple[str, int]]]:
    opts = {"recording.dir": str(directory), "recording.record_all": True,
            "gateway.api_token": TOKEN, **overrides}  # fmt: skip
    async with local_gateway(engine, name="rec", overrides=opts) as local:
        yield local.gw, local.http, local.sip


class Events:
    """The gateway's events from now on."""

    def __init__(self, gw: Gateway) -> None:
        self.seen: list[Event] = []
        self._sub = gw.manager.subscribe_events()
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def _collect(self) -> None:
        async for e in self._sub:
            self.seen.append(e)

    def recording(self, state: str) -> RecordingEvent | None:
        return next((e for e in self.seen
                     if isinstance(e, RecordingEvent) and e.state == state), None)  # fmt: skip

    async def close(self) -> None:
        await self._sub.aclose()
        self._task.cancel()


async def api(http: str, method: str, path: str, **kw: Any) -> tuple[int, bytes, str]:
    async with aiohttp.ClientSession() as s, s.request(method, http + path, **kw) as r:
        return r.status, await r.read(), r.headers.get("Content-Type", "")


def spy_on_caller_audio(call: Call) -> list[tuple[int, Int16Array]]:
    """Every caller frame the call is handed from now on, with its media time (the SIP leg
    looks the method up on each frame, so the instance attribute sees them all)."""
    seen: list[tuple[int, Int16Array]] = []
    original = call.on_caller_audio

    def spy(pcm: Int16Array) -> None:
        seen.append((call.media.tick_pos, pcm.copy()))
        original(pcm)

    setattr(call, "on_caller_audio", spy)  # noqa: B010 (an instance attribute, this call only)
    return seen


def on_media_clock(frames: list[tuple[int, Int16Array]]) -> Int16Array:
    end = max(pos + len(pcm) for pos, pcm in frames)
    out = np.zeros(end, np.int16)
    for pos, pcm in frames:
        out[pos : pos + len(pcm)] = pcm
    return out


def placement(signal: Int16Array, truth: Int16Array) -> int:
    """``p`` such that ``signal[i]`` best matches ``truth[p + i]`` (FFT cross-correlation)."""
    a = truth.astype(np.float64)
    b = signal.astype(np.float64)
    n = 1 << int(np.ceil(np.log2(len(a) + len(b))))
    c = np.fft.irfft(np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n)), n)
    return int(np.argmax(c[: len(a)]))


def read_wav(body: bytes) -> tuple[wave._wave_params, Int16Array]:
    with wave.open(io.BytesIO(body)) as w:
        params = w.getparams()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    assert len(body) == 44 + params.nframes * params.nchannels * 2, "header not final"
    return params, pcm.reshape(-1, params.nchannels)


def noise_burst(seed: int, n: int = 2400) -> Int16Array:
    return np.random.default_rng(seed).integers(-6000, 6000, n).astype(np.int16)


async def test_recorded_call_holds_both_sides_aligned(engine: Engine, tmp_path: Path) -> None:
    # No barge-in: the caller's test signal must not cut the greeting short (the agent's
    # channel then has seconds of speech to be placed by).
    async with recording_gateway(engine, tmp_path, **{"bargein.enabled": False}) as (gw, http, sip):
        events = Events(gw)
        client = await SipClient.open("127.0.0.1")
        try:
            call = await client.invite(sip, codecs=("PCMU",))
            assert call.status == 200
            (gw_call,) = gw.manager.calls.values()
            endpoint = getattr(gw_call.leg, "endpoint", None)
            assert endpoint is not None and endpoint.session is not None
            ts0 = endpoint.session.pacer.ts0
            heard = spy_on_caller_audio(gw_call)
            media = call.media
            first = await media.wait_for_audio(after=call.acked_at, threshold=SPEECH_RMS,
                                               timeout=5)  # fmt: skip
            # The caller answers the agent's first words with a known signal, and again later.
            bursts = [noise_burst(1), noise_burst(2)]
            media.send_audio(bursts[0])
            queued = time.time()
            await asyncio.sleep(2.0)
            media.send_audio(bursts[1])
            await asyncio.sleep(1.0)
            assert await call.bye() == 200
            await wait_for(lambda: events.recording("stopped"), timeout=10)
        finally:
            client.close()
            await events.close()
        stopped = events.recording("stopped")
        assert stopped is not None and stopped.channels == "both"

        # Listed and downloaded over the API, with the token only.
        base = f"/api/calls/{gw_call.id}/recordings"
        assert (await api(http, "GET", base))[0] == 401
        status, body, _ = await api(http, "GET", base, headers=AUTH)
        assert status == 200
        (listed,) = json.loads(body)["recordings"]
        assert listed["state"] == "stopped" and listed["id"] == stopped.recording_id
        assert listed["name"].endswith(f"-{gw_call.id}-testclient.wav")
        status, wav_bytes, ctype = await api(http, "GET", f"{base}/{listed['id']}", headers=AUTH)
        assert (status, ctype) == (200, "audio/wav")
        assert len(wav_bytes) == listed["bytes"] == stopped.bytes
        params, pcm = read_wav(wav_bytes)
        assert (params.nchannels, params.sampwidth, params.framerate) == (2, 2, 8000)
        left, right = pcm[:, 0], pcm[:, 1]

    # The agent's speech is on the right: as many seconds of speech as the caller heard.
    levels = frame_rms([right[i : i + N] for i in range(0, len(right) - N + 1, N)])
    assert sum(r > SPEECH_RMS for r in levels) > 75, "under 1.5 s of agent speech"

    # Right channel against the wire: the RTP timestamps are the gateway's media clock.
    wire = [(((p.ts - ts0) & 0xFFFFFFFF), PCMU.decode(p.payload)) for p in media.audio()]
    wire_agent = on_media_clock(wire)
    agent_at = placement(right, wire_agent)
    span = min(len(right), len(wire_agent) - agent_at)
    # What the gateway sent is what the file holds, to the sample (through the same G.711).
    assert np.array_equal(
        PCMU.decode(PCMU.encode(right[:span])), wire_agent[agent_at : agent_at + span]
    )

    # Left channel against what the call heard: the caller's bursts, nothing of the agent.
    caller_truth = on_media_clock(heard)
    caller_at = placement(left, caller_truth)
    skew_ms = abs(agent_at - caller_at) / 8.0
    assert skew_ms <= 20.0, f"channels {skew_ms} ms apart"
    assert agent_at == caller_at  # the same media clock: no skew at all
    # Where both the file and the spy have frames (either may have started first), the file
    # holds exactly what the call heard.
    lo = max(0, heard[0][0] - caller_at)
    hi = min(len(left), len(caller_truth) - caller_at)
    assert hi - lo > 3 * 8000
    assert np.array_equal(left[lo:hi], caller_truth[caller_at + lo : caller_at + hi])
    # The caller's signal, frame by frame: each 20 ms packet of it lands whole on a tick of
    # the left channel, in order; the jitter buffer may have dropped or stretched a few where
    # it adapted to a stall of the busy gateway (the recording keeps what the call heard).
    blocks = {left[i : i + N].tobytes(): i for i in range(0, len(left) - N + 1, N)}
    starts = []
    for burst in bursts:
        sent = PCMU.decode(PCMU.encode(burst))  # what the gateway decoded
        found = [(k, blocks.get(sent[k * N : (k + 1) * N].tobytes())) for k in range(15)]
        hits = [(k, i) for k, i in found if i is not None]
        assert len(hits) >= 10, f"{len(hits)} of 15 frames of the caller's signal on the left"
        assert [i for _, i in hits] == sorted(i for _, i in hits)
        starts.append(hits[0][1] - hits[0][0] * N)
    # Apart by the 2 s the caller waited, give or take its 20 ms send slots and what the
    # jitter buffer's adaptation moved in between (a frame at a time, up to its 200 ms).
    gap_ms = (starts[1] - starts[0]) / 8.0
    assert abs(gap_ms - 2000.0) <= 220.0, gap_ms
    quiet = np.ones(len(left), bool)
    for at in starts:
        quiet[at - N : at + 2400 + 4 * N] = False  # and a concealed frame or three
    assert np.abs(left[quiet].astype(np.int32)).max() < 50, "agent audio leaked into the left"

    # How late the caller's answer sits after the agent's first words, against the caller's
    # own reaction: the rest is the send slot (<= 20 ms) plus the gateway's jitter buffer.
    greeting_at = ((first.ts - ts0) & 0xFFFFFFFF) - agent_at  # its index in the file
    recorded_ms = (starts[0] - greeting_at) / 8.0
    reaction_ms = (queued - first.arrival) * 1000.0
    extra = recorded_ms - reaction_ms
    print(f"\nrecording: channel skew {skew_ms:.1f} ms; caller answer {recorded_ms:.1f} ms after "
          f"the agent's first loud frame in the file, caller reacted in {reaction_ms:.1f} ms: "
          f"send slot + jitter buffer {extra:.1f} ms; bursts {gap_ms:.0f} ms apart (sent "
          f"2000 ms apart)")  # fmt: skip
    assert 0.0 <= extra <= 300.0


# --- a full disk, a read-only disk ----------------------------------------------------------
def _mount(target: Path, options: str) -> bool:
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True, check=False)  # fmt: skip
    return done.returncode == 0


@contextlib.contextmanager
def broken_directory(tmp_path: Path, kind: str) -> Iterator[tuple[Path, str, bool]]:
    """A directory where recordings fail: (path, the error code expected, whether the gateway
    must be given an opener that fails because nothing real could be set up)."""
    target = tmp_path / kind
    target.mkdir()
    mounted = False
    try:
        if kind == "disk_full":
            # 64 KiB: about 2 s of 8 kHz stereo.
            mounted = _mount(target, "size=64k,mode=0777")
            yield target, "disk_full", not mounted
        else:
            mounted = _mount(target, "ro,size=64k")
            if not mounted:
                if os.geteuid() == 0:
                    pytest.skip("root without mount: a read-only directory cannot be made")
                target.chmod(0o555)
            yield target, "permission", False
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(target)], check=False)
        with contextlib.suppress(OSError):
            target.chmod(0o755)


class _NoRoom:
    """Stands in for a file on a full disk where none can be mounted: takes ``room`` bytes,
    then ENOSPC, like an unbuffered write on a full filesystem."""

    def __init__(self, path: Path, room: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "xb", buffering=0)  # noqa: SIM115
        self.room = room

    def write(self, data: bytes, /) -> int:
        left = self.room - self._f.tell()
        if left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self._f.write(data[:left]) or 0)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        return self._f.seek(offset, whence)

    def truncate(self, size: int | None = None, /) -> int:
        return self._f.truncate(size)

    def close(self) -> None:
        self._f.close()


@pytest.mark.parametrize("kind", ["disk_full", "read_only"])
async def test_a_broken_disk_leaves_the_call_up(engine: Engine, tmp_path: Path, kind: str) -> None:
    with broken_directory(tmp_path, kind) as (directory, code, simulate):
        async with recording_gateway(engine, directory) as (gw, http, sip):
            if simulate:

                def opener(path: Path) -> BinaryFile:
                    return _NoRoom(path, 64 * 1024)

                gw.recordings.opener = opener
            events = Events(gw)
            client = await SipClient.open("127.0.0.1")
            try:
                call = await client.invite(sip, codecs=("PCMU",))
                assert call.status == 200
                (gw_call,) = gw.manager.calls.values()
                await wait_for(lambda: events.recording("failed"), timeout=15)
                failed = events.recording("failed")
                assert failed is not None and failed.code == code, failed
                failed_at = time.time()
                # The call goes on: still answered, its audio still flowing both ways.
                await check_call_goes_on(call, gw_call, failed_at)
                status, body, _ = await api(http, "GET", "/metrics")
                assert status == 200
                assert f'voxgate_recording_errors_total{{code="{code}"}} 1.0' in body.decode()
                base = f"/api/calls/{gw_call.id}/recordings"
                status, body, _ = await api(http, "GET", base, headers=AUTH)
                (listed,) = json.loads(body)["recordings"]
                assert listed["state"] == "failed" and listed["code"] == code
                assert listed["error"]
                if code == "disk_full":
                    # What fitted is a valid WAV, its header final.
                    status, wav_bytes, _ = await api(
                        http, "GET", f"{base}/{listed['id']}", headers=AUTH
                    )
                    assert status == 200
                    params, _pcm = read_wav(wav_bytes)
                    assert params.nframes > 8000  # over a second fitted
                    print(f"\nrecording: {kind}: {failed.reason}; kept {failed.duration_s} s")
                else:
                    print(f"\nrecording: {kind}: {failed.reason}")
                assert await call.bye() == 200
            finally:
                client.close()
                await events.close()


async def check_call_goes_on(call: ClientCall, gw_call: Call, since: float) -> None:
    await asyncio.sleep(1.0)
    assert gw_call.info.state == "answered"
    arrived = [p for p in call.media.audio() if p.arrival >= since]
    assert len(arrived) >= 40, f"{len(arrived)} packets in the second after the failure"
    assert not call.ended and not call.remote_bye.is_set()
