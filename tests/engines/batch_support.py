"""What the batched-engine tests (onnx and torch) share: calls run on threads of their own, a
poison text patched into an engine's sentence splitter, and the scheduler's thread parked so
that queued calls form the next batches together."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from synth.engines.batching import BatchScheduler
from synth.engines.voice import Sentence

# An id past the vocabulary: the text embedding raises, inside whichever batch holds it.
POISON_SENTENCE = Sentence(("x",), (1, 0, 10**6, 0, 2))


class _SplitsSentences(Protocol):
    def _sentences(self, text: str) -> list[Sentence]: ...


def run_threads(fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each function on a thread of its own, at once; its result or the exception it raised."""
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def patch_poison(engine: _SplitsSentences, poison: str) -> None:
    """``poison`` becomes one sentence whose model call fails; every other text is unchanged."""
    original = engine._sentences

    def sentences(text: str) -> list[Sentence]:
        return [POISON_SENTENCE] if text == poison else original(text)

    engine._sentences = sentences  # type: ignore[method-assign]


def hold_scheduler(
    on_scheduler: Callable[[Callable[[], Any]], Any], scheduler: BatchScheduler
) -> tuple[threading.Event, threading.Thread]:
    """Park the scheduler's thread until the event is set: calls queue up meanwhile and form
    the next batches together."""
    release = threading.Event()
    holder = threading.Thread(target=on_scheduler, args=(release.wait,))
    holder.start()
    while scheduler.waiting:  # the hold has been taken off the queue and is running
        time.sleep(0.001)
    time.sleep(0.02)
    return release, holder
