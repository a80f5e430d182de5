"""An in-process gateway (memory bus, real onnx worker) on free loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gateway.app import Gateway
from gateway.sip.message import Address
from synth.engines import load_engine
from synth.engines.base import Engine
from voxgate.bench.localgw import local_gateway


@dataclass
class LiveGateway:
    gw: Gateway
    sip: Address
    http: str


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture
async def live_gateway(engine: Engine) -> AsyncIterator[LiveGateway]:
    async with local_gateway(engine, name="e2e") as local:
        yield LiveGateway(local.gw, local.sip, local.http)
