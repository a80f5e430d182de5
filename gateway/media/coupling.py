"""How a call's two directions meet on one media clock (sans-I/O): each tick the leg takes one
frame of the agent's audio and hands over one frame of the caller's, and the barge-in
detector needs both at the same media time, plus the idle gate that spares it silence.

Media time is an integer sample count: the pacer's tick index × frame size (stalls included),
so barge-in times are on the clock the caller hears."""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

Int16Array = npt.NDArray[np.int16]

# Idle gate: longer than the longest echo path searched (300 ms) plus a margin, and a level
# below which a caller frame is line noise: every sample in [-QUIET_PEAK, QUIET_PEAK), about
# -42 dBFS.  256 because that range is where an int16's high byte is only the sign extension
# of its low byte (0x00 or 0xFF): the check reads the high bytes, one C pass, ~4x cheaper than
# the two reductions it replaces (every idle caller packet takes it).
ECHO_TAIL_S = 0.4
QUIET_PEAK = 256
_HIGH = 1 if sys.byteorder == "little" else 0  # the high byte of each int16 sample
# Arrival placement: caller packets that place further than this behind the agent's clock
# (a long network stall, a sender whose timeline jumped) are re-anchored to arrive "now".
# Below the detector's far history (1 s+) so a placed frame always finds its echo reference.
MAX_BEHIND_S = 0.5
# How far behind the agent's clock arriving caller audio is placed (plus up to a frame for
# the grid): room for packets that arrive sooner than the first one did (network jitter)
# without moving the placement.  It is taken off the echo delay the detector sees, so it
# stays below the shortest echo path a phone leg has (the phone's own packetisation and
# jitter buffer alone make that 40 ms or more).
ARRIVAL_SLACK_S = 0.02


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
        # Arrival placement (see ``arrived``): media time = RTP timestamp + offset.
        self._offset: int | None = None
        self._arrived_end: int | None = None  # media time just after the last placed sample
        self._max_behind = int(MAX_BEHIND_S * rate)
        self._slack = int(ARRIVAL_SLACK_S * rate)
        self._grid = rate // 50  # 20 ms: every detector frame size divides it
        self.reanchored = 0

    def sent(self, pcm: Int16Array, at: int | None = None) -> int:
        """The agent frame of this tick (``at``: its media time; None continues the clock).
        Returns its media time."""
        at = self.far_pos if at is None else at
        if self._keep_far:
            # Given to the detector with the caller's frame of the same tick.
            self._far = (at, pcm)
        if np.count_nonzero(pcm):  # pcm.any(), without its Python wrapper (hot path)
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

    def arrived(self, ts: int, n: int) -> tuple[int, int] | None:
        """Place a caller packet of ``n`` samples with extended RTP timestamp ``ts`` on the
        media clock the moment it arrives (not when the jitter buffer would play it).

        Returns (media time of its first sample, samples to drop from its head), or None for
        audio already placed (a duplicate, or a reordered packet that came after its
        successor: arrival order is the point, a late packet is not waited for).

        The placement keeps the RTP timeline (consecutive packets stay contiguous, whatever
        the network jitter) and anchors it ``ARRIVAL_SLACK_S`` behind the agent's clock
        (``far_pos``, the last agent sample sent), on the 20 ms grid: the detector must
        already hold the agent audio a caller frame may echo, and its frames must not
        straddle two packets (a frame would wait for the next packet).  Where a caller frame
        sits on the media clock only sets the echo delay the detector sees, not when it is
        analysed, so the slack costs no latency.  The offset moves only when a packet would
        break that bound: one that arrives more than the slack sooner than the first did
        (the head that then overlaps is dropped), or one placed more than ``MAX_BEHIND_S``
        behind (a network stall or a timeline jump: a gap, read as silence).  Clock drift
        between the legs shows as a slowly moving echo delay, which the detector follows.
        """
        now = self.far_pos
        last = self._arrived_end
        grid = self._grid
        end = None if self._offset is None else ts + n + self._offset
        if end is None or end < now - self._max_behind:
            # Anchor: the packet's first sample on the grid, the slack behind the clock.
            start = (now - self._slack - n) // grid * grid
        elif end > now:
            # Sooner than the slack allows: right after what is placed if the bound permits
            # (nothing lost), else as late as it permits (the overlapping head is dropped).
            start = (now - n) // grid * grid
            if last is not None:
                start = min(start, last)
        else:
            start = end - n
        if end is None or start != end - n:
            self._offset = start - ts
            end = start + n
            if last is not None:
                self.reanchored += 1
        if last is not None and end <= last:
            return None
        skip = 0 if last is None else max(0, last - start)
        self._arrived_end = end
        return start + skip, skip

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
        # Every sample in [-256, 256): every high byte is 0x00 or 0xFF (see QUIET_PEAK).
        return not pcm.tobytes()[_HIGH::2].strip(b"\x00\xff")
