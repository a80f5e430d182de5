"""The per-tick fast paths against the general code they short-cut (their one-shot twins):
the jitter buffer's pull of an exact stored frame, the playout's pull from the middle of a
chunk, and the send-time histogram's bulk binning.  Twins are fed the same input; one
always takes the general path; every frame, event and statistic must be the same."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from dsp.g711 import ulaw_encode
from gateway.media.playout import Playout
from gateway.rtp.jitter import JitterBuffer
from gateway.rtp.pacer import SendTimeStats
from gateway.rtp.packet import RtpPacket
from voxgate.contract.bus.schema import AudioChunk, UtteranceEnd

Int16Array = npt.NDArray[np.int16]


def _stream(seed: int, n: int, size: int) -> list[tuple[float, RtpPacket]]:
    """A caller's packets as a bad network delivers them: jitter, reordering, loss,
    duplicates, a talkspurt marker after a pause, a timestamp jump."""
    rng = np.random.default_rng(seed)
    out = []
    ts = 1_000_000
    for i in range(n):
        if i == n // 2:
            ts += 40 * size  # the sender's clock jumps
        pcm = rng.integers(-9000, 9000, size).astype(np.int16)
        pkt = RtpPacket(0, i % 37 == 0, (500 + i) & 0xFFFF, ts & 0xFFFFFFFF, 7, ulaw_encode(pcm))
        ts += size
        if rng.random() < 0.05:
            continue  # lost
        arrival = i * size / 8000 + abs(rng.normal(0.0, 0.015)) + (0.3 if i % 97 == 50 else 0)
        out.append((arrival, pkt))
        if rng.random() < 0.03:
            out.append((arrival + 0.004, pkt))  # duplicated
    return sorted(out, key=lambda a: a[0])


@pytest.mark.parametrize(
    ("seed", "size", "adaptive"), [(1, 160, True), (2, 240, True), (3, 160, False), (4, 80, True)]
)
def test_jitter_pull_fast_path_equals_the_general_pull(
    seed: int, size: int, adaptive: bool
) -> None:
    fast = JitterBuffer({0: "PCMU"}, adaptive=adaptive)
    general = JitterBuffer({0: "PCMU"}, adaptive=adaptive)
    arrivals = _stream(seed, 1500, size)
    i = 0
    hits = 0
    for k in range(int(arrivals[-1][0] / 0.02) + 30):
        now = k * 0.02 + 0.001
        while i < len(arrivals) and arrivals[i][0] <= now:
            fast.push(arrivals[i][1], arrivals[i][0])
            general.push(arrivals[i][1], arrivals[i][0])
            i += 1
        before = fast.stats().played
        a, b = fast.pull(), general._pull_any()
        hits += fast.stats().played - before
        assert (a.kind, a.timestamp) == (b.kind, b.timestamp), k
        assert np.array_equal(a.pcm, b.pcm), k
        assert fast.stats() == general.stats(), k
    assert hits > 500  # the fast path was taken (and checked) most of the time


def _chunks(rng: np.random.Generator, total: int) -> list[Int16Array]:
    out = []
    while total > 0:
        n = int(min(total, rng.choice([1, 37, 159, 160, 161, 800, 2400])))
        out.append(rng.integers(-20000, 20000, n).astype(np.int16))
        total -= n
    return out


def test_playout_pull_fast_path_equals_the_general_pull() -> None:
    rng = np.random.default_rng(11)
    fast, general = Playout(), Playout()
    script: list[tuple[int, str, object]] = []  # (tick, what, data)
    tick = 0
    for u in range(12):
        uid = f"u{u}"
        script.append((tick, "enqueue", uid))
        for seq, pcm in enumerate(_chunks(rng, int(rng.integers(400, 6000)))):
            script.append((tick + seq // 3, "chunk", AudioChunk("c", uid, seq, 8000,
                                                                 pcm.tobytes())))  # fmt: skip
        end = tick + int(rng.integers(5, 40))
        script.append((end, "end", UtteranceEnd("c", uid, 0)))
        if u % 4 == 1:
            script.append((tick + 7, "interrupt", None))
        tick = end + int(rng.integers(0, 30))
    script.sort(key=lambda s: s[0])
    general_pulls = {"n": 0}
    any_pull = fast._pull_any

    def counted(n: int) -> tuple[Int16Array, list[object]]:
        general_pulls["n"] += 1
        return any_pull(n)  # type: ignore[return-value]

    fast._pull_any = counted  # type: ignore[assignment,method-assign]
    j = 0
    for t in range(tick + 200):
        while j < len(script) and script[j][0] <= t:
            _, what, data = script[j]
            for p in (fast, general):
                if what == "enqueue":
                    p.enqueue(str(data))
                elif what == "interrupt":
                    assert p.interrupt(clear_queue=False) is not None
                else:
                    assert isinstance(data, AudioChunk | UtteranceEnd)
                    p.on_message(data)
            j += 1
        n = 160 if t % 50 else 240  # a caller of another frame size now and then
        a, ea = fast.pull(n)
        b, eb = general._pull_any(n)
        assert np.array_equal(a, b) and ea == eb, t
        assert fast.stats == general.stats
    assert fast.stats.interrupted == 3
    # Both fast cases (quiet, mid-chunk) were taken, and checked, on most ticks.
    assert fast.stats.frames - general_pulls["n"] > 0.6 * fast.stats.frames


def test_send_time_stats_bins_in_bulk_what_it_was_given_one_by_one() -> None:
    rng = np.random.default_rng(3)
    errors = np.abs(rng.normal(0.0, 0.002, 10_000)) + rng.choice([0, 0.05], 10_000, p=[0.99, 0.01])
    bulk, one = SendTimeStats(), SendTimeStats()
    for k in range(0, errors.size, 7):
        bulk.add(errors[k : k + 7].tolist())  # a wake-up's errors: buffered, binned later
    one.record(errors)
    assert bulk.count == one.count == errors.size  # reading a figure bins what is pending
    assert np.array_equal(bulk._bins, one._bins)
    assert bulk.summary() == one.summary()
    assert bulk.max_ms == pytest.approx(errors.max() * 1000.0)
    ms = np.sort(errors * 1000.0)
    assert bulk.percentile(99) == pytest.approx(
        (np.floor(ms[int(np.ceil(0.99 * ms.size)) - 1] / 0.1) + 1) * 0.1
    )
