"""The synthesis worker: consume speak requests from the bus, stream audio back per call.

One asyncio task per utterance in flight (up to ``concurrency``); each steps its ``Renderer`` one
chunk at a time on a priority thread pool, so active utterances take turns and first chunks go
first. Between chunks the task checks the utterance's cancel marker, so synthesis stops within
one chunk of a barge-in. Every failure is answered on the call's stream as an ``UtteranceError``
and the request acknowledged: a bad request never crashes the worker or touches another call.
Requests left unacknowledged by a dead worker are claimed after ``claim_idle_ms`` (XAUTOCLAIM).

A bus outage (Redis stopped or restarted) pauses the utterances in flight at their next bus
operation; they resume where they stopped once the bus answers again (for up to
``default_deadline_s``), so the caller hears the rest rather than a re-render. Loops retry on
the bus's backoff schedule (``Bus.health``), the bus logs the outage once, and after it the
worker holds off claiming others' requests for ``claim_idle_ms``: idle time that piled up while
nobody could reach Redis says nothing about whether their worker is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from synth.cache import CachedChunk, CacheKey, RenderCache, Rendering
from synth.engines.base import Engine, StagedWarmup, WarmStep
from synth.render import Rendered, Renderer, RenderError, prepare_text
from synth.scheduler import PriorityExecutor
from synth.shared import SharedRender
from voxgate.contract.bus.base import Bus, BusDown, BusError, Delivery
from voxgate.contract.bus.schema import (
    ERR_BAD_REQUEST,
    ERR_DEADLINE,
    ERR_ENGINE,
    ERR_UNKNOWN_VOICE,
    AudioChunk,
    Profile,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)
from voxgate.contract.logs import bind_log_context

log = logging.getLogger("voxgate.worker")

T = TypeVar("T")

# A request delivered this many times without an ack is poison (it keeps killing workers).
MAX_DELIVERIES = 3
HEARTBEAT_S = 2.0
# Claim rounds (a touch of the requests in flight, then XAUTOCLAIM) come at most this far apart,
# and at least twice per claim_idle_ms: a dead worker's request is taken over within
# claim_idle_ms plus this (its idle time starts at its last touch), not up to 1.5 x.
CLAIM_ROUND_MAX_S = 0.25


# How long a stopping worker waits for the engine steps already running on its pool threads.
STOP_JOIN_S = 10.0
# Executor priority of background warm-up steps: below first chunks (0) and later ones (1).
WARM_PRIORITY = 2
# A background warm-up step starts only after this long without any utterance in flight (and
# this long after ready): a request already waiting when the worker becomes ready, or a burst,
# is served first; one arriving mid-step shares the CPU with that one step.
WARM_IDLE_S = 0.2
# A rendering nobody follows any more is finished for the cache only for a prompt asked for
# before and no longer than this (synth/shared.py); the keys asked for are remembered up to
# ASKED_KEYS, the least recent forgotten first.
FINISH_MAX_CHARS = 1000
ASKED_KEYS = 4096
MAX_UNHEARD = 4
RENDERING_COUNTS = (
    "replayed", "rendered", "followed", "finished_unheard", "stopped", "prerendered",
)  # fmt: skip


def _run_steps(steps: list[WarmStep]) -> None:
    for step in steps:
        step()


@dataclass(frozen=True, slots=True)
class UtteranceStats:
    """What one utterance cost; the benchmark and metrics read these."""

    call_id: str
    utterance_id: str
    outcome: str  # done | cancelled | error:<code>
    read_at: float  # perf_counter when the request was read from the bus
    first_audio_at: float | None  # perf_counter when the first chunk was published
    end_at: float
    audio_s: float  # seconds of output audio published
    compute_s: float  # wall seconds spent in engine + DSP steps
    chunks: int


@dataclass(slots=True)
class _Progress:
    first_at: float | None = None
    compute_s: float = 0.0
    chunks: int = 0


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def stream_id_ms(entry_id: str) -> int | None:
    """Milliseconds part of a stream entry id (``<ms>-<seq>``): when it was submitted."""
    head, _, _ = entry_id.partition("-")
    return int(head) if head.isdigit() else None


class Worker:
    def __init__(
        self,
        bus: Bus,
        engine: Engine,
        *,
        name: str = "",
        concurrency: int = 4,
        max_text_chars: int = 5000,
        eq_gain_db: float = 2.0,
        wideband_rate: int = 48000,
        claim_idle_ms: int = 10000,
        default_deadline_s: float = 30.0,
        whole: bool = False,
        on_stats: Callable[[UtteranceStats], None] | None = None,
        cache_bytes: int = 0,
        background_warm: bool = True,
        prerender: Sequence[str] = (),
    ) -> None:
        self.bus = bus
        self.engine = engine
        self.name = name or default_worker_name()
        self.concurrency = concurrency
        self.max_text_chars = max_text_chars
        self.eq_gain_db = eq_gain_db
        self.wideband_rate = wideband_rate
        self.claim_idle_ms = claim_idle_ms
        self.default_deadline_s = default_deadline_s
        self.whole = whole
        self.on_stats = on_stats
        # Finished renderings replayed for repeated prompts (0: off).
        self.cache = RenderCache(cache_bytes) if cache_bytes > 0 else None
        # Prompts rendered into the cache after ready, in the background (synth.prerender).
        self.prerender = tuple(prerender) if self.cache is not None else ()
        if prerender and self.cache is None:
            log.warning("synth.prerender ignored: the render cache is off (synth.cache_mb = 0)")
        # Renderings in progress by key, followed by every utterance asking for the same
        # prompt meanwhile (synth/shared.py); how often each key was asked for.
        self._renders: dict[CacheKey, SharedRender] = {}
        self._render_tasks: set[asyncio.Task[None]] = set()
        self._asked: OrderedDict[CacheKey, int] = OrderedDict()
        self._background = asyncio.Lock()
        # How each utterance got its audio, and how renderings ended (synth.metrics):
        # replayed (cache), rendered (started one), followed (joined one in progress);
        # finished_unheard (completed for the cache after every caller left), stopped (left).
        self.renderings: dict[str, int] = dict.fromkeys(RENDERING_COUNTS, 0)
        # More pool threads than cores only adds contention; utterances beyond that interleave.
        # A batching engine (issue 16) says how many steps it wants at once: its steps mostly
        # wait for its batch scheduler, and every utterance left out of a step is a batch row
        # missing, so it gets a thread per utterance.
        wanted = getattr(engine, "concurrent_steps", None) or os.cpu_count() or 1
        self._threads = max(1, min(concurrency, int(wanted)))
        self._executor: PriorityExecutor | None = None  # exists while run() does
        self._active: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, asyncio.Task[None]] = {}  # delivery id -> its task
        self._slot_freed = asyncio.Event()
        self._last_busy = 0.0  # monotonic time an utterance last started or ended
        self.ready = False
        # Warm only what the first request needs before ready, the rest afterwards between
        # requests (False: all of it before ready, as before issue 17).
        self.background_warm = background_warm
        self.fully_warm = asyncio.Event()  # set once the background warm-up has finished
        self.warm_first_s = 0.0  # warm-up before ready, seconds
        self.warm_rest_s = 0.0  # background warm-up, seconds of its steps
        self.voice_names = {"", getattr(engine, "voice", "")}
        # Errors answered on calls' streams by code, plus "bus" (a request left for a claim
        # because the bus failed): read by synth.metrics.
        self.errors: dict[str, int] = {}
        # Requests answered whose ack failed (the bus went down in between): acked once it is
        # back, and never served again if a claim hands one back to us.
        self._unacked: set[str] = set()
        self._stopping = False

    @property
    def in_flight(self) -> int:
        """Utterances being served now."""
        return len(self._active)

    # --- lifecycle ----------------------------------------------------------------------
    async def warmup(self) -> float:
        """Warm every graph and chunk shape (engine and DSP), all of it, now."""
        first, rest = self._warm_plan()
        t0 = time.perf_counter()
        await asyncio.to_thread(_run_steps, [*first, *rest])
        return time.perf_counter() - t0

    def _warm_plan(self) -> tuple[list[WarmStep], list[WarmStep]]:
        """Warm-up steps: (before ready, in the background after).

        Before: the engine's first-request steps and one narrowband render of a short text, so
        first-call costs in the text frontend (espeak's init), the DSP and the normalizer are
        paid. After: the engine's other shapes and the wideband path. An engine that cannot
        split its warm-up (``StagedWarmup``) is warmed whole before ready.
        """
        engine = self.engine
        if isinstance(engine, StagedWarmup):
            first, rest = engine.warmup_steps()
        else:
            first, rest = [engine.warmup], []
        first.append(functools.partial(self._render_once, "narrowband"))
        rest.append(functools.partial(self._render_once, "wideband"))
        return first, rest

    def _prerender_plan(self) -> list[WarmStep]:
        if self.whole:
            return []
        return [
            functools.partial(self._prerender_one, text, profile)
            for text in self.prerender
            for profile in ("narrowband", "wideband")
        ]

    def _prerender_one(self, text: str, profile: Profile) -> None:
        """Render ``text`` whole into the cache, under the key a request for it would use."""
        cache = self.cache
        assert cache is not None
        shape = profile if profile == "narrowband" else f"wideband/{self.wideband_rate}"
        key: CacheKey = (text, False, self.engine.voice, shape, self.engine.name)
        if key in cache:
            return  # a caller got there first
        r = Renderer(
            self.engine,
            prepare_text(text, raw=False, max_chars=self.max_text_chars),
            profile,
            eq_gain_db=self.eq_gain_db,
            wideband_rate=self.wideband_rate,
        )
        chunks: list[CachedChunk] = []
        while (out := r.step()) is not None:
            if out.data or out.words:
                chunks.append(CachedChunk(out.data, out.offset, out.words))
            if out.final:
                break
        cache.put(key, Rendering(r.rate, tuple(chunks), r.samples))
        self.renderings["prerendered"] += 1

    def _render_once(self, profile: Profile) -> None:
        r = Renderer(
            self.engine,
            ["Hello."],
            profile,
            eq_gain_db=self.eq_gain_db,
            wideband_rate=self.wideband_rate,
        )
        while r.step() is not None:
            pass

    async def _warm_in_background(self, steps: list[WarmStep], stop: asyncio.Event) -> None:
        """Run ``steps`` one at a time on the executor, each once the worker has been idle for
        ``WARM_IDLE_S``, at a priority below every utterance's: a request that arrives meanwhile
        waits for no step (a step takes one pool thread of several) and shares the CPU with at
        most one, never with a queue of them."""
        t0 = time.perf_counter()
        executor = self._executor
        assert executor is not None
        self._last_busy = time.monotonic()
        for step in steps:
            await self._idle(stop)
            if stop.is_set():
                return
            t = time.perf_counter()
            try:
                await executor.submit(WARM_PRIORITY, step)
            except Exception:  # a warm-up step failing must not take the worker down
                log.exception("background warm-up step failed")
            self.warm_rest_s += time.perf_counter() - t
        self.fully_warm.set()
        log.info(
            "worker %s: background warm-up done (%.2f s of steps, %.2f s after ready)",
            self.name,
            self.warm_rest_s,
            time.perf_counter() - t0,
        )

    async def _idle(self, stop: asyncio.Event) -> None:
        """Return once no utterance has been in flight for ``WARM_IDLE_S`` (or on stop)."""
        while not stop.is_set():
            if self._active:
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), 0.5)
                continue
            quiet = time.monotonic() - self._last_busy
            if quiet >= WARM_IDLE_S:
                return
            await asyncio.sleep(WARM_IDLE_S - quiet)

    async def run(self, stop: asyncio.Event, *, warm: bool = True) -> None:
        """Serve until ``stop`` is set; then finish in-flight utterances and retire.

        ``warm=False`` skips warm-up for an engine the caller already warmed (benchmarks).
        """
        bind_log_context(worker=self.name)
        rest: list[WarmStep] = []
        if warm:
            first, rest = self._warm_plan()
            if not self.background_warm:
                first, rest = [*first, *rest], []
            t0 = time.perf_counter()
            await asyncio.to_thread(_run_steps, first)
            self.warm_first_s = time.perf_counter() - t0
        # Always after ready: a worker that can speak should not wait for its prompt list.
        rest += self._prerender_plan()
        self._executor = executor = PriorityExecutor(self._threads)
        self.ready = True
        if not rest:
            self.fully_warm.set()
        beat = asyncio.create_task(self._heartbeat_loop(stop))
        claim = asyncio.create_task(self._claim_loop(stop))
        tasks = [beat, claim]
        if rest:
            tasks.append(asyncio.create_task(self._warm_in_background(rest, stop)))
        log.info(
            "worker %s ready (engine=%s, voice=%s, concurrency=%d, warm-up %.2f s%s)",
            self.name,
            self.engine.name,
            self.engine.voice,
            self.concurrency,
            self.warm_first_s,
            ", the rest in the background" if rest else "",
        )
        try:
            while not stop.is_set():
                free = self.concurrency - len(self._active)
                if free <= 0:
                    self._slot_freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slot_freed.wait(), 0.5)
                    continue
                if self._unacked:
                    await self._flush_acks()
                try:
                    deliveries = await self.bus.read_requests(self.name, free, 200)
                except BusError as exc:
                    await self._bus_pause("bus read failed", exc)
                    continue
                for d in deliveries:
                    self._spawn(d)
        finally:
            self._stopping = True
            self.ready = False
            for t in tasks:
                t.cancel()
            with contextlib.suppress(BusError):
                await self.bus.retire(self.name)
            if self._active:
                await asyncio.gather(*self._active, return_exceptions=True)
            # What is left is finishing for the cache alone: not worth a stopping worker's time.
            for r in list(self._render_tasks):
                r.cancel()
            if self._render_tasks:
                await asyncio.gather(*self._render_tasks, return_exceptions=True)
            # Wait for the steps still running: a pool thread inside the engine when the
            # interpreter exits aborts the process (ONNX Runtime: "terminate called without an
            # active exception", SIGABRT: measured on a SIGTERM during the background
            # warm-up).  Queued steps were cancelled above and are skipped; a step is short.
            if not await asyncio.to_thread(executor.shutdown, True, STOP_JOIN_S):
                log.warning(
                    "worker %s: engine steps still running after %.0f s", self.name, STOP_JOIN_S
                )
            self._executor = None

    async def _bus_pause(self, what: str, exc: BusError) -> None:
        """After a failed bus operation of a loop: wait until the next attempt is due. An
        outage is logged once by the bus; an error reply (Redis up) is worth a line each."""
        if isinstance(exc, BusDown):
            log.debug("%s: %s", what, exc)
            await asyncio.sleep(self.bus.health.pause_s(time.monotonic()))
        else:
            log.warning("%s: %s; retrying", what, exc)
            await asyncio.sleep(0.5)

    async def _through_outage(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one bus operation of an utterance; while the bus is down (not an error reply),
        wait for it and try again, for up to ``default_deadline_s``, so the utterance resumes
        where it stopped. Longer (or stopping): the BusError leaves it unacked for a claim."""
        first_failure: float | None = None
        while True:
            try:
                return await op()
            except BusDown:
                now = time.monotonic()
                if self._stopping:
                    raise
                if first_failure is None:
                    first_failure = now
                elif now - first_failure >= self.default_deadline_s:
                    raise
                await asyncio.sleep(self.bus.health.pause_s(now))

    async def _publish(self, message: AudioChunk | UtteranceEnd | UtteranceError) -> None:
        await self._through_outage(functools.partial(self.bus.publish, message))

    async def _is_cancelled(self, utterance_id: str) -> bool:
        return await self._through_outage(functools.partial(self.bus.is_cancelled, utterance_id))

    async def _flush_acks(self) -> None:
        """Ack what was answered during an outage, once the bus answers again."""
        for delivery_id in list(self._unacked):
            try:
                await self.bus.ack(delivery_id)
            except BusDown:
                return  # still down: next time
            except BusError:
                # An error reply: the entry (or the whole group, after Redis lost its data) is
                # gone, so there is nothing left to ack.
                pass
            self._unacked.discard(delivery_id)

    def _spawn(self, delivery: Delivery) -> None:
        if delivery.id in self._in_flight:
            return  # already ours and in progress (claimed back from ourselves)
        if delivery.id in self._unacked:
            # Answered already; only its ack was lost to an outage: never render it again (the
            # serving loop acks it next, _flush_acks).
            return
        task = asyncio.create_task(self._handle(delivery))
        self._last_busy = time.monotonic()
        self._active.add(task)
        self._in_flight[delivery.id] = task
        task.add_done_callback(functools.partial(self._done, delivery_id=delivery.id))

    def _done(self, task: asyncio.Task[None], *, delivery_id: str) -> None:
        self._active.discard(task)
        self._last_busy = time.monotonic()
        self._in_flight.pop(delivery_id, None)
        self._slot_freed.set()

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            info: dict[str, object] = {
                "name": self.name,
                "engine": self.engine.name,
                "voice": self.engine.voice,
                "concurrency": self.concurrency,
                "active": len(self._active),
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
            wait = HEARTBEAT_S
            try:
                await self.bus.heartbeat(self.name, info, ttl_s=3 * HEARTBEAT_S)
            except BusDown:
                # Beat again as soon as an attempt is due: after an outage, gateways see this
                # worker (and answer OPTIONS 200 again) within the backoff cap, not a period.
                wait = self.bus.health.pause_s(time.monotonic())
            except BusError as exc:
                log.warning("heartbeat failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        period = max(0.05, min(CLAIM_ROUND_MAX_S, self.claim_idle_ms / 2000))
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
            if stop.is_set():
                return
            try:
                # Keep our in-flight requests from looking idle: a long utterance must not be
                # claimed by another worker while this one is still rendering it.
                await self.bus.touch(self.name, list(self._in_flight))
            except BusError as exc:
                if not isinstance(exc, BusDown):
                    log.warning("touch failed: %s", exc)
            free = self.concurrency - len(self._active)
            if free <= 0:
                continue
            health = self.bus.health
            since_outage = health.up_for(time.monotonic())
            # Everyone's requests go idle while Redis is away (a restart from its RDB keeps the
            # idle clocks running): no claims during an outage, nor after it until every live
            # worker has found Redis back (its next attempt comes within the backoff cap of
            # ours) and touched what it renders, then a full claim_idle_ms for the dead ones.
            hold_s = self.claim_idle_ms / 1000 + health.cap_s
            if not health.up or (since_outage is not None and since_outage < hold_s):
                continue
            try:
                claimed = await self.bus.claim_stale(self.name, self.claim_idle_ms, free)
            except BusError as exc:
                if not isinstance(exc, BusDown):
                    log.warning("claim failed: %s", exc)
                continue
            for d in claimed:
                log.info(
                    "claimed request %s (delivery %d) from a silent worker", d.id, d.deliveries
                )
                self._spawn(d)

    # --- one utterance ------------------------------------------------------------------
    async def _handle(self, d: Delivery) -> None:
        read_at = time.perf_counter()
        req = d.request
        # This task's logs carry the request's ids (trace_id: the gateway call's).
        bind_log_context(
            call_id=req.call_id if req else d.call_id,
            utterance_id=req.utterance_id if req else d.utterance_id,
            trace_id=req.trace_id if req else "",
        )
        try:
            if req is None:
                if d.call_id:
                    await self._error(
                        d.call_id,
                        d.utterance_id or "-",
                        0,
                        ERR_BAD_REQUEST,
                        f"malformed request: {d.error}",
                        "",
                    )
                log.warning("malformed request %s: %s", d.id, d.error)
                return
            if d.deliveries > MAX_DELIVERIES:
                await self._error(
                    req.call_id,
                    req.utterance_id,
                    0,
                    ERR_ENGINE,
                    f"request failed on {d.deliveries - 1} workers; giving up",
                    req.trace_id,
                )
                return
            await self._speak(d, req, read_at)
        except BusError as exc:
            # Leave it unacked: another worker claims it once the bus is back.
            log.error("bus error while serving %s: %s", d.id, exc)
            self.errors["bus"] = self.errors.get("bus", 0) + 1
            return
        except Exception as exc:
            log.exception("unexpected failure serving %s", d.id)
            if req is not None:
                with contextlib.suppress(BusError):
                    await self._error(
                        req.call_id,
                        req.utterance_id,
                        0,
                        ERR_ENGINE,
                        f"{type(exc).__name__}: {exc}",
                        req.trace_id,
                    )
        try:
            await self.bus.ack(d.id)
        except BusDown:
            self._unacked.add(d.id)  # acked once the bus is back (_flush_acks)
        except BusError as exc:
            log.warning("ack of %s failed: %s", d.id, exc)

    async def _error(
        self, call: str, utt: str, seq: int, code: str, message: str, trace: str
    ) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        await self._publish(UtteranceError(call, utt, seq, code, message, trace))

    def _expired(self, d: Delivery, req: SpeakRequest) -> bool:
        now = time.time()
        if req.deadline:
            return now > req.deadline
        submitted = stream_id_ms(d.id)
        return submitted is not None and now - submitted / 1000 > self.default_deadline_s

    async def _speak(self, d: Delivery, req: SpeakRequest, read_at: float) -> None:
        call, utt, trace = req.call_id, req.utterance_id, req.trace_id
        progress = _Progress()

        log.info("utterance %s: request for call %s, %d chars (delivery %d)",
                 utt, call, len(req.text), d.deliveries)  # fmt: skip

        def report(outcome: str, samples: int, rate: int) -> None:
            first_ms = (
                f"{(progress.first_at - read_at) * 1000:.0f} ms"
                if progress.first_at is not None else "-"
            )  # fmt: skip
            log.info("utterance %s %s: %.2f s of audio, first chunk after %s",
                     utt, outcome, samples / rate if rate else 0.0, first_ms)  # fmt: skip
            if self.on_stats is not None:
                self.on_stats(
                    UtteranceStats(
                        call,
                        utt,
                        outcome,
                        read_at,
                        progress.first_at,
                        time.perf_counter(),
                        samples / rate if rate else 0.0,
                        progress.compute_s,
                        progress.chunks,
                    )
                )

        if self._expired(d, req):
            await self._error(
                call, utt, 0, ERR_DEADLINE, "request expired before synthesis began", trace
            )
            report(f"error:{ERR_DEADLINE}", 0, 0)
            return
        if req.voice not in self.voice_names:
            await self._error(
                call,
                utt,
                0,
                ERR_UNKNOWN_VOICE,
                f"unknown voice {req.voice!r}; this worker serves {self.engine.voice!r}",
                trace,
            )
            report(f"error:{ERR_UNKNOWN_VOICE}", 0, 0)
            return
        try:
            pieces = prepare_text(req.text, raw=req.raw, max_chars=self.max_text_chars)
        except RenderError as exc:
            await self._error(call, utt, 0, exc.code, str(exc), trace)
            report(f"error:{exc.code}", 0, 0)
            return
        rate = req.rate or self.wideband_rate  # wideband only; narrowband is always 8 kHz
        shape = req.profile if req.profile == "narrowband" else f"wideband/{rate}"
        key: CacheKey = (req.text, req.raw, self.engine.voice, shape, self.engine.name)
        cached = self.cache.get(key) if self.cache is not None and not self.whole else None
        if cached is not None:
            self.renderings["replayed"] += 1
            await self._replay(req, cached, progress, report)
            return
        shared, owner = self._render_for(key, pieces, req.profile, rate)
        self.renderings["rendered" if owner else "followed"] += 1
        shared.follow()
        try:
            await self._follow(req, shared, owner, progress, report)
        finally:
            shared.leave()

    def _render_for(
        self, key: CacheKey, pieces: list[str], profile: Profile, rate: int
    ) -> tuple[SharedRender, bool]:
        """The rendering of ``key`` in progress (to follow), or a new one: (it, started now).
        With the cache off (or the whole-piece baseline) every utterance renders on its own."""
        share = self.cache is not None and not self.whole
        asked = 0
        if share:
            asked = self._asked.pop(key, 0) + 1
            self._asked[key] = asked  # most recent last; the oldest go first
            while len(self._asked) > ASKED_KEYS:
                self._asked.popitem(last=False)
            running = self._renders.get(key)
            if running is not None and not running.finished:
                running.keep_when_abandoned = self._worth_finishing(key, asked)
                return running, False
        renderer = Renderer(
            self.engine,
            pieces,
            profile,
            eq_gain_db=self.eq_gain_db,
            wideband_rate=rate,
            whole=self.whole,
        )
        shared = SharedRender(
            key, renderer, keep_when_abandoned=share and self._worth_finishing(key, asked)
        )
        if share:
            self._renders[key] = shared
            shared.may_finish = self._room_for_unheard
        task = asyncio.create_task(shared.run(self._step, self._render_done))
        self._render_tasks.add(task)
        task.add_done_callback(self._render_tasks.discard)
        return shared, True

    def _room_for_unheard(self) -> bool:
        # At most MAX_UNHEARD renderings nobody hears at once (the asking one included): they
        # take the background turn one step at a time, and each holds its engine state.
        return sum(r.followers <= 0 for r in self._renders.values()) <= MAX_UNHEARD

    def _worth_finishing(self, key: CacheKey, asked: int) -> bool:
        # Asked for before: a prompt that repeats (a greeting, a menu), not an LLM's one-off
        # reply, whose rendering would cost a core for nobody under barge-in.
        return asked >= 2 and len(key[0]) <= FINISH_MAX_CHARS

    async def _step(self, renderer: Renderer, priority: int, background: bool) -> Rendered | None:
        assert self._executor is not None, "utterances are served only inside run()"
        if not background:
            return await self._executor.submit(priority, renderer.step)
        # Nobody is listening: below every utterance, and one such step at a time, so a
        # request arriving meanwhile shares the CPU with at most one of them.
        async with self._background:
            return await self._executor.submit(WARM_PRIORITY, renderer.step)

    def _render_done(self, shared: SharedRender) -> None:
        if self._renders.get(shared.key) is shared:
            del self._renders[shared.key]
        if shared.error is not None:
            log.error("engine failed rendering %d chars", len(shared.key[0]), exc_info=shared.error)
        elif shared.abandoned:
            self.renderings["stopped"] += 1
        elif shared.done and shared.unheard:
            self.renderings["finished_unheard"] += 1
        if shared.done and self.cache is not None and not self.whole:
            self.cache.put(shared.key, shared.rendering())

    async def _follow(
        self,
        req: SpeakRequest,
        shared: SharedRender,
        owner: bool,
        progress: _Progress,
        report: Callable[[str, int, int], None],
    ) -> None:
        """Publish ``shared``'s chunks on this utterance's call as they come; its cancel marker
        is read before each fresh chunk (and every 8th of those already made), so synthesis
        stops within one chunk of a barge-in. The compute is the owner's (who started it)."""
        call, utt, trace = req.call_id, req.utterance_id, req.trace_id
        rate = shared.renderer.rate
        seq = sent = 0
        while True:
            fresh = seq >= len(shared.chunks)
            if (fresh or seq % 8 == 0) and await self._is_cancelled(utt):
                await self._publish(UtteranceEnd(call, utt, seq, "cancelled", sent, trace))
                report("cancelled", sent, rate)
                return
            await shared.wait_beyond(seq)
            if seq < len(shared.chunks):
                item = shared.chunks[seq]
                c = item.chunk
                await self._publish(
                    AudioChunk(call, utt, seq, rate, c.data, c.offset, c.words, trace)
                )
                if seq == 0:
                    progress.first_at = time.perf_counter()
                if owner:
                    progress.compute_s += item.compute_s
                seq += 1
                progress.chunks = seq
                sent += len(c.data) // 2
                continue
            if shared.error is not None:
                exc = shared.error
                log.warning("engine failed on utterance %s", utt)
                await self._error(call, utt, seq, ERR_ENGINE, f"{type(exc).__name__}: {exc}", trace)
                report(f"error:{ERR_ENGINE}", sent, rate)
                return
            if shared.done:
                await self._publish(UtteranceEnd(call, utt, seq, "done", sent, trace))
                report("done", sent, rate)
                return
            # Abandoned while followed: only the worker stopping does that.
            await self._error(call, utt, seq, ERR_ENGINE, "worker stopped mid-utterance", trace)
            report(f"error:{ERR_ENGINE}", sent, rate)
            return

    async def _replay(
        self,
        req: SpeakRequest,
        cached: Rendering,
        progress: _Progress,
        report: Callable[[str, int, int], None],
    ) -> None:
        """Publish a cached rendering; the cancel marker is still honoured between chunks."""
        call, utt, trace = req.call_id, req.utterance_id, req.trace_id
        sent = 0
        for seq, chunk in enumerate(cached.chunks):
            if seq % 8 == 0 and await self._is_cancelled(utt):
                await self._publish(UtteranceEnd(call, utt, seq, "cancelled", sent, trace))
                report("cancelled", sent, cached.rate)
                return
            await self._publish(AudioChunk(
                call, utt, seq, cached.rate, chunk.data, chunk.offset, chunk.words, trace
            ))  # fmt: skip
            if seq == 0:
                progress.first_at = time.perf_counter()
            progress.chunks = seq + 1
            sent += len(chunk.data) // 2
        end = UtteranceEnd(call, utt, len(cached.chunks), "done", cached.samples, trace)
        await self._publish(end)
        report("done", cached.samples, cached.rate)
