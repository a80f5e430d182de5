"""Two calls joined through the gateway (the B2BUA leg of a transfer): each side hears what
the other says, and a hang-up on either side ends both.

:class:`CrossedAudio` is the sans-I/O core: one FIFO per direction, fed with a call's caller
audio (``push``, once per media tick from ``Call.on_caller_audio``) and drained as the audio
the other call sends (``pull``, from ``Call.pull_audio``). Both calls are paced by the same
media ticker, so each FIFO gains one frame and loses one per tick and stays about one frame
deep; the jitter buffers of the two legs absorb the far ends' clocks. A stall that leaves one
side a frame ahead is bounded by ``max_ms`` (the oldest audio is dropped, never a growing
delay); a frame missing at a pull is silence.

Codecs: the legs' RTP sessions decode to PCM and encode what they send. When both legs speak
the same G.711 law (both PCMU or both PCMA) the PCM crosses untouched, and since G.711 decode
then encode is the identity, the far end receives the very payload bytes the other side sent
(μ-law's negative zero 0x7F, which encodes back as 0xFF, is the one exception): pass-through,
with the jitter buffer's reordering and loss concealment in between. Different laws are
transcoded by that same decode/encode (``gateway.rtp.codecs``); different rates (a 48 kHz
browser leg and an 8 kHz phone) go through ``dsp.resample``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from dsp.resample import Resampler

Int16Array = npt.NDArray[np.int16]

# How much audio one direction may hold: a frame of phase difference between the two calls'
# ticks, plus a stalled tick or two; beyond it the oldest goes (latency must not creep).
DEFAULT_MAX_MS = 60


@dataclass(slots=True)
class _Direction:
    """Audio said on one side, queued for the other, at the listener's rate."""

    resampler: Resampler | None
    limit: int
    buf: Int16Array = field(default_factory=lambda: np.zeros(0, dtype=np.int16))
    dropped: int = 0
    missing: int = 0


class CrossedAudio:
    """Side 0's audio goes to side 1 and back (see the module doc). ``rates``: each side's
    sample rate."""

    def __init__(self, rates: tuple[int, int], *, max_ms: int = DEFAULT_MAX_MS) -> None:
        self.rates = rates
        self._dirs = (self._direction(rates[0], rates[1], max_ms),
                      self._direction(rates[1], rates[0], max_ms))  # fmt: skip

    @staticmethod
    def _direction(src: int, dst: int, max_ms: int) -> _Direction:
        resampler = None
        if src != dst:
            low = min(src, dst)
            # Telephone audio has nothing above 3.4 kHz: a short filter keeps the delay small.
            resampler = Resampler.for_rates(src, dst, pass_hz=0.425 * low, stop_hz=0.5 * low)
        return _Direction(resampler, dst * max_ms // 1000)

    def push(self, side: int, pcm: Int16Array) -> None:
        """``side``'s caller said ``pcm`` (int16 at its rate): queue it for the other side."""
        d = self._dirs[side]
        if d.resampler is not None:
            pcm = np.clip(np.rint(d.resampler.process_f64(pcm)), -32768, 32767).astype(np.int16)
        buf = np.concatenate((d.buf, pcm)) if len(d.buf) else pcm.astype(np.int16, copy=True)
        excess = len(buf) - d.limit
        if excess > 0:
            d.dropped += excess
            buf = buf[excess:]
        d.buf = buf

    def pull(self, side: int, n: int) -> Int16Array:
        """The next ``n`` samples for ``side`` to send: what the other side said, silence
        where nothing came."""
        d = self._dirs[1 - side]
        out = d.buf[:n]
        d.buf = d.buf[n:]
        if len(out) < n:
            d.missing += n - len(out)
            out = np.concatenate((out, np.zeros(n - len(out), dtype=np.int16)))
        return out

    def stats(self) -> dict[str, int]:
        """Samples dropped (a side ran ahead) and filled with silence (nothing to send), per
        direction: ``0to1`` is what side 1 hears."""
        return {
            "dropped_0to1": self._dirs[0].dropped,
            "missing_0to1": self._dirs[0].missing,
            "dropped_1to0": self._dirs[1].dropped,
            "missing_1to0": self._dirs[1].missing,
        }


class _Rated(Protocol):
    @property
    def rate(self) -> int: ...


C = TypeVar("C", bound=_Rated)


class Bridge(Generic[C]):
    """Two live calls with their media crossed. ``Call`` consults ``call.bridge``: its
    ``pull_audio`` sends the peer's audio instead of the agent's, its ``on_caller_audio``
    feeds the peer, its key presses are sent on to the peer, and its end hangs up the peer.
    (Generic in the call type so that this module needs nothing of ``gateway.call.calls``.)"""

    def __init__(self, first: C, second: C) -> None:
        self.calls = (first, second)
        self.audio = CrossedAudio((first.rate, second.rate))

    def side(self, call: C) -> int:
        return 0 if call is self.calls[0] else 1

    def peer(self, call: C) -> C:
        return self.calls[1 - self.side(call)]

    def push(self, call: C, pcm: Int16Array) -> None:
        self.audio.push(self.side(call), pcm)

    def pull(self, call: C, n: int) -> Int16Array:
        return self.audio.pull(self.side(call), n)
