"""A browser-like WebRTC client in Python (aiortc): what the tests and ``voxgate bench webrtc``
call the gateway with. It does what the softphone page does — offer with audio and a
"control" data channel, POST it to ``/api/webrtc/offer``, apply the answer — and records what
it hears with arrival times.

The caller's "microphone" is a :class:`ScriptTrack`: silence, then given PCM at a chosen time,
paced in real time like a capture device.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
import numpy as np
import numpy.typing as npt
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpsender import RTCRtpSender

RATE = 48000
SPF = RATE // 50


class ScriptTrack(MediaStreamTrack):
    """Microphone stand-in: 20 ms frames at 48 kHz in real time; silence unless ``play`` has
    queued samples. ``mute()`` stops sending altogether (a frozen or vanished browser)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, dtype=np.int16)
        self._start: float | None = None
        self._pts = 0
        self._silent = asyncio.Event()
        self.played_at: float | None = None  # monotonic time the first queued sample went out

    def play(self, pcm: npt.NDArray[np.int16]) -> None:
        self._queue = np.concatenate([self._queue, pcm.astype(np.int16)])
        self.played_at = None

    def mute(self) -> None:
        self._silent.set()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._silent.is_set():
            await asyncio.Event().wait()  # never sends again
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += SPF
            delay = self._start + self._pts / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        if self._queue.size:
            if self.played_at is None:
                self.played_at = time.monotonic()
            chunk, self._queue = self._queue[:SPF], self._queue[SPF:]
            frame_pcm = np.zeros(SPF, dtype=np.int16)
            frame_pcm[: len(chunk)] = chunk
        else:
            frame_pcm = np.zeros(SPF, dtype=np.int16)
        frame = av.AudioFrame.from_ndarray(frame_pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


@dataclass
class Heard:
    """Received audio, mono 48 kHz, with the monotonic arrival time of each 20 ms frame."""

    frames: list[npt.NDArray[np.int16]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    first_audio_at: float | None = None
    # The first decoded frame at all (silent or not), out of aiortc's jitter buffer.
    first_frame_at: float | None = None

    def pcm(self) -> npt.NDArray[np.int16]:
        return np.concatenate(self.frames) if self.frames else np.zeros(0, dtype=np.int16)

    def rms_since(self, t: float) -> float:
        sel = [f for f, at in zip(self.frames, self.times, strict=True) if at >= t]
        if not sel:
            return 0.0
        x = np.concatenate(sel).astype(np.float64)
        return float(np.sqrt(np.mean(x * x)))


class WebRtcClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        audio_threshold: int = 300,
        codec: str | None = None,
        datachannel: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.codec = codec  # offer only this codec ("PCMU", ...); None: aiortc's list
        self.token = token
        self.threshold = audio_threshold
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = ScriptTrack()
        self.heard = Heard()
        self.messages: list[dict[str, Any]] = []
        self.call_id: str | None = None
        self.t_start = 0.0
        # Phase times (monotonic) for the first-audio bench: the peer connection "connected"
        # (ICE + DTLS) and the first SRTP packet of the agent's audio decrypted at the receiver.
        self.connected_at: float | None = None
        self.first_rtp_at: float | None = None
        self._opened = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # Without a data channel (a bare audio client) there is no "open" to wait for.
        self.channel = self.pc.createDataChannel("control") if datachannel else None
        if self.channel is not None:
            self.channel.on("open", self._opened.set)
            self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    async def connect(self, timeout: float = 15.0) -> str:
        """Offer, answer, and wait until the data channel (if any) is open; returns the call id."""
        self.t_start = time.monotonic()
        self.pc.addTrack(self.mic)
        if self.codec is not None:
            caps = RTCRtpSender.getCapabilities("audio").codecs
            wanted = [c for c in caps if c.mimeType.lower() == f"audio/{self.codec.lower()}"]
            self.pc.getTransceivers()[0].setCodecPreferences(wanted)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        status, body = await self.post_offer(self.pc.localDescription.sdp)
        if status != 200:
            raise RuntimeError(f"offer refused: {status} {body}")
        self.call_id = str(body["call_id"])
        await self.pc.setRemoteDescription(
            RTCSessionDescription(sdp=str(body["sdp"]), type="answer")
        )
        if self.channel is not None:
            await asyncio.wait_for(self._opened.wait(), timeout)
        return self.call_id

    async def post_offer(self, sdp: str, **extra: object) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.base_url}/api/webrtc/offer",
                json={"sdp": sdp, "type": "offer", **extra},
                headers=headers,
            ) as resp,
        ):
            return resp.status, await resp.json()

    async def wait_audio(self, timeout: float = 10.0) -> float:
        """Seconds from ``connect()`` to the first audible frame."""
        deadline = time.monotonic() + timeout
        while self.heard.first_audio_at is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no audio from the gateway")
            await asyncio.sleep(0.01)
        return self.heard.first_audio_at - self.t_start

    async def wait_message(
        self, kind: str, timeout: float = 10.0, **match: object
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for msg in self.messages[seen:]:
                if msg.get("type") == kind and all(msg.get(k) == v for k, v in match.items()):
                    return msg
            seen = len(self.messages)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} message {match or ''}")
            await asyncio.sleep(0.01)

    def send(self, msg: dict[str, object]) -> None:
        self.send_raw(json.dumps(msg))

    def send_raw(self, data: str | bytes) -> None:
        """Anything on the data channel, as a page could send it (the tests' hostile input)."""
        if self.channel is None:
            raise RuntimeError("this client has no data channel")
        self.channel.send(data)

    def press(self, digit: str) -> None:
        self.send({"type": "dtmf", "digit": digit, "duration_ms": 100})

    async def hangup(self) -> None:
        with contextlib.suppress(Exception):
            self.send({"type": "hangup"})
        await asyncio.sleep(0.1)
        await self.close()

    async def close(self) -> None:
        await self.pc.close()
        for task in list(self._tasks):
            task.cancel()

    def _on_message(self, message: str | bytes) -> None:
        with contextlib.suppress(ValueError):
            msg = json.loads(message)
            if isinstance(msg, dict):
                self.messages.append(msg)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected" and self.connected_at is None:
            self.connected_at = time.monotonic()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._watch_rtp()
        task = asyncio.get_running_loop().create_task(self._read(track))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):
                    continue
                now = time.monotonic()
                if self.heard.first_frame_at is None:
                    self.heard.first_frame_at = now
                data = frame.to_ndarray().reshape(-1)
                channels = len(frame.layout.channels)
                if channels > 1:
                    data = data.reshape(-1, channels)[:, 0]
                pcm = data.astype(np.int16)
                self.heard.frames.append(pcm)
                self.heard.times.append(now)
                if self.heard.first_audio_at is None and int(np.abs(pcm).max()) > self.threshold:
                    self.heard.first_audio_at = now

    def _watch_rtp(self) -> None:
        """Stamp the first RTP packet to reach the audio receiver (before its jitter buffer and
        decoder): a bench probe on aiortc's receiver, skipped if aiortc's internals change."""
        receiver = next((t.receiver for t in self.pc.getTransceivers() if t.kind == "audio"), None)
        handle = getattr(receiver, "_handle_rtp_packet", None)
        if receiver is None or handle is None:
            return

        async def stamped(packet: Any, arrival_time_ms: int) -> None:
            if self.first_rtp_at is None:
                self.first_rtp_at = time.monotonic()
            await handle(packet, arrival_time_ms=arrival_time_ms)

        receiver._handle_rtp_packet = stamped  # type: ignore[method-assign]
