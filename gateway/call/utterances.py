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
    # When a worker's last message for it arrived (None: none yet), and whether that was its
    # end (or error): the no-worker watchdog (``Utterances.watchdog``) reads these.
    worker_seen_at: float | None = None
    worker_done: bool = False


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

    def from_worker(self, utterance_id: str, now: float, *, last: bool) -> None:
        """A message of the utterance came from a worker at ``now`` (``last``: its end/error)."""
        u = self._live.get(utterance_id)
        if u is not None:
            u.worker_seen_at = now
            u.worker_done = u.worker_done or last

    def watchdog(self, utterance_id: str, now: float, timeout_s: float) -> float | str | None:
        """The no-worker watchdog of a live utterance at ``now``: None when there is nothing to
        watch (it has finished, or its worker has sent its end), a time to look again (a
        message came less than ``timeout_s`` ago, or it was said less than that ago), or why to
        give it up: nothing came for ``timeout_s``, from the start (no worker took it) or since
        its last chunk (its worker died with the request lost, e.g. in a Redis restart that
        lost the data; without this the call would stay mute behind it)."""
        u = self._live.get(utterance_id)
        if u is None or u.worker_done:
            return None
        if u.worker_seen_at is None:
            if now - u.said_at >= timeout_s:
                return f"no audio from any worker within {timeout_s:g} s"
            return u.said_at + timeout_s
        if now - u.worker_seen_at >= timeout_s:
            return f"no audio from any worker for {timeout_s:g} s after its last chunk"
        return u.worker_seen_at + timeout_s

    def worker_ended(self, utterance_id: str) -> float | None:
        """The worker's end of an utterance arrived: when its cancel was sent, if one was."""
        return self._cancelled.pop(utterance_id, None)

    @property
    def pending_cancels(self) -> int:
        return len(self._cancelled)
