"""The agent's ear (gateway.media.tap): frames at the asked rate, the streamed resampling equal to
the one-shot one on awkward pushes, a bounded queue that drops the oldest, and the echo gate
with its pre-roll."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dsp.resample import Resampler
from gateway.media.tap import DUCK_DB, OPEN_MS, PREROLL_MS, CallerAudioTap

N8 = 160


def tone(n: int, rate: int = 8000, hz: float = 440.0, amp: float = 8000.0) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype(np.int16)


async def drain(tap: CallerAudioTap) -> list[np.ndarray]:
    tap.close()
    return [f async for f in tap]


async def test_same_rate_frames_pass_through() -> None:
    tap = CallerAudioTap(8000, 8000)
    x = tone(5 * N8)
    for i in range(5):
        tap.push(x[i * N8 : (i + 1) * N8], agent_audible=False)
    frames = await drain(tap)
    assert len(frames) == 5 and all(f.size == N8 for f in frames)
    assert np.array_equal(np.concatenate(frames), x)


@pytest.mark.parametrize("sizes", [(160,) * 12, (7, 311, 160, 1, 481, 960)])
async def test_upsampled_stream_equals_the_one_shot_resampler(sizes: tuple[int, ...]) -> None:
    x = tone(sum(sizes), hz=1000.0)
    tap = CallerAudioTap(8000, 16000)
    at = 0
    for n in sizes:
        tap.push(x[at : at + n], agent_audible=False)
        at += n
    frames = await drain(tap)
    assert all(f.size == 320 for f in frames)
    got = np.concatenate(frames).astype(np.float64)
    rs = Resampler.for_rates(8000, 16000, pass_hz=3600.0, stop_hz=4000.0)
    want = np.clip(np.rint(rs.process_f64(x)), -32768, 32767)
    assert got.size == want.size // 320 * 320
    assert np.array_equal(got, want[: got.size])
    # The 1 kHz tone survives the upsampling at its level.
    tail = got[640:]
    assert np.sqrt(np.mean(tail**2)) == pytest.approx(8000 / np.sqrt(2), rel=0.05)


async def test_a_slow_reader_loses_the_oldest_frames_and_they_are_counted() -> None:
    tap = CallerAudioTap(8000, 8000, max_frames=3)
    for i in range(10):
        tap.push(np.full(N8, i, np.int16), agent_audible=False)
    assert tap.dropped == 7 and tap.pending() == 3
    frames = await drain(tap)
    assert [int(f[0]) for f in frames] == [7, 8, 9]


async def test_echo_gate_holds_the_agents_voice_and_releases_the_callers_onset() -> None:
    tap = CallerAudioTap(8000, 8000, echo_gate=True)
    for i in range(40):  # 800 ms of (possible) echo while the agent speaks
        tap.push(np.full(N8, i, np.int16), agent_audible=True)
    assert tap.pending() == 0 and tap.gated == 40
    tap.caller_started()  # the detector heard the caller over the agent
    kept = PREROLL_MS // 20
    assert tap.pending() == kept  # the onset before the decision, not the whole turn
    tap.push(np.full(N8, 99, np.int16), agent_audible=True)  # open while the caller talks
    tap.caller_stopped()
    tap.push(np.full(N8, 100, np.int16), agent_audible=True)  # gated again
    tap.push(np.full(N8, 101, np.int16), agent_audible=False)  # the agent is quiet: open
    frames = await drain(tap)
    assert [int(f[0]) for f in frames] == [*range(40 - kept, 40), 99, 101]


async def test_the_reader_waits_for_frames_and_ends_with_the_call() -> None:
    tap = CallerAudioTap(8000, 16000)

    async def read() -> int:
        return len([f async for f in tap])

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    assert not reader.done()
    for _ in range(4):
        tap.push(tone(N8), agent_audible=False)
    tap.close()
    tap.push(tone(N8), agent_audible=False)  # after the end: ignored
    assert await asyncio.wait_for(reader, 1.0) >= 3


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        CallerAudioTap(8000, 44100)
    with pytest.raises(ValueError):
        CallerAudioTap(8000, 8000, max_frames=0)


async def test_fill_gated_keeps_the_stream_unbroken_with_the_echo_ducked() -> None:
    # A bridged bot expects one frame per 20 ms: the withheld frames arrive in time, 30 dB
    # down, nothing is replayed when the gate opens, and the gain glides: no step.
    tap = CallerAudioTap(8000, 8000, echo_gate=True)
    tap.fill_gated = True
    for _ in range(20):  # 400 ms of (possible) echo
        tap.push(np.full(N8, 10000, np.int16), agent_audible=True)
    assert tap.pending() == 20 and tap.gated == 20
    tap.caller_started()
    for _ in range(10):  # the caller, 200 ms
        tap.push(np.full(N8, 10000, np.int16), agent_audible=True)
    tap.caller_stopped()
    tap.push(np.full(N8, 10000, np.int16), agent_audible=True)  # gated again
    x = np.concatenate(await drain(tap)).astype(np.float64)
    assert len(x) == 31 * N8
    ducked = 10000 * 10 ** (-DUCK_DB / 20)
    assert abs(x[20 * N8 - 1] - ducked) <= 1  # the echo, 30 dB down, in time
    opened = x[20 * N8 : 30 * N8]
    assert np.all(np.diff(opened) >= 0)  # rising, no step: about 0.04 dB per sample
    assert np.max(opened[1:] / opened[:-1]) < 10 ** (0.05 / 20) + 1e-3
    assert x[20 * N8 + OPEN_MS * 8] == 10000  # full level after OPEN_MS
    assert x[-1] == round(ducked)  # and down again within one frame
