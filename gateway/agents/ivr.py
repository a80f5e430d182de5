"""The embedded agent: an IVR from the config file (greeting, DTMF menu, prompts, hang-up)."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.agents.base import CallHandle
from gateway.call.control import CallStateChanged, DtmfReceived, Event, UtteranceFinished
from voxgate.contract.config import IvrConfig


class IvrAgent:
    def __init__(self, config: IvrConfig) -> None:
        self.config = config
        self._hangup_after: str | None = None  # utterance id whose end hangs up
        self._last_prompt: str | None = None
        self._idle: asyncio.Task[None] | None = None
        self._ended = False

    async def on_start(self, call: CallHandle) -> None:
        await self._prompt(call, self.config.greeting)

    async def on_event(self, call: CallHandle, event: Event) -> None:
        if self._ended:
            return
        if isinstance(event, DtmfReceived):
            await self._on_digit(call, event.digit)
        elif isinstance(event, UtteranceFinished):
            if event.utterance_id == self._hangup_after and event.outcome != "interrupted":
                self._ended = True
                await call.hangup("ivr")
            elif event.utterance_id == self._last_prompt:
                self._arm_idle(call)
        elif isinstance(event, CallStateChanged) and event.state == "ended":
            self._stop_idle()

    async def on_end(self, call: CallHandle) -> None:
        self._ended = True
        self._stop_idle()

    async def _on_digit(self, call: CallHandle, digit: str) -> None:
        self._stop_idle()
        cfg = self.config
        interrupt = cfg.dtmf_interrupts
        if digit == cfg.repeat_digit:
            await self._prompt(call, cfg.greeting, interrupt=interrupt)
        elif digit in cfg.menu:
            utt = await self._prompt(call, cfg.menu[digit], interrupt=interrupt)
            if digit in cfg.hangup_digits:
                self._hangup_after = utt
        else:
            await self._prompt(call, cfg.invalid, interrupt=interrupt)

    async def _prompt(self, call: CallHandle, text: str, *, interrupt: bool = False) -> str:
        utt = await call.say(text, interrupt=interrupt, dtmf_interrupts=self.config.dtmf_interrupts)
        self._last_prompt = utt
        return utt

    def _arm_idle(self, call: CallHandle) -> None:
        self._stop_idle()
        if self.config.idle_timeout_s > 0 and self._hangup_after is None:
            self._idle = asyncio.create_task(self._idle_timeout(call))

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    async def _idle_timeout(self, call: CallHandle) -> None:
        await asyncio.sleep(self.config.idle_timeout_s)
        self._idle = None
        with contextlib.suppress(Exception):
            self._hangup_after = await call.say(self.config.goodbye)
