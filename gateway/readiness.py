"""Whether this gateway can speak: the bus answers and a warmed-up worker is serving.

``/readyz`` asks the bus each time; SIP cannot wait for Redis inside its event handler, so
the gateway keeps this view fresh in the background (every ``period_s``, faster until the
first worker is ready) and the user agent reads it synchronously: OPTIONS and INVITE get 503
with Retry-After while it is false (RFC 3261 §21.5.4), so an SBC or dispatcher that probes
with OPTIONS sends no caller to a gateway that would greet them with silence.

Through a Redis outage the view turns false as soon as the bus marks the outage, keeps probing
(its ping is never refused by the bus's fail-fast gate, so it is what ends the outage on the
gateway side), and turns true again once the bus answers and a worker's heartbeat is back."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from voxgate.contract.bus.base import Bus, BusError

log = logging.getLogger("voxgate.readiness")


class WorkerReadiness:
    def __init__(self, bus: Bus, *, period_s: float = 1.0, fast_period_s: float = 0.1) -> None:
        self.bus = bus
        self.period_s = period_s
        self.fast_period_s = fast_period_s
        self.bus_ok = False
        self.workers = 0
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        # The bus's own outage bookkeeping counts too: the moment any operation finds Redis
        # gone (the audio reader's blocking XREAD sees the connection drop at once), SIP
        # answers 503, without waiting for this view's next period.
        return self._ready.is_set() and self.bus.health.up

    async def refresh(self) -> bool:
        """Ask the bus now; returns (and keeps) whether a warmed worker is serving."""
        try:
            bus_ok = await self.bus.ping()
            workers = await self.bus.ready_workers() if bus_ok else []
        except BusError:
            bus_ok, workers = False, []
        was = self.ready
        self.bus_ok, self.workers = bus_ok, len(workers)
        if bus_ok and workers:
            self._ready.set()
        else:
            self._ready.clear()
        if was != self.ready:
            log.info("gateway %s (bus %s, %d ready workers)",
                     "ready" if self.ready else "not ready: no warmed worker",
                     "up" if bus_ok else "down", self.workers)  # fmt: skip
        return self.ready

    async def wait(self, timeout_s: float) -> bool:
        """Until ready or ``timeout_s`` passes; whether it is ready."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        return self.ready

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="readiness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                # Whatever the bus raised, this view must go on: not ready until it answers.
                log.exception("readiness check failed")
                self._ready.clear()
            await asyncio.sleep(self.period_s if self.ready else self.fast_period_s)
