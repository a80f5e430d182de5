"""Playout: utterance order, seq rules, underruns, interrupt fade, heard words."""

from __future__ import annotations

import numpy as np

from gateway.media.playout import Playout, PlayoutEvent, PlayoutFinished, PlayoutStarted
from voxgate.contract.bus.schema import AudioChunk, UtteranceEnd, UtteranceError, Word


def chunk(
    utt: str, seq: int, n: int, value: int = 1000, words: tuple[Word, ...] = ()
) -> AudioChunk:
    data = np.full(n, value, "<i2").tobytes()
    return AudioChunk("c", utt, seq, 8000, data, words=words)


def drain(p: Playout, frames: int, n: int = 160) -> tuple[np.ndarray, list[PlayoutEvent]]:
    out: list[np.ndarray] = []
    events: list[PlayoutEvent] = []
    for _ in range(frames):
        pcm, ev = p.pull(n)
        out.append(pcm)
        events += ev
    return np.concatenate(out), events


def test_plays_in_order_and_finishes() -> None:
    p = Playout()
    p.enqueue("u1")
    p.enqueue("u2")
    # u2's audio arrives first: it waits for u1.
    p.on_message(chunk("u2", 0, 160, 2))
    p.on_message(UtteranceEnd("c", "u2", 1))
    p.on_message(chunk("u1", 0, 240, 1))
    p.on_message(UtteranceEnd("c", "u1", 1))
    pcm, events = drain(p, 4)
    assert list(pcm[:240]) == [1] * 240 and list(pcm[240:400]) == [2] * 160
    assert not pcm[400:].any()
    kinds = [(type(e).__name__, e.utterance_id) for e in events]  # type: ignore[attr-defined]
    assert kinds == [
        ("PlayoutStarted", "u1"), ("PlayoutFinished", "u1"),
        ("PlayoutStarted", "u2"), ("PlayoutFinished", "u2"),
    ]  # fmt: skip
    assert p.stats.underruns == 0


def test_seq_rules_stale_dropped_gap_held() -> None:
    p = Playout()
    p.enqueue("u")
    p.on_message(chunk("u", 1, 160, 2))  # ahead of a gap: held
    pcm, _ = p.pull(160)
    assert not pcm.any()
    p.on_message(chunk("u", 0, 160, 1))  # fills the gap
    p.on_message(chunk("u", 0, 160, 9))  # a restarted worker's seq 0 again: stale
    pcm2, _ = drain(p, 2)
    assert list(pcm2) == [1] * 160 + [2] * 160
    assert p.stats.dropped_chunks == 1


def test_underrun_only_while_an_utterance_plays() -> None:
    p = Playout()
    drain(p, 5)  # idle: silence, no underruns
    p.enqueue("u")
    drain(p, 3)  # queued but not started (waiting for first audio): not an underrun
    assert p.stats.underruns == 0
    p.on_message(chunk("u", 0, 160))
    drain(p, 1)
    drain(p, 2)  # started, worker late: silence, counted
    assert p.stats.underruns == 2
    # The end arrives with nothing left to play: it finishes at once.
    events = p.on_message(UtteranceEnd("c", "u", 1))
    assert isinstance(events[-1], PlayoutFinished) and events[-1].outcome == "done"
    drain(p, 2)
    assert p.stats.underruns == 2


def test_interrupt_fades_to_zero_within_10ms_and_drops_the_rest() -> None:
    p = Playout(fade_ms=10.0)
    p.enqueue("u")
    p.enqueue("next")
    p.on_message(chunk("u", 0, 8000, 10000))
    drain(p, 2)
    events = p.interrupt()
    assert [(type(e), e.outcome) for e in events] == [  # type: ignore[union-attr]
        (PlayoutFinished, "interrupted"), (PlayoutFinished, "cancelled"),
    ]  # fmt: skip
    assert p.speaking  # the fade is still audible
    pcm, _ = drain(p, 2)
    fade = pcm[:80]
    assert fade[0] == 10000 and np.all(np.diff(fade.astype(int)) <= 0)
    assert abs(int(fade[-1])) < 50 and not pcm[80:].any()  # zero after 10 ms at 8 kHz
    # Late chunks of the interrupted utterance are discarded.
    p.on_message(chunk("u", 1, 160, 5))
    pcm, _ = drain(p, 1)
    assert not pcm.any() and not p.speaking


def test_heard_words_stop_where_playback_stopped() -> None:
    p = Playout()
    p.enqueue("u")
    words = (Word("hello", 0, 400), Word("there", 500, 900), Word("friend", 1000, 1500))
    p.on_message(chunk("u", 0, 1600, 100, words))
    drain(p, 6)  # 960 samples played
    (finished,) = p.interrupt()
    assert isinstance(finished, PlayoutFinished)
    assert finished.heard == ("hello", "there")


def test_error_finishes_with_error_and_next_plays() -> None:
    p = Playout()
    p.enqueue("bad")
    p.enqueue("good")
    events = p.on_message(UtteranceError("c", "bad", 0, "text_too_long", "too long"))
    assert isinstance(events[0], PlayoutFinished) and events[0].outcome == "error"
    assert "text_too_long" in (events[0].error or "")
    p.on_message(chunk("good", 0, 160, 7))
    pcm, ev = p.pull(160)
    assert list(pcm) == [7] * 160 and isinstance(ev[0], PlayoutStarted)


def test_audio_at_another_rate_is_an_error_not_garbled_speech() -> None:
    p = Playout(48000)
    p.enqueue("wrong")
    p.enqueue("right")
    bad = AudioChunk("c", "wrong", 0, 16000, np.full(320, 9, "<i2").tobytes())
    events = p.on_message(bad)
    assert isinstance(events[0], PlayoutFinished) and events[0].outcome == "error"
    assert "rate_mismatch" in (events[0].error or "")
    assert p.on_message(bad) == []  # later chunks of it are dropped quietly
    p.on_message(AudioChunk("c", "right", 0, 48000, np.full(960, 5, "<i2").tobytes()))
    pcm, ev = p.pull(960)
    assert list(pcm) == [5] * 960 and isinstance(ev[0], PlayoutStarted)


def test_cancel_a_queued_utterance() -> None:
    p = Playout()
    p.enqueue("a")
    p.enqueue("b")
    (ev,) = p.cancel("b")
    assert isinstance(ev, PlayoutFinished) and ev.outcome == "cancelled"
    assert p.pending_ids() == ["a"]
