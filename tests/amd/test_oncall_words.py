"""The word rule on a live call (``AmdOnCall`` with a recogniser): transcripts reach the detector
at the media time their result came back, decide where the heuristic is unsure, and recognition
stops at the first decision.

The caller audio is a quiet voicemail greeting (espeak-ng, -45/-43 dBFS active level): app_amd's
fixed silence threshold hears it as scattered clicks, never a word, so the heuristic alone is
NOTSURE at ``total_analysis_time``; webrtcvad and the recogniser hear it fine.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dsp.g711 import ulaw_decode, ulaw_encode
from dsp.pcm import float_to_s16
from gateway.amd.detector import AmdEvent, AmdMachine, Phase
from gateway.amd.offline import classify
from gateway.amd.oncall import AmdOnCall
from gateway.call.control import AmdResult, Event
from gateway.media.tap import CallerAudioTap
from gateway.stt.base import STT_RATE, FloatArray, SpeechToText, Transcript
from tests.amd.signals import Int16Array, frames
from voxgate.bench import amd as bench

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (deploy/ensure-test-tools.sh installs it)",
)

GREETING = "The person you are calling is not available. At the tone, please record your message."


def quiet_greeting(dbfs: float) -> Int16Array:
    """0.4 s, the greeting at ``dbfs``, 3 s; a -55 dBFS noise floor; μ-law round trip."""
    speech = bench.phone_speech(*bench.Voices(False).speak(GREETING, "en-us"), dbfs)
    x = np.concatenate((bench.silence(400), speech, bench.silence(3000)))
    x = x + np.random.default_rng(11).normal(0.0, 10 ** (-55 / 20), len(x))
    out: Int16Array = ulaw_decode(ulaw_encode(float_to_s16(x)))
    return out


class FakeCall:
    """What AmdOnCall needs of a call; the test pushes the caller's frames into its tap."""

    id = "c1"

    def __init__(self) -> None:
        self.tap: CallerAudioTap | None = None
        self.events: list[Event] = []

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        self.tap = CallerAudioTap(8000, rate, max_frames=max_frames)
        return self.tap

    def emit(self, event: Event) -> None:
        self.events.append(event)


class HeldStt:
    """A recogniser whose every job waits until the test releases it with the text to return."""

    name = "held"

    def __init__(self) -> None:
        self.started = 0
        self._release = threading.Event()
        self._text = ""

    def transcribe(self, audio: FloatArray) -> Transcript:
        self.started += 1
        assert audio.dtype == np.float32 and audio.size > 0
        if not self._release.wait(30):
            raise TimeoutError("the test never released the job")
        self._release.clear()
        return Transcript(self._text, audio.size / STT_RATE, 0.01)

    def release(self, text: str) -> None:
        self._text = text
        self._release.set()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    p = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amd-test-stt")
    yield p
    p.shutdown(wait=True, cancel_futures=True)


async def until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.002)


async def fed(oc: AmdOnCall, ms: int) -> None:
    """Until the detector has had ``ms`` of audio (and the hearing its frames too)."""
    await until(lambda: oc.detector.elapsed_ms >= ms)


async def test_fake_transcripts_arrive_at_their_media_time_and_decide_a_notsure_greeting(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcm = quiet_greeting(-45.0)
    assert classify(pcm).result != "machine"  # the heuristic alone does not call it
    call = FakeCall()
    stt = HeldStt()
    got: list[AmdEvent] = []
    oc = AmdOnCall(call, on_event=got.append, stt=stt, pool=pool)
    seen: list[tuple[str, int, bool]] = []
    real = oc.detector.transcript

    def spy(text: str, at_ms: int, final: bool = True) -> list[AmdEvent]:
        seen.append((text, at_ms, final))
        return real(text, at_ms, final)

    monkeypatch.setattr(oc.detector, "transcript", spy)
    oc.start()
    assert call.tap is not None
    expected: list[tuple[str, int, bool]] = []
    submitted_at: int | None = None
    unsure_seen = False
    pushed = 0
    for frame in frames(pcm):
        call.tap.push(frame, agent_audible=False)
        pushed += 20
        await fed(oc, pushed)
        unsure_seen = unsure_seen or oc.detector.phase is Phase.UNSURE
        if expected and len(seen) < len(expected):
            # The frame after a released job: its words reached the detector with this frame.
            await until(lambda: len(seen) == len(expected))
        job, u = oc._job, oc._utterance
        if job is None or u is None:
            submitted_at = None
            continue
        submitted_at = oc.detector.elapsed_ms if submitted_at is None else submitted_at
        if oc.detector.elapsed_ms - submitted_at < 200:
            continue  # the job "runs" for 200 ms of media time
        # Words only once the heuristic is unsure: "um" partials before (no decision either
        # way), a voicemail phrase after; a final before then says nothing (a short final
        # would be a person to the word rule).
        if oc.detector.phase is Phase.UNSURE:
            text = "please leave a message after the tone"
        else:
            text = "" if u.final else "um"
        stt.release(text)
        await until(job.done)
        submitted_at = None
        if text:
            expected.append((text, pushed + 20, u.final))  # applied with the next frame
        if oc.detector.decision is not None:
            break
    await until(lambda: len(seen) == len(expected) or oc.detector.decision is not None)
    assert unsure_seen
    assert seen == expected and len(seen) >= 2  # partials "um", then the phrase
    decision = oc.detector.decision
    assert isinstance(decision, AmdMachine) and decision.cause == "HINT"
    assert decision.at_ms == expected[-1][1] > 5000  # after NOTSURE at total_analysis_time
    assert [e for e in got if isinstance(e, AmdMachine)] == [decision]
    results = [e for e in call.events if isinstance(e, AmdResult)]
    assert (results[0].type, results[0].cause, results[0].at_ms) == (
        "amd.machine", "HINT", decision.at_ms
    )  # fmt: skip
    # Decided: the hearing is over, whatever audio comes (the detector still waits for a beep).
    assert oc.ears is not None and oc.ears.closed
    jobs = stt.started
    for frame in frames(pcm)[:100]:
        call.tap.push(frame, agent_audible=False)
    pushed += 2000
    await fed(oc, pushed)
    assert stt.started == jobs and oc._job is None
    await oc.stop()


async def test_without_a_recogniser_nothing_is_heard(pool: ThreadPoolExecutor) -> None:
    call = FakeCall()
    oc = AmdOnCall(call, on_event=lambda e: None)
    assert oc.ears is None
    oc.start()
    assert call.tap is not None
    for frame in frames(quiet_greeting(-45.0))[:60]:
        call.tap.push(frame, agent_audible=False)
    await until(lambda: oc.detector.elapsed_ms >= 1200)
    assert oc._job is None
    await oc.stop()


@pytest.fixture(scope="module")
def whisper() -> SpeechToText:
    from gateway.stt.whisper import SttUnavailable, WhisperStt

    try:
        return WhisperStt()
    except (SttUnavailable, ImportError) as exc:
        pytest.skip(f"the speech-to-text model is not installed: {exc}")


class CountingStt:
    def __init__(self, inner: SpeechToText) -> None:
        self.inner = inner
        self.name = inner.name
        self.started = 0

    def transcribe(self, audio: FloatArray) -> Transcript:
        self.started += 1
        return self.inner.transcribe(audio)


async def test_real_recogniser_calls_a_quiet_voicemail_greeting_a_machine(
    whisper: SpeechToText, pool: ThreadPoolExecutor
) -> None:
    pcm = quiet_greeting(-43.0)
    alone = classify(pcm)
    # The heuristic alone: NOTSURE at 5 s, then nothing (no beep) until the recording ends.
    assert alone.result in ("undecided", "decision_timeout", "human", "no_speech"), alone
    call = FakeCall()
    stt = CountingStt(whisper)
    got: list[AmdEvent] = []
    oc = AmdOnCall(call, on_event=got.append, stt=stt, pool=pool)
    oc.start()
    assert call.tap is not None
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    ears = oc.ears
    assert ears is not None
    jobs_at_decision: int | None = None
    for i, frame in enumerate(frames(pcm)):
        # In real time (the recogniser's latency is wall-clock), without drift.
        await asyncio.sleep(max(0.0, t0 + i * 0.02 - loop.time()))
        call.tap.push(frame, agent_audible=False)
        if jobs_at_decision is None and oc.detector.decision is not None:
            jobs_at_decision = ears.submitted
    await until(lambda: oc.detector.elapsed_ms >= len(pcm) // 160 * 20, timeout=30)
    decision = oc.detector.decision
    assert isinstance(decision, AmdMachine), got
    assert decision.cause in ("WORDCOUNT", "HINT")
    assert decision.at_ms < 5000  # before the heuristic would even have said NOTSURE
    # None started after it (the loop side counts them; the recogniser saw no more).
    assert jobs_at_decision is not None and ears.submitted == jobs_at_decision
    assert ears.closed and stt.started <= jobs_at_decision
    await oc.stop()
    # Offline, as ``voxgate bench amd --words`` runs it: the same verdict.
    offline = classify(pcm, stt=whisper)
    assert (offline.result, offline.cause) == ("machine", decision.cause)
    assert offline.recognitions >= 1
