"""/metrics on a live gateway: scraped over HTTP before, during and after a real SIP call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from gateway.call.control import AgentError, AgentTurn
from tests.metrics.conftest import TOKEN, MetricsGateway, Scrape, scrape
from voxgate.bench.sipclient import SipClient

SPEECH_RMS = 300.0


async def wait_for(url: str, ok: Callable[[Scrape], bool], timeout: float = 5.0) -> Scrape:
    """Scrape until ``ok`` (events reach the counters through a task), at most ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        s = await scrape(url)
        if ok(s):
            return s
        if asyncio.get_running_loop().time() > deadline:
            return s
        await asyncio.sleep(0.05)


async def test_metrics_is_open_while_the_api_needs_a_token(
    metrics_gateway: MetricsGateway,
) -> None:
    base = metrics_gateway.http
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/api/calls") as r:
            assert r.status == 401
        async with s.get(f"{base}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    first = await scrape(f"{base}/metrics")
    assert first.get("voxgate_calls_active", leg="sip") == 0
    assert first.total("voxgate_calls_total") == 0
    assert first.get("voxgate_time_to_first_audio_seconds_count") == 0
    # The embedded worker's metrics are on the same page (voxgate serve).
    assert first.get("voxgate_worker_ready") == 1
    assert first.get("voxgate_worker_inflight") == 0
    assert first.get("voxgate_synth_request_stream_lag") == 0
    assert first.get("voxgate_synth_request_stream_pending") == 0
    assert "_created" not in first.text


async def test_a_call_moves_the_metrics(metrics_gateway: MetricsGateway) -> None:
    url = f"{metrics_gateway.http}/metrics"
    before = await scrape(url)
    client = await SipClient.open("127.0.0.1")
    try:
        call = await client.invite(metrics_gateway.sip, codecs=("PCMU",))
        assert call.status == 200
        await call.media.wait_for_audio(after=call.acked_at, threshold=SPEECH_RMS, timeout=5)
        during = await wait_for(
            url,
            lambda s: (
                s.get("voxgate_rtp_packets_received_total", leg="sip") > 10
                and s.get("voxgate_time_to_first_audio_seconds_count") >= 1
            ),
        )
        assert during.get("voxgate_calls_active", leg="sip") == 1
        assert during.get("voxgate_calls_active", leg="webrtc") == 0
        assert during.get("voxgate_rtp_packets_received_total", leg="sip") > 10
        assert during.get("voxgate_time_to_first_audio_seconds_count") >= 1
        ttfa = during.get("voxgate_time_to_first_audio_seconds_sum")
        assert 0 < ttfa < 5 * during.get("voxgate_time_to_first_audio_seconds_count")
        assert during.get("voxgate_worker_time_to_first_chunk_seconds_count") >= 1
        # Nothing plays the caller out (no recording, no bridge; the agent hears each packet
        # on arrival): the jitter buffer rests and the depth gauges leave the call out ...
        assert during.get("voxgate_jitter_buffer_depth_seconds") == 0
        # ... until a recording takes the caller's audio in playout time.
        (call_id,) = list(metrics_gateway.gw.manager.calls)
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{metrics_gateway.http}/api/calls/{call_id}/recordings",
                json={},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as r,
        ):
            assert r.status in (200, 201), await r.text()
        recorded = await wait_for(url, lambda s: s.get("voxgate_jitter_buffer_depth_seconds") > 0)
        assert recorded.get("voxgate_jitter_buffer_depth_seconds") > 0
        assert recorded.get("voxgate_jitter_buffer_depth_max_seconds") > 0
        # Let the greeting finish, then hang up from the phone.
        await call.media.wait_for_quiet(quiet_s=0.5, threshold=30.0, timeout=15)
        received_live = during.get("voxgate_rtp_packets_received_total", leg="sip")
        assert await call.bye() == 200
        after = await wait_for(
            url,
            lambda s: (
                s.get("voxgate_calls_total", leg="sip", outcome="remote_hangup") >= 1
                and s.total("voxgate_utterances_total") >= 1
            ),
        )
    finally:
        client.close()
    assert after.get("voxgate_calls_active", leg="sip") == 0
    assert after.get("voxgate_calls_total", leg="sip", outcome="remote_hangup") == 1
    assert after.total("voxgate_calls_total") == before.total("voxgate_calls_total") + 1
    # The ended call's media counters stay in the totals (never backwards).
    assert after.get("voxgate_rtp_packets_received_total", leg="sip") >= received_live
    assert after.get("voxgate_rtp_packets_lost_total", leg="sip") == 0
    assert after.get("voxgate_utterances_total", outcome="done") == 1
    assert after.get("voxgate_worker_utterances_total", outcome="done") == 1
    assert after.get("voxgate_worker_rtf_count") == 1
    assert after.get("voxgate_playout_underruns_total", leg="sip") >= 0
    assert after.get("voxgate_jitter_buffer_depth_seconds") == 0  # no call up now


async def test_a_browser_call_moves_the_metrics(metrics_gateway: MetricsGateway) -> None:
    from voxgate.bench.webrtc_client import WebRtcClient

    url = f"{metrics_gateway.http}/metrics"
    client = WebRtcClient(metrics_gateway.http, token=TOKEN)
    try:
        await client.connect()
        await client.wait_audio()
        during = await wait_for(
            url, lambda s: s.get("voxgate_rtp_packets_received_total", leg="webrtc") > 10
        )
        assert during.get("voxgate_calls_active", leg="webrtc") == 1
        assert during.get("voxgate_rtp_packets_received_total", leg="webrtc") > 10
        received_live = during.get("voxgate_rtp_packets_received_total", leg="webrtc")
    finally:
        await client.hangup()
    after = await wait_for(url, lambda s: s.get("voxgate_calls_active", leg="webrtc") == 0)
    assert after.get("voxgate_calls_active", leg="webrtc") == 0
    assert after.get("voxgate_calls_total", leg="webrtc", outcome="remote_hangup") == 1
    assert after.get("voxgate_rtp_packets_received_total", leg="webrtc") >= received_live


async def test_agent_turns_and_fallbacks_are_counted(metrics_gateway: MetricsGateway) -> None:
    """What the llm agent reports (gateway.agents.llm) reaches /metrics: turns by what ended
    them, the recogniser's and the model's times, fallbacks by code."""
    url = f"{metrics_gateway.http}/metrics"
    manager = metrics_gateway.gw.manager
    manager.publish(AgentTurn("c1", reason="model", stt_ms=180.0, decided_at=100.0,
                              first_token_at=100.25))  # fmt: skip
    manager.publish(AgentError("c1", kind="llm_timeout", message="no first token in 8 s"))
    s = await wait_for(url, lambda s: s.get("voxgate_agent_errors_total", code="llm_timeout") > 0)
    assert s.get("voxgate_agent_errors_total", code="llm_timeout") == 1
    assert s.get("voxgate_agent_errors_total", code="llm_status") == 0
    assert s.get("voxgate_agent_turns_total", outcome="model") == 1
    assert s.get("voxgate_agent_stt_seconds_sum") == 0.18
    assert s.get("voxgate_agent_llm_first_token_seconds_sum") == 0.25
