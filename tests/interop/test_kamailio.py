"""The Kamailio front (deploy/kamailio/kamailio.cfg, Debian's ``kamailio`` package) in front of
real gateway processes, with sipp calling through it.

One cluster for the module: one ``voxgate worker`` and gateways A and B on one Redis prefix,
gateway C on a prefix no worker serves (so it answers OPTIONS 503: gateway/readiness.py), the
front with all three in its dispatcher set, probing every second. Kamailio runs the shipped
config unedited, in the foreground as the test user, with its runtime directory, pid file,
control socket and dispatcher list under tmp_path (``voxgate.bench.front.Kamailio``).

- Calls are spread over A and B, never C; ACK, INFO and BYE follow each call to the gateway
  that took it (a wrong gateway would answer 481); the SDP answer names that gateway's own RTP
  port and RTP flows between sipp and it directly; the gateway's BYE reaches the caller through
  the front.
- B stopped with SIGTERM while calls arrive: no new call fails (the front retries the ones B
  leaves unanswered at A after FR_GATEWAY_MS and takes B out at the first), B is out within
  that timeout, and back in once it is ready again.
- B killed with SIGKILL while no call arrives: the OPTIONS probes take it out within
  ds_ping_interval + the probe's timeout.
- A front whose only gateway has no worker tells the truth upstream: OPTIONS 503 and an INVITE
  503, both with Retry-After.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from redis import Redis

from tests.conftest import REDIS_URL
from tests.interop.conftest import free_port, need, port_block
from voxgate.bench.front import (
    CALL_SCENARIO,
    SCENARIOS,
    SILENT_UAS_SCENARIO,
    CallRecord,
    Cluster,
    FrontTimers,
    GatewayProc,
    Kamailio,
    options_to_front,
    run_stop,
    sbin,
    spread,
    start_calls,
)

pytestmark = [pytest.mark.interop, pytest.mark.redis, pytest.mark.slow]

TIMERS = FrontTimers(ping_interval_s=1)
RATE = 10.0  # calls/s through the front
# The box is shared and noisy: what a timing bound allows beyond the config's own timers.
MARGIN_S = 1.0


class TestPorts:
    """The interop session's port allocator (ports never handed out twice in a session)."""

    @staticmethod
    def one() -> int:
        return free_port()

    @staticmethod
    def block(size: int) -> tuple[int, int]:
        return port_block(size)


@dataclass
class Front:
    cluster: Cluster
    front: Kamailio
    a: GatewayProc
    b: GatewayProc
    c: GatewayProc  # no worker on its prefix: never ready

    @property
    def workdir(self) -> Path:
        return self.cluster.workdir

    def calls(self, tag: str, n: int, hold_ms: int = 300) -> list[CallRecord]:
        run = start_calls(
            self.workdir, self.front.address, tag=tag, calls=n, rate=RATE, hold_ms=hold_ms,
            local_port=free_port(), media_port=port_block(2)[0],
        )  # fmt: skip
        rc, records = run.wait(60)
        assert rc == 0, run.output()
        assert len(records) == n, run.output()
        return records


def _gateway_problems(gw: GatewayProc) -> list[str]:
    return [ln for ln in gw.log().splitlines() if "Traceback" in ln or " ERROR " in ln]


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    need("sipp")
    for tool in ("kamailio", "kamcmd"):
        if sbin(tool) is None:
            pytest.skip(f"{tool} is not installed (deploy/ensure-test-tools.sh installs it)")
    try:
        Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    c = Cluster(tmp_path_factory.mktemp("kamailio"), REDIS_URL, TestPorts(), TIMERS)
    try:
        c.start_worker()
        a, b = c.add_gateway("a"), c.add_gateway("b")
        unserved = c.add_gateway("c", prefix=f"{c.prefix}-nobody")
        for gw in (a, b):
            gw.wait_status("/readyz", 200, 120)
        unserved.wait_status("/healthz", 200, 60)
        assert unserved.status("/readyz") == 503
        k = c.start_front([a, b, unserved])
        # A and B answer the probes 200, C 503: out of the set (I = inactive).
        k.wait_flags({a.uri: "A", b.uri: "A", unserved.uri: "I"}, 15)
        yield Front(c, k, a, b, unserved)
        assert k.problems() == [], k.log()[-4000:]
        for gw in (a, b, unserved):
            assert _gateway_problems(gw) == [], gw.log()[-4000:]
    finally:
        c.close()


def test_calls_spread_over_ready_gateways_and_follow_their_dialogs(front: Front) -> None:
    status, _ = options_to_front(
        front.workdir, front.front.address, tag="opt", local_port=free_port()
    )
    assert status == 200  # the front answers for itself: a gateway is in the set
    gws = (front.a, front.b, front.c)
    ended = {g.name: g.metric_sum("voxgate_calls_total", leg="sip") for g in gws}
    hung_up = {g.name: g.metric_sum("voxgate_calls_total", outcome="remote_hangup") for g in gws}
    rx = {g.name: g.metric_sum("voxgate_rtp_packets_received_total") for g in gws}

    records = front.calls("spread", 20)

    assert all(r.status == 200 and not r.aborted for r in records), records
    by_port = spread(records)
    # Round robin over the two ready gateways (C is skipped), whatever order the probes left.
    assert set(by_port) == {front.a.sip_port, front.b.sip_port}, by_port
    assert all(8 <= n <= 12 for n in by_port.values()), by_port
    # The SDP answer is the answering gateway's own: RTP goes to it, not through the front.
    for r in records:
        gw = front.a if r.gateway_port == front.a.sip_port else front.b
        assert r.media_port is not None and gw.rtp[0] <= r.media_port <= gw.rtp[1], (r, gw.rtp)
    time.sleep(0.5)  # the last BYEs' calls reach the counters
    for gw in (front.a, front.b):
        n = by_port[gw.sip_port]
        assert gw.metric_sum("voxgate_calls_total", leg="sip") - ended[gw.name] == n
        # Each call ended by the caller's BYE at the gateway holding it (routed by the front).
        assert gw.metric_sum("voxgate_calls_total", outcome="remote_hangup") - hung_up[
            gw.name
        ] == n  # fmt: skip
        # sipp echoed the gateway's RTP straight back to it.
        assert gw.metric_sum("voxgate_rtp_packets_received_total") > rx[gw.name]
    assert front.c.metric_sum("voxgate_calls_total", leg="sip") == ended["c"] == 0

    # The other direction: the gateway's own BYE reaches the caller through the front.
    hangup = SCENARIOS / "gateway_hangup_via_front.xml"
    assert hangup.is_file() and CALL_SCENARIO.is_file()
    done = subprocess.run(
        ["sipp", "-sf", str(hangup), front.front.address, "-s", "ivr", "-i", "127.0.0.1",
         "-p", str(free_port()), "-mi", "127.0.0.1", "-mp", str(port_block(2)[0]), "-m", "1",
         "-nostdin", "-timeout", "40s", "-timeout_error", "-trace_err",
         "-error_file", str(front.workdir / "hangup.err")],
        cwd=front.workdir, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    err = front.workdir / "hangup.err"
    assert done.returncode == 0, (done.stdout[-2000:], err.read_text() if err.exists() else "")


def test_sigterm_under_traffic_no_new_call_fails(front: Front) -> None:
    fo, records = run_stop(
        front.cluster, front.b, sig=signal.SIGTERM, traffic=True, rate=RATE, tag="term"
    )
    print(f"SIGTERM with traffic: {fo}")
    assert fo.new_calls >= 30, fo
    assert fo.new_failed == 0, [r for r in records if r.sent >= fo.stopped_at]
    # The first call B leaves unanswered takes it out: one INVITE timeout after the stop (plus
    # the gap to the next call B would get under round robin).
    bound = TIMERS.fr_gateway_ms / 1000 + 2 / RATE + MARGIN_S
    assert fo.down_after_s <= bound, fo
    # Every call B delayed was retried at A: after FR_GATEWAY_MS if B left it unanswered (it had
    # exited), at once if B refused it with 503 while draining (84312e1); none was sent to B after
    # the front took it out.
    assert fo.delayed >= 1, fo
    assert len(fo.delayed_setup_s) + len(fo.refused_setup_s) == fo.delayed, fo
    assert all(s >= TIMERS.fr_gateway_ms / 1000 * 0.9 for s in fo.delayed_setup_s), fo
    assert all(s < TIMERS.fr_gateway_ms / 1000 * 0.5 for s in fo.refused_setup_s), fo
    down_at = fo.stopped_at + fo.down_after_s
    after = [r for r in records if r.sent > down_at + 0.05]
    assert after and all(r.gateway_port == front.a.sip_port for r in after), after
    retried = front.front.retried()
    assert not [r.call_id for r in after if r.call_id in retried]
    # SIGTERM: B hangs up its calls and exits by itself.
    assert fo.exit_s is not None and fo.exit_s < 10, fo
    assert fo.exit_rc == 0, fo
    # Started again, B is back after DS_INACTIVE_THRESHOLD good probes.
    assert fo.up_after_ready_s is not None
    assert fo.up_after_ready_s <= TIMERS.inactive_threshold * TIMERS.ping_interval_s + MARGIN_S


def test_sigkill_while_idle_the_probes_take_it_out(front: Front) -> None:
    front.front.wait_flags({front.a.uri: "A", front.b.uri: "A"}, 10)
    fo, _ = run_stop(
        front.cluster, front.b, sig=signal.SIGKILL, traffic=False, rate=RATE, tag="kill"
    )
    print(f"SIGKILL idle: {fo}")
    # No call told the front: the next probe (within ds_ping_interval) timed out (FR_TIMER_MS).
    assert fo.down_after_s <= TIMERS.probe_bound_s + MARGIN_S, fo
    assert fo.down_after_s >= TIMERS.fr_timer_ms / 1000 * 0.9, fo  # it was the probe's timeout
    assert fo.exit_s is not None and fo.exit_s < 1 and fo.exit_rc == -signal.SIGKILL, fo
    # B is back: calls spread over both again.
    front.front.wait_flags({front.a.uri: "A", front.b.uri: "A"}, 10)
    by_port = spread(front.calls("after-kill", 10))
    assert by_port.get(front.a.sip_port, 0) >= 3 and by_port.get(front.b.sip_port, 0) >= 3


def test_a_gateway_silent_after_100_trying_does_not_hold_the_call(
    front: Front, tmp_path: Path
) -> None:
    """What a gateway stopped or killed between its 100 Trying and its answer looks like: a
    sipp UAS that sends 100 and nothing more (and answers the probes, so it stays in the set).
    The front gives up after FR_INV_GATEWAY_MS (shortened to 2 s here), CANCELs it and sends
    the call to A: the caller waits that long, the call is not lost."""
    port = free_port()
    uas = subprocess.Popen(
        ["sipp", "-sf", str(SILENT_UAS_SCENARIO), "-i", "127.0.0.1", "-p", str(port), "-aa",
         "-nostdin", "-trace_err", "-error_file", str(tmp_path / "uas.err")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    silent = f"sip:127.0.0.1:{port}"
    stuck = Kamailio(
        tmp_path, public_port=free_port(), gateways_port=free_port(),
        destinations=[silent, front.a.uri], timers=replace(TIMERS, fr_inv_gateway_ms=2000),
    )  # fmt: skip
    stuck.start()
    try:
        stuck.wait_flags({silent: "A", front.a.uri: "A"}, 10)
        run = start_calls(
            tmp_path, stuck.address, tag="stuck", calls=4, rate=RATE, hold_ms=100,
            local_port=free_port(), media_port=port_block(2)[0],
        )  # fmt: skip
        rc, records = run.wait(60)
        assert rc == 0 and len(records) == 4, run.output()
        retried = stuck.retried()
        assert all(r.gateway_port == front.a.sip_port and not r.aborted for r in records)
        held = [r for r in records if r.call_id in retried]
        assert 1 <= len(held) <= 3, (records, retried)  # round robin: some went to the UAS first
        assert all(r.setup_s is not None and 1.8 <= r.setup_s <= 2 + MARGIN_S for r in held)
        assert all(r.setup_s is not None and r.setup_s < 0.5 for r in records if r not in held)
        assert "gave call" in stuck.log()
        assert stuck.problems() == []
    finally:
        stuck.stop()
        uas.kill()
        uas.wait(5)


def test_a_gateway_without_workers_is_never_dispatched(front: Front, tmp_path: Path) -> None:
    c = front.c
    assert c.metric_sum("voxgate_calls_total") == 0
    assert "new inbound sip call" not in c.log()
    assert front.front.flags()[c.uri].startswith("I")
    assert not [x for x in front.front.changes() if x.uri == c.uri and x.state == "up"]
    # A front with only C behind it says so upstream: OPTIONS and INVITE both get 503 with
    # Retry-After (the config's RETRY_AFTER), and C never sees the INVITE.
    alone = Kamailio(
        tmp_path, public_port=free_port(), gateways_port=free_port(), destinations=[c.uri],
        timers=TIMERS,
    )  # fmt: skip
    alone.start()
    try:
        alone.wait_flags({c.uri: "I"}, 10)
        assert options_to_front(tmp_path, alone.address, tag="opt503", local_port=free_port()) == (
            503, "5",
        )  # fmt: skip
        run = start_calls(
            tmp_path, alone.address, tag="refused", calls=2, rate=RATE, hold_ms=100,
            local_port=free_port(), media_port=port_block(2)[0],
        )  # fmt: skip
        _, records = run.wait(30)
        assert [r.status for r in records] == [503, 503], run.output()
        assert alone.problems() == []
    finally:
        alone.stop()
    assert c.metric_sum("voxgate_calls_total") == 0
