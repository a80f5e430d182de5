"""A live in-process gateway (memory bus, real onnx worker) for browser-leg tests."""

from __future__ import annotations

import pytest

from synth.engines import load_engine
from synth.engines.base import Engine


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")
