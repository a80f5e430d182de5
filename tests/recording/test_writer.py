"""The recorder's layers on their own: the aligner (frames by media time, silence where a side
had nothing), the WAV writer (header patched and finalised), names (sanitised), the retention
sweep, and the writer thread with real files, a full device and refused permissions."""

from __future__ import annotations

import errno
import io
import os
import re
import time
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from gateway.call.control import CallInfo, Event, RecordingEvent
from gateway.media.recording import (
    HEADER_BYTES,
    Aligner,
    BinaryFile,
    Recorder,
    Recordings,
    WavFile,
    block_bytes,
    caller_label,
    error_code,
    recording_name,
    sanitise,
    sweep,
)
from tests.waiting import wait_for
from voxgate.contract.config import ConfigError, RecordingConfig, load

Int16Array = npt.NDArray[np.int16]
N = 160  # a 20 ms frame at 8 kHz


def frame(value: int, n: int = N) -> Int16Array:
    return np.full(n, value, np.int16)


def released(aligner: Aligner, final: bool = False) -> Int16Array:
    """What ``take`` gives, silence runs expanded, as (samples, channels)."""
    parts = []
    for block in aligner.take(final):
        if isinstance(block, int):
            parts.append(np.zeros((block, aligner.channels), np.int16))
        else:
            parts.append(block)
    return np.concatenate(parts) if parts else np.zeros((0, aligner.channels), np.int16)


def ticks(aligner: Aligner, count: int, *, start: int = 0,
          skip_caller: frozenset[int] | set[int] = frozenset(),
          skip_agent: frozenset[int] | set[int] = frozenset()) -> None:  # fmt: skip
    """``count`` media ticks as a call makes them: the agent frame, then the caller's; tick
    ``k`` carries the value k+1 (agent) and -(k+1) (caller)."""
    for k in range(start, start + count):
        if k not in skip_agent:
            aligner.add(1, k * N, frame(k + 1))
        if k not in skip_caller:
            aligner.add(0, k * N, frame(-(k + 1)))


# --- the aligner ----------------------------------------------------------------------------
def test_stereo_layout_and_silence_where_a_side_had_nothing() -> None:
    a = Aligner(2, lag=5 * N, window=50 * N)
    # Tick 3 and 4: the caller's packets were lost; tick 6: the agent sent nothing.
    ticks(a, 10, skip_caller={3, 4}, skip_agent={6})
    out = released(a, final=True)
    assert out.shape == (10 * N, 2)
    for k in range(10):
        left, right = out[k * N : (k + 1) * N, 0], out[k * N : (k + 1) * N, 1]
        assert (left == (0 if k in (3, 4) else -(k + 1))).all(), k  # caller: left
        assert (right == (0 if k == 6 else k + 1)).all(), k  # agent: right


def test_release_waits_lag_behind_the_furthest_frame() -> None:
    a = Aligner(2, lag=3 * N, window=50 * N)
    ticks(a, 8)
    out = released(a)
    assert len(out) == 5 * N  # 3 frames held back for a late other side
    # The writer drained between the agent's and the caller's frame of tick 8: the caller's
    # still lands beside the agent's, not after it.
    a.add(1, 8 * N, frame(9))
    a.add(1, 9 * N, frame(10))
    a.add(0, 8 * N, frame(-9))
    a.add(0, 9 * N, frame(-10))
    rest = released(a, final=True)
    full = np.concatenate([out, rest])
    assert len(full) == 10 * N
    assert (full[8 * N : 9 * N, 0] == -9).all() and (full[8 * N : 9 * N, 1] == 9).all()
    assert a.late == 0


def test_a_frame_for_released_media_time_is_dropped_and_counted() -> None:
    a = Aligner(2, lag=N, window=50 * N)
    ticks(a, 10)
    released(a)  # up to tick 9
    a.add(0, 2 * N, frame(7))  # far too late
    a.add(0, 9 * N - N // 2, frame(5))  # half of it is still open
    out = released(a, final=True)
    assert a.late == N + N // 2
    assert (out[:, 0] == 5).sum() == N // 2


def test_a_jump_past_the_window_becomes_silence() -> None:
    # Ticks skipped in a long stall move media time on; the file keeps the gap as silence.
    a = Aligner(2, lag=N, window=10 * N)
    ticks(a, 2)
    ticks(a, 2, start=40)
    out = released(a, final=True)
    assert out.shape == (42 * N, 2)
    assert not out[2 * N : 40 * N].any()
    assert (out[40 * N : 41 * N, 1] == 41).all()


def test_mono_keeps_the_caller_and_runs_on_the_agents_clock() -> None:
    # A browser leg may hand over no caller frame on a tick: the agent's frames still move
    # the clock, so the caller's channel gets silence there rather than closing the gap.
    a = Aligner(1, lag=N, window=50 * N)
    ticks(a, 6, skip_caller={2, 5})
    out = released(a, final=True)
    assert out.shape == (6 * N, 1)
    assert [int(out[k * N, 0]) for k in range(6)] == [-1, -2, 0, -4, -5, 0]


def test_streamed_release_equals_one_shot() -> None:
    # Drained at awkward moments or all at the end: the same file.
    rng = np.random.default_rng(1)
    frames = [(ch, k * N, rng.integers(-3000, 3000, N).astype(np.int16))
              for k in range(60) for ch in (1, 0) if rng.random() > 0.1]  # fmt: skip
    one = Aligner(2, lag=4 * N, window=20 * N)
    for f in frames:
        one.add(*f)
    whole = released(one, final=True)
    streamed = Aligner(2, lag=4 * N, window=20 * N)
    parts = []
    for i, f in enumerate(frames):
        streamed.add(*f)
        if i % 7 == 3:
            parts.append(released(streamed))
    parts.append(released(streamed, final=True))
    assert np.array_equal(np.concatenate(parts), whole)


def test_block_bytes_interleaves_little_endian() -> None:
    block = np.array([[1, -2], [3, 4]], np.int16)
    assert block_bytes(block, 2) == [b"\x01\x00\xfe\xff\x03\x00\x04\x00"]
    assert b"".join(block_bytes(70000, 2)) == bytes(70000 * 4)


# --- the WAV file ---------------------------------------------------------------------------
def test_wav_header_is_patched_and_finalised(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    f = open(path, "xb", buffering=0)  # noqa: SIM115 (closed by finish)
    wav = WavFile(f, 8000, 2)
    data = np.arange(-800, 800, dtype=np.int16).reshape(-1, 2)
    wav.write(data.tobytes())
    wav.patch()
    # Readable mid-recording, up to the patch.
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 8000)
        assert w.getnframes() == 800
    wav.write(data.tobytes())
    wav.finish()
    with wave.open(str(path)) as w:
        assert w.getnframes() == 1600
        got = np.frombuffer(w.readframes(1600), np.int16).reshape(-1, 2)
    assert np.array_equal(got, np.concatenate([data, data]))
    assert path.stat().st_size == HEADER_BYTES + 1600 * 4


class FullDisk(io.BytesIO):
    """A file on a device with ``room`` bytes: a write past it is cut short, the next one
    raises ENOSPC (what an unbuffered write on a full filesystem does)."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.closed_cleanly = False

    def write(self, data: bytes, /) -> int:  # type: ignore[override]
        end = self.tell() + len(data)
        if end > self.room:
            fit = self.room - self.tell()
            if fit <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = bytes(data)[:fit]
        return super().write(data)

    def close(self) -> None:
        self.closed_cleanly = True  # keep the buffer readable for the test


def test_a_full_disk_leaves_a_valid_wav_of_whole_frames() -> None:
    f = FullDisk(HEADER_BYTES + 1001)  # room for 250 frames and a quarter
    wav = WavFile(f, 8000, 2)
    with pytest.raises(OSError) as info:
        for _ in range(10):
            wav.write(bytes(400))
    assert error_code(info.value) == "disk_full"
    wav.finish()
    data = f.getvalue()
    assert len(data) == HEADER_BYTES + 1000  # the part frame is cut off
    with wave.open(io.BytesIO(data)) as w:
        assert w.getnframes() == 250
    assert f.closed_cleanly


# --- names ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("remote", "label"),
    [
        ("sip:+15551234@example.com", "+15551234"),
        ("sips:alice@example.com;transport=tls", "alice"),
        ('"Mallory" <sip:../../etc/passwd@evil.example>', "_.._etc_passwd"),
        ("sip:..@x", "unknown"),
        ("tel:+44-20-7946-0000", "+44-20-7946-0000"),
        ("browser:127.0.0.1:50123", "127.0.0.1_50123"),
        ("sip:Zoë Ünïcode@h", "Zo_n_code"),
        ("sip:a%2F..%2Fb@h", "a_2F.._2Fb"),
        ("", "unknown"),
    ],
)
def test_caller_labels_are_sanitised(remote: str, label: str) -> None:
    assert caller_label(remote) == label


def test_sanitise_never_gives_a_path() -> None:
    for value in ("../..", "/etc/passwd", "a/b\\c", ".hidden", "-rf", "x" * 500, "\x00\n"):
        s = sanitise(value)
        assert "/" not in s and "\\" not in s and not s.startswith((".", "-")) and s
        assert len(s) <= 48


def test_recording_name_stays_under_the_directory() -> None:
    started = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    name = recording_name(
        "{date}/{time}-{call_id}-{caller}.wav", call_id="c/../1", caller="../../x",
        started=started, recording_id="r1",
    )  # fmt: skip
    assert name == "2023-11-14/221320-c_.._1-_.._x.wav"
    nasty = recording_name("{caller}/{id}.wav", call_id="c", caller="..", started=started,
                           recording_id="../r")  # fmt: skip
    assert nasty == "unknown/_r.wav"


@pytest.mark.parametrize(
    "pattern",
    ["/abs/{call_id}.wav", "../{call_id}.wav", "a/../../{id}.wav", "{call_id}.mp3",
     "{nope}.wav", "{call_id.__class__}.wav", "{call_id", ""],
)  # fmt: skip
def test_bad_patterns_are_refused_at_load(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"recording\.pattern"):
        load(None, env={}, overrides={"recording.pattern": pattern})


def test_config_section() -> None:
    cfg = load(None, env={"VOXGATE_RECORDING_CHANNELS": "caller",
                          "VOXGATE_RECORDING_RECORD_ALL": "true"})  # fmt: skip
    assert (cfg.recording.channels, cfg.recording.record_all) == ("caller", True)
    for key, value in (("recording.channels", "left"), ("recording.retention_days", -1),
                       ("recording.max_queue_s", 0.0), ("recording.dir", " ")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(key)):
            load(None, env={}, overrides={key: value})


# --- retention ------------------------------------------------------------------------------
def test_sweep_deletes_old_recordings_only(tmp_path: Path) -> None:
    now = time.time()
    day = 86400.0

    def make(rel: str, age_days: float) -> Path:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"RIFF")
        os.utime(p, (now - age_days * day, now - age_days * day))
        return p

    old = make("2024-01-01/old.wav", 40)
    old_busy = make("2024-01-01/busy.wav", 40)  # still being written (kept)
    new = make("2024-03-01/new.wav", 1)
    other = make("2024-01-01/notes.txt", 40)  # not ours
    gone_dir = make("2023-12-01/x.wav", 60).parent
    os.utime(gone_dir, (now - 60 * day, now - 60 * day))
    deleted = sweep(tmp_path, 30 * day, now, keep={old_busy})
    assert sorted(deleted) == sorted([old, gone_dir / "x.wav"])
    assert not old.exists() and old_busy.exists() and new.exists() and other.exists()
    # The emptied directory is old itself once its file is gone? Its mtime just changed, so
    # it waits for the next sweep (a new recording may be about to land in it).
    assert gone_dir.exists()
    assert sweep(tmp_path, 30 * day, now + 31 * day, keep={old_busy, new}) == []
    assert not gone_dir.exists()
    assert tmp_path.exists()
    assert sweep(tmp_path / "missing", 1.0, now) == []


# --- the writer thread ----------------------------------------------------------------------
class Call:
    """What a recording needs of a call (``RecordedCall``), recording its events."""

    def __init__(self, call_id: str = "c1", remote: str = "sip:alice@example.com",
                 rate: int = 8000) -> None:  # fmt: skip
        self.id = call_id
        self.info = CallInfo(call_id, "sip", "inbound", "answered", remote, "sip:ivr@gw", 0.0)
        self.rate = rate
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def recording(self, state: str) -> RecordingEvent | None:
        return next((e for e in self.events
                     if isinstance(e, RecordingEvent) and e.state == state), None)  # fmt: skip


def settings(tmp_path: Path, **kw: object) -> RecordingConfig:
    cfg = RecordingConfig(dir=str(tmp_path / "rec"), **kw)  # type: ignore[arg-type]
    cfg.validate()
    return cfg


async def test_recording_through_the_writer_thread(tmp_path: Path) -> None:
    recs = Recordings(settings(tmp_path), poll_s=0.02)
    call = Call(remote="sip:+15550001@example.com")
    rec = recs.record(call, "both")
    for k in range(100):  # 2 s of ticks; the caller's packets 40-49 were lost
        rec.agent(k * N, frame(k + 1))
        if not 40 <= k < 50:
            rec.caller(k * N, frame(-(k + 1)))
    await wait_for(lambda: call.recording("started"), timeout=5)
    started = call.recording("started")
    assert started is not None and started.path.endswith("-c1-+15550001.wav")
    assert recs.active == 1
    rec.stop()
    await wait_for(lambda: call.recording("stopped"), timeout=5)
    stopped = call.recording("stopped")
    assert stopped is not None
    assert (stopped.duration_s, stopped.bytes) == (2.0, HEADER_BYTES + 100 * N * 4)
    path = Path(stopped.path)
    assert path.parent.parent == tmp_path / "rec"
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 8000, 100 * N)
        pcm = np.frombuffer(w.readframes(100 * N), np.int16).reshape(-1, 2)
    assert path.stat().st_size == stopped.bytes
    assert path.stat().st_mode & 0o007 == 0, "a recording readable by everyone"
    assert [int(pcm[k * N, 1]) for k in range(100)] == [k + 1 for k in range(100)]
    assert [int(pcm[k * N, 0]) for k in range(100)] == [
        0 if 40 <= k < 50 else -(k + 1) for k in range(100)
    ]
    assert recs.active == 0 and recs.bytes_written == 100 * N * 4
    listed = recs.of_call("c1")[0].to_json()
    assert listed["state"] == "stopped" and listed["bytes"] == stopped.bytes
    # Frames after the stop are ignored (the media path may tick once more).
    rec.caller(100 * N, frame(1))
    await recs.close()


async def test_mono_caller_only(tmp_path: Path) -> None:
    recs = Recordings(settings(tmp_path, pattern="{id}.wav"), poll_s=0.02)
    call = Call(rate=16000)
    rec = recs.record(call, "caller")
    for k in range(10):
        rec.agent(k * 320, frame(5, 320))
        rec.caller(k * 320, frame(-7, 320))
    rec.stop()
    await wait_for(lambda: call.recording("stopped"), timeout=5)
    with wave.open(str(rec.path)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (1, 16000, 3200)
        assert set(np.frombuffer(w.readframes(3200), np.int16).tolist()) == {-7}
    assert rec.path.name == f"{rec.id}.wav"
    await recs.close()


async def test_two_recordings_in_the_same_second_get_two_files(tmp_path: Path) -> None:
    recs = Recordings(settings(tmp_path, pattern="{call_id}.wav"), poll_s=0.02)
    call = Call()
    first, second = recs.record(call, "both"), recs.record(call, "both")
    first.stop()
    second.stop()
    await wait_for(lambda: not recs.active and len(call.events) == 4, timeout=5)
    assert {first.name, second.name} == {"c1.wav", "c1-2.wav"}
    await recs.close()


async def test_a_full_device_fails_the_recording_not_the_caller(tmp_path: Path) -> None:
    # /dev/full: every write fails with ENOSPC, as a full disk's does.
    def opener(path: Path) -> BinaryFile:
        return open("/dev/full", "wb", buffering=0)

    recs = Recordings(settings(tmp_path), opener=opener, poll_s=0.02)
    call = Call()
    rec = recs.record(call, "both")
    rec.agent(0, frame(1))
    await wait_for(lambda: call.recording("failed"), timeout=5)
    failed = call.recording("failed")
    assert failed is not None and failed.code == "disk_full"
    assert failed.reason is not None and "No space left on device" in failed.reason
    assert recs.errors == {"disk_full": 1, "permission": 0, "io": 0}
    assert not rec.active and recs.active == 0
    rec.agent(N, frame(1))  # the media path goes on; nothing is queued
    assert rec.frames_dropped == 0
    await recs.close()


async def test_a_disk_filling_mid_call_keeps_what_fit(tmp_path: Path) -> None:
    disk = FullDisk(HEADER_BYTES + 40 * N * 4 + 2)

    recs = Recordings(settings(tmp_path), opener=lambda path: disk, poll_s=0.02)
    call = Call()
    rec = recs.record(call, "both")
    for k in range(100):
        rec.agent(k * N, frame(k + 1))
        rec.caller(k * N, frame(-(k + 1)))
    await wait_for(lambda: call.recording("failed"), timeout=5)
    failed = call.recording("failed")
    assert failed is not None and failed.code == "disk_full"
    assert failed.bytes == HEADER_BYTES + 40 * N * 4 and failed.duration_s == 0.8
    with wave.open(io.BytesIO(disk.getvalue())) as w:
        assert w.getnframes() == 40 * N
    await recs.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
async def test_a_read_only_directory_fails_with_permission(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    root.mkdir()
    root.chmod(0o555)
    try:
        recs = Recordings(settings(tmp_path), poll_s=0.02)
        call = Call()
        recs.record(call, "both")
        await wait_for(lambda: call.recording("failed"), timeout=5)
        failed = call.recording("failed")
        assert failed is not None and failed.code == "permission"
        await recs.close()
    finally:
        root.chmod(0o755)


async def test_permission_refused_by_the_opener(tmp_path: Path) -> None:
    # As root (where chmod does not stop writes) the refusal comes from the opener itself.
    def opener(path: Path) -> BinaryFile:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    recs = Recordings(settings(tmp_path), opener=opener, poll_s=0.02)
    call = Call()
    recs.record(call, "both")
    await wait_for(lambda: call.recording("failed"), timeout=5)
    failed = call.recording("failed")
    assert failed is not None and failed.code == "permission"
    assert failed.reason is not None and failed.reason.startswith("Permission denied: ")
    assert recs.errors["permission"] == 1
    await recs.close()


def test_a_full_queue_drops_frames_and_never_blocks() -> None:
    events: list[RecordingEvent] = []
    rec = Recorder(
        recording_id="r", call_id="c", root=Path("/nonexistent"), name="x.wav",
        channels="both", rate=8000, max_frames=4, notify=events.append,
    )  # fmt: skip
    for k in range(10):
        rec.agent(k * N, frame(1))
    assert rec.frames_dropped == 6
    rec.stop()
    rec.agent(0, frame(1))  # after the stop: ignored, not counted
    assert rec.frames_dropped == 6 and not rec.active


async def test_close_finalises_recordings_in_progress(tmp_path: Path) -> None:
    recs = Recordings(settings(tmp_path), poll_s=0.02)
    call = Call()
    rec = recs.record(call, "both")
    for k in range(25):
        rec.agent(k * N, frame(1))
        rec.caller(k * N, frame(2))
    await recs.close()
    with wave.open(str(rec.path)) as w:
        assert w.getnframes() == 25 * N
    assert rec.state == "stopped"
