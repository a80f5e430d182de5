"""Answering-machine detection on a live call: the thin asyncio side of :class:`AmdDetector`.

:meth:`AmdOnCall.start` takes a tap of the caller's audio (``Call.caller_audio``, 20 ms int16
frames at 8 kHz) and feeds it to the detector on its own task; every event it gives is put on
the call as an :class:`AmdResult` (``/api/events`` and the call's history) and handed to
``on_event``. Call :meth:`start` synchronously from the call's "answered" state change (a call
listener): the tap then exists before the first frame after the answer, so the detector's media
times (``at_ms``) count from the answer. When the detector is done (decided and, for a machine,
found the beep, or waited out ``tone_timeout_ms``), the feed stops and ``on_done`` is called.

Speech-to-text is not fed here (``AmdDetector.transcript``, the jambonz word rule): the
heuristic and the beep alone score 95.8 % on ``voxgate bench amd`` and decide a person in about
1.7 s, before a transcript of the first words would be ready; running the recogniser on every
dialled call's first seconds would add its CPU to each call of a campaign.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gateway.amd.detector import AmdBeep, AmdConfig, AmdDetector, AmdEvent, AmdHuman, AmdMachine
from gateway.call.control import AmdResult, Event
from gateway.media.tap import CallerAudioTap

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
    ) -> None:
        self.call = call
        self.detector = AmdDetector(config)
        self.on_event = on_event
        self.on_done = on_done
        self.campaign = campaign
        self.contact = contact
        self.tap: CallerAudioTap | None = None
        self._task: asyncio.Task[None] | None = None

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
                for event in self.detector.process(frame):
                    self.call.emit(
                        amd_result(
                            self.call.id, event, campaign=self.campaign, contact=self.contact
                        )
                    )
                    self.on_event(event)
                if self.detector.done:
                    break
            if tap.dropped:
                log.warning("call %s: AMD fell behind and lost %d frames", self.call.id,
                            tap.dropped)  # fmt: skip
        finally:
            tap.close()
            if self.on_done is not None:
                self.on_done()

    async def stop(self) -> None:
        """Stop listening (the call ended, or the dialler has what it needs)."""
        if self.tap is not None:
            self.tap.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
