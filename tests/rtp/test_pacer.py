"""Outbound pacer and shared ticker, driven by a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from dsp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from gateway.rtp.dtmf import DtmfDecoder, DtmfDigit, TelephoneEvent
from gateway.rtp.jitter import JitterBuffer
from gateway.rtp.pacer import Pacer, SendTimeStats, Ticker
from gateway.rtp.packet import RtpPacket

F = 160
SILENCE_U = b"\xff" * F


def tone(ms: int, amp: int = 8000) -> np.ndarray:
    t = np.arange(ms * 8)
    return (amp * np.sin(2 * np.pi * 697 * t / 8000)).astype(np.int16)


def make(**kw: object) -> Pacer:
    base: dict[str, object] = {"ssrc": 0x1234, "sequence": 65530, "timestamp": 2**32 - 800}
    base.update(kw)
    p = Pacer(**base)  # type: ignore[arg-type]
    p.start(100.0)
    return p


def tick_at_due(p: Pacer, jitter: float = 0.0) -> RtpPacket | None:
    data = p.tick(p.next_due + jitter)
    return RtpPacket.parse(data) if data is not None else None


def test_no_drift_over_10000_ticks() -> None:
    p = make()
    rng = np.random.default_rng(0)
    seqs, tss, errs = [], [], []
    for n in range(10_000):
        due = p.next_due
        assert due == pytest.approx(100.0 + n * 0.02, abs=1e-9)
        late = float(rng.uniform(0, 0.004))  # timer wake-up noise up to 4 ms
        pkt = RtpPacket.parse(p.tick(due + late) or b"")
        seqs.append(pkt.sequence_number)
        tss.append(pkt.timestamp)
        errs.append(late)
    assert p.next_due == pytest.approx(100.0 + 10_000 * 0.02, abs=1e-9)
    assert seqs == [(65530 + i) & 0xFFFF for i in range(10_000)]
    assert tss == [(2**32 - 800 + i * F) & 0xFFFFFFFF for i in range(10_000)]
    s = p.stats()
    assert s.sent == 10_000 and s.skipped_ticks == 0 and s.late_sends == 0
    assert s.mean_error_ms == pytest.approx(1000 * float(np.mean(errs)))
    assert s.underruns == 0 and s.silence == 10_000


def test_first_packet_has_marker_and_idle_is_silence() -> None:
    p = make()
    first, second = tick_at_due(p), tick_at_due(p)
    assert first is not None and second is not None
    assert first.marker and not second.marker
    assert first.payload == SILENCE_U and first.ssrc == 0x1234 and first.payload_type == 0


def test_audio_then_underrun_counted_only_mid_utterance() -> None:
    p = make()
    pcm = tone(50)
    p.enqueue(pcm)
    enc = ulaw_encode(pcm)
    a, b = tick_at_due(p), tick_at_due(p)
    assert a is not None and b is not None
    assert a.payload + b.payload == enc[: 2 * F]
    c = tick_at_due(p)  # 10 ms left, utterance not ended: the synthesiser is behind
    assert c is not None and c.payload == SILENCE_U
    assert p.stats().underruns == 1
    p.enqueue(tone(10))
    d = tick_at_due(p)
    assert d is not None and d.payload == enc[2 * F :] + ulaw_encode(tone(10))
    p.end_utterance()
    for _ in range(5):
        tick_at_due(p)
    assert p.stats().underruns == 1 and not p.playing
    p.enqueue(tone(30))
    p.end_utterance()
    e, f = tick_at_due(p), tick_at_due(p)
    assert e is not None and f is not None
    assert f.payload == ulaw_encode(tone(30))[F:] + SILENCE_U[: F // 2]  # tail padded
    assert p.stats().underruns == 1


def test_stall_skips_ticks_without_burst() -> None:
    p = make()
    p.enqueue(tone(1000))
    for _ in range(5):
        tick_at_due(p)
    due = p.next_due
    data = p.tick(due + 0.2 + 0.003)  # the process stalled for 200 ms
    assert data is not None
    pkt = RtpPacket.parse(data)
    assert p.tick(due + 0.2 + 0.004) is None  # nothing more due: no catch-up burst
    s = p.stats()
    assert s.skipped_ticks == 10 and s.late_sends == 1 and s.sent == 6
    assert pkt.marker  # timestamp jump flagged (RFC 3551 §4.1)
    assert pkt.timestamp == (2**32 - 800 + 15 * F) & 0xFFFFFFFF  # media time moved on
    assert pkt.sequence_number == (65530 + 5) & 0xFFFF  # no sequence gap: nothing was lost
    assert pkt.payload == ulaw_encode(tone(1000))[5 * F : 6 * F]  # audio delayed, not dropped
    assert p.next_due == pytest.approx(100.0 + 16 * 0.02)


def test_pull_source_gets_one_frame_per_tick_on_the_media_clock() -> None:
    p = make()
    pulls: list[tuple[int, int]] = []
    level = np.full(F, 3000, np.int16)

    def source(n: int, at: int) -> np.ndarray:
        pulls.append((n, at))
        return level if len(pulls) <= 3 else np.zeros(n, np.int16)

    p.source = source
    for _ in range(5):
        tick_at_due(p)
    due = p.next_due
    p.tick(due + 0.2 + 0.003)  # a 200 ms stall: 10 ticks skipped, one pull
    assert [n for n, _ in pulls] == [F] * 6
    # Positions follow the tick clock, the skipped ticks included.
    assert [at for _, at in pulls] == [0, F, 2 * F, 3 * F, 4 * F, 15 * F]
    s = p.stats()
    assert s.underruns == 0  # silence from the source is not an underrun of the pacer


def test_slightly_early_wake_sends_the_due_tick() -> None:
    p = make()
    assert p.tick(p.next_due - 0.0005) is not None
    assert p.ticks == 1 and p.stats().skipped_ticks == 0


def test_barge_in_fades_10ms_then_silence() -> None:
    p = make(codec="PCMA")
    loud = np.full(8000, 12000, dtype=np.int16)
    p.enqueue(loud)
    tick_at_due(p)
    dropped = p.barge_in(10)
    assert dropped == 8000 - F - 80
    pkt = tick_at_due(p)
    assert pkt is not None and pkt.payload_type == 8
    pcm = alaw_decode(pkt.payload)
    assert pcm[0] > 11000 and abs(int(pcm[79])) < 200
    assert np.all(np.diff(pcm[:80].astype(int)) <= 64)  # monotone fade (A-law steps)
    assert pkt.payload[80:] == alaw_encode(np.zeros(80, dtype=np.int16))
    assert p.queued_samples == 0 and not p.playing
    for _ in range(3):
        tick_at_due(p)
    assert p.stats().underruns == 0


def test_dtmf_train_holds_audio_and_decodes() -> None:
    p = make(dtmf_pt=101)
    p.enqueue(tone(100))
    p.end_utterance()
    tick_at_due(p)
    p.send_dtmf("59", duration_ms=100, gap_ms=40)
    pkts = [tick_at_due(p) for _ in range(30)]
    assert all(x is not None for x in pkts)
    evs = [x for x in pkts if x is not None and x.payload_type == 101]
    assert len(evs) == 14
    assert evs[0].marker and evs[7].marker
    assert len({e.timestamp for e in evs[:7]}) == 1
    assert [TelephoneEvent.parse(e.payload).duration for e in evs[:7]] == [
        160,
        320,
        480,
        640,
        800,
        800,
        800,
    ]
    dec = DtmfDecoder()
    digits: list[DtmfDigit] = []
    for e in evs:
        digits += dec.feed(e)
    assert [(d.digit, d.duration_ms) for d in digits] == [("5", 100), ("9", 100)]
    # audio resumes after the train and the gap, and none of it was lost
    audio = b"".join(x.payload for x in pkts if x is not None and x.payload_type == 0)
    assert ulaw_encode(tone(100))[F:] in audio
    with pytest.raises(ValueError, match="not negotiated"):
        make().send_dtmf("1")


def test_comfort_noise_dtx() -> None:
    p = make(cn_pt=13, cn_refresh_ms=200)
    out = [p.tick(p.next_due) for _ in range(25)]
    sent = [RtpPacket.parse(x) for x in out if x is not None]
    assert [i for i, x in enumerate(out) if x is not None] == [0, 10, 20]
    assert all(s.payload_type == 13 and len(s.payload) == 1 for s in sent)
    p.enqueue(tone(20))
    a = tick_at_due(p)
    assert a is not None and a.payload_type == 0 and a.marker  # talkspurt after DTX
    assert a.sequence_number == (sent[-1].sequence_number + 1) & 0xFFFF


def test_hold_sends_nothing_but_keeps_time() -> None:
    p = make()
    p.enqueue(tone(100))
    p.sending = False
    assert all(tick_at_due(p) is None for _ in range(3))
    p.sending = True
    pkt = tick_at_due(p)
    assert pkt is not None and pkt.timestamp == (2**32 - 800 + 3 * F) & 0xFFFFFFFF
    assert pkt.payload == ulaw_encode(tone(100))[3 * F : 4 * F]


def test_pacer_to_jitter_buffer_round_trip_30ms() -> None:
    p = make(ptime_ms=30)
    pcm = tone(900)
    p.enqueue(pcm)
    p.end_utterance()
    jb = JitterBuffer({0: "PCMU"}, frame_ms=30)
    got = []
    for _ in range(40):
        now = p.next_due
        data = p.tick(now)
        assert data is not None
        jb.push(RtpPacket.parse(data), now)
        f = jb.pull()
        if f.kind == "audio":
            got.append(f.pcm)
    out = np.concatenate(got)
    ref = ulaw_decode(ulaw_encode(pcm))
    assert np.array_equal(out[: ref.size], ref)


def test_ticker_schedules_many_calls_aligned() -> None:
    ticker: Ticker[Pacer] = Ticker(align=0.002, period=0.02)
    pacers = [Pacer(ptime_ms=20 if i % 3 else 30) for i in range(300)]
    starts = []
    for i, p in enumerate(pacers):
        at = ticker.add(p, 5.0 + i * 0.0007)
        starts.append(at)
        assert at == pytest.approx(round(at / 0.002) * 0.002) and at >= 5.0 + i * 0.0007 - 1e-9
    # balanced over the 10 phases of the 20 ms period: 30 calls each
    phases = np.bincount(np.round(np.array(starts) / 0.002).astype(int) % 10, minlength=10)
    assert phases.tolist() == [30] * 10
    now = 5.0
    sent = 0
    while True:
        due = ticker.next_due()
        assert due is not None
        if due > 7.0:
            break
        now = due + 0.0003
        sent += sum(1 for _, r in ticker.run(now) if r is not None)
    assert ticker.wakeups <= 10 * 100 + 20  # one per phase, not one per call
    for p in pacers:
        assert p.stats().skipped_ticks == 0
    assert sent == sum(p.stats().sent for p in pacers)
    assert ticker.error.count == sent
    assert ticker.error.percentile(99) <= 1.0
    ticker.remove(pacers[0])
    assert len(ticker) == 299
    before = pacers[0].stats().sent
    ticker.run(ticker.next_due() or 0.0)
    assert pacers[0].stats().sent == before


def test_send_time_stats_percentiles() -> None:
    s = SendTimeStats(bin_ms=0.1, max_ms=100)
    s.record(np.array([0.0005] * 90 + [0.005] * 9 + [0.05]))
    assert s.count == 100
    assert s.percentile(50) == pytest.approx(0.6)
    assert s.percentile(95) == pytest.approx(5.1)
    assert s.percentile(100) == pytest.approx(50.1)
    assert s.max_ms == pytest.approx(50.0)
    s.record([-0.001])
    assert s.min_ms == pytest.approx(-1.0)
    assert s.summary()["count"] == 101
