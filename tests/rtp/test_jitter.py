"""Jitter buffer: reordering, loss, duplicates, wraparound, late packets, stats."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from dsp.g711 import alaw_decode, ulaw_decode, ulaw_encode
from gateway.rtp.dtmf import TelephoneEvent
from gateway.rtp.jitter import JitterBuffer, JitterFrame
from gateway.rtp.packet import RtpPacket
from tests.rtp.pcap import SIPP_DIR, read_udp

F = 160  # 20 ms at 8 kHz
Int16Array = npt.NDArray[np.int16]


def signal(frames: int, seed: int = 1) -> Int16Array:
    rng = np.random.default_rng(seed)
    t = np.arange(frames * F)
    x = 8000 * np.sin(2 * np.pi * 440 * t / 8000) + rng.normal(0, 500, t.size)
    return np.clip(x, -32768, 32767).astype(np.int16)


def packets(
    pcm: Int16Array, *, seq0: int = 1000, ts0: int = 50_000, ssrc: int = 7, size: int = F
) -> list[RtpPacket]:
    out = []
    for i in range(len(pcm) // size):
        out.append(
            RtpPacket(
                payload_type=0,
                marker=i == 0,
                sequence_number=(seq0 + i) & 0xFFFF,
                timestamp=(ts0 + i * size) & 0xFFFFFFFF,
                ssrc=ssrc,
                payload=ulaw_encode(pcm[i * size : (i + 1) * size]),
            )
        )
    return out


def run(
    jb: JitterBuffer,
    arrivals: list[tuple[float, RtpPacket]],
    pulls: int,
    ptime: float = 0.02,
) -> list[JitterFrame]:
    """Deliver packets by arrival time; pull once per ptime (pull k happens at k·ptime+1 ms)."""
    arrivals = sorted(arrivals, key=lambda a: a[0])
    out, i = [], 0
    for k in range(pulls):
        now = k * ptime + 0.001
        while i < len(arrivals) and arrivals[i][0] <= now:
            jb.push(arrivals[i][1], arrivals[i][0])
            i += 1
        out.append(jb.pull())
    return out


def audio_of(frames: list[JitterFrame]) -> Int16Array:
    return np.concatenate([f.pcm for f in frames if f.kind == "audio"])


def on_time(pkts: list[RtpPacket], ptime: float = 0.02) -> list[tuple[float, RtpPacket]]:
    return [(i * ptime, p) for i, p in enumerate(pkts)]


def test_in_order_stream_is_reproduced_exactly() -> None:
    pcm = signal(50)
    jb = JitterBuffer({0: "PCMU"}, target_ms=60)
    frames = run(jb, on_time(packets(pcm)), 60)
    ref = ulaw_decode(ulaw_encode(pcm))
    assert np.array_equal(audio_of(frames), ref)
    kinds = [f.kind for f in frames]
    assert kinds[:2] == ["silence", "silence"]  # priming to the 60 ms target
    assert kinds.count("audio") == 50
    s = jb.stats()
    assert (s.received, s.lost, s.late, s.duplicate, s.reordered) == (50, 0, 0, 0, 0)
    assert s.jitter == pytest.approx(0.0, abs=1e-6)
    first = next(f for f in frames if f.kind == "audio")
    assert first.timestamp == 50_000


def test_reordering_within_depth_is_invisible() -> None:
    pcm = signal(40)
    pk = packets(pcm)
    arrivals = on_time(pk)
    for i in range(3, 37, 4):  # swap neighbours: i+1 arrives 1 ms before i
        (ta, a), (tb, b) = arrivals[i], arrivals[i + 1]
        arrivals[i], arrivals[i + 1] = (tb, a), (ta - 0.001 + 0.02 - 0.02, b)
    jb = JitterBuffer({0: "PCMU"}, target_ms=60)
    frames = run(jb, arrivals, 50)
    assert np.array_equal(audio_of(frames), ulaw_decode(ulaw_encode(pcm)))
    s = jb.stats()
    assert s.reordered == 9 and s.lost == 0 and s.late == 0


def test_duplicates_dropped() -> None:
    pcm = signal(20)
    pk = packets(pcm)
    arrivals = on_time(pk) + [(i * 0.02 + 0.005, pk[i]) for i in (2, 5, 5, 9)]
    jb = JitterBuffer({0: "PCMU"})
    frames = run(jb, arrivals, 30)
    assert np.array_equal(audio_of(frames), ulaw_decode(ulaw_encode(pcm)))
    assert jb.stats().duplicate == 4 and jb.stats().received == 20


def test_loss_concealed_with_repeat_and_fade_then_silence() -> None:
    pcm = signal(30)
    pk = packets(pcm)
    lost = {10, 20, 21, 22, 23, 24}
    jb = JitterBuffer({0: "PCMU"}, target_ms=60, plc_ms=60, adaptive=False)
    frames = run(jb, [a for i, a in enumerate(on_time(pk)) if i not in lost], 40)
    started = [f for f in frames if f.timestamp is not None]
    kinds = [f.kind for f in started[:30]]
    assert kinds[10] == "concealed"
    assert kinds[20:25] == ["concealed", "concealed", "concealed", "silence", "silence"]
    assert kinds[25] == "audio"
    prev = ulaw_decode(ulaw_encode(pcm[9 * F : 10 * F])).astype(np.float64)
    gain = 1.0 - np.arange(F) / (3 * F)
    assert np.array_equal(started[10].pcm, np.rint(prev * gain).astype(np.int16))
    assert np.abs(started[22].pcm).max() < np.abs(started[20].pcm).max() / 2
    s = jb.stats()
    assert s.lost == 6 and s.late == 0
    assert s.concealed == 1 + 3 + 3  # the gaps, then the end of the stream
    # timestamps keep counting through the gap
    assert [f.timestamp for f in started[:30]] == [50_000 + i * F for i in range(30)]


def test_wraparound_of_sequence_and_timestamp() -> None:
    pcm = signal(40)
    pk = packets(pcm, seq0=65520, ts0=2**32 - 10 * F)
    arrivals = on_time(pk)
    arrivals[19], arrivals[20] = (arrivals[20][0], pk[19]), (arrivals[19][0], pk[20])  # across 0
    jb = JitterBuffer({0: "PCMU"})
    frames = run(jb, arrivals, 50)
    assert np.array_equal(audio_of(frames), ulaw_decode(ulaw_encode(pcm)))
    s = jb.stats()
    assert (s.received, s.expected, s.lost, s.reordered) == (40, 40, 0, 1)
    ts = [f.timestamp for f in frames if f.kind == "audio"]
    assert ts[9] == 2**32 - F and ts[10] == 0


def test_late_packet_dropped_counted_and_target_grows() -> None:
    pcm = signal(40)
    pk = packets(pcm)
    arrivals = on_time(pk)
    arrivals[15] = (arrivals[15][0] + 0.2, pk[15])  # 200 ms late: after its playout time
    jb = JitterBuffer({0: "PCMU"}, target_ms=40, min_ms=40, max_ms=120)
    frames = run(jb, arrivals, 50)
    s = jb.stats()
    assert s.late == 1 and s.lost == 0
    assert s.target_ms == 60
    kinds = [f.kind for f in frames]
    assert kinds.count("concealed") >= 2  # the missing frame and the one inserted to deepen


def test_fixed_depth_does_not_adapt() -> None:
    pcm = signal(40)
    pk = packets(pcm)
    arrivals = on_time(pk)
    arrivals[15] = (arrivals[15][0] + 0.2, pk[15])
    jb = JitterBuffer({0: "PCMU"}, target_ms=40, adaptive=False)
    run(jb, arrivals, 50)
    assert jb.stats().late == 1 and jb.stats().target_ms == 40


def test_jitter_matches_rfc3550_a8() -> None:
    pcm = signal(100)
    pk = packets(pcm)
    rng = np.random.default_rng(3)
    delays = rng.uniform(0, 0.03, len(pk))
    arrivals = [(i * 0.02 + d, p) for i, (p, d) in enumerate(zip(pk, delays, strict=True))]
    jb = JitterBuffer({0: "PCMU"}, target_ms=60)
    for t, p in sorted(arrivals, key=lambda a: a[0]):
        jb.push(p, t)
    # Reference, in arrival order (RFC 3550 §A.8 updates per received packet).
    j, last = 0.0, None
    for t, p in sorted(arrivals, key=lambda a: a[0]):
        transit = t * 8000 - p.timestamp
        if last is not None:
            j += (abs(transit - last) - j) / 16
        last = transit
    assert jb.stats().jitter == pytest.approx(j)
    assert jb.stats().jitter_ms == pytest.approx(j / 8)


def test_remote_30ms_packets_pulled_as_20ms_frames() -> None:
    pcm = signal(30)  # 600 ms = 20 packets of 30 ms
    pk = packets(pcm, size=240)
    jb = JitterBuffer({0: "PCMU"}, frame_ms=20, target_ms=60)
    frames = run(jb, on_time(pk, 0.03), 40)
    assert np.array_equal(audio_of(frames), ulaw_decode(ulaw_encode(pcm)))


def test_telephone_events_in_sequence_space_are_not_loss() -> None:
    pcm = signal(20)
    pk = packets(pcm)
    ev = [
        RtpPacket(
            101,
            False,
            (1020 + i) & 0xFFFF,
            50_000 + 20 * F,
            7,
            bytes(TelephoneEvent(5, i > 2, 10, 160 * (i + 1))),
        )
        for i in range(5)
    ]
    after = packets(signal(10, seed=2), seq0=1025, ts0=50_000 + 25 * F)
    arrivals = on_time(pk + ev + after)
    jb = JitterBuffer({0: "PCMU"})
    run(jb, arrivals, 45)
    s = jb.stats()
    assert s.received == 35 and s.lost == 0 and s.expected == 35


def test_ssrc_change_resyncs() -> None:
    a = packets(signal(20), ssrc=1)
    b = packets(signal(20, seed=5), seq0=9, ts0=123, ssrc=2)
    arrivals = on_time(a + b)
    jb = JitterBuffer({0: "PCMU"})
    frames = run(jb, arrivals, 50)
    s = jb.stats()
    assert s.resyncs >= 1 and s.received == 40 and s.lost == 0
    tail = [f.timestamp for f in frames if f.kind == "audio"][-5:]
    assert tail[-1] == 123 + 19 * F


def test_sequence_restart_after_big_jump() -> None:
    a = packets(signal(10), seq0=100)
    b = packets(signal(10), seq0=40_000, ts0=50_000 + 10 * F)
    jb = JitterBuffer({0: "PCMU"})
    for i, p in enumerate(a + b):
        jb.push(p, i * 0.02)
    s = jb.stats()
    assert s.received == 19  # §A.1: the first packet after the jump is held as suspect
    assert s.lost == 0


def test_marker_on_empty_buffer_reprimes_talkspurt() -> None:
    pk = packets(signal(10))
    later = packets(signal(10, seed=4), seq0=1010, ts0=50_000 + 60 * F)  # after 1 s of DTX
    jb = JitterBuffer({0: "PCMU"}, target_ms=60)
    frames = run(jb, on_time(pk) + [(1.2 + i * 0.02, p) for i, p in enumerate(later)], 90)
    assert [f.kind for f in frames].count("audio") == 20
    assert jb.stats().late == 0


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        JitterBuffer(target_ms=20, min_ms=40)


def test_random_jitter_adaptive_every_audio_frame_is_right() -> None:
    """Uniform 0-50 ms delay (heavy reordering): the buffer adapts, late packets are few, and
    every frame it calls audio is exactly the sender's audio for that timestamp."""
    pcm = signal(500)
    ref = ulaw_decode(ulaw_encode(pcm))
    pk = packets(pcm)
    rng = np.random.default_rng(11)
    arrivals = [(i * 0.02 + rng.uniform(0, 0.05), p) for i, p in enumerate(pk)]
    jb = JitterBuffer({0: "PCMU"}, target_ms=40, min_ms=40, max_ms=200)
    frames = run(jb, arrivals, 520)
    for f in frames:
        if f.kind == "audio":
            assert f.timestamp is not None
            off = f.timestamp - 50_000
            assert np.array_equal(f.pcm, ref[off : off + F])
    s = jb.stats()
    assert s.lost == 0 and s.reordered > 50
    assert s.late <= 5
    assert 40 <= s.target_ms <= 120
    assert s.played >= 490


@pytest.mark.skipif(
    not (SIPP_DIR / "g711a.pcap").is_file(), reason="sipp pcaps not installed (apt sip-tester)"
)
def test_sipp_g711a_capture_through_the_buffer() -> None:
    """sipp's g711a.pcap: PCMA at 30 ms, replayed with its capture times, pulled at 20 ms."""
    records = read_udp(SIPP_DIR / "g711a.pcap")
    pkts = [RtpPacket.parse(r.payload) for r in records]
    assert {p.payload_type for p in pkts} == {8}
    assert {len(p.payload) for p in pkts} == {240}
    assert all(bytes(p) == r.payload for p, r in zip(pkts, records, strict=True))
    t0 = records[0].time
    jb = JitterBuffer({8: "PCMA"}, target_ms=60)
    frames = run(jb, [(r.time - t0, p) for r, p in zip(records, pkts, strict=True)], 400)
    ref = alaw_decode(b"".join(p.payload for p in sorted(pkts, key=lambda p: p.sequence_number)))
    got = audio_of(frames)
    s = jb.stats()
    assert s.lost == 0 and s.duplicate == 0
    assert np.array_equal(got, ref[: got.size]) and got.size >= ref.size - F


def test_resting_buffer_counts_and_decodes_then_primes_afresh() -> None:
    """set_playing(False): nothing stored (nobody pulls), but the statistics and ``decoded``
    (the arrival path) go on; set_playing(True): playout primes from the next packet and
    then plays it exactly."""
    pcm = signal(60)
    pkts = packets(pcm)
    jb = JitterBuffer({0: "PCMU"}, target_ms=60)
    for i, p in enumerate(pkts[:30]):
        jb.push(p, i * 0.02)
        if i == 5:
            jb.set_playing(False)
        if i >= 6:
            assert jb.decoded is not None
            assert np.array_equal(jb.decoded[1], ulaw_decode(p.payload))
    assert jb.depth_samples == 0  # nothing held while resting
    s = jb.stats()
    assert (s.received, s.lost, s.late, s.duplicate) == (30, 0, 0, 0)
    jb.set_playing(True)
    frames = run(jb, on_time(pkts[30:]), 40)  # run() restarts its clock at 0
    kinds = [f.kind for f in frames]
    assert "audio" in kinds
    first = kinds.index("audio")
    assert set(kinds[:first]) <= {"silence"}  # primed afresh, no stale audio
    assert frames[first].timestamp == pkts[30].timestamp
    played = audio_of(frames)
    ref = ulaw_decode(ulaw_encode(pcm))[30 * F :]
    assert np.array_equal(played, ref[: played.size])
    assert jb.stats().received == 60
