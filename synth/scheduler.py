"""A small priority thread pool for engine steps.

Engines are synchronous and release the GIL inside onnxruntime/torch, so the worker runs their
steps on threads. A plain FIFO executor would make a new call's first chunk wait behind the queued
later chunks of every other utterance; here each step carries a priority (lower runs first) so
first chunks jump the queue, which is what keeps time-to-first-audio flat under concurrency.
Within one priority, steps run in submission order, so active utterances take turns chunk by chunk
and a long utterance never blocks another.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()


class PriorityExecutor:
    def __init__(self, threads: int, name: str = "synth") -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._counter = itertools.count()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        self._closed = False
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is _STOP:
                return
            fn, fut, loop = item
            if fut.cancelled():
                continue
            try:
                result = fn()
            except BaseException as exc:
                _post(loop, _set_exception, fut, exc)
            else:
                _post(loop, _set_result, fut, result)

    def submit(self, priority: int, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` on a pool thread; the returned future resolves on the calling loop."""
        if self._closed:
            raise RuntimeError("executor is shut down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((priority, next(self._counter), (fn, fut, loop)))
        return fut

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> bool:
        """No more submissions; the pool threads end once the queue is drained (steps whose
        future was cancelled are skipped).  ``wait``: join them, for at most ``timeout``
        seconds in all; True when every thread has ended."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                # Highest possible priority value so queued work drains first.
                self._queue.put((1 << 62, next(self._counter), _STOP))
        if not wait:
            return not any(t.is_alive() for t in self._threads)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        return not any(t.is_alive() for t in self._threads)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    # A step that finishes after its loop closed (a worker stopped mid-utterance) has no one
    # left to tell; raising here would only kill the pool thread and lose the steps behind it.
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
