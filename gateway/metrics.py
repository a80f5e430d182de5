"""Prometheus metrics of the gateway, served on ``GET /metrics`` (outside ``/api/``: no token).

Pull-style: one ``CollectorRegistry`` per ``GatewayMetrics`` (never the global default: tests
run many gateways in one process). A custom collector reads live state at scrape time — the
calls in ``CallManager.calls``, their playout stats and their leg's media counters — and adds
what calls that have ended left behind. Latencies come from the call events
(``CallManager.subscribe_events``: barge-in, worker stop, utterance outcomes) and one hook
per utterance (time to first audio); nothing is counted on the media tick.

Per-leg media counters: every leg implements ``media_stats() -> dict[str, float]`` (the
``Leg`` protocol) with the keys of ``MEDIA_COUNTERS`` (cumulative counts) and
``"jitter_buffer_ms"`` (depth now); missing keys count as 0. When a call ends its last values
are added to the totals, so counters never go backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.agents.stream import StreamStats
from gateway.call.calls import Call
from gateway.call.control import (
    AgentError,
    AgentTurn,
    BargeIn,
    CampaignEvent,
    Event,
    LegKind,
    UtteranceFinished,
    WorkerStopped,
)
from gateway.call.manager import CallManager
from gateway.campaign.outcomes import Outcome
from gateway.legs.sip.tls import FAILURE_REASONS as TLS_FAILURE_REASONS
from gateway.media.recording import ERROR_CODES as RECORDING_ERROR_CODES
from gateway.sip.access import OUTCOMES as SIP_ACCESS_OUTCOMES
from gateway.sip.limits import REASONS as SIP_REFUSAL_REASONS
from voxgate.contract.bus.base import Bus, BusError
from voxgate.contract.metrics import CONTENT_TYPE, render_registry

log = logging.getLogger("voxgate.metrics")

LEGS: tuple[str, ...] = typing.get_args(LegKind)
# Cumulative per-leg media counters (``media_stats`` keys) -> exported counter name.
MEDIA_COUNTERS: dict[str, tuple[str, str]] = {
    "packets_received": ("voxgate_rtp_packets_received", "RTP packets received from callers"),
    "packets_lost": ("voxgate_rtp_packets_lost", "RTP packets lost on the way in (RFC 3550)"),
    "late_sends": (
        "voxgate_rtp_late_sends",
        "RTP packets sent later than half a frame after their due time (or ticks skipped)",
    ),
    # SIP legs with SRTP (gateway.rtp.srtp): inbound packets dropped, never played.
    "srtp_auth_failures": (
        "voxgate_srtp_auth_failures",
        "SRTP/SRTCP packets dropped because they did not authenticate (wrong key, tampered)",
    ),
    "srtp_replays": (
        "voxgate_srtp_replays",
        "SRTP packets dropped as replays (an index seen before or older than the window)",
    ),
}
JITTER_KEY = "jitter_buffer_ms"

AGENT_ERROR_KINDS = (
    "llm_timeout", "llm_unreachable", "llm_status", "llm_malformed", "tool", "stt",
    # The stream bridge (gateway.agents.stream): connecting, then the bot's messages.
    "stream_timeout", "stream_handshake", "stream_tls", "stream_unreachable", "stream_lost",
    "stream_malformed", "stream_event", "stream_too_big", "stream_flood", "stream_stalled",
    "stream_overflow", "stream_internal",
    "other",
)  # fmt: skip
# What crossed bot bridges (``StreamStats`` fields) -> exported counter name, help, scale.
BRIDGE_COUNTERS: dict[str, tuple[str, str, float]] = {
    "media_sent": ("voxgate_bridge_media_sent", "Caller frames (20 ms) sent to bots", 1.0),
    "media_dropped": (
        "voxgate_bridge_media_dropped",
        "Caller frames dropped because a bot did not read its socket in time", 1.0,
    ),
    "dtmf_sent": ("voxgate_bridge_dtmf_sent", "Keys sent to bots", 1.0),
    "media_received": ("voxgate_bridge_media_received", "media messages received from bots", 1.0),
    "samples_received": (
        "voxgate_bridge_audio_received_seconds", "Bot audio received (seconds of 8 kHz)", 1 / 8000,
    ),
    "samples_dropped": (
        "voxgate_bridge_audio_dropped_seconds",
        "Bot audio dropped over the buffer cap (seconds, at the call's rate)", 0.0,
    ),
    "clears": ("voxgate_bridge_clears", "clear messages from bots (the agent cut off)", 1.0),
    "marks_echoed": ("voxgate_bridge_marks_echoed", "mark messages echoed back to bots", 1.0),
}  # fmt: skip
STT_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)

# End reasons are free text (a SIP status line of the far end among them): bucket them.
CALL_OUTCOMES = (
    "remote_hangup", "local_hangup", "cancelled", "rejected", "timeout", "error", "shutdown",
    "other",
)  # fmt: skip
_REASONS = {
    "remote hangup": "remote_hangup",
    "api": "local_hangup",
    "agent": "local_hangup",
    "ivr": "local_hangup",
    "cancelled": "cancelled",
    "shutdown": "shutdown",
    "timeout": "timeout",
    "no ack": "timeout",
    "media timeout": "timeout",
    # Browser legs (gateway.legs.webrtc): the peer connection closed by the page is its BYE.
    "connection closed": "remote_hangup",
    "connection failed": "error",
    "connect timeout": "timeout",
    "bad offer": "rejected",
    "unreachable": "error",
}
UTTERANCE_OUTCOMES = ("done", "interrupted", "cancelled", "error")

TTFA_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
STOP_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5)
ONSET_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0)
WORKER_STOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
PENDING_TIMEOUT_S = 2.0
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_OUTCOMES = frozenset(o.value for o in Outcome)


def call_outcome(reason: str | None) -> str:
    """An end reason bucketed to ``CALL_OUTCOMES`` (a fixed, small label set)."""
    text = (reason or "").strip().lower()
    if text in _REASONS:
        return _REASONS[text]
    if re.match(r"[3-6]\d\d\b", text):
        return "rejected"  # a final non-2xx answer to our INVITE
    if "timeout" in text:
        return "timeout"
    if "error" in text or text.startswith("bad ") or "unusable" in text:
        return "error"
    return "other"


class GatewayMetrics:
    """The gateway's registry; ``handle`` is the aiohttp handler of ``GET /metrics``."""

    def __init__(self, manager: CallManager, bus: Bus) -> None:
        self.manager = manager
        self.bus = bus
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttfa = Histogram(
            "voxgate_time_to_first_audio_seconds",
            "say() to the first audio frame of that utterance played to the caller",
            buckets=TTFA_BUCKETS, registry=r,
        )  # fmt: skip
        self.bargein_stop = Histogram(
            "voxgate_bargein_stop_latency_seconds",
            "Barge-in: VAD decision to the agent's audio at zero (media time)",
            buckets=STOP_BUCKETS, registry=r,
        )  # fmt: skip
        self.bargein_onset = Histogram(
            "voxgate_bargein_onset_to_zero_seconds",
            "Barge-in: estimated onset of the caller's speech to the agent's audio at zero",
            buckets=ONSET_BUCKETS, registry=r,
        )  # fmt: skip
        self.bargeins = Counter("voxgate_bargein", "Barge-ins (the agent was talked over)",
                                registry=r)  # fmt: skip
        self.worker_stop = Histogram(
            "voxgate_worker_stop_seconds",
            "Cancel of an interrupted utterance to the worker's acknowledgement (wall clock)",
            buckets=WORKER_STOP_BUCKETS, registry=r,
        )  # fmt: skip
        self.utterances = Counter(
            "voxgate_utterances", "Utterances finished on calls, by outcome",
            labelnames=("outcome",), registry=r,
        )  # fmt: skip
        for outcome in UTTERANCE_OUTCOMES:
            self.utterances.labels(outcome)
        # Conversational agents (gateway.agents.llm): turns, where their time goes, fallbacks.
        self.agent_turns = Counter(
            "voxgate_agent_turns", "Caller turns answered by an agent, by what ended the turn "
            "(model: the end-of-turn model; silence; cut: a monologue split)",
            labelnames=("outcome",), registry=r,
        )  # fmt: skip
        for reason in ("model", "silence", "cut", "hangup"):
            self.agent_turns.labels(reason)
        self.agent_stt = Histogram(
            "voxgate_agent_stt_seconds", "Speech-to-text compute for a caller turn's transcript",
            buckets=STT_BUCKETS, registry=r,
        )  # fmt: skip
        self.agent_first_token = Histogram(
            "voxgate_agent_llm_first_token_seconds",
            "End of the caller's turn to the model's first token",
            buckets=STT_BUCKETS, registry=r,
        )  # fmt: skip
        self.agent_errors = Counter(
            "voxgate_agent_errors", "Agent fallbacks taken, by code (llm_timeout, "
            "llm_unreachable, llm_status, llm_malformed, tool, stt)",
            labelnames=("code",), registry=r,
        )  # fmt: skip
        for kind in AGENT_ERROR_KINDS:
            self.agent_errors.labels(kind)
        # Outbound campaigns (gateway.campaign), from their events: no campaign label (ids are
        # unbounded); the outcome label is the fixed set of attempt outcomes.
        self.campaign_dialled = Counter(
            "voxgate_campaign_dialled", "Campaign attempts dialled by this gateway", registry=r,
        )  # fmt: skip
        self.campaign_answered = Counter(
            "voxgate_campaign_answered", "Campaign attempts answered (by a person or a machine)",
            registry=r,
        )  # fmt: skip
        self.campaign_outcomes = Counter(
            "voxgate_campaign_outcome", "Campaign attempts ended, by outcome",
            labelnames=("outcome",), registry=r,
        )  # fmt: skip
        for o in Outcome:
            self.campaign_outcomes.labels(o.value)
        self.campaign_in_flight = Gauge(
            "voxgate_campaign_in_flight", "Campaign calls this gateway has up now", registry=r,
        )  # fmt: skip
        # Totals left by ended calls: (leg, outcome) -> calls; (leg, key) -> media counters.
        self._ended_calls: dict[tuple[str, str], int] = {}
        self._ended_media: dict[tuple[str, str], float] = {}
        self._ended_bridge: dict[str, float] = {}
        # Highest value seen per live call and counter, so a counter a leg recomputes (loss
        # goes down when a late packet turns up) never makes the total go backwards.
        self._seen: dict[str, dict[str, float]] = {}
        self._lag: float | None = None
        self._pending: float | None = None
        self._refreshers: list[Callable[[], Awaitable[None]]] = [self._refresh_bus]
        # The SIP user agent's admission state (gateway.sip.limits), read at scrape time.
        self._sip_refused: Callable[[], Mapping[str, int]] | None = None
        self._sip_transactions: Callable[[], int] | None = None
        self._sip_tls_failures: Callable[[], Mapping[str, int]] | None = None
        self._sip_access: Callable[[], Mapping[str, int]] | None = None
        r.register(_LiveCollector(self))
        r.register(_RecordingCollector(manager))
        r.register(_ProcessCollector(self))
        r.register(_BusCollector(bus))
        manager.on_forget.append(self._on_forget)
        manager.on_first_audio.append(self._on_first_audio)
        self._events = manager.subscribe_events()
        self._task: asyncio.Task[None] | None = None
        # The loop whose tasks voxgate_asyncio_tasks counts (set by start()).
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._consume(), name="gateway-metrics"
            )

    async def close(self) -> None:
        await self._events.aclose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def watch_campaigns(self, in_flight: Callable[[], int]) -> None:
        """Read the campaign calls up now from ``in_flight`` at each scrape
        (``CampaignService.in_flight``)."""
        self.campaign_in_flight.set_function(lambda: float(in_flight()))

    def watch_sip(
        self,
        refused: Callable[[], Mapping[str, int]],
        transactions: Callable[[], int],
        tls_failures: Callable[[], Mapping[str, int]] | None = None,
        access: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """Read the SIP requests refused so far, by reason, and the transactions held now at
        each scrape (``SourceLimits.refused_counts``, ``TransactionLayer.transaction_count``);
        ``access``: who-may-call outcomes so far (``Gatekeeper.counts``)."""
        self._sip_refused, self._sip_transactions = refused, transactions
        self._sip_tls_failures = tls_failures  # by reason (gateway.legs.sip.tls)
        self._sip_access = access

    def add_refresher(self, refresh: Callable[[], Awaitable[None]]) -> None:
        """Run ``refresh`` before each scrape (e.g. an embedded worker's metrics)."""
        self._refreshers.append(refresh)

    # --- the scrape ----------------------------------------------------------------------
    async def render(self) -> bytes:
        for refresh in self._refreshers:
            try:
                await refresh()
            except Exception:  # a scrape must answer whatever one source does
                log.exception("metrics refresh failed")
        return render_registry(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        body = await self.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _refresh_bus(self) -> None:
        try:
            lag, pending = await asyncio.wait_for(self.bus.pending(), PENDING_TIMEOUT_S)
        except (BusError, TimeoutError):
            self._lag = self._pending = None
            return
        self._lag, self._pending = float(lag), float(pending)

    # --- hooks and events ----------------------------------------------------------------
    def _on_first_audio(self, call: Call, seconds: float) -> None:
        self.ttfa.observe(seconds)

    def _on_forget(self, call: Call) -> None:
        leg_kind = call.info.leg
        key = (leg_kind, call_outcome(call.info.end_reason))
        self._ended_calls[key] = self._ended_calls.get(key, 0) + 1
        final = self._call_counters(call)
        for name, value in final.items():
            k = (leg_kind, name)
            self._ended_media[k] = self._ended_media.get(k, 0.0) + value
        self._seen.pop(call.id, None)
        for name, count in bridge_counters(call).items():
            self._ended_bridge[name] = self._ended_bridge.get(name, 0.0) + count

    async def _consume(self) -> None:
        async for event in self._events:
            try:
                self.on_event(event)
            except Exception:
                log.exception("metrics: event %s not counted", event.type)

    def on_event(self, event: Event) -> None:
        if isinstance(event, BargeIn):
            self.bargeins.inc()
            self.bargein_stop.observe(max(event.zero_ms - event.decision_ms, 0.0) / 1000)
            self.bargein_onset.observe(max(event.zero_ms - event.onset_ms, 0.0) / 1000)
        elif isinstance(event, WorkerStopped):
            self.worker_stop.observe(event.stop_ms / 1000)
        elif isinstance(event, UtteranceFinished):
            outcome = event.outcome if event.outcome in UTTERANCE_OUTCOMES else "error"
            self.utterances.labels(outcome).inc()
        elif isinstance(event, AgentTurn):
            self.agent_turns.labels(event.reason or "other").inc()
            self.agent_stt.observe(event.stt_ms / 1000)
            if event.first_token_at is not None:
                self.agent_first_token.observe(max(event.first_token_at - event.decided_at, 0.0))
        elif isinstance(event, AgentError):
            kind = event.kind if event.kind in AGENT_ERROR_KINDS else "other"
            self.agent_errors.labels(kind).inc()
        elif isinstance(event, CampaignEvent):
            self._on_campaign(event)

    def _on_campaign(self, event: CampaignEvent) -> None:
        if event.type == "campaign.dial":
            self.campaign_dialled.inc()
        elif event.type == "campaign.attempt" and event.outcome is not None:
            outcome = event.outcome if event.outcome in _OUTCOMES else Outcome.FAILED.value
            self.campaign_outcomes.labels(outcome).inc()
            if outcome in (Outcome.HUMAN, Outcome.MACHINE):
                self.campaign_answered.inc()

    # --- reading calls -------------------------------------------------------------------
    def _call_counters(self, call: Call, stats: dict[str, float] | None = None) -> dict[str, float]:
        """The call's cumulative counters now (never below what was reported before);
        ``stats``: its leg's ``media_stats()`` if already read."""
        seen = self._seen.setdefault(call.id, {})
        current: dict[str, float] = {"underruns": float(call.playout.stats.underruns)}
        if stats is None:
            stats = leg_media_stats(call)
        if stats is not None:
            for key in MEDIA_COUNTERS:
                current[key] = float(stats.get(key, 0.0))
        for key, value in current.items():
            if value > seen.get(key, 0.0):
                seen[key] = value
        return dict(seen)

    def collect_live(self) -> Iterator[Metric]:
        active = {leg: 0 for leg in LEGS}
        media = dict(self._ended_media)
        depths: list[float] = []
        bridge = dict(self._ended_bridge)
        bridged = 0
        for call in list(self.manager.calls.values()):
            leg_kind: str = call.info.leg
            if (counts := bridge_counters(call)) and call.info.state != "ended":
                bridged += 1
            for key, value in counts.items():
                bridge[key] = bridge.get(key, 0.0) + value
            if call.info.state != "ended":
                active[leg_kind] = active.get(leg_kind, 0) + 1
            stats = leg_media_stats(call)
            for name, value in self._call_counters(call, stats).items():
                media[(leg_kind, name)] = media.get((leg_kind, name), 0.0) + value
            if stats is not None and JITTER_KEY in stats:
                depths.append(float(stats[JITTER_KEY]) / 1000)

        g = GaugeMetricFamily("voxgate_calls_active", "Calls up now (ringing, answered or held)",
                              labels=["leg"])  # fmt: skip
        for leg_kind, n in sorted(active.items()):
            g.add_metric([leg_kind], n)
        yield g
        c = CounterMetricFamily("voxgate_calls", "Calls ended, by leg and outcome (bucketed "
                                "end reason)", labels=["leg", "outcome"])  # fmt: skip
        legs = sorted(set(LEGS) | {leg for leg, _ in self._ended_calls})
        for leg_kind in legs:
            for outcome in CALL_OUTCOMES:
                c.add_metric([leg_kind, outcome], self._ended_calls.get((leg_kind, outcome), 0))
        yield c
        legs = sorted(set(LEGS) | {leg for leg, _ in media})
        c = CounterMetricFamily(
            "voxgate_playout_underruns",
            "20 ms frames of silence sent mid-utterance because the worker was behind",
            labels=["leg"],
        )
        for leg_kind in legs:
            c.add_metric([leg_kind], media.get((leg_kind, "underruns"), 0.0))
        yield c
        for key, (name, doc) in MEDIA_COUNTERS.items():
            c = CounterMetricFamily(name, doc, labels=["leg"])
            for leg_kind in legs:
                c.add_metric([leg_kind], media.get((leg_kind, key), 0.0))
            yield c
        yield GaugeMetricFamily(
            "voxgate_bridge_calls_active", "Calls bridged to a bot's WebSocket now", value=bridged
        )
        for key, (name, doc, _) in BRIDGE_COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=bridge.get(key, 0.0))
        yield GaugeMetricFamily(
            "voxgate_jitter_buffer_depth_seconds",
            "Mean inbound jitter-buffer depth over the calls up now that play the caller out "
            "(recorded or bridged; agents hear on arrival, so a plain call's buffer rests)",
            value=sum(depths) / len(depths) if depths else 0.0,
        )
        yield GaugeMetricFamily(
            "voxgate_jitter_buffer_depth_max_seconds",
            "Deepest inbound jitter buffer among the calls up now that play the caller out",
            value=max(depths, default=0.0),
        )
        if self._sip_refused is not None and self._sip_transactions is not None:
            refused = self._sip_refused()
            c = CounterMetricFamily(
                "voxgate_sip_requests_refused",
                "New SIP requests refused before any transaction (503 or dropped), by reason: "
                "rate (per-source token bucket), calls (per-source cap), lockout (failed "
                "authentication), table (max_transactions)",
                labels=["reason"],
            )
            for reason in sorted(set(SIP_REFUSAL_REASONS) | set(refused)):
                c.add_metric([reason], float(refused.get(reason, 0)))
            yield c
            yield GaugeMetricFamily(
                "voxgate_sip_transactions", "SIP transactions held now (client and server)",
                value=self._sip_transactions(),
            )  # fmt: skip
        if self._sip_access is not None:
            # An operator's view of who tried to call: a climbing failed/locked_out/forbidden
            # is a scan or a brute force, a climbing stale is phones with a slow clock.
            outcomes = self._sip_access()
            c = CounterMetricFamily(
                "voxgate_sip_access",
                "Who-may-call decisions on new SIP requests, by outcome: admitted_trunk "
                "(allow-listed source), admitted_user (digest verified), challenged (401/407 "
                "sent), failed (wrong credentials or unknown user), stale, replayed, malformed, "
                "forbidden (403: not allowed), locked_out (403: too many failures), registered",
                labels=["outcome"],
            )
            for outcome in sorted(set(SIP_ACCESS_OUTCOMES) | set(outcomes)):
                c.add_metric([outcome], float(outcomes.get(outcome, 0)))
            yield c
        if self._sip_tls_failures is not None:
            failures = self._sip_tls_failures()
            c = CounterMetricFamily(
                "voxgate_sip_tls_failures",
                "SIP TLS connections that failed their handshake, in or out, by reason: "
                "plaintext (not TLS on the TLS port), certificate (untrusted, expired, wrong "
                "name or missing), protocol (below TLS 1.2, no common cipher), timeout, "
                "closed, other",
                labels=["reason"],
            )
            for reason in sorted(set(TLS_FAILURE_REASONS) | set(failures)):
                c.add_metric([reason], float(failures.get(reason, 0)))
            yield c
        if self._lag is not None and self._pending is not None:
            yield GaugeMetricFamily(
                "voxgate_synth_request_stream_lag",
                "Speak requests on the bus not yet delivered to any worker",
                value=self._lag,
            )
            yield GaugeMetricFamily(
                "voxgate_synth_request_stream_pending",
                "Speak requests delivered to a worker and not yet acknowledged",
                value=self._pending,
            )


def leg_media_stats(call: Call) -> dict[str, float] | None:
    leg = call.leg
    if leg is None:
        return None
    try:
        return leg.media_stats()
    except Exception:  # a broken leg must not break the scrape
        log.exception("media_stats failed on call %s", call.id)
        return None


def bridge_counters(call: Call) -> dict[str, float]:
    """What the call's bot bridge has carried so far (``BRIDGE_COUNTERS`` keys, scaled); empty
    when its agent is not a bridge."""
    stats = getattr(call.agent, "stats", None)
    if not isinstance(stats, StreamStats):
        return {}
    out: dict[str, float] = {}
    for key, (_, _, scale) in BRIDGE_COUNTERS.items():
        # Dropped bot audio is counted at the call's rate (a browser leg's is 48 kHz).
        unit = scale or 1.0 / call.rate
        out[key] = getattr(stats, key) * unit
    return out


class _LiveCollector:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self._metrics.collect_live())

    def describe(self) -> Iterable[Metric]:
        # Names only (the registry refuses duplicates across collectors by these).
        names = [
            ("voxgate_calls_active", "gauge"), ("voxgate_calls", "counter"),
            ("voxgate_playout_underruns", "counter"),
            *((name, "counter") for name, _ in MEDIA_COUNTERS.values()),
            ("voxgate_jitter_buffer_depth_seconds", "gauge"),
            ("voxgate_jitter_buffer_depth_max_seconds", "gauge"),
            ("voxgate_synth_request_stream_lag", "gauge"),
            ("voxgate_synth_request_stream_pending", "gauge"),
            ("voxgate_sip_requests_refused", "counter"), ("voxgate_sip_transactions", "gauge"),
        ]  # fmt: skip
        return [Metric(name, "", typ) for name, typ in names]


class _RecordingCollector:
    """Call recording (``gateway.media.recording``), read from the writer's counters at scrape
    time: recordings being written, bytes written, frames dropped on a full queue, and the
    recordings that failed, by ``code`` (disk_full, permission, io)."""

    def __init__(self, manager: CallManager) -> None:
        self._manager = manager

    def collect(self) -> Iterable[Metric]:
        rec = self._manager.recordings
        yield GaugeMetricFamily(
            "voxgate_recordings_active", "Call recordings being written now",
            value=rec.active if rec is not None else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "voxgate_recording_written_bytes", "Audio bytes written to call recordings",
            value=rec.bytes_written if rec is not None else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "voxgate_recording_dropped_frames",
            "Frames a call recording dropped because its writer fell max_queue_s behind",
            value=rec.frames_dropped if rec is not None else 0,
        )
        errors = CounterMetricFamily(
            "voxgate_recording_errors",
            "Call recordings stopped by a disk error, by code (disk_full, permission, io); "
            "the calls went on",
            labels=["code"],
        )
        for code in RECORDING_ERROR_CODES:
            errors.add_metric([code], rec.errors.get(code, 0) if rec is not None else 0)
        yield errors

    def describe(self) -> Iterable[Metric]:
        names = [
            ("voxgate_recordings_active", "gauge"), ("voxgate_recording_written_bytes", "counter"),
            ("voxgate_recording_dropped_frames", "counter"),
            ("voxgate_recording_errors", "counter"),
        ]  # fmt: skip
        return [Metric(name, "", typ) for name, typ in names]


class _ProcessCollector:
    """What a soak watches for leaks, read at scrape time from this process: asyncio tasks on
    the gateway's loop, open file descriptors and resident memory (Linux ``/proc``; elsewhere
    the two process gauges read 0). Named ``voxgate_*`` rather than prometheus-client's
    ``process_*`` collector so one gateway's page keeps one naming scheme; a scrape costs one
    directory listing and one small file read."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        loop = self._metrics._loop
        tasks = 0
        if loop is not None and not loop.is_closed():
            tasks = len(asyncio.all_tasks(loop))
        yield GaugeMetricFamily(
            "voxgate_asyncio_tasks", "asyncio tasks alive on the gateway's event loop now",
            value=tasks,
        )  # fmt: skip
        fds = 0
        with contextlib.suppress(OSError):
            fds = len(os.listdir("/proc/self/fd"))
        yield GaugeMetricFamily(
            "voxgate_process_open_fds", "File descriptors the gateway process has open now",
            value=fds,
        )  # fmt: skip
        rss = 0
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * _PAGE_SIZE  # resident pages (proc(5))
        yield GaugeMetricFamily(
            "voxgate_process_resident_memory_bytes", "Resident memory of the gateway process",
            value=rss,
        )  # fmt: skip

    def describe(self) -> Iterable[Metric]:
        names = (
            "voxgate_asyncio_tasks", "voxgate_process_open_fds",
            "voxgate_process_resident_memory_bytes",
        )  # fmt: skip
        return [Metric(name, "", "gauge") for name in names]


class _BusCollector:
    """The bus connection's outages (``Bus.health``, voxgate.contract.bus.health), read at
    scrape time: whether Redis answers now, outages it came back from, and the seconds it did
    not answer (the current outage included, so the counter moves while it lasts)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    def collect(self) -> Iterable[Metric]:
        health = self._bus.health
        now = time.monotonic()
        yield GaugeMetricFamily(
            "voxgate_bus_up", "1 while the bus (Redis) answers, 0 during an outage",
            value=1.0 if health.up else 0.0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "voxgate_bus_reconnects", "Bus outages ended by Redis answering again",
            value=health.reconnects,
        )  # fmt: skip
        yield CounterMetricFamily(
            "voxgate_bus_outage_seconds", "Seconds the bus (Redis) did not answer",
            value=health.outage_seconds(now),
        )  # fmt: skip

    def describe(self) -> Iterable[Metric]:
        return [
            Metric("voxgate_bus_up", "", "gauge"),
            Metric("voxgate_bus_reconnects", "", "counter"),
            Metric("voxgate_bus_outage_seconds", "", "counter"),
        ]
