"""The gateway process: SIP user agent, media ticker, calls with their agents, control API.

``voxgate gateway --redis URL`` runs it alone against workers elsewhere; ``voxgate serve``
(:mod:`voxgate.serve`) runs it with an in-process worker over the in-memory bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.agents.registry import AgentRegistry
from gateway.api.campaigns import campaign_routes
from gateway.api.recordings import recording_routes
from gateway.api.routes import check_bind_safety, make_app, start_api, stop_api
from gateway.call.manager import CallManager
from gateway.campaign.service import CampaignService
from gateway.legs.sip.register import Registrar
from gateway.legs.sip.ua import SipUA, resolve_uri
from gateway.legs.webrtc.service import WebRtcService
from gateway.media.recording import Recordings
from gateway.metrics import GatewayMetrics
from gateway.readiness import WorkerReadiness
from gateway.rtp.endpoint import MediaTicker
from gateway.rtp.timerfd import TimerFd
from gateway.sip import parse_uri
from gateway.sip.events import SipEvent
from voxgate.contract.bus.base import Bus
from voxgate.contract.config import Config, ConfigError, parse_hostport
from voxgate.contract.runtime import build_bus, install_stop_signals

log = logging.getLogger("voxgate.gateway")


class Gateway:
    def __init__(self, cfg: Config, bus: Bus) -> None:
        self.cfg = cfg
        self.bus = bus
        # The key is read from the environment variable [llm] api_key_env names, now: a
        # missing one stops the start with one line, not the first call.
        api_key = cfg.llm.api_key() if cfg.llm.base_url else None
        self.agents = AgentRegistry(cfg, api_key=api_key)
        self.manager = CallManager(
            bus, self.agents.default, max_calls=cfg.gateway.max_calls,
            max_text_chars=cfg.synth.max_text_chars, bargein=cfg.bargein,
            synth_timeout_s=cfg.worker.default_deadline_s + 2.0,
        )  # fmt: skip
        self.manager.agents = self.agents
        # Call recording: one writer thread for every call's WAV (gateway.media.recording).
        self.recordings = Recordings(cfg.recording)
        self.manager.recordings = self.recordings
        if cfg.gateway.media_timer == "timerfd" and not TimerFd.available():
            raise ConfigError("gateway.media_timer: 'timerfd' needs Linux's timerfd; use 'auto'")
        self.ticker = MediaTicker(timer=cfg.gateway.media_timer)
        self.readiness = WorkerReadiness(bus)
        self.ua = SipUA(cfg.gateway, self.manager, self.ticker, self.readiness)
        # Browser calls run at the worker's wideband rate (no telephone band limit).
        self.webrtc = WebRtcService(self.manager, cfg.webrtc, rate=cfg.synth.wideband_rate)
        self.runner: web.AppRunner | None = None
        self.registrar: Registrar | None = None
        self.http_port = 0
        # Prometheus /metrics (outside /api/: no token, like /healthz and /readyz).
        self.metrics = GatewayMetrics(self.manager, bus)
        # Outbound campaigns (gateway.campaign.service): their store is opened in start().
        self.campaigns = CampaignService(cfg, self.manager)
        self.metrics.watch_campaigns(self.campaigns.in_flight)
        self.metrics.watch_sip(
            self.ua.limits.refused_counts,
            self._sip_transactions,
            self._sip_tls_failures,
            access=lambda: self.ua.gate.counts,
        )

    def _sip_transactions(self) -> int:
        return self.ua.layer.transaction_count

    def _sip_tls_failures(self) -> dict[str, int]:
        transport = getattr(self.ua, "transport", None)  # set by SipUA.start
        return transport.tls_failures if transport is not None else {}

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready when the bus answers and at least one warmed-up worker is serving (asked now;
        SIP reads the same view, kept fresh in the background)."""
        ready = await self.readiness.refresh()
        body = {
            "ready": ready,
            "bus": self.readiness.bus_ok,
            "workers": self.readiness.workers,
            "calls": len(self.manager.calls),
        }
        return web.json_response(body, status=200 if ready else 503)

    async def start(self) -> None:
        g = self.cfg.gateway
        host, port = parse_hostport("gateway.http_listen", g.http_listen)
        check_bind_safety(host, g.api_token or None)  # before anything listens
        try:
            await self.agents.warm()  # the default agent's models, before any call is taken
        except RuntimeError as exc:  # the speech-to-text / end-of-turn model is missing
            raise ConfigError(f"agent.kind: {exc}") from None
        self.readiness.start()
        await self.readiness.refresh()
        await self.ua.start()
        if g.register:
            await self._start_registration()
        # After the UA: resumed campaigns dial at once; the bound SIP port names this gateway.
        await self.campaigns.start(sip_port=self.ua.transport.port)
        app = make_app(
            self.manager, token=g.api_token or None, max_text_chars=self.cfg.synth.max_text_chars,
            extra_routes=[web.get("/readyz", self.readyz), web.get("/metrics", self.metrics.handle),
                          *self.webrtc.routes(), *recording_routes(self.manager),
                          *campaign_routes(self.campaigns)],
            twilio_account_sid=self.cfg.stream.account_sid or None,
        )  # fmt: skip
        self.metrics.start()
        self.recordings.start()
        self.runner = await start_api(app, host, port)
        addresses = self.runner.addresses
        self.http_port = int(addresses[0][1]) if addresses else port
        log.info("control API on http://%s:%d", host, self.http_port)

    async def _start_registration(self) -> None:
        g = self.cfg.gateway
        peer = resolve_uri(parse_uri(g.trunk), None)
        registrar = Registrar(
            self.ua.transport, registrar=g.trunk, peer=peer, user=g.from_user,
            local_ip=self.ua.local_address(peer[0]), expires_s=g.register_expires_s,
            username=g.trunk_username, password=g.trunk_password,
        )  # fmt: skip
        ua_handler = self.ua.transport.handler

        def handler(event: SipEvent) -> None:
            # REGISTER responses go to the registrar; everything else to the user agent.
            if not registrar.on_event(event):
                ua_handler(event)

        self.ua.transport.handler = handler
        self.registrar = registrar
        await registrar.start()

    async def close(self) -> None:
        if self.registrar is not None:
            await self.registrar.close()
        await self.webrtc.close()
        await self.campaigns.close()  # no new dials; the UA's close ends the live calls
        await self.ua.close()
        await self.recordings.close()  # the calls have ended: their files are finalised
        await self.readiness.close()
        self.ticker.close()
        if self.runner is not None:
            await stop_api(self.runner)
        await self.metrics.close()
        await self.agents.close()


# Something run beside the gateway in its process (``voxgate serve``: a worker): started once the
# bus is up and before the gateway listens; returns the task to await at shutdown.
Companion = Callable[["Gateway", asyncio.Event], Awaitable["asyncio.Task[None] | None"]]


async def run_gateway(cfg: Config, *, companion: Companion | None = None) -> int:
    """Run a gateway until SIGINT/SIGTERM (and ``companion`` beside it)."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    bus = build_bus(cfg)
    await bus.start()
    task: asyncio.Task[None] | None = None
    gw = Gateway(cfg, bus)
    try:
        # The gateway listens first: while a companion worker loads its engine (seconds on a
        # cold graph cache), SIP OPTIONS and INVITE get 503 with Retry-After and /readyz 503,
        # where a port that does not answer yet would look like a dead host to a dispatcher.
        await gw.start()
        if companion is not None:
            task = await companion(gw, stop)
        # Everything loaded so far (models, tables, the codebase) lives as long as the process:
        # out of the collector's reach, a full collection no longer walks it and stalls the
        # media ticker for hundreds of ms (a gen-2 pass over a heap with the speech models).
        gc.collect()
        gc.freeze()
        log.info("gateway ready: SIP %s, HTTP %s", cfg.gateway.sip_listen, cfg.gateway.http_listen)
        await stop.wait()
    finally:
        await gw.close()
        stop.set()
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        await bus.close()
    return 0
