"""Call recording: what the caller said and what the agent played, as the gateway had them,
written to a WAV file off the media path.

Media side (the call's tick, synchronous): ``Recorder.agent(pos, pcm)`` from
``Call.pull_audio`` and ``Recorder.caller(pos, pcm)`` from ``Call.on_caller_audio`` append the
frame and its media time to a bounded deque: no copy, no lock, no disk. A frame that finds the
queue full (the writer is ``max_queue_s`` behind) is dropped and counted. Keeping references is
safe because nobody writes to a frame once it is handed over (the playout allocates each agent
frame; decoded caller frames and the jitter buffer's shared silence are read-only).

Writer side (one thread for every recording, woken every ``POLL_S``): each recording's frames go
through an ``Aligner`` that places them by media time. Both directions are on the call's media
clock (the pacer's tick index × frame size, stalls included), so a frame's position and not its
arrival order decides where it lands. A side that had nothing gets silence: a lost RTP packet
the jitter buffer could not conceal, an agent with nothing to say, ticks skipped in a stall. The
channels cannot drift apart however long the call. The caller's channel is what the call heard:
after the jitter buffer, so its playout delay (60 ms by default, up to 200 ms on a jittery line)
later than the packets reached the gateway. Barge-in times are reported on the same clock.

Files: 16-bit PCM WAV (RIFF ``WAVE_FORMAT_PCM``) at the call's rate (8 kHz SIP, 48 kHz
browser). Stereo puts the caller on the left and the agent on the right, as telephony recorders
do; mono records the caller only. The header's sizes are patched as the file grows (a crash
leaves a readable file up to the last patch) and finalised on stop or hang-up. A disk error
(ENOSPC, EACCES, EROFS, ...) stops that recording only: the file keeps what was written, as a
valid WAV; a ``RecordingEvent`` ``failed`` goes out and the error is counted; the call goes on.

Names come from ``[recording] pattern``. Each substituted value is cut down to
``[A-Za-z0-9._+-]`` with no leading dot, so a caller string cannot add a directory or climb out
of ``[recording] dir``. Old files are deleted by ``sweep`` (``retention_days``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import logging
import os
import re
import stat
import struct
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.call.control import CallInfo, Event, RecordingEvent, Unavailable
from voxgate.contract.config import RecordingConfig

log = logging.getLogger("voxgate.recording")

Int16Array = npt.NDArray[np.int16]
# What the aligner releases: samples × channels, or a run of that many silent samples.
Block = npt.NDArray[np.int16] | int

CHANNELS = ("both", "caller")
CALLER, AGENT = 0, 1  # channel index in a stereo file: caller left, agent right
ERROR_CODES = ("disk_full", "permission", "io")
# The writer wakes this often; frames wait at most this long in memory.
POLL_S = 0.1
# How long a frame of one side may trail the other's furthest frame and still land in place.
# Both sides of one tick are queued microseconds apart, so this only covers a writer that
# drains between them; a browser leg's catch-up frames run ahead by up to 3 frames.
ALIGN_LAG_S = 0.1
# Audio the aligner holds before forcing it out (a frame far ahead of the rest).
ALIGN_WINDOW_S = 2.0
# The header's sizes are brought up to date this often while recording.
HEADER_EVERY_S = 2.0
# Retention sweep period.
SWEEP_EVERY_S = 3600.0
# Recordings listed per call, for this many calls (the newest).
INDEX_CALLS = 1000
# Longest substituted value in a file name.
NAME_FIELD_MAX = 48
# RIFF sizes are 32-bit: a file stops growing there (6 h of 48 kHz stereo).
RIFF_MAX = 0xFFFFFFFF - 36
_SILENCE_CHUNK = 1 << 16  # samples of silence written per piece


# --- names ----------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def sanitise(value: str, *, limit: int = NAME_FIELD_MAX) -> str:
    """``value`` as one safe path-component piece: only ``[A-Za-z0-9._+-]`` (runs of anything
    else become one ``_``), no leading dot or dash, at most ``limit`` characters, never
    empty."""
    cleaned = _UNSAFE.sub("_", value).lstrip(".-")[:limit]
    return cleaned or "unknown"


def caller_label(remote: str) -> str:
    """The other party for a file name: the user part of a ``sip:``/``sips:``/``tel:`` URI
    (``sip:+15551234@host`` → ``+15551234``), else the address (a browser's)."""
    text = remote.strip()
    if "<" in text and ">" in text:  # a name-addr: "Name" <sip:...>
        text = text[text.index("<") + 1 : text.index(">")]
    scheme, sep, rest = text.partition(":")
    if sep and "@" not in scheme:  # sip:, sips:, tel:, browser:127.0.0.1:5000
        text = rest
    user, at, _host = text.partition("@")
    text = user if at else text
    return sanitise(text.split(";", 1)[0])


def recording_name(
    pattern: str, *, call_id: str, caller: str, started: float, recording_id: str
) -> str:
    """The file name (relative to the recordings directory) ``pattern`` gives; {date} and
    {time} are UTC. The pattern is the operator's and is validated at load
    (``RecordingConfig.validate``); the values are sanitised here."""
    t = time.gmtime(started)
    name = pattern.format(
        date=time.strftime("%Y-%m-%d", t),
        time=time.strftime("%H%M%S", t),
        call_id=sanitise(call_id),
        caller=sanitise(caller),
        id=sanitise(recording_id),
    )
    norm = os.path.normpath(name)
    # Belt and braces: the validated pattern and sanitised values cannot climb out.
    if os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
        raise ValueError(f"recording name {name!r} leaves the recordings directory")
    return norm


def error_code(exc: BaseException) -> str:
    """A disk error bucketed to ``ERROR_CODES`` (the metric's label)."""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return "disk_full"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "permission"
    return "io"


# --- WAV ------------------------------------------------------------------------------------
def wav_header(rate: int, channels: int, data_bytes: int) -> bytes:
    """The canonical 44-byte header of 16-bit PCM (RIFF/WAVE, ``fmt `` chunk of 16 bytes,
    format 1, then the ``data`` chunk's header)."""
    block = 2 * channels
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


HEADER_BYTES = 44


class BinaryFile(Protocol):
    """What the writer needs of a file (an unbuffered ``io.FileIO``; tests pass others)."""

    def write(self, data: bytes, /) -> int | None: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def truncate(self, size: int | None = None, /) -> int: ...

    def close(self) -> None: ...


Opener = Callable[[Path], BinaryFile]


def open_new(path: Path) -> BinaryFile:
    """Create ``path`` (and its directory); FileExistsError if it exists. Unbuffered, so a
    full disk shows at the write that hits it, not at some later flush. Recordings are
    personal data: owner and group only (0640, directories 0750, before the umask)."""
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o640)
    return open(fd, "wb", buffering=0)


class WavFile:
    """A 16-bit PCM WAV written in pieces through an unbuffered file."""

    def __init__(self, f: BinaryFile, rate: int, channels: int) -> None:
        self.f = f
        self.rate = rate
        self.channels = channels
        self.block = 2 * channels
        self.data_bytes = 0  # bytes of samples on disk (a failed write may leave a part frame)
        self._write_all(wav_header(rate, channels, 0), count=False)

    def write(self, data: bytes) -> None:
        room = RIFF_MAX - self.data_bytes
        if len(data) > room:  # the 32-bit RIFF limit: stop growing, quietly
            data = data[: room - room % self.block]
        if data:
            self._write_all(data)

    def _write_all(self, data: bytes, *, count: bool = True) -> None:
        while data:
            n = self.f.write(data) or 0
            if count:
                self.data_bytes += n
            if n <= 0:  # a disk file never takes nothing without an error; do not spin
                raise OSError(errno.EIO, "the file took no bytes")
            data = data[n:]  # a short write (the disk filling up): the next one raises

    @property
    def frames(self) -> int:
        return self.data_bytes // self.block

    def patch(self) -> None:
        """Bring the header's sizes up to what is written (whole frames)."""
        size = self.frames * self.block
        self.f.seek(4)
        self._write_all(struct.pack("<I", 36 + size), count=False)
        self.f.seek(40)
        self._write_all(struct.pack("<I", size), count=False)
        self.f.seek(0, os.SEEK_END)

    def finish(self) -> None:
        """Drop a trailing part frame (left by a failed write), finalise the header, close."""
        try:
            whole = self.frames * self.block
            if whole != self.data_bytes:
                self.f.truncate(HEADER_BYTES + whole)
                self.data_bytes = whole
            self.patch()
            try:
                fd = self.f.fileno()  # type: ignore[attr-defined]
            except (AttributeError, io.UnsupportedOperation):
                fd = None  # not a real file (tests)
            if fd is not None:
                os.fsync(fd)  # flushed to disk on hang-up, not whenever the kernel likes
        finally:
            self.f.close()


# --- alignment (sans-I/O) -------------------------------------------------------------------
class Aligner:
    """Frames of both directions in, each at its media time; interleaved samples out, in media
    order, with silence wherever a channel had nothing.

    Output is released ``lag`` samples behind the furthest frame seen (``take``), so the other
    side's frame of the same tick still finds its place; ``take(final=True)`` releases all. A
    frame (or its part) for a stretch already released is dropped and counted in ``late``.
    ``channels`` 1: only channel 0 is kept; the other side's frames still move the clock, so
    the caller's silence is written when a browser leg hands over no frame."""

    def __init__(self, channels: int, *, lag: int, window: int) -> None:
        if not 0 <= lag < window:
            raise ValueError("need 0 <= lag < window")
        self.channels = channels
        self.lag = lag
        self.window = window
        self._buf = np.zeros((window, channels), np.int16)
        self.base: int | None = None  # media time of _buf[0]: everything before is released
        self._high = 0  # end of the furthest frame seen, relative to base
        self._ready: list[Block] = []
        self.late = 0  # samples dropped because their stretch was already released

    def add(self, channel: int, pos: int, pcm: Int16Array) -> None:
        n = len(pcm)
        if self.base is None:
            self.base = pos
        rel = pos - self.base
        if rel < 0:
            if rel + n <= 0:
                self.late += n
                return
            pcm = pcm[-rel:]
            self.late += -rel
            n += rel
            rel = 0
        over = rel + n - self.window
        if over > 0:
            self._release(over)
            rel -= over
        if channel < self.channels:
            self._buf[rel : rel + n, channel] = pcm
        self._high = max(self._high, rel + n)

    def take(self, final: bool = False) -> list[Block]:
        """What is settled: all but the last ``lag`` samples (everything when ``final``)."""
        k = self._high if final else self._high - self.lag
        if k > 0:
            self._release(k)
        out, self._ready = self._ready, []
        return out

    def _release(self, k: int) -> None:
        assert self.base is not None
        kept = min(k, self.window)
        self._ready.append(self._buf[:kept].copy())
        if k > kept:  # a jump past the whole window: the gap is silence
            self._ready.append(k - kept)
        self._buf[: self.window - kept] = self._buf[kept:]  # numpy copes with the overlap
        self._buf[self.window - kept :] = 0
        self.base += k
        self._high = max(self._high - k, 0)


def block_bytes(block: Block, channels: int) -> list[bytes]:
    """A released block as little-endian interleaved bytes (silence in bounded pieces)."""
    if isinstance(block, int):
        out: list[bytes] = []
        left = block
        while left > 0:
            k = min(left, _SILENCE_CHUNK)
            out.append(bytes(2 * channels * k))
            left -= k
        return out
    return [block.astype("<i2", copy=False).tobytes()]


# --- one recording --------------------------------------------------------------------------
class Recorder:
    """One recording of one call: the media side's queue (``agent``, ``caller``, ``stop``) and
    the writer's side (``step``, on the writer thread only)."""

    def __init__(
        self,
        *,
        recording_id: str,
        call_id: str,
        root: Path,
        name: str,
        channels: str,
        rate: int,
        max_frames: int,
        notify: Callable[[RecordingEvent], None],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        if channels not in CHANNELS:
            raise ValueError(f"channels must be one of {CHANNELS}, got {channels!r}")
        self.id = recording_id
        self.call_id = call_id
        self.root = root
        self.name = name
        self.channels = channels
        self.rate = rate
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.state = "starting"  # starting | recording | stopped | failed
        self.error: str | None = None
        self.code: str | None = None
        self.frames_dropped = 0
        self._nch = 2 if channels == "both" else 1
        self._queue: deque[tuple[int, int, Int16Array]] = deque()
        self._max = max(max_frames, 1)
        self._taking = True  # frames are queued (until stop or failure)
        self._stopping = False
        self._aligner = Aligner(
            self._nch, lag=int(ALIGN_LAG_S * rate), window=int(ALIGN_WINDOW_S * rate)
        )
        self._wav: WavFile | None = None
        self._patched = 0.0
        self._notify = notify
        self._wake = wake

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def active(self) -> bool:
        """Taking frames: neither stopped nor failed."""
        return self._taking

    @property
    def bytes(self) -> int:
        """The file's size so far (header included)."""
        return HEADER_BYTES + self._wav.data_bytes if self._wav is not None else 0

    @property
    def duration_s(self) -> float:
        return self._wav.frames / self.rate if self._wav is not None else 0.0

    # -- the media side (the call's tick: cheap, never blocks) -------------------------------
    def agent(self, pos: int, pcm: Int16Array) -> None:
        """The agent frame sent at media time ``pos``."""
        if self._taking:
            if len(self._queue) < self._max:
                self._queue.append((AGENT, pos, pcm))
            else:
                self.frames_dropped += 1

    def caller(self, pos: int, pcm: Int16Array) -> None:
        """The caller frame heard at media time ``pos``."""
        if self._taking:
            if len(self._queue) < self._max:
                self._queue.append((CALLER, pos, pcm))
            else:
                self.frames_dropped += 1

    def stop(self) -> None:
        """No more frames: the writer writes what is queued, finalises the file and reports
        ``stopped``."""
        if self._taking:
            self._taking = False
            self._stopping = True
            self._wake()

    # -- the writer side (writer thread) -----------------------------------------------------
    def step(self, opener: Opener, now: float) -> int:
        """Write what has arrived, and finish when stopped (``done`` is then true; also after
        a failure). Returns the sample bytes written."""
        before = self._wav.data_bytes if self._wav is not None else 0
        try:
            if self._wav is None:
                self._open(opener)
            assert self._wav is not None
            final = self._stopping
            self._drain(final)
            if final:
                self._finish()
            elif now - self._patched >= HEADER_EVERY_S:
                self._wav.patch()
                self._patched = now
        except Exception as exc:  # OSError above all; anything else must not kill the writer
            self._fail(exc)
        return self._wav.data_bytes - before if self._wav is not None else 0

    @property
    def done(self) -> bool:
        return self.state in ("stopped", "failed")

    def _open(self, opener: Opener) -> None:
        stem, name = self.name[: -len(".wav")], self.name
        for n in range(2, 102):
            try:
                f = opener(self.root / name)
                break
            except FileExistsError:  # the same second, the same call: number it
                name = f"{stem}-{n}.wav"
        else:
            raise FileExistsError(errno.EEXIST, "no free file name", str(self.root / self.name))
        self.name = name
        self._wav = WavFile(f, self.rate, self._nch)
        self._patched = time.monotonic()
        self.state = "recording"
        log.info("call %s: recording %s to %s", self.call_id, self.id, self.path)
        self._notify(self._event("started"))

    def _drain(self, final: bool) -> None:
        assert self._wav is not None
        q, aligner = self._queue, self._aligner
        for _ in range(len(q)):  # what is there now; the media side keeps appending
            channel, pos, pcm = q.popleft()
            aligner.add(channel, pos, pcm)
        for block in aligner.take(final):
            for data in block_bytes(block, self._nch):
                self._wav.write(data)

    def _finish(self) -> None:
        assert self._wav is not None
        self._wav.finish()
        self.state = "stopped"
        self.ended_at = time.time()
        log.info("call %s: recording %s stopped (%.1f s, %d bytes)", self.call_id, self.id,
                 self.duration_s, self.bytes)  # fmt: skip
        self._notify(self._event("stopped"))

    def _fail(self, exc: BaseException) -> None:
        self._taking = False
        self._queue.clear()
        if self._wav is not None:
            with contextlib.suppress(Exception):  # keep what fits as a valid file, if it can
                self._wav.finish()
        self.state = "failed"
        self.code = error_code(exc)
        self.error = (
            f"{exc.strerror}: {exc.filename or self.path}"
            if isinstance(exc, OSError) and exc.strerror
            else f"{type(exc).__name__}: {exc}"
        )
        self.ended_at = time.time()
        if self.code == "io" and not isinstance(exc, OSError):
            log.error("call %s: recording %s failed", self.call_id, self.id, exc_info=exc)
        else:
            log.warning("call %s: recording %s failed (%s): %s", self.call_id, self.id,
                        self.code, self.error)  # fmt: skip
        self._notify(self._event("failed"))

    def _event(self, state: str) -> RecordingEvent:
        return RecordingEvent(
            self.call_id, recording_id=self.id, state=state, path=str(self.path),
            channels=self.channels, reason=self.error, code=self.code,
            duration_s=round(self.duration_s, 3), bytes=self.bytes,
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        """The recording as ``GET /api/calls/{id}/recordings`` lists it."""
        return {
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "path": str(self.path),
            "channels": self.channels,
            "rate": self.rate,
            "state": self.state,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": round(self.duration_s, 3),
            "bytes": self.bytes,
            "frames_dropped": self.frames_dropped,
            "error": self.error,
            "code": self.code,
        }


# --- the gateway's recordings ---------------------------------------------------------------
class RecordedCall(Protocol):
    """What a recording needs of its call (``gateway.call.calls.Call``)."""

    @property
    def id(self) -> str: ...

    @property
    def info(self) -> CallInfo: ...

    rate: int

    def emit(self, event: Event) -> None: ...


class Recordings:
    """Every recording of the gateway: the writer thread, the index of recordings by call, the
    retention sweep and the counters ``/metrics`` reads."""

    def __init__(
        self, settings: RecordingConfig, *, opener: Opener = open_new, poll_s: float = POLL_S
    ) -> None:
        self.settings = settings
        self.root = Path(settings.dir)
        self.opener = opener
        self.poll_s = poll_s
        self._by_call: OrderedDict[str, list[Recorder]] = OrderedDict()
        self._active: set[Recorder] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None
        # Counters (written by the writer thread only).
        self.bytes_written = 0
        self.errors: dict[str, int] = dict.fromkeys(ERROR_CODES, 0)
        self._dropped_done = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the retention sweep (when ``retention_days`` is set); the writer thread
        starts with the first recording."""
        if self.settings.retention_days > 0 and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_loop(), name="recording-sweep"
            )

    async def close(self) -> None:
        """Stop every recording, let the writer finalise their files, stop the thread."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        with self._lock:
            active = list(self._active)
        for rec in active:
            rec.stop()
        self._closing = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join)
            self._thread = None

    # -- recordings ------------------------------------------------------------------------
    def record(self, call: RecordedCall, channels: str) -> Recorder:
        """A new recording of ``call`` (the file is created by the writer: the ``started``
        event says when it is open; ``failed`` if it cannot be)."""
        if channels not in CHANNELS:
            raise ValueError(f"channels must be one of {CHANNELS}, got {channels!r}")
        if self._closing:
            raise Unavailable("the gateway is shutting down: no new recordings")
        loop = asyncio.get_running_loop()
        emit = call.emit

        def notify(event: RecordingEvent) -> None:
            # From the writer thread: the call's events are the event loop's business.
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                loop.call_soon_threadsafe(emit, event)

        rid = uuid.uuid4().hex[:12]
        name = recording_name(
            self.settings.pattern, call_id=call.id, caller=caller_label(call.info.remote),
            started=time.time(), recording_id=rid,
        )  # fmt: skip
        # Two sides per tick, 50 ticks a second (20 ms frames).
        max_frames = int(self.settings.max_queue_s * 100)
        rec = Recorder(
            recording_id=rid, call_id=call.id, root=self.root, name=name, channels=channels,
            rate=call.rate, max_frames=max_frames, notify=notify, wake=self._wake.set,
        )  # fmt: skip
        self._by_call.setdefault(call.id, []).append(rec)
        self._by_call.move_to_end(call.id)
        while len(self._by_call) > INDEX_CALLS:
            self._by_call.popitem(last=False)
        with self._lock:
            self._active.add(rec)
        self._ensure_thread()
        self._wake.set()
        return rec

    def of_call(self, call_id: str) -> list[Recorder]:
        return list(self._by_call.get(call_id, ()))

    def get(self, call_id: str, recording_id: str) -> Recorder | None:
        return next((r for r in self._by_call.get(call_id, ()) if r.id == recording_id), None)

    @property
    def active(self) -> int:
        """Recordings being written now."""
        with self._lock:
            return sum(1 for r in self._active if not r.done)

    @property
    def frames_dropped(self) -> int:
        """Frames dropped on full queues, over the gateway's life."""
        with self._lock:
            live = sum(r.frames_dropped for r in self._active)
        return self._dropped_done + live

    # -- the writer thread -----------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="voxgate-recorder", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.poll_s)
            self._wake.clear()
            with self._lock:
                recs = list(self._active)
            now = time.monotonic()
            for rec in recs:
                self.bytes_written += rec.step(self.opener, now)
                if rec.done:
                    if rec.state == "failed" and rec.code is not None:
                        self.errors[rec.code] = self.errors.get(rec.code, 0) + 1
                    with self._lock:
                        self._active.discard(rec)
                        self._dropped_done += rec.frames_dropped
            if self._closing:
                with self._lock:
                    if not self._active:
                        return

    # -- retention -------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        max_age = self.settings.retention_days * 86400.0
        while True:
            with self._lock:
                keep = {r.path for r in self._active}
            try:
                deleted = await asyncio.to_thread(sweep, self.root, max_age, time.time(), keep)
            except Exception:
                log.exception("recording retention sweep failed")
            else:
                if deleted:
                    log.info("retention: deleted %d recordings older than %d days",
                             len(deleted), self.settings.retention_days)  # fmt: skip
            await asyncio.sleep(SWEEP_EVERY_S)


def sweep(root: Path, max_age_s: float, now: float, keep: Collection[Path] = ()) -> list[Path]:
    """Delete the ``*.wav`` files under ``root`` last modified more than ``max_age_s`` before
    ``now`` (except those in ``keep``: recordings being written), then the directories under
    ``root`` left empty and as old. Other files are left alone. Returns the files deleted."""
    if not root.is_dir():
        return []
    kept = {os.path.abspath(p) for p in keep}
    deleted: list[Path] = []
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for fn in files:
            if not fn.endswith(".wav"):
                continue
            path = os.path.join(dirpath, fn)
            if os.path.abspath(path) in kept:
                continue
            try:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime > max_age_s:
                    os.unlink(path)
                    deleted.append(Path(path))
            except OSError as exc:
                log.warning("retention: cannot delete %s: %s", path, exc)
        if os.path.abspath(dirpath) != os.path.abspath(root):
            # Only an old, empty directory: a new one may be about to get its first file.
            with contextlib.suppress(OSError):
                if now - os.stat(dirpath).st_mtime > max_age_s:
                    os.rmdir(dirpath)  # fails (and is left) unless empty
    return deleted
