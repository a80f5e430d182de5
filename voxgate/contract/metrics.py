"""Prometheus text exposition shared by the gateway's and the worker's ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class _WithoutCreated:
    """A registry minus the ``*_created`` series prometheus-client adds to counters and
    histograms (OpenMetrics-only; noise in the text format)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def render_registry(registry: CollectorRegistry) -> bytes:
    """The text exposition of ``registry`` (without ``*_created`` series)."""
    return generate_latest(_WithoutCreated(registry))  # type: ignore[arg-type]
