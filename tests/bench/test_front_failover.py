"""voxgate.bench.front: a stopped gateway's delayed calls split into those it left unanswered
(retried after FR_GATEWAY_MS) and those it refused while draining (retried at once)."""

from __future__ import annotations

from voxgate.bench.front import _RETRIED, _SILENT, CallRecord, failover

# The lines failure_route writes (deploy/kamailio/kamailio.cfg), as kamailio logs them.
LOG = """\
 5(7109) INFO: {1 1 INVITE 1-7@h} <script>: call 1-7@h retried at sip:127.0.0.1:5071
 5(7109) WARNING: {1 1 INVITE 2-7@h} <script>: gateway sip:127.0.0.1:5072 did not answer call 2-7@h: marked down
 5(7109) INFO: {1 1 INVITE 2-7@h} <script>: call 2-7@h retried at sip:127.0.0.1:5071
 5(7109) WARNING: {1 1 INVITE 3-7@h} <script>: gateway sip:127.0.0.1:5072 gave call 3-7@h no final answer
 5(7109) INFO: {1 1 INVITE 3-7@h} <script>: call 3-7@h retried at sip:127.0.0.1:5071
"""  # noqa: E501


def test_failover_tells_a_refused_call_from_an_unanswered_one() -> None:
    retried = {m[1]: m[2] for m in _RETRIED.finditer(LOG)}
    silent = {m[1] for m in _SILENT.finditer(LOG)}
    assert set(retried) == {"1-7@h", "2-7@h", "3-7@h"}
    assert silent == {"2-7@h", "3-7@h"}
    records = [
        CallRecord("0-7@h", 9.0, 9.01, 5072, 4000, 200),  # before the stop
        CallRecord("1-7@h", 10.1, 10.115, 5071, 4002, 200),  # B's 503, retried at A at once
        CallRecord("2-7@h", 10.2, 11.2, 5071, 4004, 200),  # B silent: FR_GATEWAY_MS later
        CallRecord("3-7@h", 10.3, 12.3, 5071, 4006, 200),  # B's 100 Trying, then nothing
        CallRecord("4-7@h", 10.4, 10.41, 5071, 4008, 200),  # straight to A
    ]
    fo = failover(
        records, sig="SIGTERM", traffic=True, stopped_at=10.0, down_at=11.2, dead_port=5072,
        retried=retried, silent=silent, exit_s=0.1, exit_rc=0,
    )  # fmt: skip
    assert (fo.new_calls, fo.delayed, fo.new_failed) == (4, 3, 0)
    assert [round(s, 3) for s in fo.delayed_setup_s] == [1.0, 2.0]
    assert [round(s, 3) for s in fo.refused_setup_s] == [0.015]
