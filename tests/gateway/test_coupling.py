"""The call's media clock: the caller frame of a tick sits at the agent frame's media time,
the agent frame goes to the detector once, and the idle gate waits out the echo tail."""

from __future__ import annotations

import numpy as np

from gateway.media.coupling import ECHO_TAIL_S, QUIET_PEAK, MediaCoupling

RATE = 8000
N = 160


def test_both_directions_share_the_tick_clock() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    speech = np.full(N, 3000, np.int16)
    assert m.sent(speech, at=1600) == 1600  # a pacer tick after skipped ones
    assert m.tick_pos == 1600
    pos, far = m.received(N)
    assert pos == 1600 and far is not None and far[0] == 1600 and far[1] is speech
    assert m.received(N) == (1760, None)  # no agent frame this time: the clock just goes on
    assert m.sent(np.zeros(N, np.int16)) == 1760  # None continues from the last frame
    assert m.far_pos == 1920


def test_idle_only_after_the_echo_tail_and_on_quiet_frames() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    quiet = np.full(N, QUIET_PEAK - 1, np.int16)
    m.sent(np.full(N, 3000, np.int16), at=0)  # the agent speaks until sample 160
    tail = int(ECHO_TAIL_S * RATE)
    assert not m.idle(N + tail, quiet)  # echo could still be on the line
    assert m.idle(N + tail + 1, quiet)
    assert not m.idle(N + tail + 1, np.full(N, QUIET_PEAK, np.int16))  # the caller is there


def test_without_a_detector_no_agent_frame_is_kept() -> None:
    m = MediaCoupling(RATE, keep_far=False)
    m.sent(np.full(N, 3000, np.int16), at=0)
    assert m.received(N) == (0, None)
