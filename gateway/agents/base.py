"""The agent interface: what drives a call once it is up.

An agent sees one call through a ``CallHandle`` and reacts to its events (DTMF, utterance
finished, caller speech started/stopped, state changes). The embedded default is the IVR in
``gateway.agents.ivr``; a pipecat pipeline fits the same shape (events in as frames, ``say`` out as
TTS text), which is how LLM/STT agents plug in later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.call.control import CallInfo, Event


class CallHandle(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def info(self) -> CallInfo: ...

    async def say(
        self,
        text: str,
        *,
        interrupt: bool = False,
        dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:
        """Queue ``text``; returns its utterance id. ``interrupt`` stops what is playing first;
        ``dtmf_interrupts`` / ``barge_in`` let a key press / the caller's voice cut it short."""
        ...

    async def hangup(self, reason: str = "agent") -> None: ...


class Agent(Protocol):
    async def on_start(self, call: CallHandle) -> None:
        """The call is answered and media flows."""

    async def on_event(self, call: CallHandle, event: Event) -> None: ...

    async def on_end(self, call: CallHandle) -> None:
        """The call has ended (either side); release whatever the agent holds."""


AgentFactory = Callable[[CallInfo], Agent]
