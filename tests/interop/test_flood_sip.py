"""A SIP flood against a real ``voxgate serve`` process while 20 calls are up (issue 15, part 3).

A separate process floods the gateway with 10,000 INVITEs from 127.0.0.2 (each a new
transaction: its own branch, Call-ID and From tag, with an SDP offer) at 5,000 a second: about
the most the gateway takes in on this 2-core box beside the flooder (at 10,000/s and above the
kernel drops part of the flood on the gateway's full socket buffer before the gateway sees it;
``FLOOD_TEST_RATE=0`` sends back to back, ~300,000/s, and the kernel drops ~98 %). Meanwhile
20 legitimate calls (five from each of 127.0.0.1, .4, .5 and .6: phones behind a few
addresses; the per-source call cap is 5) keep receiving the gateway's RTP, and a new call from
127.0.0.3 is placed during the flood. Checked, and printed:

- the legitimate calls' audio: packets, sequence gaps, skipped frames and receive pacing error
  (kernel timestamps against the stream's own 20 ms grid) in a baseline window before the flood
  and in a window covering the flood; the gateway's late sends and underruns in both;
- every legitimate call is still up (its BYE gets 200);
- the new call from another address is answered, and how long that took;
- the flooder got 503 + Retry-After for what it sent over its rate, at most the per-source call
  cap of calls, and the gateway's transaction table stayed bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass

import pytest

from tests.interop.conftest import GatewayFactory, GatewayProc
from voxgate.bench.sipclient import ClientCall, RxPacket, SipClient, SipClientError

pytestmark = [pytest.mark.slow, pytest.mark.interop]

LEGIT_CALLS = 20
FLOOD = 10_000
LEGIT_SOURCES = ("127.0.0.1", "127.0.0.4", "127.0.0.5", "127.0.0.6")
CALL_CAP = 5  # gateway.limit_calls_per_source: the legitimate sources' five calls each
BASELINE_S = 4.0
FLOOD_RATE = float(os.environ.get("FLOOD_TEST_RATE", "5000"))  # INVITEs a second; 0: unpaced

# The flooder: builds every INVITE first, then sends them from 127.0.0.2 at ``rate`` a second
# (back to back with 0), reading what comes back between sends; prints one JSON line when
# sending starts and one at the end. It runs at nice 10: the 2-core box is shared between the
# gateway, the flooder, this test's 21 RTP receivers and whatever else runs, and a flooder on
# another machine would take none of the gateway's CPU.
FLOODER = r"""
import json, os, socket, sys, time
host, port, n, src = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# A real flooder runs on another machine: here it yields the CPU to the gateway it floods.
os.nice(10)
rate = float(sys.argv[5])  # INVITEs a second; 0: back to back
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind((src, 0))
s.setblocking(False)
me = f"{src}:{s.getsockname()[1]}"
sdp = (f"v=0\r\no=- 1 1 IN IP4 {src}\r\ns=-\r\nc=IN IP4 {src}\r\nt=0 0\r\n"
       "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")
msgs = []
for i in range(n):
    msgs.append((
        f"INVITE sip:ivr@{host}:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {me};branch=z9hG4bKflood{i}x;rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:flood@{me}>;tag=f{i}\r\n"
        f"To: <sip:ivr@{host}:{port}>\r\n"
        f"Call-ID: flood-{i}@{src}\r\n"
        "CSeq: 1 INVITE\r\n"
        f"Contact: <sip:flood@{me}>\r\n"
        "Content-Type: application/sdp\r\n"
        f"Content-Length: {len(sdp)}\r\n\r\n{sdp}").encode())
final = {}
retry_after = set()
def drain():
    while True:
        try:
            data = s.recv(65535)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            continue
        head = data.split(b"\r\n\r\n", 1)[0].decode(errors="replace").split("\r\n")
        try:
            status = int(head[0].split()[1])
        except (IndexError, ValueError):
            continue
        cid = next((h.split(":", 1)[1].strip() for h in head
                    if h.lower().startswith(("call-id:", "i:"))), "")
        if status >= 200 and cid not in final:
            final[cid] = status
        if status == 503:
            retry_after.update(l for l in head if l.lower().startswith("retry-after:"))
print(json.dumps({"event": "sending", "t": time.time()}), flush=True)
t0 = time.perf_counter()
for i, m in enumerate(msgs):
    if rate > 0:
        ahead = t0 + i / rate - time.perf_counter()
        if ahead > 0.001:
            drain()
            time.sleep(ahead)
    while True:
        try:
            s.sendto(m, (host, port))
            break
        except BlockingIOError:
            drain()
    if i % 64 == 0:
        drain()
sent_s = time.perf_counter() - t0
end = time.time() + 3.0
while time.time() < end:
    drain()
    time.sleep(0.01)
counts = {}
for status in final.values():
    counts[str(status)] = counts.get(str(status), 0) + 1
print(json.dumps({"event": "done", "sent": n, "send_s": sent_s, "finals": counts,
                  "retry_after": sorted(retry_after)}), flush=True)
"""


@dataclass
class Window:
    packets: int = 0
    expected: int = 0
    seq_gaps: int = 0
    skipped_frames: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0

    def line(self) -> str:
        return (
            f"{self.packets}/{self.expected} packets, {self.seq_gaps} seq gaps, "
            f"{self.skipped_frames} skipped frames, pacing error p50 {self.p50_ms:.2f} ms "
            f"p99 {self.p99_ms:.2f} ms max {self.max_ms:.2f} ms"
        )


def window(calls: list[ClientCall], t0: float, t1: float) -> Window:
    """Receive figures of ``calls`` for packets that arrived in [t0, t1) (wall clock)."""
    w = Window()
    errors: list[float] = []
    for call in calls:
        pkts: list[RxPacket] = [p for p in call.media.audio() if t0 <= p.arrival < t1]
        w.packets += len(pkts)
        w.expected += round((t1 - t0) * 50)
        chk = call.media.check(pkts)
        w.seq_gaps += chk.seq_gaps
        w.skipped_frames += chk.skipped_frames
        errors += call.media.pacing_errors_ms(pkts)
    if errors:
        errors.sort()
        w.p50_ms = statistics.median(errors)
        w.p99_ms = errors[min(len(errors) - 1, int(len(errors) * 0.99))]
        w.max_ms = errors[-1]
    return w


def metrics(gw: GatewayProc) -> dict[str, float]:
    with urllib.request.urlopen(gw.http + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("voxgate_") and " " in line:
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def gateway_figures(m: dict[str, float]) -> dict[str, float]:
    def get(name: str) -> float:
        return m.get(name, 0.0)

    return {
        "late_sends": get('voxgate_rtp_late_sends_total{leg="sip"}'),
        "underruns": get('voxgate_playout_underruns_total{leg="sip"}'),
        "refused_rate": get('voxgate_sip_requests_refused_total{reason="rate"}'),
        "refused_calls": get('voxgate_sip_requests_refused_total{reason="calls"}'),
        "refused_table": get('voxgate_sip_requests_refused_total{reason="table"}'),
        "transactions": get("voxgate_sip_transactions"),
        "calls_active": get('voxgate_calls_active{leg="sip"}'),
    }


async def watch_transactions(gw: GatewayProc, seen: list[float]) -> None:
    """Append the transaction-table size /metrics shows to ``seen`` every 100 ms."""
    while True:
        m = gateway_figures(await asyncio.to_thread(metrics, gw))
        seen.append(m["transactions"])
        await asyncio.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def udp_rcvbuf_errors() -> int:
    """The kernel's count of UDP datagrams dropped on a full receive buffer (all sockets)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    header, values = rows[0], rows[1]
    return int(values[header.index("RcvbufErrors")])


async def until_fully_warm(gw: GatewayProc, timeout: float = 60.0) -> None:
    """A worker that warms the rest of its graphs in the background once idle would do it in
    the middle of the measurement: wait for it to finish first."""
    if "the rest in the background" not in gw.log():
        return
    deadline = time.monotonic() + timeout
    while "background warm-up done" not in gw.log():
        assert time.monotonic() < deadline, "the worker's background warm-up never finished"
        await asyncio.sleep(0.2)


async def until_synthesis_idle(gw: GatewayProc, timeout: float = 60.0) -> None:
    """Wait until the in-process worker has nothing in flight (the greetings are rendered)."""
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(metrics, gw)
        if m.get("voxgate_worker_inflight", 0.0) == 0.0:
            return
        assert time.monotonic() < deadline, "the worker never went idle"
        await asyncio.sleep(0.2)


def can_bind(ip: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


async def invite_with_retries(
    client: SipClient, target: tuple[str, int], attempts: int = 8
) -> tuple[ClientCall, int]:
    """Place a call, trying again (a fresh INVITE) when no answer comes within 1 s, as a
    phone's INVITE retransmissions would (the kernel drops datagrams while the flood fills the
    gateway's socket)."""
    for attempt in range(1, attempts + 1):
        try:
            return await client.invite(target, codecs=("PCMU",), timeout=1.0), attempt
        except SipClientError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


async def test_invite_flood_beside_20_calls(gateway_factory: GatewayFactory) -> None:
    for ip in ("127.0.0.2", "127.0.0.3", *LEGIT_SOURCES):
        if not can_bind(ip):
            pytest.skip(f"cannot bind {ip} (loopback aliases)")
    gw = gateway_factory("--gateway-limit-calls-per-source", str(CALL_CAP))
    await until_fully_warm(gw)
    target = ("127.0.0.1", gw.sip_port)
    clients = [await SipClient.open(ip) for ip in LEGIT_SOURCES]
    other = await SipClient.open("127.0.0.3")
    flooder: asyncio.subprocess.Process | None = None
    try:
        calls = []
        for i in range(LEGIT_CALLS):
            call = await clients[i % len(clients)].invite(target, codecs=("PCMU",), timeout=10.0)
            assert call.status == 200, call.status
            calls.append(call)
        # The greetings rendered: the two windows differ by the flood alone.
        await until_synthesis_idle(gw)
        t_base = time.time()
        m_base = gateway_figures(await asyncio.to_thread(metrics, gw))
        cpu_base = cpu_seconds(gw.proc.pid)
        await asyncio.sleep(BASELINE_S)
        m_before = gateway_figures(await asyncio.to_thread(metrics, gw))
        cpu_before = cpu_seconds(gw.proc.pid)
        drops_before = udp_rcvbuf_errors()

        flooder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FLOODER, "127.0.0.1", str(gw.sip_port), str(FLOOD), "127.0.0.2",
            str(FLOOD_RATE),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert flooder.stdout is not None
        started = json.loads(await asyncio.wait_for(flooder.stdout.readline(), 30))
        tx_seen = [m_before["transactions"]]
        peak = asyncio.create_task(watch_transactions(gw, tx_seen))
        t_flood = float(started["t"])
        await asyncio.sleep(0.1)  # into the flood
        t_new = time.time()
        new_call, attempts = await invite_with_retries(other, target)
        connect_s = time.time() - t_new
        assert new_call.status == 200, new_call.status
        done_line = await asyncio.wait_for(flooder.stdout.readline(), 60)
        await flooder.wait()
        peak.cancel()
        peak_tx = max(tx_seen)
        assert done_line, (await flooder.stderr.read()).decode() if flooder.stderr else ""
        done = json.loads(done_line)
        t_end = time.time()
        cpu_after = cpu_seconds(gw.proc.pid)
        m_after = gateway_figures(await asyncio.to_thread(metrics, gw))
        drops = udp_rcvbuf_errors() - drops_before
        # The flood window: from the first INVITE sent to the flooder's last read (3 s after
        # its last send), which covers everything the gateway had queued.
        base = window(calls, t_base, t_base + BASELINE_S)
        during = window(calls, t_flood, t_end - 0.5)
        new_audio = await new_call.media.wait_for_audio(after=new_call.acked_at, timeout=10.0)

        # Every legitimate call is still up: its BYE is answered 200.
        byes = [await c.bye() for c in calls]
        new_bye = await new_call.bye()

        finals: dict[str, int] = done["finals"]
        send_s = float(done["send_s"])
        refused = m_after["refused_rate"] - m_before["refused_rate"]
        cap_refused = m_after["refused_calls"] - m_before["refused_calls"]
        print(
            f"\nflood: {FLOOD} INVITEs from 127.0.0.2 sent in {send_s:.2f} s "
            f"({FLOOD / send_s:.0f}/s offered); the gateway refused {refused:.0f} over the rate "
            f"and {cap_refused:.0f} over the per-source call cap ({CALL_CAP}); kernel "
            f"receive-buffer drops {drops}; flooder's final answers by status {finals} "
            f"{done['retry_after']}; transaction table peak {peak_tx:.0f}, after "
            f"{m_after['transactions']:.0f}"
        )
        base_cpu = (cpu_before - cpu_base) / (t_flood - t_base)
        flood_cpu = (cpu_after - cpu_before) / (t_end - t_flood)
        handled = refused + cap_refused + finals.get("200", 0)
        extra_cpu_s = max(0.0, flood_cpu - base_cpu) * (t_end - t_flood)
        extra_us = extra_cpu_s / max(handled, 1) * 1e6
        print(
            f"gateway CPU: baseline {base_cpu:.0%} of a core, flood window {flood_cpu:.0%}; "
            f"{extra_us:.0f} µs of extra CPU per flood INVITE the gateway read"
        )
        print(f"legit calls ({LEGIT_CALLS}), baseline {BASELINE_S:.0f} s: {base.line()}")
        print(f"legit calls, flood window {t_end - 0.5 - t_flood:.1f} s: {during.line()}")
        print(
            "gateway late sends / underruns: baseline "
            f"{m_before['late_sends'] - m_base['late_sends']:.0f} / "
            f"{m_before['underruns'] - m_base['underruns']:.0f}, flood "
            f"{m_after['late_sends'] - m_before['late_sends']:.0f} / "
            f"{m_after['underruns'] - m_before['underruns']:.0f}"
        )
        print(
            f"new call from 127.0.0.3 during the flood: answered in {connect_s * 1000:.0f} ms "
            f"({attempts} INVITE(s)); first audio "
            f"{(new_audio.arrival - new_call.acked_at) * 1000:.0f} ms after the ACK"
        )

        assert byes == [200] * LEGIT_CALLS, byes
        assert new_bye == 200
        # The legitimate calls lost nothing and kept their pace, measured against the baseline:
        # on this shared 2-core box a busy neighbour makes the gateway skip frames in both
        # windows; a gateway the flood stalls skips far more (22-39 % of the frames in this
        # test's first version, where 25 admitted flood calls and the worker's background
        # warm-up took the CPU).
        assert during.seq_gaps == 0, during
        base_skip = base.skipped_frames / base.expected
        assert during.skipped_frames <= (base_skip + 0.10) * during.expected, (base, during)
        assert during.packets >= (0.90 - base_skip) * during.expected, (base, during)
        assert during.p99_ms <= max(25.0, 2 * base.p99_ms), (base, during)
        # What the flood cost the gateway, in CPU time (which a busy neighbour does not
        # inflate): a source over its rate is refused before its datagrams are parsed (~10 us
        # of Python each, ~40 us with the socket work); a parse alone is ~300 us on this box.
        # 0.5 s of slack: the new call and the admitted flood calls cost CPU too.
        assert extra_cpu_s < 150e-6 * handled + 0.5, (extra_cpu_s, handled)
        # The flooder: 503 + Retry-After beyond its rate, never more calls than the cap.
        assert refused > 0
        assert finals.get("200", 0) <= CALL_CAP, finals
        assert finals.get("503", 0) > 0 and done["retry_after"] == ["Retry-After: 5"], done
        # Bounded state: the flood left no more than its admitted calls' transactions.
        assert peak_tx < 200 and m_after["transactions"] < 200, (peak_tx, m_after)
    finally:
        if flooder is not None and flooder.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                flooder.kill()
            with contextlib.suppress(Exception):
                await flooder.wait()
        for client in clients:
            client.close()
        other.close()
