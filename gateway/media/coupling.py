"""How a call's two directions meet on one media clock (sans-I/O): each tick the leg takes one
frame of the agent's audio and hands over one frame of the caller's, and the barge-in
detector needs both at the same media time, plus the idle gate that spares it silence.

Media time is an integer sample count: the pacer's tick index × frame size (stalls included),
so barge-in times are on the clock the caller hears."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Int16Array = npt.NDArray[np.int16]

# Idle gate: longer than the longest echo path searched (300 ms) plus a margin, and a peak
# below which a caller frame is line noise (about -44 dBFS).
ECHO_TAIL_S = 0.4
QUIET_PEAK = 200


class MediaCoupling:
    """Positions of the frames sent and received, the agent frame of the current tick (for
    the detector) and when the agent was last audible."""

    def __init__(self, rate: int, *, keep_far: bool) -> None:
        self.rate = rate
        self._keep_far = keep_far  # a detector wants the agent's frames
        self.far_pos = 0  # media time of the next agent sample to be sent
        self.near_pos = 0  # media time of the next caller sample expected
        self._tick_pos: int | None = None  # the current tick's time, between sent and received
        self._far: tuple[int, Int16Array] | None = None
        self._far_heard = -(1 << 40)  # media time just after the last non-silent agent frame
        self._echo_tail = int(ECHO_TAIL_S * rate)

    def sent(self, pcm: Int16Array, at: int | None = None) -> int:
        """The agent frame of this tick (``at``: its media time; None continues the clock).
        Returns its media time."""
        at = self.far_pos if at is None else at
        if self._keep_far:
            # Given to the detector with the caller's frame of the same tick.
            self._far = (at, pcm)
        if pcm.any():
            self._far_heard = at + len(pcm)
        self._tick_pos = at  # the caller's frame of this same tick is at this media time
        self.far_pos = at + len(pcm)
        return at

    def received(self, n: int) -> tuple[int, tuple[int, Int16Array] | None]:
        """A caller frame of ``n`` samples: its media time, and the agent frame sent on the
        same tick (None when there was none, or when no detector wants it)."""
        pos = self._tick_pos if self._tick_pos is not None else self.near_pos
        self._tick_pos = None
        self.near_pos = pos + n
        far, self._far = self._far, None
        return pos, far

    @property
    def tick_pos(self) -> int:
        """Media time the next caller frame will be given (benchmarks tag frames with it)."""
        return self._tick_pos if self._tick_pos is not None else self.near_pos

    def agent_audible(self, pos: int) -> bool:
        """The agent's voice may be on the line at ``pos``: it played within the echo tail."""
        return pos - self._far_heard <= self._echo_tail

    def idle(self, pos: int, pcm: Int16Array) -> bool:
        """Nothing to decide: the agent has been silent longer than any echo path, and the
        caller's frame at ``pos`` is quiet."""
        if self.agent_audible(pos):
            return False
        return int(np.abs(pcm).max(initial=0)) < QUIET_PEAK
