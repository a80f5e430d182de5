"""One record per utterance of a call, from ``say()`` until it has finished playing, and the
cancels still waiting for the worker's acknowledgement.

Sans-I/O: times are passed in (``time.monotonic()`` seconds in the gateway)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# Cancels whose end the worker never acknowledges (it had already finished, or died) are
# forgotten oldest first beyond this many, so a long call keeps bounded state.
MAX_PENDING_CANCELS = 64


@dataclass(slots=True)
class Utterance:
    id: str
    text: str
    said_at: float  # when say() was called
    dtmf_interrupts: bool = True  # a key press fades it out
    barge_in: bool = True  # caller speech fades it out
    heard: bool = False  # its first audio frame has been played


class Utterances:
    """The call's live utterances by id, and its pending cancels."""

    def __init__(self) -> None:
        self._live: dict[str, Utterance] = {}
        self._cancelled: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def add(self, u: Utterance) -> None:
        self._live[u.id] = u

    def get(self, utterance_id: str | None) -> Utterance | None:
        return self._live.get(utterance_id) if utterance_id is not None else None

    def first_audio(self, utterance_id: str) -> Utterance | None:
        """Its first frame is being played: the record the first time, None after that (or for
        an utterance not said through this call)."""
        u = self._live.get(utterance_id)
        if u is None or u.heard:
            return None
        u.heard = True
        return u

    def finish(self, utterance_id: str) -> Utterance | None:
        """It has finished playing (done, interrupted, cancelled or failed): forget it."""
        return self._live.pop(utterance_id, None)

    def cancelled(self, utterance_id: str, now: float) -> None:
        """A cancel was sent to the worker at ``now``."""
        self._cancelled[utterance_id] = now
        self._cancelled.move_to_end(utterance_id)
        while len(self._cancelled) > MAX_PENDING_CANCELS:
            self._cancelled.popitem(last=False)

    def worker_ended(self, utterance_id: str) -> float | None:
        """The worker's end of an utterance arrived: when its cancel was sent, if one was."""
        return self._cancelled.pop(utterance_id, None)

    @property
    def pending_cancels(self) -> int:
        return len(self._cancelled)
