"""Prometheus metrics of a synthesis worker (``voxgate worker``: its own ``/metrics``, see
``synth.health``; ``voxgate serve``: on the gateway's ``/metrics``, same registry).

One ``CollectorRegistry`` per ``WorkerMetrics`` unless one is passed in (never the global
default). Per-utterance figures come from the worker's ``on_stats`` report (chained, so a
benchmark's callback still runs); readiness, utterances in flight and error counts are read
from the worker at scrape time; the request stream's lag and pending count from the bus,
fetched just before each scrape (``refresh``). Every name starts ``voxgate_worker_`` so a
gateway registry can hold both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from synth.worker import UtteranceStats, Worker
from voxgate.contract.bus.base import BusError
from voxgate.contract.bus.schema import (
    ERR_BAD_REQUEST,
    ERR_DEADLINE,
    ERR_EMPTY_TEXT,
    ERR_ENGINE,
    ERR_TEXT_TOO_LONG,
    ERR_UNKNOWN_VOICE,
)
from voxgate.contract.metrics import render_registry

# Text exposition format 0.0.4: what every Prometheus version scrapes.
UTTERANCE_OUTCOMES = ("done", "cancelled", "error")
# Error codes always exported (0 until they happen); "bus": the bus failed mid-request.
ERROR_CODES = (
    ERR_BAD_REQUEST, ERR_DEADLINE, ERR_EMPTY_TEXT, ERR_ENGINE, ERR_TEXT_TOO_LONG,
    ERR_UNKNOWN_VOICE, "bus",
)  # fmt: skip
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
TTFC_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
PENDING_TIMEOUT_S = 2.0


class WorkerMetrics:
    def __init__(self, worker: Worker, *, registry: CollectorRegistry | None = None) -> None:
        self.worker = worker
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.utterances = Counter(
            "voxgate_worker_utterances", "Utterances this worker finished, by outcome",
            labelnames=("outcome",), registry=r,
        )  # fmt: skip
        for outcome in UTTERANCE_OUTCOMES:
            self.utterances.labels(outcome)
        self.cancelled = Counter(
            "voxgate_worker_utterances_cancelled",
            "Utterances stopped by a cancel (barge-in, hang-up) before they were done",
            registry=r,
        )
        self.rtf = Histogram(
            "voxgate_worker_rtf",
            "Real-time factor per synthesized utterance (compute seconds per audio second)",
            buckets=RTF_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttfc = Histogram(
            "voxgate_worker_time_to_first_chunk_seconds",
            "Request read from the bus to its first audio chunk published",
            buckets=TTFC_BUCKETS, registry=r,
        )  # fmt: skip
        self._lag: float | None = None
        self._pending: float | None = None
        r.register(_WorkerCollector(self))
        previous = worker.on_stats

        def on_stats(stats: UtteranceStats) -> None:
            self.observe(stats)
            if previous is not None:
                previous(stats)

        worker.on_stats = on_stats

    def observe(self, stats: UtteranceStats) -> None:
        outcome = stats.outcome.partition(":")[0]
        self.utterances.labels(outcome if outcome in UTTERANCE_OUTCOMES else "error").inc()
        if outcome == "cancelled":
            self.cancelled.inc()
        if stats.first_audio_at is not None:
            self.ttfc.observe(max(stats.first_audio_at - stats.read_at, 0.0))
        # Replays from the render cache cost no compute: they say nothing about the engine.
        if outcome == "done" and stats.audio_s > 0 and stats.compute_s > 0:
            self.rtf.observe(stats.compute_s / stats.audio_s)

    async def refresh(self) -> None:
        """Fetch the request stream's backlog (before a scrape)."""
        try:
            lag, pending = await asyncio.wait_for(self.worker.bus.pending(), PENDING_TIMEOUT_S)
        except (BusError, TimeoutError):
            self._lag = self._pending = None
            return
        self._lag, self._pending = float(lag), float(pending)

    async def render(self) -> bytes:
        await self.refresh()
        return render_registry(self.registry)

    def collect_live(self) -> list[Metric]:
        w = self.worker
        out: list[Metric] = [
            GaugeMetricFamily("voxgate_worker_ready", "1 once warmed up and serving, else 0",
                              value=1.0 if w.ready else 0.0),
            GaugeMetricFamily("voxgate_worker_inflight", "Utterances being synthesized now",
                              value=float(w.in_flight)),
            GaugeMetricFamily("voxgate_worker_concurrency", "Utterances served at once, at most",
                              value=float(w.concurrency)),
        ]  # fmt: skip
        errors = CounterMetricFamily(
            "voxgate_worker_errors", "Requests answered with an error, by code", labels=["code"]
        )
        counts = dict(w.errors)
        for code in sorted(set(ERROR_CODES) | set(counts)):
            errors.add_metric([code], float(counts.get(code, 0)))
        out.append(errors)
        renderings = CounterMetricFamily(
            "voxgate_worker_renderings",
            "How utterances got their audio (replayed from the cache, rendered, followed a "
            "rendering in progress) and how renderings nobody heard ended (finished_unheard "
            "for the cache, stopped)",
            labels=["outcome"],
        )
        for how, n in w.renderings.items():
            renderings.add_metric([how], float(n))
        out.append(renderings)
        if self._lag is not None and self._pending is not None:
            out.append(GaugeMetricFamily(
                "voxgate_worker_request_stream_lag",
                "Speak requests on the bus not yet delivered to any worker", value=self._lag,
            ))  # fmt: skip
            out.append(GaugeMetricFamily(
                "voxgate_worker_request_stream_pending",
                "Speak requests delivered to a worker of the group and not yet acknowledged",
                value=self._pending,
            ))  # fmt: skip
        return out


class _WorkerCollector:
    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics.collect_live()

    def describe(self) -> Iterable[Metric]:
        names = [
            ("voxgate_worker_ready", "gauge"), ("voxgate_worker_inflight", "gauge"),
            ("voxgate_worker_concurrency", "gauge"), ("voxgate_worker_errors", "counter"),
            ("voxgate_worker_request_stream_lag", "gauge"),
            ("voxgate_worker_request_stream_pending", "gauge"),
        ]  # fmt: skip
        return [Metric(name, "", typ) for name, typ in names]
