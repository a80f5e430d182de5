"""``voxgate bench agent``: the trial analysis on hand-made events (fast), and a real smoke run
(slow): a ``voxgate serve`` llm gateway, the mock LLM and spoken questions over SIP/RTP."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from voxgate.bench.agent import (
    PARTS,
    QUESTIONS,
    CallerVoice,
    analyse,
    last_speech_sample,
    run_agent_bench,
    script,
    within_goal,
)


def test_last_speech_sample_trims_trailing_silence() -> None:
    tone = (3000 * np.sin(np.arange(800) * 0.3)).astype(np.int16)
    pcm = np.concatenate((np.zeros(400, np.int16), tone, np.zeros(1600, np.int16)))
    last = last_speech_sample(pcm)
    assert 400 + 780 <= last < 1200
    assert abs(int(pcm[last])) >= 184  # −45 dBFS


class _Codec:
    def encode(self, pcm: np.ndarray[Any, Any]) -> bytes:
        return bytes(np.asarray(pcm, np.int16).tobytes())


class _Media:
    codec = _Codec()


async def test_caller_voice_notes_the_packet_with_the_last_speech_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(range(100, 200))
    monkeypatch.setattr("voxgate.bench.agent.time.time", lambda: float(next(clock)))
    voice = CallerVoice(_Media())
    pcm = np.ones(500, np.int16)
    done = voice.say(pcm, 330)  # frame 2 (samples 320..479) carries it
    frames = [voice.next_frame() for _ in range(5)]
    assert done.done()
    assert done.result() == (100.0, 102.0)  # built as frames 0 and 2
    assert np.frombuffer(frames[3], np.int16).tolist() == [1] * 20 + [0] * 140
    assert frames[4] == bytes(320)  # silence after the question


def test_every_answer_has_a_new_first_clause() -> None:
    replies = [t["reply"] for t in script(300)["turns"]]
    firsts = [r.split(",")[0] for r in replies]
    assert len(set(firsts)) == len(firsts) == 300


def _events(call: str, t_last: float) -> list[dict[str, Any]]:
    decided = t_last + 0.6
    return [
        {"type": "transcript", "call_id": call, "ts": t_last + 0.3, "role": "caller",
         "text": "what time", "final": False},
        {"type": "agent.turn", "call_id": call, "ts": decided + 0.01, "text": "What time on "
         "Saturday?", "reason": "model", "probability": 0.9, "decided_at": decided,
         "stt_ms": 150.0, "eot_ms": 50.0, "first_token_at": decided + 0.005,
         "first_say_at": decided + 0.006, "utterance_id": "u1"},
        {"type": "utterance.started", "call_id": call, "ts": decided + 0.106,
         "utterance_id": "u1"},
        {"type": "agent.turn", "call_id": "other", "ts": decided, "decided_at": decided},
    ]  # fmt: skip


def test_analyse_splits_voice_to_voice_into_parts_that_add_up() -> None:
    t_last = 1000.0
    trial = {
        "gateway_call_id": "c1", "t_first": t_last - 2.0, "t_last": t_last,
        "arrival": t_last + 0.73, "keyword": "saturday", "first_sound": t_last + 0.71,
    }  # fmt: skip
    r = analyse(trial, _events("c1", t_last), math.inf, 200.0)
    assert r["turns"] == 1 and not r["missed"] and not r["misplit"] and r["heard_ok"]
    assert r["v2v_ms"] == pytest.approx(730.0)
    assert r["end_of_turn_ms"] == pytest.approx(600.0)
    assert r["decision_after_silence_ms"] == pytest.approx(400.0)
    assert r["llm_first_token_ms"] == pytest.approx(5.0)
    assert r["first_clause_ms"] == pytest.approx(1.0)
    assert r["tts_first_audio_ms"] == pytest.approx(100.0)
    assert r["to_caller_ms"] == pytest.approx(24.0)
    assert r["send_ms"] == pytest.approx(4.0) and r["voice_lead_in_ms"] == pytest.approx(20.0)
    assert r["partial_done_after_end_ms"] == pytest.approx(300.0)
    assert r["sum_of_parts_ms"] == pytest.approx(r["v2v_ms"])


def test_analyse_counts_a_missed_and_a_mis_split_turn() -> None:
    t_last = 1000.0
    trial = {"gateway_call_id": "c1", "t_first": t_last - 2.0, "t_last": t_last,
             "arrival": None, "keyword": "saturday"}  # fmt: skip
    missed = analyse(trial, [], math.inf, 200.0)
    assert missed["missed"] and math.isnan(missed["v2v_ms"])
    early = {**_events("c1", t_last - 1.0)[1], "utterance_id": "u0"}
    split = analyse(trial, [early, *_events("c1", t_last)], math.inf, 200.0)
    assert split["misplit"] and split["turns"] == 2
    assert split["end_of_turn_ms"] == pytest.approx(600.0)  # the turn after the speech ended
    # A turn after the next question's first packet belongs to that question.
    assert analyse(trial, _events("c1", t_last), t_last + 0.5, 200.0)["missed"]


def test_goal_counts_a_missed_reply_as_late() -> None:
    assert within_goal([300.0] * 19 + [700.0])[0]
    assert not within_goal([300.0] * 19 + [math.nan])[0]
    assert not within_goal([600.0] * 20)[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_three_trials_at_concurrency_one() -> None:
    # Questions the tiny.en recogniser hears reliably (one in an espeak-ng voice).
    questions = [QUESTIONS[0], QUESTIONS[7], QUESTIONS[8]]
    r = run_agent_bench(3, (1,), pipecat=False, questions=questions)
    (level,) = r["levels"]
    assert level["errors"] == [], level["errors"]
    trials = level["per_trial"]
    assert len(trials) == 3
    # tiny.en on 8 kHz phone audio is not word-perfect (CI once heard "Saturday" as "setter
    # day"): each question is heard as a sentence, and at least 2 of the 3 keywords come through.
    # A garbled caller path misses them all; what the recogniser gets right is the bench's
    # heard_ok figure, not this test's subject.
    heard = [t["keyword"] in t["heard_text"].lower() for t in trials]
    assert sum(heard) >= 2, trials
    for t in trials:
        assert t["turns"] >= 1, t
        assert len(t["heard_text"].split()) >= 3, t
        assert math.isfinite(t["v2v_ms"]) and 0 < t["v2v_ms"] < 10000, t
        for part in PARTS:
            assert t[part] is not None and t[part] >= 0, (part, t)
        assert t["sum_of_parts_ms"] == pytest.approx(t["v2v_ms"], abs=5.0), t
    assert level["cpu_per_conversation_pct"]["total"] > 0
    assert r["pipecat"] == {"skipped": "--no-pipecat"}
