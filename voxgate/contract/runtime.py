"""What every voxgate process does the same way: run on uvloop, stop on SIGINT/SIGTERM, and
build its bus from the configuration."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any

from voxgate.contract.bus import make_bus
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import Config


def build_bus(cfg: Config) -> Bus:
    b = cfg.bus
    return make_bus(b.kind, b.redis_url, b.prefix, b.audio_maxlen, b.cancel_ttl_s, b.audio_ttl_s)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Signal handlers exist only on a Unix loop in the main thread (asyncio raises
        # NotImplementedError elsewhere, RuntimeError off the main thread): a gateway run inside
        # a test's or an embedder's thread is stopped by its owner instead.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


def run(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop (the event loop of every voxgate process)."""
    import uvloop

    return uvloop.run(main)
