"""GatewayMetrics without a network: fake legs, events published by hand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.agents.stream import StreamStats
from gateway.call.control import BargeIn, UtteranceFinished, WorkerStopped
from gateway.call.manager import CallManager
from gateway.metrics import CALL_OUTCOMES, GatewayMetrics, call_outcome
from tests.metrics.conftest import Scrape, parse_scrape
from voxgate.contract.bus.memory import MemoryBus


class FakeLeg:
    """A leg with media counters the test sets (a SIP or WebRTC leg's ``media_stats``)."""

    def __init__(self) -> None:
        self.stats: dict[str, float] = {}
        self.calls = 0

    def media_stats(self) -> dict[str, float]:
        self.calls += 1
        return dict(self.stats)

    async def hangup(self, reason: str) -> None: ...

    async def send_dtmf(self, digits: str) -> None: ...


class NoStatsLeg:
    """A leg that measures nothing (its media_stats is empty)."""

    async def hangup(self, reason: str) -> None: ...

    async def send_dtmf(self, digits: str) -> None: ...

    def media_stats(self) -> dict[str, float]:
        return {}


async def render(m: GatewayMetrics) -> Scrape:
    await asyncio.sleep(0)  # let the event consumer run
    await asyncio.sleep(0)
    return parse_scrape((await m.render()).decode())


@pytest.fixture
async def setup() -> AsyncIterator[tuple[CallManager, GatewayMetrics]]:
    bus = MemoryBus()
    await bus.start()
    manager = CallManager(bus, None)
    metrics = GatewayMetrics(manager, bus)
    metrics.start()
    yield manager, metrics
    await metrics.close()
    await bus.close()


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [
        ("remote hangup", "remote_hangup"),
        ("api", "local_hangup"),
        ("ivr", "local_hangup"),
        ("agent", "local_hangup"),
        ("cancelled", "cancelled"),
        ("486 Busy Here", "rejected"),
        ("603 Decline", "rejected"),
        ("timeout", "timeout"),
        ("no ACK", "timeout"),
        ("agent error", "error"),
        ("bad SDP answer in ACK", "error"),
        ("shutdown", "shutdown"),
        (None, "other"),
        ("something a peer made up " + "x" * 200, "other"),
    ],
)
def test_end_reasons_are_bucketed(reason: str | None, outcome: str) -> None:
    assert call_outcome(reason) == outcome
    assert outcome in CALL_OUTCOMES


async def test_counters_survive_the_end_of_a_call(
    setup: tuple[CallManager, GatewayMetrics],
) -> None:
    manager, metrics = setup
    a = manager.new_call("sip", "inbound", "sip:a@x", "sip:ivr@y")
    b = manager.new_call("webrtc", "inbound", "browser", "gw")
    c = manager.new_call("sip", "inbound", "sip:c@x", "sip:ivr@y")
    leg_a, leg_b = FakeLeg(), FakeLeg()
    a.leg, b.leg, c.leg = leg_a, leg_b, NoStatsLeg()
    leg_a.stats = {"packets_received": 100, "packets_lost": 3, "late_sends": 1,
                   "jitter_buffer_ms": 40}  # fmt: skip
    leg_b.stats = {"packets_received": 50}  # missing keys count as 0
    s = await render(metrics)
    assert s.get("voxgate_calls_active", leg="sip") == 2
    assert s.get("voxgate_calls_active", leg="webrtc") == 1
    assert s.get("voxgate_rtp_packets_received_total", leg="sip") == 100
    assert s.get("voxgate_rtp_packets_received_total", leg="webrtc") == 50
    assert s.get("voxgate_rtp_packets_lost_total", leg="sip") == 3
    assert s.get("voxgate_rtp_late_sends_total", leg="sip") == 1
    assert s.get("voxgate_jitter_buffer_depth_seconds") == pytest.approx(0.040)
    assert s.get("voxgate_jitter_buffer_depth_max_seconds") == pytest.approx(0.040)

    # Loss recomputed lower (a late packet turned up): the counter holds.
    leg_a.stats.update(packets_received=150, packets_lost=2)
    s = await render(metrics)
    assert s.get("voxgate_rtp_packets_received_total", leg="sip") == 150
    assert s.get("voxgate_rtp_packets_lost_total", leg="sip") == 3

    leg_a.stats["packets_received"] = 160  # the last packets before the BYE
    await a.ended("remote hangup")
    await c.ended("486 Busy Here")
    leg_a.stats["packets_received"] = 0  # whatever the dead leg says now is not read
    s = await render(metrics)
    assert s.get("voxgate_calls_active", leg="sip") == 0
    assert s.get("voxgate_calls_total", leg="sip", outcome="remote_hangup") == 1
    assert s.get("voxgate_calls_total", leg="sip", outcome="rejected") == 1
    assert s.get("voxgate_calls_total", leg="webrtc", outcome="remote_hangup") == 0
    assert s.get("voxgate_rtp_packets_received_total", leg="sip") == 160
    assert s.get("voxgate_rtp_packets_lost_total", leg="sip") == 3
    assert s.get("voxgate_jitter_buffer_depth_seconds") == 0  # only b is up; it has no depth
    assert metrics._seen.keys() == {b.id}

    await b.ended("api")
    s = await render(metrics)
    assert s.get("voxgate_calls_total", leg="webrtc", outcome="local_hangup") == 1
    assert s.get("voxgate_rtp_packets_received_total", leg="webrtc") == 50
    assert s.total("voxgate_calls_total") == 3


async def test_a_broken_leg_does_not_break_the_scrape(
    setup: tuple[CallManager, GatewayMetrics],
) -> None:
    manager, metrics = setup

    class Broken(FakeLeg):
        def media_stats(self) -> dict[str, float]:
            raise RuntimeError("boom")

    call = manager.new_call("sip", "inbound", "sip:a@x", "sip:ivr@y")
    call.leg = Broken()
    s = await render(metrics)
    assert s.get("voxgate_calls_active", leg="sip") == 1


async def test_bargein_and_utterance_events(setup: tuple[CallManager, GatewayMetrics]) -> None:
    manager, metrics = setup
    manager.publish(BargeIn("c1", utterance_id="u", onset_ms=1000.0, decision_ms=1100.0,
                            zero_ms=1125.0, faded_samples=80))  # fmt: skip
    manager.publish(WorkerStopped("c1", utterance_id="u", stop_ms=12.0))
    for outcome in ("done", "done", "interrupted", "cancelled", "error", "weird"):
        manager.publish(UtteranceFinished("c1", utterance_id="u", outcome=outcome))
    s = await render(metrics)
    assert s.get("voxgate_bargein_total") == 1
    assert s.get("voxgate_bargein_stop_latency_seconds_count") == 1
    assert s.get("voxgate_bargein_stop_latency_seconds_sum") == pytest.approx(0.025)
    assert s.get("voxgate_bargein_stop_latency_seconds_bucket", le="0.025") == 1
    assert s.get("voxgate_bargein_stop_latency_seconds_bucket", le="0.02") == 0
    assert s.get("voxgate_bargein_onset_to_zero_seconds_sum") == pytest.approx(0.125)
    assert s.get("voxgate_worker_stop_seconds_sum") == pytest.approx(0.012)
    assert s.get("voxgate_utterances_total", outcome="done") == 2
    assert s.get("voxgate_utterances_total", outcome="interrupted") == 1
    assert s.get("voxgate_utterances_total", outcome="cancelled") == 1
    assert s.get("voxgate_utterances_total", outcome="error") == 2  # unknown -> error


async def test_metrics_registries_are_per_gateway() -> None:
    # Two gateways in one process must not share (or collide on) a registry.
    bus = MemoryBus()
    await bus.start()
    m1 = GatewayMetrics(CallManager(bus, None), bus)
    m2 = GatewayMetrics(CallManager(bus, None), bus)
    m1.bargeins.inc()
    s1 = parse_scrape((await m1.render()).decode())
    s2 = parse_scrape((await m2.render()).decode())
    assert (s1.get("voxgate_bargein_total"), s2.get("voxgate_bargein_total")) == (1, 0)
    await m1.close()
    await m2.close()
    await bus.close()


async def test_bridge_counters_add_live_and_ended_bridges(
    setup: tuple[CallManager, GatewayMetrics],
) -> None:
    manager, metrics = setup

    class Bridge:  # what the scrape reads of a StreamAgent: its stats
        def __init__(self) -> None:
            self.stats = StreamStats()

    a = manager.new_call("sip", "inbound", "sip:a@x", "sip:bot@y")
    b = manager.new_call("webrtc", "inbound", "browser", "gw")
    manager.new_call("sip", "inbound", "sip:c@x", "sip:ivr@y")  # not bridged
    bridge_a, bridge_b = Bridge(), Bridge()
    a.agent, b.agent = bridge_a, bridge_b  # type: ignore[assignment]
    b.rate = 48000  # a browser leg
    bridge_a.stats.media_sent, bridge_a.stats.samples_received = 50, 16000
    bridge_a.stats.clears, bridge_a.stats.dtmf_sent = 2, 4
    bridge_b.stats.media_sent, bridge_b.stats.samples_dropped = 10, 48000
    s = await render(metrics)
    assert s.get("voxgate_bridge_calls_active") == 2
    assert s.get("voxgate_bridge_media_sent_total") == 60
    assert s.get("voxgate_bridge_audio_received_seconds_total") == pytest.approx(2.0)
    assert s.get("voxgate_bridge_audio_dropped_seconds_total") == pytest.approx(1.0)  # 48 kHz
    assert s.get("voxgate_bridge_clears_total") == 2
    await a.ended("remote hangup")
    bridge_a.stats.media_sent = 0  # not read again once the call is forgotten
    s = await render(metrics)
    assert s.get("voxgate_bridge_calls_active") == 1
    assert s.get("voxgate_bridge_media_sent_total") == 60
    assert s.get("voxgate_bridge_dtmf_sent_total") == 4
