"""Stand-ins for the agents' tests: a ``CallHandle`` that records what the agent does (its
streamed say cut by the real chunker, as ``Call.say_stream`` does) and lets a test play the
caller's voice into its tap and the playout's ends back to the agent; recognisers that answer
at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from gateway.call.control import (
    BadRequest,
    CallInfo,
    Conflict,
    Event,
    TextTooLong,
    TransferOutcome,
)
from gateway.media.tap import CallerAudioTap
from gateway.stt.base import FloatArray, Transcript
from gateway.stt.segmenter import RATE
from voxgate.contract.chunker import Chunker
from voxgate.contract.dtmf import DTMF_KEYS


class FakeCall:
    """A ``CallHandle``: ``said`` maps each utterance id to its text, in the order queued."""

    def __init__(self, call_id: str = "call-1", *, max_text_chars: int = 5000) -> None:
        self.id = call_id
        self.max_text_chars = max_text_chars
        self.speaking = False
        self.ended = False
        self.said: dict[str, str] = {}
        self.events: list[Event] = []
        self.hangups: list[str] = []
        self.dtmf: list[str] = []
        self.interrupts = 0
        self.taps: list[CallerAudioTap] = []
        # When set, send_dtmf waits for it (a slow far end).
        self.dtmf_gate: asyncio.Event | None = None
        self.dtmf_started = asyncio.Event()
        self.recordings: list[str] = []
        self.recording = False
        self.transfers: list[tuple[str, str, str | None]] = []
        self.transfer_outcome = TransferOutcome("completed", 202, "accepted")

    @property
    def info(self) -> CallInfo:
        return CallInfo(
            self.id, "sip", "inbound", "ended" if self.ended else "answered",
            "sip:caller@example.com", "sip:agent@127.0.0.1", 1000.0, 1001.0,
            speaking=self.speaking,
        )  # fmt: skip

    @property
    def texts(self) -> list[str]:
        return list(self.said.values())

    @property
    def ids(self) -> list[str]:
        return list(self.said)

    async def say(
        self,
        text: str,
        *,
        interrupt: bool = False,
        dtmf_interrupts: bool = True,
        barge_in: bool = True,
    ) -> str:
        if self.ended:
            raise Conflict(f"call {self.id} has ended")
        if len(text) > self.max_text_chars:
            raise TextTooLong(f"text is {len(text)} characters; the limit is {self.max_text_chars}")
        if interrupt:
            self.interrupt()
        utt = f"u{len(self.said) + 1}"
        self.said[utt] = text
        return utt

    async def say_stream(
        self, chunks: AsyncIterator[str], *, utterances: list[str] | None = None
    ) -> str:
        # As gateway.call.calls.Call.say_stream.
        chunker = Chunker()
        first: str | None = None
        total = 0
        async for piece in chunks:
            total += len(piece)
            if total > self.max_text_chars:
                raise TextTooLong(f"streamed text passed the limit of {self.max_text_chars}")
            for text in chunker.feed(piece):
                utt = await self.say(text)
                first = first or utt
                if utterances is not None:
                    utterances.append(utt)
        for text in chunker.flush():
            utt = await self.say(text)
            first = first or utt
            if utterances is not None:
                utterances.append(utt)
        if first is None:
            raise BadRequest("streamed text had nothing to speak")
        return first

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def interrupt(self, *, clear_queue: bool = True) -> None:
        self.interrupts += 1

    async def send_dtmf(self, digits: str) -> None:
        bad = sorted(set(digits) - set(DTMF_KEYS))
        if not digits or bad:
            raise BadRequest(f"digits must be 0-9 * # A-D; got {digits!r}")
        self.dtmf_started.set()
        if self.dtmf_gate is not None:
            await self.dtmf_gate.wait()
        self.dtmf.append(digits)

    def caller_audio(
        self, rate: int = 8000, *, echo_gate: bool = False, max_frames: int = 50
    ) -> CallerAudioTap:
        tap = CallerAudioTap(16000, rate, echo_gate=echo_gate, max_frames=max_frames)
        self.taps.append(tap)
        return tap

    async def hangup(self, reason: str = "agent") -> None:
        self.hangups.append(reason)

    def start_recording(self, channels: str = "both") -> str:
        """Records the request (``recordings``: the channels asked for, in order)."""
        self.recordings.append(channels)
        self.recording = True
        return f"r{len(self.recordings)}"

    def stop_recording(self) -> None:
        self.recording = False

    async def transfer(
        self,
        target: str,
        *,
        mode: str = "blind",
        fallback: str | None = None,
        timeout_s: float | None = None,
    ) -> TransferOutcome:
        """Records the request; answers ``transfer_outcome`` (a test sets what it needs)."""
        self.transfers.append((target, mode, fallback))
        return self.transfer_outcome

    def close(self) -> None:
        """The call ended: the taps end."""
        self.ended = True
        for tap in self.taps:
            tap.close()


class FakeStt:
    """Answers at once with ``text`` (set it before the caller speaks)."""

    name = "fake"

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.calls = 0

    def transcribe(self, audio: FloatArray) -> Transcript:
        self.calls += 1
        return Transcript(self.text, np.asarray(audio).size / RATE, 0.0)
