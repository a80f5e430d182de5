"""A browser call: one aiortc peer connection as the ``Leg`` of a ``Call``.

Media clock. The agent's audio is pulled one 20 ms frame per tick by :class:`AgentTrack`, whose
``recv()`` aiortc's sender awaits in a loop; the track paces itself on an absolute schedule
(``start + pts / rate``), so jitter in one tick does not accumulate, and after a stall it skips
the missed ticks (moving the timestamp) instead of bursting them out, like the SIP pacer. On
each tick, after ``pull_audio``, one frame of the caller's decoded audio is handed to
``Call.on_caller_audio``: both directions then sit on one media clock, which the barge-in
detector needs to line up the echo of what it sent with what comes back.

Wideband: the call runs at the worker's wideband rate (48 kHz by default, Opus's native rate),
no 3.8 kHz telephone band limit. aiortc's Opus encoder takes mono s16 at any rate.

Liveness. A tab that closes or a network that drops sends nothing more: no BYE is guaranteed,
and ICE consent freshness (RFC 7675) takes ~30 s to fail. Browsers send audio packets every
20 ms for as long as the call lives (muted tracks send silence), so no inbound media for
``media_timeout_s`` ends the call; so does a peer connection going ``failed``/``closed``.

The data channel ("control") carries JSON both ways: ``{"type": "dtmf", "digit": "5"}`` and
``{"type": "hangup"}`` from the page; the call's events (state, utterances, barge-in, DTMF the
agent sends) to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpsender import RTCRtpSender

from gateway.call.calls import Call
from gateway.call.control import Event, event_json
from gateway.legs.webrtc.opus import MonoOpusEncoder
from voxgate.contract.config import WebrtcConfig
from voxgate.contract.dtmf import is_dtmf_key

log = logging.getLogger("voxgate.webrtc")

FRAME_MS = 20
# A tick more than this late counts as a late send; more than STALL_S late, missed ticks are
# skipped rather than sent in a burst (the browser's jitter buffer would only drop them).
LATE_S = 0.010
STALL_S = 0.060
# Inbound frames waiting for a tick; more than this means our ticks stalled: catch up.
NEAR_BACKLOG = 3
NEAR_MAX = 25
# Data channel messages from the page are tiny; a flood is cut off.
MAX_MESSAGE = 4096
# Cancelling the agent's synthesis at hang-up is one small write per utterance; a bus that does
# not answer within this does not hold up the rest of the teardown.
CANCEL_TIMEOUT_S = 2.0


def ice_configuration(cfg: WebrtcConfig) -> RTCConfiguration:
    """aiortc defaults to a public STUN server when given none; an explicit empty list keeps
    every candidate on the host (no traffic leaves the machine unless configured)."""
    servers = [
        RTCIceServer(
            urls=url,
            username=cfg.ice_username or None if url.startswith("turn") else None,
            credential=cfg.ice_credential or None if url.startswith("turn") else None,
        )
        for url in cfg.ice_urls()
    ]
    return RTCConfiguration(iceServers=servers)


class AgentTrack(MediaStreamTrack):
    """The agent's audio to the browser, self-paced at ``rate`` (see the module doc)."""

    kind = "audio"

    def __init__(self, leg: WebRtcLeg, rate: int, *, opus: bool = True) -> None:
        super().__init__()
        self._leg = leg
        self.rate = rate
        # Opus: encoded here, inline (see gateway.legs.webrtc.opus); G.711: aiortc encodes frames.
        self._opus = MonoOpusEncoder(rate) if opus else None
        self.spf = rate * FRAME_MS // 1000
        self._start: float | None = None
        self._pts = 0
        self._time_base = fractions.Fraction(1, rate)
        self.frames_sent = 0
        self.late_sends = 0
        self.skipped_ticks = 0

    async def recv(self) -> av.AudioFrame | av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            self._pts += self.spf
            lateness = loop.time() - (self._start + self._pts / self.rate)
            if lateness < 0:
                await asyncio.sleep(-lateness)
            elif lateness > STALL_S:
                skip = int(lateness * self.rate) // self.spf
                self._pts += skip * self.spf
                self.skipped_ticks += skip
                self.late_sends += 1
            elif lateness > LATE_S:
                self.late_sends += 1
        pcm = self._leg.tick(self.spf, self._pts)
        self.frames_sent += 1
        if self._opus is not None:
            return self._opus.encode(pcm, self._pts)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        return frame


class WebRtcLeg:
    """One browser call. Create, ``await accept(offer)`` for the answer SDP; the call starts
    when ICE + DTLS are up and ends on hang-up from either side, failure or media timeout."""

    def __init__(
        self, call: Call, cfg: WebrtcConfig, *, codec: str = "opus", sends_audio: bool = True
    ) -> None:
        self.call = call
        self.cfg = cfg
        self.codec = codec
        # A listen-only browser (recvonly) is watched by its connection state alone.
        self.sends_audio = sends_audio
        self.pc = RTCPeerConnection(ice_configuration(cfg))
        self.track = AgentTrack(self, call.rate, opus=codec == "opus")
        self.channel: RTCDataChannel | None = None
        self._near: deque[npt.NDArray[np.int16]] = deque()
        self._near_rest = np.zeros(0, dtype=np.int16)
        self._resampler: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._connected_at: float | None = None
        self._created = time.monotonic()
        self._last_media = time.monotonic()
        self.frames_received = 0
        self.near_dropped = 0
        self._rx_stats: dict[str, float] = {}
        self._clock_rate = 48000 if codec == "opus" else 8000  # RTP clock (RFC 7587, 3551)
        # Told when the leg has closed (the service forgets it).
        self.on_close: Callable[[WebRtcLeg], None] | None = None
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_state)

    # --- signalling ----------------------------------------------------------------------
    async def accept(self, offer_sdp: str) -> str:
        """Apply the browser's offer and return our answer (all candidates in it: no trickle
        needed, host candidates gather at once)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        transceiver = next((t for t in self.pc.getTransceivers() if t.kind == "audio"), None)
        if transceiver is None:
            raise ValueError("the offer has no audio transceiver")
        # Best codec first (Opus; G.711 only when the browser offers nothing better).
        caps = RTCRtpSender.getCapabilities("audio").codecs
        wanted = [c for c in caps if c.mimeType.lower() == f"audio/{self.codec}"]
        transceiver.setCodecPreferences(wanted)
        self.pc.addTrack(self.track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        # Answered now, as a SIP call is at its 200: the agent starts (and the worker
        # synthesises its first words) while ICE and DTLS are still connecting, so the greeting
        # is ready when the first packet can go. Playout starts at the first media tick.
        self.call.listeners.append(self._forward_event)
        self.call.set_codec(_codec_name(self.codec))
        self.call.set_state("answered")
        self._spawn(self.call.start(self.call.manager.agent_for(self.call)), "start")
        self._spawn(self._watchdog(), "watchdog")
        return self.pc.localDescription.sdp

    # --- Leg -----------------------------------------------------------------------------
    async def hangup(self, reason: str) -> None:
        await self._close(reason)

    async def send_dtmf(self, digits: str) -> None:
        """The agent sends digits: the page shows and plays them (no RTP DTMF on this leg)."""
        self._send({"type": "dtmf", "digits": digits, "direction": "outbound"})

    def media_stats(self) -> dict[str, float]:
        return {
            "packets_received": self._rx_stats.get("packets_received", 0.0),
            "packets_lost": self._rx_stats.get("packets_lost", 0.0),
            # aiortc keeps its jitter buffer's depth to itself: not reported (0), rather than
            # passing off the network jitter as a depth.
            "late_sends": float(self.track.late_sends),
        }

    # --- media tick (hot path) -----------------------------------------------------------
    def tick(self, n: int, at: int) -> npt.NDArray[np.int16]:
        pcm = self.call.pull_audio(n, at)
        near = self._near
        if near:
            self.call.on_caller_audio(near.popleft())
            while len(near) > NEAR_BACKLOG:  # our ticks fell behind the browser's clock
                self.call.on_caller_audio(near.popleft())
        return pcm

    def _on_caller_frame(self, frame: av.AudioFrame) -> None:
        self._last_media = time.monotonic()
        self.frames_received += 1
        pcm = _mono_s16(frame)
        if frame.sample_rate != self.call.rate:
            pcm = self._resample(pcm, frame.sample_rate)
        # Re-cut into 20 ms frames at the call's rate (browsers may use other packet times).
        buf = np.concatenate([self._near_rest, pcm]) if self._near_rest.size else pcm
        spf = self.track.spf
        whole = len(buf) // spf * spf
        for i in range(0, whole, spf):
            self._near.append(buf[i : i + spf])
        self._near_rest = buf[whole:].copy()
        while len(self._near) > NEAR_MAX:  # nobody is ticking (not connected yet): keep recent
            self._near.popleft()
            self.near_dropped += 1

    def _resample(self, pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
        from dsp.resample import Resampler

        if self._resampler is None or self._resampler[0] != rate:
            out = self.call.rate
            edge = 0.45 * min(rate, out)
            self._resampler = (rate, Resampler.for_rates(rate, out, 0.9 * edge, edge * 1.1))
        y = self._resampler[1].process(pcm.astype(np.float32) / 32768.0)
        scaled = np.clip(np.round(y * 32768.0), -32768, 32767)
        pcm_out: npt.NDArray[np.int16] = scaled.astype(np.int16)
        return pcm_out

    # --- events --------------------------------------------------------------------------
    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._read_caller(track), "caller-audio")

    async def _read_caller(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, av.AudioFrame):
                    self._on_caller_frame(frame)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self.channel is None:
            self.channel = channel
            channel.on("message", self._on_message)
            channel.on("open", lambda: self._send(self._hello()))
            if channel.readyState == "open":
                self._send(self._hello())

    def _hello(self) -> dict[str, object]:
        return {"type": "hello", "call_id": self.call.id, "rate": self.call.rate}

    def _on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes) or len(message) > MAX_MESSAGE:
            self._send({"type": "error", "message": "messages are JSON text under 4 kB"})
            return
        try:
            msg = json.loads(message)
        except (ValueError, RecursionError):  # RecursionError: "[" * 4000 nests too deep
            msg = None
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "dtmf":
            digit = msg.get("digit") if isinstance(msg, dict) else None
            if is_dtmf_key(digit):
                duration = msg.get("duration_ms", 100) if isinstance(msg, dict) else 100
                ms = int(duration) if isinstance(duration, int | float) else 100
                self.call.on_dtmf(digit, max(0, min(ms, 5000)), source="datachannel")
            else:
                self._send({"type": "error", "message": f"not a DTMF key: {digit!r}"})
        elif kind == "hangup":
            self._spawn(self._close("remote hangup"), "hangup")
        elif kind == "ping":
            self._send({"type": "pong", "t": msg.get("t") if isinstance(msg, dict) else None})
        else:
            self._send({"type": "error", "message": f"unknown message type {kind!r}"})

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self._connected_at is None:
            self._connected_at = time.monotonic()
            self._last_media = self._connected_at
        elif state in ("failed", "closed"):
            self._spawn(self._close(f"connection {state}"), "hangup")

    async def _watchdog(self) -> None:
        while not self._closing:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if self._connected_at is None:
                if now - self._created > self.cfg.connect_timeout_s:
                    await self._close("connect timeout")
                continue
            if self.sends_audio and now - self._last_media > self.cfg.media_timeout_s:
                await self._close("media timeout")
                continue
            await self._refresh_stats()

    async def _refresh_stats(self) -> None:
        receiver = next((t.receiver for t in self.pc.getTransceivers() if t.kind == "audio"), None)
        if receiver is None:
            return
        with contextlib.suppress(Exception):  # stats are best effort, never fatal
            report = await receiver.getStats()
            for stat in report.values():
                if getattr(stat, "type", None) == "inbound-rtp":
                    self._rx_stats = {
                        "packets_received": float(stat.packetsReceived),
                        "packets_lost": float(max(stat.packetsLost, 0)),
                        "jitter_ms": float(stat.jitter) * 1000 / self._clock_rate,
                    }

    def _forward_event(self, event: Event) -> None:
        self._send_raw(event_json(event))

    def _send(self, msg: dict[str, object]) -> None:
        self._send_raw(json.dumps(msg))

    def _send_raw(self, text: str) -> None:
        ch = self.channel
        if ch is not None and ch.readyState == "open":
            with contextlib.suppress(Exception):
                ch.send(text)

    # --- teardown ------------------------------------------------------------------------
    async def _close(self, reason: str) -> None:
        if self._closing:
            return
        self._closing = True
        log.info("webrtc call %s ending: %s", self.call.id, reason)
        self.track.stop()
        await self.cancel_synthesis()
        await self.call.ended(reason)
        with contextlib.suppress(Exception):
            await self.pc.close()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        if self.on_close is not None:
            self.on_close(self)

    async def cancel_synthesis(self) -> None:
        """Tell the worker to stop rendering what this call will never play, before the call
        ends (issue 17). ``Call.ended`` only spawns its cancels as tasks and then cancels the
        call's tasks; on a bus whose calls do not suspend (the embedded memory bus) they never
        ran, so a caller who hung up mid-greeting left the worker rendering the whole greeting
        for nobody, and the next call's first chunk queued behind it: 0.5–4 s of silence
        before its greeting in one call of three, when calls come one after another. Awaited
        here, the cancel marker is set before anything else of the call is torn down; the
        worker drops the utterance at its next chunk boundary."""
        utterances = self.call.playout.pending_ids()
        if not utterances:
            return
        bus = self.call.manager.bus
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                for utterance_id in utterances:
                    await bus.cancel(utterance_id)
        except Exception as exc:  # BusError, timeout: the call still ends; the worker's
            # own deadline ends the rendering.
            log.warning("webrtc call %s: synthesis not cancelled: %r", self.call.id, exc)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"webrtc-{name}-{self.call.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _mono_s16(frame: av.AudioFrame) -> npt.NDArray[np.int16]:
    """Decoded Opus arrives as packed s16 stereo; the detector and agents want mono."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.name != "s16":
        data = (np.asarray(data, dtype=np.float32) * 32767).astype(np.int16)
    flat = data.reshape(-1)
    if channels > 1:
        mixed = flat.reshape(-1, channels).astype(np.int32).sum(axis=1) // channels
        out: npt.NDArray[np.int16] = mixed.astype(np.int16)
        return out
    mono: npt.NDArray[np.int16] = flat.astype(np.int16, copy=False)
    return mono


def _codec_name(codec: str) -> str:
    return {"opus": "opus/48000/2", "pcmu": "PCMU/8000", "pcma": "PCMA/8000"}.get(codec, codec)
