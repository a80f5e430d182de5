"""An agent's ear on the caller: the call's caller audio as 20 ms int16 frames at the rate the
agent asks for (8 or 16 kHz), through a bounded queue that drops the oldest frame when the
agent falls behind (and counts it), so a slow agent never holds up the media path.

With ``echo_gate`` the frames are held back while the agent's own voice may be coming back
on the line and the barge-in detector has not recognised the caller over it: the agent's
speech-to-text then does not transcribe the agent.  When the detector does recognise the
caller (``caller_started``), the held pre-roll (the caller's onset, before the decision) is
released first, so no word start is lost.  A consumer that needs an unbroken 20 ms stream (a
bridged bot: its VAD and Twilio's ``timestamp`` expect one frame per 20 ms) sets ``fill_gated``:
each withheld frame is then delivered in time but ducked by ``DUCK_DB`` (an echo suppressor's
attenuation, not a mute), nothing is replayed when the gate opens, and the gain glides (over
``OPEN_MS`` up, one frame down) instead of stepping.  Why (``voxgate bench bridge``, pipecat's
Silero VAD): digital silence in place of the echo and then a replayed onset, or a 30 dB step
when the detector opens the gate on echo, are exactly what a VAD takes for a talker starting.

The frame path (:meth:`CallerAudioTap.push`) is synchronous and cheap; the asyncio side is
only the wake-up of the reader."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from dsp.resample import Resampler

Int16Array = npt.NDArray[np.int16]

TAP_RATES = (8000, 16000)
FRAME_MS = 20
# Pre-roll kept while gated: longer than the detector's onset → decision (p95 ~110 ms) plus
# the batch delay.
PREROLL_MS = 300
# ``fill_gated``: how far a withheld frame is turned down (the echo then sits ~30 dB below the
# caller's level, under any VAD's floor, and the stream stays continuous).
DUCK_DB = 30.0
_DUCK = 10 ** (-DUCK_DB / 20)
# ``fill_gated``: the gain rises from the ducked level to unity over this long once the gate
# opens (a VAD hears a rise, not a step; Silero wants 200 ms of speech before it decides).
OPEN_MS = 100


def _resampler(in_rate: int, out_rate: int) -> Resampler | None:
    if in_rate == out_rate:
        return None
    # Pass band up to the lower of the two telephone-ish limits, stop at its Nyquist.
    low = min(in_rate, out_rate)
    return Resampler.for_rates(in_rate, out_rate, pass_hz=0.45 * low, stop_hz=0.5 * low)


class CallerAudioTap:
    """One consumer's stream of the caller's audio (see the module docstring)."""

    def __init__(
        self, in_rate: int, rate: int, *, echo_gate: bool = False, max_frames: int = 50
    ) -> None:
        if rate not in TAP_RATES:
            raise ValueError(f"caller audio rate must be one of {TAP_RATES}, got {rate}")
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        self.rate = rate
        self.frame = rate * FRAME_MS // 1000
        self.echo_gate = echo_gate
        self._resampler = _resampler(in_rate, rate)
        self._carry = np.zeros(0, dtype=np.float64)
        self._queue: deque[Int16Array] = deque()
        self._max = max_frames
        self._preroll: deque[Int16Array] = deque(maxlen=max(1, PREROLL_MS // FRAME_MS))
        self._caller = False  # the detector has the caller speaking (gate open)
        self.fill_gated = False  # deliver withheld frames ducked, in time (module doc)
        self._gain = 1.0  # fill_gated: the gain at the end of the last frame delivered
        self._wake = asyncio.Event()
        self.closed = False
        self.frames = 0  # delivered into the queue
        self.dropped = 0  # oldest frames dropped because the consumer fell behind
        self.gated = 0  # frames withheld as (possible) echo of the agent

    # -- the media side (synchronous) ------------------------------------------------------
    def push(self, pcm: Int16Array, *, agent_audible: bool) -> None:
        """One caller frame at the call's rate; ``agent_audible``: the agent's voice may be
        on the line now (it was playing within the echo tail)."""
        if self.closed:
            return
        rs = self._resampler
        x = pcm.astype(np.float64) if rs is None else rs.process_f64(pcm)
        buf = np.concatenate((self._carry, x)) if self._carry.size else x
        n = buf.size // self.frame * self.frame
        self._carry = buf[n:].copy()
        for i in range(0, n, self.frame):
            frame = np.clip(np.rint(buf[i : i + self.frame]), -32768, 32767).astype(np.int16)
            gated = self.echo_gate and agent_audible and not self._caller
            if gated:
                self.gated += 1
            if self.fill_gated:
                self._deliver(self._glide(frame, _DUCK if gated else 1.0))
            elif gated:
                self._preroll.append(frame)
            else:
                self._deliver(frame)

    def _glide(self, frame: Int16Array, target: float) -> Int16Array:
        """The frame with the gain moving toward ``target``: down within the frame, up by
        ``DUCK_DB`` per ``OPEN_MS`` (geometric, sample by sample: no step for a VAD to hear)."""
        start = self._gain
        if start == target == 1.0:
            return frame
        if target < start:
            end = target
        else:
            step = 10 ** (DUCK_DB / 20 * FRAME_MS / OPEN_MS)  # per frame
            end = min(target, start * step)
        ramp = start * (end / start) ** (np.arange(1, len(frame) + 1) / len(frame))
        self._gain = end
        out: Int16Array = np.clip(np.rint(frame * ramp), -32768, 32767).astype(np.int16)
        return out

    def caller_started(self) -> None:
        """The barge-in detector recognised the caller (over the agent or not): open the gate
        and release the held onset."""
        self._caller = True
        while self._preroll:
            self._deliver(self._preroll.popleft())
            self.gated -= 1

    def caller_stopped(self) -> None:
        self._caller = False
        self._preroll.clear()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    def _deliver(self, frame: Int16Array) -> None:
        if len(self._queue) >= self._max:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(frame)
        self.frames += 1
        self._wake.set()

    # -- the agent side (asyncio) ----------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[Int16Array]:
        return self

    async def __anext__(self) -> Int16Array:
        while not self._queue:
            if self.closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._queue.popleft()

    def pending(self) -> int:
        return len(self._queue)
