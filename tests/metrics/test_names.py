"""Metric names follow Prometheus conventions and the documented set is all there."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.conftest import MetricsGateway

README = Path(__file__).resolve().parents[2] / "README.md"

GATEWAY = {
    "voxgate_calls_active": "gauge",
    "voxgate_calls": "counter",
    "voxgate_time_to_first_audio_seconds": "histogram",
    "voxgate_bargein_stop_latency_seconds": "histogram",
    "voxgate_bargein_onset_to_zero_seconds": "histogram",
    "voxgate_bargein": "counter",
    "voxgate_worker_stop_seconds": "histogram",
    "voxgate_rtp_late_sends": "counter",
    "voxgate_playout_underruns": "counter",
    "voxgate_jitter_buffer_depth_seconds": "gauge",
    "voxgate_jitter_buffer_depth_max_seconds": "gauge",
    "voxgate_rtp_packets_lost": "counter",
    "voxgate_rtp_packets_received": "counter",
    "voxgate_synth_request_stream_lag": "gauge",
    "voxgate_synth_request_stream_pending": "gauge",
    "voxgate_utterances": "counter",
    "voxgate_agent_turns": "counter",
    "voxgate_agent_stt_seconds": "histogram",
    "voxgate_agent_llm_first_token_seconds": "histogram",
    "voxgate_agent_errors": "counter",
    "voxgate_recordings_active": "gauge",
    "voxgate_recording_written_bytes": "counter",
    "voxgate_recording_dropped_frames": "counter",
    "voxgate_recording_errors": "counter",
    "voxgate_bridge_calls_active": "gauge",
    "voxgate_bridge_media_sent": "counter",
    "voxgate_bridge_media_dropped": "counter",
    "voxgate_bridge_dtmf_sent": "counter",
    "voxgate_bridge_media_received": "counter",
    "voxgate_bridge_audio_received_seconds": "counter",
    "voxgate_bridge_audio_dropped_seconds": "counter",
    "voxgate_bridge_clears": "counter",
    "voxgate_bridge_marks_echoed": "counter",
    "voxgate_campaign_dialled": "counter",
    "voxgate_campaign_answered": "counter",
    "voxgate_campaign_outcome": "counter",
    "voxgate_campaign_in_flight": "gauge",
    "voxgate_sip_requests_refused": "counter",
    "voxgate_sip_transactions": "gauge",
    "voxgate_asyncio_tasks": "gauge",
    "voxgate_process_open_fds": "gauge",
    "voxgate_process_resident_memory_bytes": "gauge",
    "voxgate_bus_up": "gauge",
    "voxgate_bus_reconnects": "counter",
    "voxgate_bus_outage_seconds": "counter",
    "voxgate_sip_tls_failures": "counter",
    "voxgate_sip_access": "counter",
    "voxgate_srtp_auth_failures": "counter",
    "voxgate_srtp_replays": "counter",
}
WORKER = {
    "voxgate_worker_ready": "gauge",
    "voxgate_worker_utterances": "counter",
    "voxgate_worker_utterances_cancelled": "counter",
    "voxgate_worker_rtf": "histogram",
    "voxgate_worker_time_to_first_chunk_seconds": "histogram",
    "voxgate_worker_inflight": "gauge",
    "voxgate_worker_concurrency": "gauge",
    "voxgate_worker_request_stream_lag": "gauge",
    "voxgate_worker_request_stream_pending": "gauge",
    "voxgate_worker_errors": "counter",
    "voxgate_worker_renderings": "counter",
}
# Dimensionless by nature: ratios and counts of things.
UNITLESS = {"voxgate_worker_rtf"}
TIME_WORDS = re.compile(r"(latency|time|delay|duration|stop|depth|_ms\b|_ms_|millis)")
NAME = re.compile(r"^voxgate_[a-z0-9_]+$")


async def test_names_follow_conventions(metrics_gateway: MetricsGateway) -> None:
    text = (await metrics_gateway.gw.metrics.render()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    types = {name: f.type for name, f in families.items()}
    assert types == {**GATEWAY, **WORKER}, "the exported set changed: update the README too"
    sample_lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    for line in sample_lines:
        name = line.split("{")[0].split(" ")[0]
        assert NAME.match(name), name
        assert not name.endswith("_created"), name
    for name, family in families.items():
        assert family.documentation, f"{name} has no help text"
        samples = {s.name for s in family.samples}
        if family.type == "counter":
            assert samples == {name + "_total"}, (name, samples)
            assert not name.endswith("_total")  # the parser strips it: no _total_total
        else:
            assert not any(s.endswith("_total") for s in samples), (name, samples)
        if family.type == "histogram":
            assert name.endswith("_seconds") or name in UNITLESS, name
            buckets = [s for s in family.samples if s.name.endswith("_bucket")]
            assert buckets and buckets[-1].labels["le"] == "+Inf"
        # Anything timed is in base units (seconds), never ms.
        if TIME_WORDS.search(name) and name not in UNITLESS:
            assert name.endswith("_seconds"), f"{name}: a time without _seconds"
        assert "_ms" not in name and "milli" not in name, name
    # Label values are a small fixed set: never a call id, a trace id or a free-text reason.
    for family in families.values():
        for s in family.samples:
            for key, value in s.labels.items():
                assert key in {"leg", "outcome", "code", "reason", "le"}, (family.name, key)
                assert len(value) < 24, (family.name, key, value)


def test_readme_lists_every_metric() -> None:
    text = README.read_text()
    for name, typ in {**GATEWAY, **WORKER}.items():
        exported = name + "_total" if typ == "counter" else name
        assert exported in text, f"README does not mention {exported}"
