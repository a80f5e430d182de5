"""Fixtures of the backend-fault tests: a private Redis each test may break."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.redis_server import PrivateRedis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()
