"""A live in-process gateway with its worker attached (as ``voxgate serve`` wires them), the
tone stand-in engine (fast), and a scrape helper that parses the Prometheus text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway
from gateway.sip.message import Address
from synth.worker import Worker
from tests.fakes import ToneEngine
from voxgate.bench.localgw import local_gateway
from voxgate.contract.bus.memory import MemoryBus

TOKEN = "metrics-test-token"


@dataclass
class Scrape:
    """One scrape: sample name + labels -> value; families by name -> type."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]
    text: str

    def get(self, name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        if key not in self.samples:
            raise AssertionError(f"no sample {name}{labels} in the scrape:\n{self.text}")
        return self.samples[key]

    def total(self, name: str, **labels: str) -> float:
        """Sum over every sample ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        found = [v for (n, ls), v in self.samples.items() if n == name and want <= ls]
        if not found:
            raise AssertionError(f"no sample {name}{labels} in the scrape:\n{self.text}")
        return sum(found)


def parse_scrape(text: str) -> Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return Scrape(samples, types, text)


async def scrape(url: str) -> Scrape:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "text/plain"
        return parse_scrape(await r.text())


@dataclass
class MetricsGateway:
    gw: Gateway
    worker: Worker
    bus: MemoryBus
    sip: Address
    http: str


@pytest.fixture
async def metrics_gateway(tmp_path: Path) -> AsyncIterator[MetricsGateway]:
    overrides = {
        # Recording on request (POST /api/calls/{id}/recordings): it fills the jitter buffer.
        "recording.dir": str(tmp_path / "recordings"),
        # /metrics must stay open when the control API needs a token.
        "gateway.api_token": TOKEN,
        "gateway.rtp_port_min": 32000,
        "gateway.rtp_port_max": 34000,
        "ivr.greeting": "Hello there, thank you for calling the metrics test line today.",
    }
    engine = ToneEngine(samples_per_word=800)
    async with local_gateway(engine, name="metrics", overrides=overrides) as lg:
        yield MetricsGateway(lg.gw, lg.worker, lg.bus, lg.sip, lg.http)
