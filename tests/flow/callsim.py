"""A ``FakeCall`` that plays like a call, for the flow's tests: utterances queue and play one at a
time (the test says when the one playing ends), a key cuts the one playing when it allows it
and is then delivered (as ``Call.on_dtmf`` does), ``interrupt`` stops it and drops the queue,
a hang-up ends the call; every event reaches the agent in order on one task, as the call's
agent task delivers them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.agents.base import Agent
from gateway.call.control import (
    CallStateChanged,
    DtmfReceived,
    Event,
    SpeechStarted,
    UtteranceFinished,
)
from tests.agents.fakes import FakeCall


class SimCall(FakeCall):
    def __init__(self, agent: Agent, call_id: str = "call-1") -> None:
        super().__init__(call_id)
        self.agent = agent
        self.queue: list[str] = []  # queued utterances; the first is playing
        self.keys_cut: dict[str, bool] = {}
        self.outcomes: dict[str, str] = {}
        self._inbox: asyncio.Queue[Event | None] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.agent.on_start(self)
        self._pump = asyncio.get_running_loop().create_task(self._deliver())
        await self.settle()

    async def _deliver(self) -> None:
        try:
            while (ev := await self._inbox.get()) is not None:
                await self.agent.on_event(self, ev)
        finally:
            await self.agent.on_end(self)

    def tell(self, event: Event | None) -> None:
        self._inbox.put_nowait(event)

    async def settle(self) -> None:
        """Until the agent has taken in every event and its own task has nothing to do now."""
        for _ in range(5):
            while not self._inbox.empty():
                await asyncio.sleep(0)
            for _ in range(20):
                await asyncio.sleep(0)

    # --- the call's side ------------------------------------------------------------------
    async def say(
        self, text: str, *, interrupt: bool = False, dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:  # fmt: skip
        utt = await super().say(
            text, interrupt=interrupt, dtmf_interrupts=dtmf_interrupts, barge_in=barge_in
        )
        self.queue.append(utt)
        self.keys_cut[utt] = dtmf_interrupts
        return utt

    def interrupt(self, *, clear_queue: bool = True) -> None:
        super().interrupt(clear_queue=clear_queue)
        if self.queue:
            self._end(self.queue[0], "interrupted")
        if clear_queue:
            for utt in list(self.queue):
                self._end(utt, "cancelled")

    async def hangup(self, reason: str = "agent") -> None:
        await super().hangup(reason)
        self.end_call(reason)

    def end_call(self, reason: str = "remote") -> None:
        if self.ended:
            return
        for utt in list(self.queue):
            self._end(utt, "interrupted" if utt == self.queue[0] else "cancelled")
        self.close()
        self.tell(CallStateChanged(self.id, state="ended", reason=reason))
        self.tell(None)

    def _end(self, utt: str, outcome: str) -> None:
        self.queue.remove(utt)
        self.outcomes[utt] = outcome
        text = self.said.get(utt, "")
        self.tell(UtteranceFinished(
            self.id, utterance_id=utt, outcome=outcome, text=text,
            heard=text if outcome == "done" else "",
        ))  # fmt: skip

    # --- the test's hands ---------------------------------------------------------------
    @property
    def playing(self) -> str | None:
        return self.queue[0] if self.queue else None

    async def finish(self) -> str:
        """The utterance playing plays to its end; its text."""
        assert self.queue, "nothing is playing"
        utt = self.queue[0]
        self._end(utt, "done")
        await self.settle()
        return self.said[utt]

    async def finish_all(self) -> None:
        while self.queue:
            await self.finish()

    async def key(self, digit: str) -> None:
        if self.queue and self.keys_cut[self.queue[0]]:
            super().interrupt(clear_queue=False)
            self._end(self.queue[0], "interrupted")
        self.tell(DtmfReceived(self.id, digit=digit))
        await self.settle()

    async def keys(self, digits: str) -> None:
        for d in digits:
            await self.key(d)

    def speech_started(self) -> None:
        self.tell(SpeechStarted(self.id))

    async def close_call(self) -> None:
        self.end_call("remote")
        if self._pump is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._pump, 10)


class AudioSimCall(SimCall):
    """A SimCall that also plays raw audio (``play_audio``), as ``Call`` does."""

    def __init__(self, agent: Agent, call_id: str = "call-1") -> None:
        super().__init__(agent, call_id)
        self.played: list[tuple[str, int, int]] = []  # (utterance id, samples, rate)

    def play_audio(
        self, utterance_id: str, pcm: npt.NDArray[np.int16], *, rate: int = 8000,
        barge_in: bool = False, dtmf_interrupts: bool = False, max_queued_s: float = 60.0,
    ) -> int:  # fmt: skip
        if utterance_id not in self.keys_cut:
            self.queue.append(utterance_id)
            self.keys_cut[utterance_id] = dtmf_interrupts
            self.said[utterance_id] = f"<audio {utterance_id}>"
        self.played.append((utterance_id, len(pcm), rate))
        return 0

    def end_audio(self, utterance_id: str) -> None:
        pass


def texts_of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]
