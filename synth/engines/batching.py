"""Continuous batching of engine steps across every stream of one worker (issue 16).

The worker steps each utterance's ``stream()`` generator on a thread of its own. With a batching
engine those threads do not run the model: each one hands its step's model call (an encode of a
sentence, a decoder window) to a :class:`BatchScheduler` and blocks until the result is back.
One scheduler thread runs the model, one batch per step, over whatever is waiting:

* **Continuous.** Streams join and leave between steps; a batch holds the calls waiting now, not
  a fixed group. After a batch the scheduler waits up to ``window_s`` for the streams still busy
  in their own step (the python between two model calls: crossfades, the DSP) so they make the
  next batch, but never for a stream that has no call coming (it left its step): a lone stream
  never waits.
* **Priorities.** A call carries the priority of the step it belongs to (0: an utterance's first
  chunk, which a caller is waiting to hear; 1: later chunks, which have audio queued ahead of
  them). A batch is the best waiting call's kind, filled in priority order, then by when each
  call's step began (a stream's second call of a step keeps its place: the first stream to
  start finishes its step first, which is what first audio wants). A later
  chunk waiting longer than ``promote_after_s`` counts as a first chunk, so a stream of new calls
  cannot starve playing ones into an underrun.
* **Latency budget.** Each kind's batch time is fitted online as ``a + b * units`` (units: the
  padded work, e.g. frames x batch rows); a batch takes calls only while the prediction stays
  within ``budget_s``, so a step never grows past what first audio can afford. The first call is
  always taken.
* **Isolation.** A call whose ``should_stop`` says stop when its batch is formed is dropped from
  it and its stream ends (:class:`StepStopped`); a batch that raises is run again one call at a
  time, so a poison call fails only itself.

Synchronous and backend-agnostic: a runner is two plain functions over a list of payloads.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

PRIORITY_FIRST = 0  # the step that produces an utterance's first audio
PRIORITY_LATER = 1  # every later step


class StepStopped(Exception):
    """The stream asked to stop (its ``should_stop``) while its call waited for a batch."""


@dataclass(frozen=True, slots=True)
class Failed:
    """A runner's result for one call that failed on its own (a runner that runs its calls
    one by one reports each failure so, and its batch-mates keep their results)."""

    error: BaseException


def one_by_one(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """A runner body that runs ``fn`` on each payload in turn, a failure staying its own."""

    def run(payloads: list[Any]) -> list[Any]:
        out: list[Any] = []
        for payload in payloads:
            try:
                out.append(fn(payload))
            except Exception as exc:
                out.append(Failed(exc))
        return out

    return run


@dataclass(frozen=True, slots=True)
class Runner:
    """How to run one kind of call as a batch.

    ``run(payloads)`` returns one result per payload, in order, and must be safe to repeat (a
    batch that raised runs again call by call); ``units(payloads)`` is the work
    of running them together (what the cost model scales with: padded frames x rows, say).
    ``own(payload)`` is one call's work unpadded: a call joins a batch only if the batch's
    padded units stay within ``max_padding`` times the sum of its calls' own (on a CPU padding
    is paid in full: a 32-frame window padded to 184 costs 5.75 windows). ``max_rows``: most
    calls in a batch of this kind (a runner that runs its calls one by one gains nothing from a
    batch, and would hold the first stream's next call behind the others': 1). ``max_units``
    caps a batch's units outright (on a CPU big windows decode slower batched than one by one: the
    activations of a batch outgrow the caches).
    """

    run: Callable[[list[Any]], list[Any]]
    units: Callable[[list[Any]], float]
    max_rows: int = 0  # 0: the scheduler's max_batch; 1 for a runner that runs calls one by one
    own: Callable[[Any], float] | None = None
    max_padding: float = float("inf")
    max_units: float = float("inf")


@dataclass(slots=True, eq=False)  # identity: payloads (arrays) have no usable ==
class _Call:
    kind: str
    payload: Any
    priority: int
    seq: int
    submitted: float
    should_stop: Callable[[], bool] | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch run: for tests, stats and the benchmark."""

    kind: str
    size: int
    units: float
    seconds: float
    first_chunks: int  # calls in it at PRIORITY_FIRST (after promotion)


class CostModel:
    """Seconds of one batch as ``a + b * units``, least squares over past batches with
    exponential forgetting (``decay`` per batch), so it follows a machine whose load changes.

    Weighted sums, no history: S0 = sum w, S1 = sum w*u, S2 = sum w*u^2, T0 = sum w*t,
    T1 = sum w*u*t. When every batch had the same size the line is undetermined: then time is
    taken as proportional to units (a = 0), which over-predicts small batches, the safe side.
    """

    def __init__(self, decay: float = 0.97) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")
        self.decay = decay
        self._s = [0.0, 0.0, 0.0, 0.0, 0.0]  # S0, S1, S2, T0, T1
        self.observed = 0

    def observe(self, units: float, seconds: float) -> None:
        s, d = self._s, self.decay
        for i in range(5):
            s[i] *= d
        s[0] += 1.0
        s[1] += units
        s[2] += units * units
        s[3] += seconds
        s[4] += units * seconds
        self.observed += 1

    def coefficients(self) -> tuple[float, float]:
        s0, s1, s2, t0, t1 = self._s
        if self.observed == 0 or s1 <= 0.0:
            return 0.0, 0.0
        det = s0 * s2 - s1 * s1
        # Relative test: det is a variance of units times s0^2; tiny means one batch size seen.
        if det > 1e-9 * s2 * s0:
            b = (s0 * t1 - s1 * t0) / det
            a = (t0 - b * s1) / s0
            if b > 0.0 and a >= 0.0:
                return a, b
            if b > 0.0:  # a negative intercept: the line through the origin fits better
                return 0.0, t1 / s2
        return 0.0, t0 / s1

    def predict(self, units: float) -> float | None:
        """Predicted seconds, or None before anything was observed (no cap yet)."""
        if self.observed == 0:
            return None
        a, b = self.coefficients()
        return a + b * units


class BatchScheduler:
    """Runs the model calls of many streams as batches on one thread (see the module doc).

    ``runners``: kind -> :class:`Runner`. ``max_batch``: most calls in one batch (memory bound;
    a runner may also pad rows to fixed sizes up to it). ``budget_s``: latency budget of one
    batch (0: none, ``max_batch`` only). ``window_s``: longest wait, after a batch, for streams
    still busy in their step. ``thread_context``: entered once on the scheduler's thread around
    everything it runs (``torch.inference_mode`` is per thread).
    """

    def __init__(
        self,
        runners: dict[str, Runner],
        *,
        max_batch: int = 16,
        budget_s: float = 0.0,
        window_s: float = 0.002,
        promote_after_s: float = 0.1,
        thread_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        name: str = "batch-scheduler",
        history: int = 20000,
    ) -> None:
        if max_batch < 1 or window_s < 0 or budget_s < 0 or promote_after_s < 0:
            raise ValueError("max_batch must be >= 1; window_s, budget_s, promote_after_s >= 0")
        self.runners = dict(runners)
        self.max_batch = max_batch
        self.budget_s = budget_s
        self.window_s = window_s
        self.promote_after_s = promote_after_s
        self.cost = {kind: CostModel() for kind in runners}
        self.records: deque[BatchRecord] = deque(maxlen=history)
        self.busy_s = 0.0  # seconds the scheduler spent running batches
        self._thread_context = thread_context
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[_Call] = []
        self._seq = itertools.count()
        self._in_step = 0  # streams inside a step right now (waiting or busy)
        self._local = threading.local()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the streams' side ----------------------------------------------------------------------

    @contextlib.contextmanager
    def step(
        self, priority: int = PRIORITY_LATER, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[None]:
        """Mark the calling thread as inside one step of a stream: its model calls inherit
        ``priority`` and ``should_stop``, and the scheduler, after a batch, waits (up to
        ``window_s``) for every thread inside a step to hand in its next call."""
        previous = getattr(self._local, "step", None)
        with self._cond:
            order = next(self._seq)
        self._local.step = (priority, should_stop, order)
        with self._cond:
            self._in_step += 1
        try:
            yield
        finally:
            self._local.step = previous
            with self._cond:
                self._in_step -= 1
                self._cond.notify_all()

    def submit(self, kind: str, payload: Any) -> Any:
        """Run ``payload`` as part of the next batch of ``kind``; block until its result.

        Outside :meth:`step` a call is a lone one (priority later, never stopped, and the
        scheduler waits for no one on its behalf). Raises what running it alone raised, or
        :class:`StepStopped`.
        """
        if kind not in self.runners:
            raise KeyError(f"no runner for {kind!r}")
        step = getattr(self._local, "step", None)
        priority, should_stop, order = step or (PRIORITY_LATER, None, -1)
        call = _Call(kind, payload, priority, order, time.monotonic(), should_stop)
        with self._cond:
            if self._closed:
                raise RuntimeError("batch scheduler is closed")
            if order < 0:
                call.seq = next(self._seq)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append(call)
            self._cond.notify_all()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def in_step(self) -> int:
        return self._in_step

    def close(self) -> None:
        """Stop the thread; calls still queued fail with RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            left, self._queue = self._queue, []
        for call in left:
            call.error = RuntimeError("batch scheduler is closed")
            call.done.set()

    # -- the scheduler's side -------------------------------------------------------------------

    def _loop(self) -> None:
        context = self._thread_context() if self._thread_context else contextlib.nullcontext()
        with context:
            while True:
                try:
                    picked = self._form()
                except BaseException as exc:  # a bug in forming must not strand the callers
                    self._fail_queued(exc)
                    continue
                if picked is None:
                    return
                self._run(*picked)

    def _fail_queued(self, exc: BaseException) -> None:
        with self._cond:
            left, self._queue = self._queue, []
        for call in left:
            call.error = exc
            call.done.set()

    def _effective(self, call: _Call, now: float) -> int:
        if call.priority > PRIORITY_FIRST and now - call.submitted >= self.promote_after_s:
            return PRIORITY_FIRST
        return call.priority

    def _form(self) -> tuple[str, list[_Call], list[int]] | None:
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                # Wait (a little) for streams still busy in their step: they are about to hand
                # in a call and should ride in this batch rather than wait for the next one.
                deadline = time.monotonic() + self.window_s
                while not self._closed:
                    everyone = len(self._queue) >= self._in_step
                    if everyone or len(self._queue) >= self.max_batch:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return None
                stopped = [c for c in self._queue if c.should_stop is not None and _stop(c)]
                for call in stopped:
                    self._queue.remove(call)
                    call.error = StepStopped()
                    call.done.set()
                if not self._queue:
                    continue
                now = time.monotonic()
                order = sorted(self._queue, key=lambda c: (self._effective(c, now), c.seq))
                kind = order[0].kind
                runner, cost = self.runners[kind], self.cost[kind]
                chosen: list[_Call] = []
                own_sum = 0.0
                rows = min(self.max_batch, runner.max_rows or self.max_batch)
                for call in (c for c in order if c.kind == kind):
                    if len(chosen) >= rows:
                        break
                    own = runner.own(call.payload) if runner.own is not None else 0.0
                    if chosen:
                        units = runner.units([*_payloads(chosen), call.payload])
                        if units > runner.max_units:
                            continue
                        if runner.own is not None and units > runner.max_padding * (own_sum + own):
                            continue  # pads badly with these: it leads a batch of its own next
                        if self.budget_s > 0:
                            predicted = cost.predict(units)
                            if predicted is not None and predicted > self.budget_s:
                                break  # priority order kept: no later call jumps this one
                    chosen.append(call)
                    own_sum += own
                for call in chosen:
                    self._queue.remove(call)
                return kind, chosen, [self._effective(c, now) for c in chosen]

    def _run(self, kind: str, calls: list[_Call], priorities: list[int]) -> None:
        runner = self.runners[kind]
        payloads = _payloads(calls)
        t0 = time.perf_counter()
        try:
            results = runner.run(payloads)
            if len(results) != len(calls):
                raise RuntimeError(f"runner {kind!r} gave {len(results)} results for {len(calls)}")
        except BaseException as exc:  # the loop must outlive any one batch
            if len(calls) == 1:
                calls[0].error = exc
            else:
                # One poison call must not fail its batch-mates: run each alone.
                for call in calls:
                    try:
                        (call.result,) = runner.run([call.payload])
                    except BaseException as single:
                        call.error = single
            seconds = time.perf_counter() - t0
            self.busy_s += seconds
            for call in calls:
                call.done.set()
            return
        seconds = time.perf_counter() - t0
        self.busy_s += seconds
        units = runner.units(payloads)
        self.cost[kind].observe(units, seconds)
        firsts = sum(1 for p in priorities if p == PRIORITY_FIRST)
        self.records.append(BatchRecord(kind, len(calls), units, seconds, firsts))
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, Failed):
                call.error = result.error
            else:
                call.result = result
            call.done.set()

    # -- stats ----------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Batches run per kind: count, mean and max size, mean seconds (JSON-able)."""
        out: dict[str, Any] = {"busy_s": round(self.busy_s, 4)}
        for kind in self.runners:
            recs = [r for r in self.records if r.kind == kind]
            if not recs:
                continue
            out[kind] = {
                "batches": len(recs),
                "calls": sum(r.size for r in recs),
                "mean_size": sum(r.size for r in recs) / len(recs),
                "max_size": max(r.size for r in recs),
                "mean_ms": 1000 * sum(r.seconds for r in recs) / len(recs),
                "max_ms": 1000 * max(r.seconds for r in recs),
            }
        return out


def _payloads(calls: Sequence[_Call]) -> list[Any]:
    return [c.payload for c in calls]


def _stop(call: _Call) -> bool:
    assert call.should_stop is not None
    try:
        return bool(call.should_stop())
    except Exception:  # a broken predicate must not take the scheduler down; keep the call
        return False


def drive(
    inner: Iterator[Any],
    scheduler: BatchScheduler | None,
    *,
    urgent: bool,
    should_stop: Callable[[], bool] | None,
) -> Iterator[Any]:
    """Step ``inner`` (a ``stream()`` generator) chunk by chunk inside scheduler steps: the
    first chunk of an urgent stream at :data:`PRIORITY_FIRST`, the rest later. A call stopped
    inside a batch ends the stream there (its last chunk then is not final, as for any stop)."""
    if scheduler is None:
        yield from inner
        return
    produced = 0
    while True:
        priority = PRIORITY_FIRST if urgent and produced == 0 else PRIORITY_LATER
        with scheduler.step(priority, should_stop):
            try:
                chunk = next(inner)
            except StopIteration:
                return
            except StepStopped:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()
                return
        yield chunk
        produced += 1
