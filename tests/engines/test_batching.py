"""The batch scheduler (synth.engines.batching) with fake runners: fast, no model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from synth.engines.batching import (
    PRIORITY_FIRST,
    PRIORITY_LATER,
    BatchScheduler,
    CostModel,
    Runner,
    StepStopped,
    drive,
)


class Recorder:
    """A runner that records each batch's payloads, sleeps ``per_unit_s`` a unit, and raises
    on the payload "poison"."""

    def __init__(self, per_unit_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.per_unit_s = per_unit_s
        self.gate = gate

    def run(self, payloads: list[Any]) -> list[Any]:
        if self.gate is not None:
            self.gate.wait()
        self.batches.append(list(payloads))
        if "poison" in payloads:
            raise ValueError("poison")
        time.sleep(self.per_unit_s * len(payloads))
        return [f"out:{p}" for p in payloads]


def scheduler(rec: Recorder, **kw: Any) -> BatchScheduler:
    return BatchScheduler({"k": Runner(rec.run, units=len)}, **kw)


def in_threads(fns: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_lone_call_never_waits_for_the_window() -> None:
    rec = Recorder()
    s = scheduler(rec, window_s=10.0)
    try:
        t0 = time.monotonic()
        assert s.submit("k", 1) == "out:1"
        with s.step(PRIORITY_FIRST):  # a stream alone in its step: nobody else to wait for
            assert s.submit("k", 2) == "out:2"
        assert time.monotonic() - t0 < 1.0
    finally:
        s.close()


def test_streams_in_a_step_ride_one_batch() -> None:
    rec = Recorder()
    s = scheduler(rec, window_s=5.0)
    barrier = threading.Barrier(4)

    def stream(i: int) -> Any:
        with s.step(PRIORITY_FIRST):
            barrier.wait()  # all four are inside a step before any submits
            time.sleep(0.05 * i)  # busy for a while: the scheduler waits for it
            return s.submit("k", i)

    try:
        out = in_threads([lambda i=i: stream(i) for i in range(4)])
        assert out == [f"out:{i}" for i in range(4)]
        assert [sorted(b) for b in rec.batches] == [[0, 1, 2, 3]]
    finally:
        s.close()


def test_first_chunks_go_first_and_the_budget_caps_the_batch() -> None:
    gate = threading.Event()
    rec = Recorder(per_unit_s=0.01)
    hold = Recorder(gate=gate)  # a kind of its own: its wait does not teach k's cost model
    s = BatchScheduler(
        {"k": Runner(rec.run, units=len), "hold": Runner(hold.run, units=len)},
        window_s=0.0,
        budget_s=0.035,
        promote_after_s=60.0,
    )
    # Teach the cost model 10 ms a call before the test's batches.
    for n in (1, 2, 4):
        s.cost["k"].observe(n, 0.01 * n)
    try:
        blocker = threading.Thread(target=s.submit, args=("hold", "blocker"))
        blocker.start()  # holds the scheduler in its runner until the gate opens
        time.sleep(0.05)

        def call(priority: int, name: str) -> Any:
            with s.step(priority):
                return s.submit("k", name)

        fns = [lambda i=i: call(PRIORITY_LATER, f"later{i}") for i in range(4)]
        fns += [lambda i=i: call(PRIORITY_FIRST, f"first{i}") for i in range(4)]
        threads = [threading.Thread(target=f) for f in fns]
        for t in threads:
            t.start()
            time.sleep(0.01)  # arrival order: the later chunks first
        while s.waiting < 8:
            time.sleep(0.001)
        gate.set()
        for t in [blocker, *threads]:
            t.join(10)
        batches = rec.batches
        # 35 ms at 10 ms a call: three calls a batch; first chunks before later ones even
        # though they arrived after them.
        assert max(len(b) for b in batches) == 3
        order = [p for b in batches for p in b]
        assert order[:4] == ["first0", "first1", "first2", "first3"]
        assert sorted(order[4:]) == ["later0", "later1", "later2", "later3"]
    finally:
        gate.set()
        s.close()


def test_later_chunks_waiting_too_long_are_promoted() -> None:
    gate = threading.Event()
    rec = Recorder(gate=gate)
    s = scheduler(rec, window_s=0.0, max_batch=1, promote_after_s=0.05)
    try:
        blocker = threading.Thread(target=s.submit, args=("k", "blocker"))
        blocker.start()
        time.sleep(0.05)

        def call(priority: int, name: str) -> Any:
            with s.step(priority):
                return s.submit("k", name)

        old = threading.Thread(target=call, args=(PRIORITY_LATER, "old"))
        old.start()
        time.sleep(0.1)  # "old" waits past promote_after_s
        new = threading.Thread(target=call, args=(PRIORITY_FIRST, "new"))
        new.start()
        while s.waiting < 2:
            time.sleep(0.001)
        gate.set()
        for t in (blocker, old, new):
            t.join(10)
        assert [b[0] for b in rec.batches] == ["blocker", "old", "new"]
    finally:
        gate.set()
        s.close()


def test_poison_fails_only_itself() -> None:
    rec = Recorder()
    s = scheduler(rec, window_s=5.0)
    barrier = threading.Barrier(3)

    def stream(name: str) -> Any:
        with s.step(PRIORITY_FIRST):
            barrier.wait()
            return s.submit("k", name)

    try:
        out = in_threads([lambda: stream("a"), lambda: stream("poison"), lambda: stream("b")])
        assert out[0] == "out:a" and out[2] == "out:b"
        assert isinstance(out[1], ValueError)
        # The batch of three failed, then each ran alone.
        assert sorted(map(sorted, rec.batches)) == [["a"], ["a", "b", "poison"], ["b"], ["poison"]]
        assert s.submit("k", "after") == "out:after"  # the scheduler lives on
    finally:
        s.close()


def test_a_stopped_call_leaves_its_batch() -> None:
    rec = Recorder()
    s = scheduler(rec, window_s=5.0)
    barrier = threading.Barrier(3)

    def stream(name: str, stop: bool) -> Any:
        with s.step(PRIORITY_LATER, lambda: stop):
            barrier.wait()
            return s.submit("k", name)

    try:
        out = in_threads([lambda: stream("a", False), lambda: stream("x", True),
                          lambda: stream("b", False)])  # fmt: skip
        assert out[0] == "out:a" and out[2] == "out:b"
        assert isinstance(out[1], StepStopped)
        assert [sorted(b) for b in rec.batches] == [["a", "b"]]
    finally:
        s.close()


def test_padding_and_unit_limits_split_batches() -> None:
    batches: list[list[int]] = []

    def run(widths: list[int]) -> list[int]:
        batches.append(sorted(widths))
        return widths

    runner = Runner(
        run, units=lambda ws: len(ws) * max(ws), own=float, max_padding=1.3, max_units=200
    )
    s = BatchScheduler({"d": runner}, window_s=5.0)
    barrier = threading.Barrier(5)

    def stream(i: int, w: int) -> Any:
        with s.step(PRIORITY_FIRST):
            barrier.wait()
            time.sleep(0.02 * i)  # arrival in list order
            return s.submit("d", w)

    try:
        in_threads([lambda i=i, w=w: stream(i, w) for i, w in enumerate((32, 32, 40, 184, 60))])
        # 32, 32, 40 pad within 1.3x (120 units for 104 own); 60 would pad them to 240 > 200
        # units and 184 to 5.75x: each runs on its own.
        assert sorted(batches) == [[32, 32, 40], [60], [184]]
    finally:
        s.close()


def test_cost_model_fits_a_line() -> None:
    m = CostModel(decay=1.0)
    assert m.predict(10) is None
    for u in (1, 2, 4, 8, 16):
        m.observe(u, 0.002 + 0.001 * u)
    a, b = m.coefficients()
    assert a == pytest.approx(0.002, rel=1e-6) and b == pytest.approx(0.001, rel=1e-6)
    same = CostModel()
    for _ in range(5):
        same.observe(4, 0.008)  # one size only: proportional, through the origin
    assert same.predict(8) == pytest.approx(0.016)


def test_drive_steps_at_priorities_and_ends_on_stop() -> None:
    seen: list[int] = []
    rec = Recorder()
    s = scheduler(rec)

    def gen() -> Iterator[int]:
        for i in range(3):
            seen.append(s._local.step[0])  # (priority, stop, order)
            if i == 2:
                raise StepStopped()
            yield i

    try:
        assert list(drive(gen(), s, urgent=True, should_stop=None)) == [0, 1]
        assert seen == [PRIORITY_FIRST, PRIORITY_LATER, PRIORITY_LATER]
        seen.clear()
        assert list(drive(gen(), s, urgent=False, should_stop=None)) == [0, 1]
        assert seen[0] == PRIORITY_LATER
        assert s.in_step == 0
        assert list(drive(iter([1, 2]), None, urgent=True, should_stop=None)) == [1, 2]
    finally:
        s.close()


def test_close_fails_what_is_queued_and_refuses_more() -> None:
    gate = threading.Event()
    rec = Recorder(gate=gate)
    s = scheduler(rec, window_s=0.0)
    first = threading.Thread(target=s.submit, args=("k", 1))
    first.start()
    time.sleep(0.05)
    out = []
    second = threading.Thread(target=lambda: out.append(in_threads([lambda: s.submit("k", 2)])))
    second.start()
    time.sleep(0.05)
    closer = threading.Thread(target=s.close)
    closer.start()
    time.sleep(0.05)
    gate.set()
    for t in (first, second, closer):
        t.join(10)
    assert isinstance(out[0][0], RuntimeError)
    with pytest.raises(RuntimeError):
        s.submit("k", 3)
