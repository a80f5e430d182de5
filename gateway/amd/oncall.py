"""Answering-machine detection on a live call: the thin asyncio side of :class:`AmdDetector`.

:meth:`AmdOnCall.start` takes a tap of the caller's audio (``Call.caller_audio``, 20 ms int16
frames at 8 kHz) and feeds it to the detector on its own task; every event it gives is put on
the call as an :class:`AmdResult` (``/api/events`` and the call's history) and handed to
``on_event``. Call :meth:`start` synchronously from the call's "answered" state change (a call
listener): the tap then exists before the first frame after the answer, so the detector's media
times (``at_ms``) count from the answer. When the detector is done (decided and, for a machine,
found the beep, or waited out ``tone_timeout_ms``), the feed stops and ``on_done`` is called.

Speech-to-text (the jambonz word rule, ``AmdDetector.transcript``) is fed only when a
recogniser is given (``stt``: the gateway's loaded one, ``AgentRegistry.stt``, present when
``[agent] kind`` is ``llm``, a flow file listens for speech, or an llm call has loaded it; none
is loaded for AMD alone). Then the same frames also go to :class:`gateway.amd.speech.AmdEars`
(16 kHz, webrtcvad segments, partials while the caller speaks), and each utterance is
recognised in the shared STT pool, one job at a time for the call; its transcript reaches the
detector at the media time the result came back (frames fed so far), between two frames of the
same task, so the word rule and the heuristic see one clock. The hearing stops for good at the
detector's first decision (words no longer change it): queued utterances are dropped and no job
is started after it; one still running finishes in its thread and is ignored. Without a
recogniser nothing of this runs. The words matter where app_amd's fixed ``silence_threshold``
mishears a quiet line (a greeting at -40 to -43 dBFS is scattered clicks to it: NOTSURE, or a
wrong HUMAN); there ``voxgate bench amd --words`` has machines right 23/24 instead of 20/24 at
-40 dBFS, 17/24 instead of 10/24 at -43 dBFS. At a normal level the heuristic decides first
(same 46/48 either way), and the words cost 41 recognitions for 48 greetings (4.1 s of CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from gateway.amd.detector import AmdBeep, AmdConfig, AmdDetector, AmdEvent, AmdHuman, AmdMachine
from gateway.amd.speech import AmdEars, Int16Array, Utterance
from gateway.call.control import AmdResult, Event
from gateway.media.tap import CallerAudioTap
from gateway.stt.base import SpeechToText, Transcript
from gateway.stt.stream import stt_pool

log = logging.getLogger("voxgate.amd")

# The tap holds this many frames (5 s) for a detector task that falls behind: frames dropped
# would shift every later media time, so it is generous (a frame is 320 bytes).
TAP_FRAMES = 250


class AmdCall(Protocol):
    """What AMD needs of a call (``gateway.call.calls.Call``)."""

    @property
    def id(self) -> str: ...

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap: ...

    def emit(self, event: Event) -> None: ...


def amd_result(
    call_id: str, event: AmdEvent, *, campaign: str | None = None, contact: int | None = None
) -> AmdResult:
    """The call event for a detector event (``type`` is its ``amd.*`` name)."""
    cause = event.cause if isinstance(event, AmdHuman | AmdMachine) else ""
    freq = event.frequency_hz if isinstance(event, AmdBeep) else None
    return AmdResult(
        call_id, type=event.name, at_ms=event.at_ms, cause=cause, frequency_hz=freq,
        campaign=campaign, contact=contact,
    )  # fmt: skip


class AmdOnCall:
    """One call's detector fed from its caller audio (see the module docstring)."""

    def __init__(
        self,
        call: AmdCall,
        config: AmdConfig | None = None,
        *,
        on_event: Callable[[AmdEvent], None],
        on_done: Callable[[], None] | None = None,
        campaign: str | None = None,
        contact: int | None = None,
        stt: SpeechToText | None = None,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.call = call
        self.detector = AmdDetector(config)
        self.on_event = on_event
        self.on_done = on_done
        self.campaign = campaign
        self.contact = contact
        self.tap: CallerAudioTap | None = None
        self._task: asyncio.Task[None] | None = None
        self.stt = stt
        self._pool = pool
        # The word rule's ears: only with a recogniser.
        self.ears: AmdEars | None = AmdEars() if stt is not None else None
        self._job: asyncio.Future[Transcript] | None = None
        self._utterance: Utterance | None = None
        self.stt_errors = 0

    def start(self) -> None:
        """Tap the caller's audio now and start feeding the detector (synchronous: call it
        from the answer's state change)."""
        if self.tap is not None:
            return
        self.tap = self.call.caller_audio(8000, max_frames=TAP_FRAMES)
        self._task = asyncio.get_running_loop().create_task(
            self._run(self.tap), name=f"amd-{self.call.id}"
        )

    async def _run(self, tap: CallerAudioTap) -> None:
        try:
            async for frame in tap:
                self._emit(self.detector.process(frame))
                if self.ears is not None:
                    self._hear(frame)
                if self.detector.done:
                    break
            if tap.dropped:
                log.warning("call %s: AMD fell behind and lost %d frames", self.call.id,
                            tap.dropped)  # fmt: skip
        finally:
            tap.close()
            self._stop_hearing()
            if self.on_done is not None:
                self.on_done()

    def _emit(self, events: list[AmdEvent]) -> None:
        for event in events:
            self.call.emit(
                amd_result(self.call.id, event, campaign=self.campaign, contact=self.contact)
            )
            self.on_event(event)

    # --- the word rule (only with a recogniser) --------------------------------------------
    def _hear(self, frame: Int16Array) -> None:
        ears = self.ears
        assert ears is not None
        if self._job is not None and self._job.done():
            self._heard(self._job)
        if self.detector.decision is not None:
            self._stop_hearing()  # words change nothing after the first decision
            return
        if ears.closed:
            return
        u = ears.feed(frame)
        if u is not None:
            self._submit(u)

    def _submit(self, u: Utterance) -> None:
        assert self.stt is not None
        loop = asyncio.get_running_loop()
        self._utterance = u
        self._job = loop.run_in_executor(self._pool or stt_pool(), self.stt.transcribe, u.audio)

    def _heard(self, job: asyncio.Future[Transcript]) -> None:
        """A recognition ended: its words to the detector at the media time now."""
        u, self._job, self._utterance = self._utterance, None, None
        assert u is not None and self.ears is not None
        try:
            text = job.result().text
        except Exception:
            # A failing recogniser costs the word rule this utterance, not the call's AMD.
            log.exception("call %s: speech-to-text failed for AMD", self.call.id)
            self.stt_errors += 1
            text = ""
        if text:
            self._emit(self.detector.transcript(text, self.detector.elapsed_ms, u.final))
        if self.detector.decision is None:
            nxt = self.ears.done()
            if nxt is not None:
                self._submit(nxt)

    def _stop_hearing(self) -> None:
        if self.ears is not None and not self.ears.closed:
            self.ears.close()
        if self._job is not None:
            # A job already in its thread runs to its end; its result is not wanted.
            self._job.cancel()
            self._job = None

    async def stop(self) -> None:
        """Stop listening (the call ended, or the dialler has what it needs)."""
        if self.tap is not None:
            self.tap.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._stop_hearing()
