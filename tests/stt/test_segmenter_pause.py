"""The segmenter's ``Pause`` event (``pause_ms``): once per pause, ``pause_ms`` after the last
speech frame; when nothing more is said, the ``Final`` that follows carries exactly the Pause's
start, end and audio (so its eager transcript can be reused); new speech after a Pause gives no
Final for it, and a later Pause and Final cover the longer utterance; bad values are refused.

The caller is synthetic voiced sound (every frame of it is speech to the VAD), so the
utterance boundaries are known to the frame."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.stt.segmenter import (
    FRAME,
    RATE,
    TAIL_FRAMES,
    Final,
    Partial,
    Pause,
    SegmenterConfig,
    SegmentEvent,
    SpeechSegmenter,
)
from tests.agents.audio import Int16Array, frames_of, silence, voiced


def feed(seg: SpeechSegmenter, x: Int16Array) -> list[tuple[int, SegmentEvent]]:
    """Every event with the media time (``seg.pos``) just after the frame that produced it."""
    out: list[tuple[int, SegmentEvent]] = []
    for f in frames_of(x):
        out += [(seg.pos, e) for e in seg.feed(f)]
    return out


def of(events: list[tuple[int, SegmentEvent]], kind: type) -> list[tuple[int, SegmentEvent]]:
    return [(at, e) for at, e in events if isinstance(e, kind)]


def config(**kw: object) -> SegmenterConfig:
    base: dict[str, object] = {"min_silence_ms": 500, "pause_ms": 100, "partial_every_ms": 10000}
    base.update(kw)
    return SegmenterConfig(**base)  # type: ignore[arg-type]


def test_one_pause_per_pause_after_pause_ms_of_non_speech() -> None:
    seg = SpeechSegmenter(config())
    x = np.concatenate([silence(0.3), voiced(1.0), silence(1.0)])
    events = feed(seg, x)
    pauses, finals = of(events, Pause), of(events, Final)
    assert len(pauses) == 1 and len(finals) == 1, events
    at, p = pauses[0]
    assert isinstance(p, Pause)
    # pause_ms after the last speech frame, not before, not again while the silence goes on.
    assert at - p.end == 100 * RATE // 1000
    final_at, f = finals[0]
    assert isinstance(f, Final)
    assert final_at - f.end == 500 * RATE // 1000
    # The voiced sound is speech frame by frame: the utterance ends where it does (a few
    # frames of VAD hangover at most) and starts at most the pre-roll before it.
    speech_start, speech_end = int(0.3 * RATE), int(1.3 * RATE)
    assert speech_end <= p.end <= speech_end + 4 * FRAME
    assert speech_start - int(0.2 * RATE) - FRAME <= p.start <= speech_start


def test_a_pause_shorter_than_pause_ms_gives_none() -> None:
    seg = SpeechSegmenter(config())
    gap = (100 - 40) / 1000  # two frames short of pause_ms
    x = np.concatenate([voiced(0.6), silence(gap), voiced(0.6), silence(1.0)])
    events = feed(seg, x)
    assert len(of(events, Pause)) == 1  # only the final silence
    assert len(of(events, Final)) == 1


def test_the_final_equals_the_pause_when_nothing_more_is_said() -> None:
    for pause_ms in (100, 200, 480):
        seg = SpeechSegmenter(config(pause_ms=pause_ms))
        events = feed(seg, np.concatenate([silence(0.2), voiced(0.8), silence(0.8)]))
        ((_, p),) = of(events, Pause)
        ((_, f),) = of(events, Final)
        assert isinstance(p, Pause) and isinstance(f, Final)
        assert (p.start, p.end) == (f.start, f.end), pause_ms
        assert np.array_equal(p.audio, f.audio), pause_ms
        assert not f.cut
        # The audio ends a short tail after the last speech frame, wherever the Pause fired.
        assert p.audio.size == p.end - p.start + TAIL_FRAMES * FRAME


def test_the_final_at_flush_equals_the_pause() -> None:
    seg = SpeechSegmenter(config())
    events = feed(seg, np.concatenate([voiced(0.8), silence(0.3)]))  # the call ends mid-pause
    ((_, p),) = of(events, Pause)
    assert not of(events, Final)
    (f,) = seg.flush()
    assert isinstance(p, Pause) and isinstance(f, Final)
    assert (p.start, p.end) == (f.start, f.end)
    assert np.array_equal(p.audio, f.audio)


def test_new_speech_after_a_pause_makes_one_longer_utterance() -> None:
    seg = SpeechSegmenter(config())
    x = np.concatenate([silence(0.2), voiced(0.6), silence(0.25), voiced(0.7), silence(0.8)])
    events = feed(seg, x)
    pauses = [e for _, e in of(events, Pause)]
    finals = [e for _, e in of(events, Final)]
    assert len(pauses) == 2 and len(finals) == 1, events
    first, second = pauses
    (f,) = finals
    assert isinstance(first, Pause) and isinstance(second, Pause) and isinstance(f, Final)
    # No Final for the first pause; the second Pause and the Final span both parts.
    assert first.start == second.start == f.start
    assert first.end < second.end == f.end
    assert second.end - first.end >= int(0.9 * RATE)
    assert np.array_equal(second.audio, f.audio)
    assert first.audio.size < f.audio.size
    # What the first Pause carried is the start of the longer utterance.
    assert np.array_equal(
        f.audio[: first.end - first.start], first.audio[: first.end - first.start]
    )


def test_no_pause_events_when_pause_ms_is_zero() -> None:
    seg = SpeechSegmenter(config(pause_ms=0))
    x = np.concatenate([voiced(0.6), silence(0.3), voiced(0.6), silence(1.0)])
    events = feed(seg, x)
    assert not of(events, Pause)
    assert len(of(events, Final)) == 1
    # The default config has none either.
    seg = SpeechSegmenter()
    assert not of(feed(seg, np.concatenate([voiced(0.6), silence(1.0)])), Pause)


def test_silence_gives_no_pause_and_partials_still_come() -> None:
    seg = SpeechSegmenter(config())
    assert feed(seg, silence(3.0)) == []
    seg = SpeechSegmenter(config(partial_every_ms=400))
    events = feed(seg, np.concatenate([voiced(1.5), silence(1.0)]))
    assert len(of(events, Partial)) >= 3
    assert len(of(events, Pause)) == 1 and len(of(events, Final)) == 1


@pytest.mark.parametrize(
    ("pause_ms", "min_silence_ms"),
    [(20, 500), (40, 500), (59, 500), (500, 500), (600, 500), (-20, 500), (100, 100)],
)
def test_invalid_pause_ms_is_refused(pause_ms: int, min_silence_ms: int) -> None:
    with pytest.raises(ValueError, match="pause_ms"):
        SegmenterConfig(pause_ms=pause_ms, min_silence_ms=min_silence_ms)


@pytest.mark.parametrize(("pause_ms", "min_silence_ms"), [(0, 500), (100, 500), (480, 500)])
def test_valid_pause_ms_is_accepted(pause_ms: int, min_silence_ms: int) -> None:
    cfg = SegmenterConfig(pause_ms=pause_ms, min_silence_ms=min_silence_ms)
    assert cfg.pause_ms == pause_ms


def test_a_click_gives_neither_final_nor_partial() -> None:
    seg = SpeechSegmenter(config())
    events = feed(seg, np.concatenate([voiced(0.08), silence(1.0)]))  # shorter than min_segment
    assert not of(events, Final) and not of(events, Partial)


def test_a_click_gives_no_pause() -> None:
    seg = SpeechSegmenter(config())
    events = feed(seg, np.concatenate([voiced(0.08), silence(1.0)]))
    assert not of(events, Pause)
