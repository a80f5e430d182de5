"""The media tick across calls, batched (gateway.rtp.batch): the one-shot twin is the
per-call tick.  Twin pacers (same SSRC, sequence, timestamp, same source) are ticked one at a
time and through :class:`OutboundBatch`; every packet must be the same bytes and every
counter the same, with awkward batch sizes, codecs and ptimes mixed, calls that drop out of
the batched path (DTMF, CN, hold, queued audio, an odd frame), stalls, calls joining and
leaving between wake-ups and a call whose source raises."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from dsp.g711 import alaw_encode, encode_frames, ulaw_encode
from gateway.rtp.batch import OutboundBatch
from gateway.rtp.pacer import Pacer, Ticker
from gateway.rtp.packet import RtpPacket

Int16Array = npt.NDArray[np.int16]
Source = Callable[[int, int], Int16Array]


def speech_source(seed: int, silent_every: int = 5) -> Source:
    """Frames of noise-like 'speech' with runs of digital silence (utterances that start and
    end), a deterministic function of the frame's media time, so twins pull the same."""

    def pull(n: int, at: int) -> Int16Array:
        frame = at // n
        if (frame // 3 + seed) % silent_every == 0:
            return np.zeros(n, np.int16)
        rng = np.random.default_rng(seed * 1_000_003 + frame)
        return rng.integers(-20000, 20000, n).astype(np.int16)

    return pull


def twin(i: int, **kw: object) -> tuple[Pacer, Pacer]:
    codec = "PCMA" if i % 4 == 3 else "PCMU"
    ptime = 30 if i % 5 == 4 else 20
    args: dict[str, object] = {
        "codec": codec,
        "ptime_ms": ptime,
        "ssrc": 0x1000 + i,
        "sequence": (65530 + 7 * i) & 0xFFFF,  # some wrap during the test
        "timestamp": (2**32 - 900 * (i + 1)) & 0xFFFFFFFF,  # timestamps wrap too
        "dtmf_pt": 101,
    }
    args.update(kw)
    pair = (Pacer(**args), Pacer(**args))  # type: ignore[arg-type]
    for p in pair:
        p.start(10.0 + 0.002 * (i % 10))
        p.source = speech_source(i)
    return pair


def test_encode_frames_is_per_frame_encode_row_for_row() -> None:
    rng = np.random.default_rng(5)
    for rows in (1, 3, 7, 33):
        frames = rng.integers(-32768, 32768, (rows, 160)).astype(np.int16)
        frames[0, :5] = (-32768, -1, 0, 1, 32767)
        for law, one in (("ulaw", ulaw_encode), ("alaw", alaw_encode)):
            block = np.zeros((rows, 172), np.uint8)  # payload columns of RTP packets
            encode_frames(law, frames, block[:, 12:])
            assert all(block[r, 12:].tobytes() == one(frames[r]) for r in range(rows))
            assert encode_frames(law, frames).tobytes() == one(frames.ravel())
    with pytest.raises(TypeError):
        encode_frames("ulaw", frames.astype(np.int32))  # type: ignore[arg-type]


@pytest.mark.parametrize("calls", [1, 3, 13, 70])
def test_batched_ticks_equal_per_call_ticks_byte_for_byte(calls: int) -> None:
    pairs = [twin(i) for i in range(calls)]
    batch = OutboundBatch(capacity=4)  # grows while the test runs (70 calls due at once)
    now = 10.0
    sent = 0
    for step in range(160):
        now += 0.002
        if step == 90:
            now += 0.137  # a stall: ticks are skipped, the marker flags the timestamp jump
        due = [(a, b) for a, b in pairs if b.next_due <= now + 0.001]
        singles = [a.tick(now) for a, _ in due]
        batched = batch.build([b for _, b in due], now)
        assert batched == singles
        assert not batch.failures
        sent += sum(1 for x in batched if x is not None)
    for a, b in pairs:
        assert a.stats() == b.stats()
        assert (a._seq, a.ticks, a.playing) == (b._seq, b.ticks, b.playing)
    assert sent > 0 and batch.batched >= sent - batch.single
    assert sum(a.stats().skipped_ticks for a, _ in pairs) > 0  # the stall was seen


def test_sequence_and_timestamp_run_on_per_call_across_batches() -> None:
    pairs = [twin(i, codec="PCMU", ptime_ms=20) for i in range(5)]
    batch = OutboundBatch(capacity=2)
    got: dict[int, list[RtpPacket]] = {}
    now = 10.0
    for _ in range(30):
        now += 0.02
        for pkt in batch.build([b for _, b in pairs], now):
            assert pkt is not None
            p = RtpPacket.parse(pkt)
            got.setdefault(p.ssrc, []).append(p)
    for i, (_, b) in enumerate(pairs):
        pkts = got[b.ssrc]
        assert [p.sequence_number for p in pkts] == [
            ((65530 + 7 * i) + j) & 0xFFFF for j in range(len(pkts))
        ]
        ts = [p.timestamp for p in pkts]
        assert all((y - x) & 0xFFFFFFFF == 160 for x, y in itertools.pairwise(ts))
        assert pkts[0].marker and not any(p.marker and p.payload_type == 0 for p in pkts[1:])


def test_calls_that_leave_the_batched_path_still_match() -> None:
    """DTMF queued mid-call (audio held back, then the queue drains one call at a time), CN
    (DTX), hold, audio pushed with enqueue, a source whose frame is the wrong size: the
    batch sends their packets through ``finish_tick``, the same bytes as ticking them alone."""
    specials: list[tuple[Pacer, Pacer]] = [twin(i) for i in range(6)]
    for p in specials[1]:
        p.cn_pt = 13
        p.source = speech_source(1, silent_every=2)
    for p in specials[2]:
        p.sending = False
    odd = speech_source(9)
    for p in specials[4]:
        p.source = lambda n, at: odd(n + 40, at)  # more than a frame: the rest is queued
    pairs = specials + [twin(10 + i) for i in range(9)]
    batch = OutboundBatch()
    now = 10.0
    for step in range(400):
        now += 0.002
        if step == 20:
            for p in specials[0]:
                p.send_dtmf("5#", duration_ms=60)
        if step == 30:
            for p in specials[3]:
                p.source = None
                p.enqueue(np.full(800, 1234, np.int16))
                p.end_utterance()
        if step == 150:
            for p in specials[3]:
                p.source = speech_source(3)  # back to pulling, after its queue drained
        due = [(a, b) for a, b in pairs if b.next_due <= now + 0.001]
        assert batch.build([b for _, b in due], now) == [a.tick(now) for a, _ in due]
    for a, b in pairs:
        assert a.stats() == b.stats()
    assert specials[0][1].stats().dtmf > 0 and specials[1][1].stats().cn > 0
    assert batch.single > 0 and batch.batched > 0


def test_a_failing_call_is_left_out_and_the_others_go_on() -> None:
    pairs = [twin(i, codec="PCMU", ptime_ms=20) for i in range(6)]
    calls = {"n": 0}
    good = speech_source(2)

    def flaky(n: int, at: int) -> Int16Array:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("agent exploded")
        return good(n, at)

    pairs[2][0].source = pairs[2][1].source = flaky
    batch = OutboundBatch()
    now = 9.99  # the first build at 10.01: every call's tick 0 is due
    for _ in range(12):
        now += 0.02
        out = batch.build([b for _, b in pairs], now)
        failed = {i for i, _ in batch.failures}
        assert failed <= {2}
        assert all(out[i] is not None for i in range(6) if i not in failed)
        if failed:
            assert out[2] is None and isinstance(batch.failures[0][1], RuntimeError)
    # The others never noticed; the flaky one lost only its failed ticks (no packet, no seq).
    for i, (_, b) in enumerate(pairs):
        s = b.stats()
        assert s.sent == (12 if i != 2 else 8) and s.skipped_ticks == 0


def members(ticker: Ticker[Pacer], batch: list[Pacer]) -> Callable[[int], bool]:
    """``build``'s ``live``: still on the schedule (as MediaTicker asks it)."""
    return lambda i: ticker.is_member(batch[i])


def test_ticker_batch_with_calls_joining_and_leaving_mid_batch() -> None:
    """pop_due/reschedule around a batch: a call removed by an earlier call's tick in the same
    wake-up is neither sent nor rescheduled; one added meanwhile starts on its own slot."""
    ticker: Ticker[Pacer] = Ticker(align=0.002, period=0.02)
    pacers = [twin(i, codec="PCMU", ptime_ms=20)[0] for i in range(12)]
    for p in pacers:
        ticker.add(p, 0.0)  # 12 calls over 10 phases: 0 and 10 share phase 0, in that order
    extra = Pacer(ssrc=99, sequence=1, timestamp=0)
    extra.source = speech_source(99)
    victim = pacers[10]
    base = pacers[0].source
    assert base is not None
    fired = {"removed": False}
    victim_ticks = []

    def remover(n: int, at: int) -> Int16Array:
        if not fired["removed"] and at >= 160 * 10:
            fired["removed"] = True
            ticker.remove(victim)  # due in this same wake-up, after us
            victim_ticks.append(victim.ticks)
            ticker.add(extra, 0.2)
        return base(n, at)

    pacers[0].source = remover
    batch = OutboundBatch()
    now = 0.0
    seen: dict[int, int] = {}
    while now < 0.5:
        due = ticker.next_due()
        assert due is not None
        now = due + 0.0003
        items = ticker.pop_due(now)
        live = [p for p in items if ticker.is_member(p)]
        out = batch.build(live, now, members(ticker, live))
        for p, pkt in zip(live, out, strict=True):
            if pkt is not None:
                seen[p.ssrc] = seen.get(p.ssrc, 0) + 1
        ticker.reschedule(items)
    assert fired["removed"] and len(ticker) == 12
    # The victim (same phase as the remover) was not ticked in the wake-up that removed it,
    # nor ever after; the call that joined is paced from its start.
    assert victim.ticks == victim_ticks[0] == seen[victim.ssrc] == 10
    assert seen[extra.ssrc] == extra.ticks >= 14
    assert all(seen[p.ssrc] == p.ticks >= 24 for p in pacers if p is not victim)
