"""The call's media clock: the caller frame of a tick sits at the agent frame's media time,
the agent frame goes to the detector once, and the idle gate waits out the echo tail."""

from __future__ import annotations

import numpy as np

from gateway.media.coupling import (
    ARRIVAL_SLACK_S,
    ECHO_TAIL_S,
    MAX_BEHIND_S,
    QUIET_PEAK,
    MediaCoupling,
)

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
    assert m.idle(N + tail + 1, -quiet)
    assert m.idle(N + tail + 1, np.full(N, -QUIET_PEAK, np.int16))  # [-QUIET_PEAK, QUIET_PEAK)
    assert not m.idle(N + tail + 1, np.full(N, -QUIET_PEAK - 1, np.int16))
    assert m.idle(N + tail + 1, np.zeros(0, np.int16))  # no samples: nothing to decide
    # A lone full-scale negative sample is no quiet frame (abs(-32768) wraps in int16).
    peak = np.zeros(N, np.int16)
    peak[7] = -32768
    assert not m.idle(N + tail + 1, peak)


def test_idle_gate_equals_its_range_definition() -> None:
    # The gate reads the samples' high bytes; the definition is every sample in
    # [-QUIET_PEAK, QUIET_PEAK) over the frame.
    m = MediaCoupling(RATE, keep_far=True)
    rng = np.random.default_rng(5)
    for scale in (1, 50, 150, 199, 200, 201, 255, 256, 257, 400, 30000):
        for _ in range(20):
            pcm = np.clip(rng.normal(0, scale / 2.5, N), -32768, 32767).astype(np.int16)
            want = bool(np.all((pcm >= -QUIET_PEAK) & (pcm < QUIET_PEAK)))
            assert m.idle(10**6, pcm) == want
    for edge in (-QUIET_PEAK - 1, -QUIET_PEAK, QUIET_PEAK - 1, QUIET_PEAK, -32768, 32767):
        one = np.zeros(N, np.int16)
        one[N - 1] = edge
        assert m.idle(10**6, one) == (-QUIET_PEAK <= edge < QUIET_PEAK), edge
    assert m.idle(10**6, np.arange(-QUIET_PEAK, QUIET_PEAK, dtype=np.int16))


def test_without_a_detector_no_agent_frame_is_kept() -> None:
    m = MediaCoupling(RATE, keep_far=False)
    m.sent(np.full(N, 3000, np.int16), at=0)
    assert m.received(N) == (0, None)


# --- arrival placement ---------------------------------------------------------------------
def _ticks(m: MediaCoupling, n: int) -> None:
    for _ in range(n):
        m.sent(np.zeros(N, np.int16))


def test_arriving_packets_are_placed_behind_the_agent_clock_on_the_grid() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    _ticks(m, 10)  # far_pos 1600
    ts0 = 123_457  # a random first timestamp, off the 20 ms grid
    first = m.arrived(ts0, N)
    assert first is not None
    pos, skip = first
    assert skip == 0 and pos % N == 0  # detector frames never straddle two packets
    assert pos + N <= m.far_pos - int(ARRIVAL_SLACK_S * RATE)  # the slack behind the clock
    assert pos + N > m.far_pos - int(ARRIVAL_SLACK_S * RATE) - N
    # The RTP timeline is kept, whatever the arrival jitter: packets stay contiguous.
    _ticks(m, 1)
    assert m.arrived(ts0 + N, N) == (pos + N, 0)
    assert m.arrived(ts0 + 2 * N, N) == (pos + 2 * N, 0)  # early (before its tick): same place
    _ticks(m, 3)
    assert m.arrived(ts0 + 3 * N, N) == (pos + 3 * N, 0)  # late: same place
    assert m.reanchored == 0


def test_duplicates_and_reordered_late_packets_are_dropped_and_losses_leave_gaps() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    _ticks(m, 10)
    first = m.arrived(0, N)
    assert first is not None
    pos = first[0]
    _ticks(m, 2)
    assert m.arrived(2 * N, N) == (pos + 2 * N, 0)  # packet 1 lost (or late): a gap
    assert m.arrived(N, N) is None  # ... and when it comes after its successor, it is dropped
    assert m.arrived(2 * N, N) is None  # a duplicate


def test_a_packet_sooner_than_the_slack_allows_moves_the_placement_back() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    _ticks(m, 10)
    first = m.arrived(0, N)  # the first packet was late by 100 ms: the anchor is late
    assert first is not None
    pos = first[0]
    # The next ones come on time: 100 ms "sooner" than the first, beyond the agent's clock.
    placed = m.arrived(N + 800, N)  # its timestamp says 120 ms later, it came after no tick
    assert placed == (pos + N, 0) and m.reanchored == 1  # right after the first: nothing lost
    _ticks(m, 1)
    assert m.arrived(2 * N + 800, N) == (pos + 2 * N, 0)  # the new placement holds
    assert m.reanchored == 1
    # No room at all behind the clock: placed at the bound, the overlapping head dropped.
    _ticks(m, 1)
    placed = m.arrived(20 * N, 3 * N)  # 60 ms of audio, far "ahead"
    assert placed is not None
    start, skip = placed
    assert start + 3 * N - skip == m.far_pos  # ends at the agent's clock, not beyond
    assert start == pos + 3 * N and skip > 0  # right after what was placed, head dropped
    assert m.arrived(23 * N, N) is None  # and with no tick since, there is no room left


def test_a_long_stall_re_anchors_forward() -> None:
    m = MediaCoupling(RATE, keep_far=True)
    _ticks(m, 10)
    first = m.arrived(0, N)
    assert first is not None
    _ticks(m, int((MAX_BEHIND_S + 0.2) * RATE) // N)  # the caller's packets stop: a stall
    placed = m.arrived(N, N)  # the next one is placed near the clock again, not 0.7 s back
    assert placed is not None
    assert placed[0] + N >= m.far_pos - int(ARRIVAL_SLACK_S * RATE) - N and m.reanchored == 1
