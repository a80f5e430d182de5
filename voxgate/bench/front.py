"""``voxgate bench front``: the Kamailio front (deploy/kamailio/kamailio.cfg, Debian's
``kamailio`` package) in front of several ``voxgate gateway`` processes sharing one
``voxgate worker`` over Redis, driven by sipp through the front.

The same pieces run ``tests/interop/test_kamailio.py``: :class:`Kamailio` (the shipped config,
unedited, on loopback ports, with its own runtime directory and control socket),
:class:`GatewayProc` (a real gateway process), :func:`start_calls` (sipp with
``sip-fixtures/kamailio/call_via_front.xml``, one log line per call: when its INVITE left, when
the 200 came, which gateway answered and with which RTP port) and :func:`failover` (the figures
of one stopped gateway).

What the benchmark measures, in one run:

1. *spread*: ``--spread-calls`` calls at ``--rate``; calls per gateway, setup time (INVITE sent
   to 200 received at the caller) p50/p95/p99;
2. *failover*, ``--stops`` times, one gateway stopped each time (SIGTERM and SIGKILL in turn,
   with calls arriving at ``--rate`` and, in turn, with no traffic): the time from the signal to
   the front's "gateway down" (its own wall-clock stamp), how many new calls the dead gateway
   delayed (each by ``FR_GATEWAY_MS``: retried at the next gateway) and how many failed, the
   calls up on it that were lost; then the gateway is started again and the time to "gateway
   up" is recorded;
3. *cores* (``--cores-calls N``): N concurrent calls held ``--cores-hold`` s through the front
   to one gateway, then to two: each gateway's CPU (% of one core, from /proc) and its media
   ticker's send-time error (the pacing goal: p99 <= 2 ms), beside the box's total CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[2]
KAMAILIO_CFG = ROOT / "deploy" / "kamailio" / "kamailio.cfg"
SCENARIOS = ROOT / "sip-fixtures" / "kamailio"
CALL_SCENARIO = SCENARIOS / "call_via_front.xml"
OPTIONS_SCENARIO = SCENARIOS / "options_front.xml"
SILENT_UAS_SCENARIO = SCENARIOS / "uas_trying_then_silence.xml"
LOCAL = "127.0.0.1"


def sbin(tool: str) -> str | None:
    """``tool`` on PATH, or in /usr/sbin (where Debian puts kamailio and kamcmd, which is not on
    every user's PATH)."""
    found = shutil.which(tool)
    if found is None and os.access(f"/usr/sbin/{tool}", os.X_OK):
        found = f"/usr/sbin/{tool}"
    return found


# --- the front ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FrontTimers:
    """The config's timing defines (deploy/kamailio/kamailio.cfg explains each)."""

    ping_interval_s: int = 1
    probing_threshold: int = 1
    inactive_threshold: int = 2
    fr_gateway_ms: int = 1000
    fr_timer_ms: int = 2000
    fr_inv_gateway_ms: int = 10000

    def defines(self) -> list[str]:
        return [
            f"DS_PING_INTERVAL={self.ping_interval_s}",
            f"DS_PROBING_THRESHOLD={self.probing_threshold}",
            f"DS_INACTIVE_THRESHOLD={self.inactive_threshold}",
            f"FR_GATEWAY_MS={self.fr_gateway_ms}",
            f"FR_TIMER_MS={self.fr_timer_ms}",
            f"FR_INV_GATEWAY_MS={self.fr_inv_gateway_ms}",
        ]

    @property
    def probe_bound_s(self) -> float:
        """The longest an idle front keeps a dead gateway: the next probes (one per interval,
        ``probing_threshold`` of them must fail) and the last one's timeout."""
        return self.probing_threshold * self.ping_interval_s + self.fr_timer_ms / 1000


@dataclass(frozen=True)
class StateChange:
    """One "voxgate-front: gateway down|up URI at T" line of the front's log."""

    state: str  # "down" | "up"
    uri: str
    at: float  # the front's wall clock (time.time() on this box)


_CHANGE = re.compile(r"voxgate-front: gateway (down|up) (\S+) at ([0-9]+\.[0-9]+)")
_RETRIED = re.compile(r"call (\S+) retried at (\S+)")
# failure_route's lines for a branch that timed out (no answer at all, or 100 Trying and no final).
_SILENT = re.compile(r"gateway \S+ (?:did not answer|gave) call (\S+?):? ")


class Kamailio:
    """The shipped config run in the foreground (``-DD -E``) as the current user, on loopback:
    callers reach ``public_port``, the gateways see ``gateways_port`` (the double Record-Route
    path of the config's ``LISTEN_GATEWAYS``). Runtime directory, pid file, control socket,
    dispatcher list and log all live in ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        *,
        public_port: int,
        gateways_port: int,
        destinations: Sequence[str],
        timers: FrontTimers = FrontTimers(),
        children: int = 2,
        binary: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.public_port = public_port
        self.gateways_port = gateways_port
        self.destinations = list(destinations)
        self.timers = timers
        self.children = children
        self.binary = binary or sbin("kamailio") or "kamailio"
        self.kamcmd = sbin("kamcmd") or "kamcmd"
        self.rundir = workdir / "kamailio-run"
        self.list_path = workdir / "dispatcher.list"
        self.ctl = self.rundir / "kamailio_ctl"
        self.log_path = workdir / "kamailio.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{LOCAL}:{self.public_port}"

    def argv(self) -> list[str]:
        defines = [
            f'DS_LIST="{self.list_path}"',
            f'CTL_SOCKET="unix:{self.ctl}"',
            f"LISTEN_PUBLIC=udp:{LOCAL}:{self.public_port}",
            f"LISTEN_GATEWAYS=udp:{LOCAL}:{self.gateways_port}",
            f"CHILDREN={self.children}",
            *self.timers.defines(),
        ]
        argv = [self.binary, "-DD", "-E", "-f", str(KAMAILIO_CFG), "-Y", str(self.rundir),
                "-P", str(self.rundir / "kamailio.pid")]  # fmt: skip
        for d in defines:
            argv += ["-A", d]
        return argv

    def write_list(self) -> None:
        lines = ["# set destination (written by voxgate.bench.front)"]
        lines += [f"1 {uri}" for uri in self.destinations]
        self.list_path.write_text("\n".join(lines) + "\n")

    def check(self) -> None:
        """``kamailio -c``: the config parses with these defines (raises with its output)."""
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.write_list()
        r = subprocess.run([*self.argv(), "-c"], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"kamailio -c failed:\n{r.stdout}\n{r.stderr}")

    def start(self, timeout: float = 20.0) -> None:
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.write_list()
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kamailio exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if self.rpc("core.uptime"):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kamailio did not start in {timeout} s:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def rpc(self, *command: str) -> str:
        """A control command through its binrpc socket (``kamcmd``, from the same package)."""
        r = subprocess.run(
            [self.kamcmd, "-s", f"unix:{self.ctl}", *command],
            capture_output=True, text=True, timeout=5, check=True,
        )  # fmt: skip
        return r.stdout

    def flags(self) -> dict[str, str]:
        """Destination URI -> its dispatcher FLAGS (``AP``: active and probed, ``IP``:
        inactive, probed; ``TP``: trying)."""
        out: dict[str, str] = {}
        uri = None
        for line in self.rpc("dispatcher.list").splitlines():
            key, _, value = line.strip().partition(":")
            if key == "URI":
                uri = value.strip()
            elif key == "FLAGS" and uri is not None:
                out[uri] = value.strip()
                uri = None
        return out

    def wait_flags(self, want: Mapping[str, str], timeout: float) -> dict[str, str]:
        """Until each URI's state letter (A/I/T/D) is the one wanted."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.flags()
            if all(got.get(u, "?")[:1] == s for u, s in want.items()):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"dispatcher state {got}, wanted {dict(want)}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def changes(self) -> list[StateChange]:
        return [StateChange(m[1], m[2], float(m[3])) for m in _CHANGE.finditer(self.log())]

    def retried(self) -> dict[str, str]:
        """Call-ID -> the gateway the front retried it at (after a 5xx or silence)."""
        return {m[1]: m[2] for m in _RETRIED.finditer(self.log())}

    def silent(self) -> set[str]:
        """Call-IDs whose branch timed out at a gateway (as against one it refused with a 5xx)."""
        return {m[1] for m in _SILENT.finditer(self.log())}

    def wait_change(self, state: str, uri: str, after: float, timeout: float) -> StateChange:
        deadline = time.monotonic() + timeout
        while True:
            for c in self.changes():
                if c.state == state and c.uri == uri and c.at >= after:
                    return c
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no 'gateway {state} {uri}' after {after:.3f} in the front's log:\n"
                    f"{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def problems(self) -> list[str]:
        """ERROR/CRITICAL lines the front logged (none is expected)."""
        return [ln for ln in self.log().splitlines() if " ERROR: " in ln or " CRITICAL: " in ln]

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        # The main process takes its children with it on SIGTERM; the group catches strays.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


# --- gateways and the worker --------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class GatewayProc:
    """One ``voxgate gateway`` (or, with ``stats``, the bench wrapper that also dumps its media
    ticker's statistics: ``voxgate.bench.calls child``)."""

    name: str
    workdir: Path
    redis_url: str
    prefix: str
    sip_port: int
    http_port: int
    rtp: tuple[int, int]
    extra: list[str] = field(default_factory=list)
    stats: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def uri(self) -> str:
        return f"sip:{LOCAL}:{self.sip_port}"

    @property
    def http(self) -> str:
        return f"http://{LOCAL}:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"gateway-{self.name}.log"

    def start(self) -> None:
        self.starts += 1
        head = [sys.executable, "-m", "voxgate.cli"]
        if self.stats is not None:
            head = [sys.executable, "-m", "voxgate.bench.calls", "child", str(self.stats), "--"]
        argv = [
            *head, "gateway", "--redis", self.redis_url, "--bus-prefix", self.prefix,
            "--sip-listen", f"{LOCAL}:{self.sip_port}",
            "--http-listen", f"{LOCAL}:{self.http_port}",
            "--gateway-rtp-port-min", str(self.rtp[0]), "--gateway-rtp-port-max", str(self.rtp[1]),
            *self.extra,
        ]  # fmt: skip
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts} ---\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.http + path, timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def wait_status(self, path: str, want: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                rc = self.proc.returncode if self.proc is not None else None
                raise AssertionError(f"gateway {self.name} exited {rc}:\n{self.log()[-4000:]}")
            with contextlib.suppress(OSError):
                if self.status(path) == want:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"gateway {self.name}: {path} not {want} in {timeout} s:\n{self.log()[-4000:]}"
                )
            time.sleep(0.2)

    def metrics(self) -> dict[str, float]:
        """The Prometheus text of /metrics as {sample name with labels: value}."""
        with urllib.request.urlopen(self.http + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
        return out

    def metric_sum(self, family: str, **labels: str) -> float:
        total = 0.0
        for name, value in self.metrics().items():
            base, _, rest = name.partition("{")
            if base != family:
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += value
        return total

    def send(self, sig: signal.Signals) -> float:
        """Deliver ``sig``; the wall-clock time just before it was sent."""
        assert self.proc is not None
        t = time.time()
        self.proc.send_signal(sig)
        return t

    def wait_exit(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(10) is None:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class WorkerProc:
    workdir: Path
    redis_url: str
    prefix: str
    http_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "worker.log"

    def start(self, *extra: str) -> None:
        argv = [sys.executable, "-m", "voxgate.cli", "worker", "--redis", self.redis_url,
                "--bus-prefix", self.prefix, "--worker-name", f"front-{self.prefix}",
                "--worker-http-listen", f"{LOCAL}:{self.http_port}", *extra]  # fmt: skip
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def delete_prefix(redis_url: str, prefix: str) -> None:
    from redis import Redis

    r = Redis.from_url(redis_url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


# --- calls through the front (sipp) -------------------------------------------------------------
@dataclass(frozen=True)
class CallRecord:
    """One sipp call, from the scenario's log line (and sipp's error log)."""

    call_id: str
    sent: float  # INVITE sent (caller's wall clock)
    answered: float | None  # 200 received; None: a final failure
    gateway_port: int | None  # the answering gateway's SIP port (its Contact)
    media_port: int | None  # the RTP port in its SDP answer
    status: int  # 200, or the failure's code
    aborted: bool = False  # answered, then cut off (a BYE from a stopping gateway, a lost BYE)

    @property
    def setup_s(self) -> float | None:
        return None if self.answered is None else self.answered - self.sent


@dataclass
class SippRun:
    proc: subprocess.Popen[bytes]
    log_path: Path
    err_path: Path
    out_path: Path
    stat_path: Path

    def wait(self, timeout: float) -> tuple[int, list[CallRecord]]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"sipp did not finish in {timeout} s:\n{self.output()}") from None
        return rc, parse_call_log(self.log_text(), self.err_text())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def err_text(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def output(self) -> str:
        out = self.out_path.read_text(errors="replace") if self.out_path.exists() else ""
        return f"{out[-2000:]}\n--- errors ---\n{self.err_text()[-3000:]}"

    def stats(self) -> dict[str, str]:
        if not self.stat_path.exists():
            return {}
        lines = [ln for ln in self.stat_path.read_text().splitlines() if ln.strip()]
        if len(lines) < 2:
            return {}
        return dict(zip(lines[0].split(";"), lines[-1].split(";"), strict=False))


def _when(s: str, us: str) -> float:
    # sipp's <gettimeofday> variables print as doubles ("1796198480.000000", "367058.000000").
    return float(s) + float(us) / 1e6


# sipp's error log: "Aborting call on an unexpected BYE for call: <id>", "Aborting call on
# unexpected message for Call-Id '<id>'"; entries are not newline-separated, so the last octet of
# the (loopback) Call-ID host ends lazily where a quote, a date or a blank starts.
_ABORTED = re.compile(
    r"(?:for call: |for Call-Id ')(\d+-\d+@(?:\d{1,3}\.){3}\d{1,3}?)(?='|\d{4}-\d\d-\d\d|\s|$)"
)


def parse_call_log(text: str, errors: str = "") -> list[CallRecord]:
    """The scenario's OK/FAIL lines; calls named in sipp's error log (``errors``) after their
    OK line were aborted later."""
    aborted = set(re.findall(_ABORTED, errors))
    out: list[CallRecord] = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 8 and f[0] == "OK":
            out.append(CallRecord(
                f[1], _when(f[2], f[3]), _when(f[4], f[5]), int(float(f[6])), int(float(f[7])),
                200, f[1] in aborted,
            ))  # fmt: skip
        elif len(f) == 5 and f[0] == "FAIL":
            out.append(CallRecord(f[1], _when(f[2], f[3]), None, None, None, int(float(f[4]))))
    return out


def start_calls(
    workdir: Path,
    front: str,
    *,
    tag: str,
    calls: int,
    rate: float,
    hold_ms: int,
    local_port: int,
    media_port: int,
    limit: int | None = None,
    timeout_s: int = 120,
    sipp: str = "sipp",
) -> SippRun:
    """sipp places ``calls`` calls at ``rate``/s to ``front`` (HOST:PORT), each held
    ``hold_ms`` after the INFO, with RTP echoed back (``-rtp_echo``) so media flows both ways
    between sipp and the gateway that answered."""
    log_path, err_path = workdir / f"{tag}.calls.log", workdir / f"{tag}.err"
    out_path, stat_path = workdir / f"{tag}.out", workdir / f"{tag}.csv"
    argv = [
        sipp, "-sf", str(CALL_SCENARIO), front, "-s", "ivr",
        "-i", LOCAL, "-p", str(local_port), "-mi", LOCAL, "-mp", str(media_port), "-rtp_echo",
        "-m", str(calls), "-r", f"{rate:g}", "-d", str(hold_ms),
        "-nostdin", "-trace_logs", "-log_file", str(log_path),
        "-trace_err", "-error_file", str(err_path),
        "-trace_stat", "-stf", str(stat_path), "-fd", "1",
        "-timeout", f"{timeout_s}s", "-timeout_error", "-max_recv_loops", "10000",
    ]  # fmt: skip
    if limit is not None:
        argv += ["-l", str(limit)]
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    return SippRun(proc, log_path, err_path, out_path, stat_path)


def options_to_front(workdir: Path, front: str, *, tag: str, local_port: int) -> tuple[int, str]:
    """OPTIONS to the front itself: (status, Retry-After or "-")."""
    log_path = workdir / f"{tag}.log"
    argv = [
        "sipp", "-sf", str(OPTIONS_SCENARIO), front, "-i", LOCAL, "-p", str(local_port),
        "-m", "1", "-nostdin", "-trace_logs", "-log_file", str(log_path),
        "-timeout", "10s", "-timeout_error",
    ]  # fmt: skip
    r = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=30)
    text = log_path.read_text() if log_path.exists() else ""
    m = re.search(r"OPTIONS (\d+) (\S+)", text)
    if m is None:
        raise AssertionError(f"no OPTIONS answer (sipp rc {r.returncode}):\n{r.stdout[-2000:]}")
    return int(m[1]), m[2]


# --- figures ------------------------------------------------------------------------------------
@dataclass
class Failover:
    """What stopping one gateway cost, from the callers' side and the front's."""

    signal: str
    traffic: bool
    stopped_at: float
    down_after_s: float  # signal -> the front's "gateway down" stamp
    new_calls: int  # INVITE sent after the signal
    new_failed: int  # of those: a final failure, or cut off after the answer
    delayed: int  # of those: first sent to the stopped gateway, retried at the next one
    last_delayed_after_s: float  # signal -> the INVITE of the last such call (0: none)
    delayed_setup_s: list[float]  # setup times of those it left unanswered (about FR_GATEWAY_MS)
    in_flight_lost: int  # answered by it before the signal and cut off
    exit_s: float | None  # signal -> the process exited (None: not within 15 s)
    exit_rc: int | None  # its exit status (-9: SIGKILL)
    up_after_ready_s: float | None = None  # restarted gateway ready -> the front's "gateway up"
    # Setup times of those it refused instead (503 "Shutting Down" while a SIGTERM drains it):
    # retried at once, so no FR_GATEWAY_MS wait.
    refused_setup_s: list[float] = field(default_factory=list)


def failover(
    records: Sequence[CallRecord],
    *,
    sig: str,
    traffic: bool,
    stopped_at: float,
    down_at: float,
    dead_port: int,
    retried: Mapping[str, str],
    silent: Collection[str] = (),
    exit_s: float | None,
    exit_rc: int | None,
) -> Failover:
    new = [r for r in records if r.sent >= stopped_at]
    old = [r for r in records if r.sent < stopped_at]
    delayed = [r for r in new if r.call_id in retried]
    unanswered = [r for r in delayed if r.call_id in silent]
    refused = [r for r in delayed if r.call_id not in silent]
    return Failover(
        signal=sig,
        traffic=traffic,
        stopped_at=stopped_at,
        down_after_s=down_at - stopped_at,
        new_calls=len(new),
        new_failed=sum(1 for r in new if r.answered is None or r.aborted),
        delayed=len(delayed),
        last_delayed_after_s=max((r.sent - stopped_at for r in delayed), default=0.0),
        delayed_setup_s=[r.setup_s for r in unanswered if r.setup_s is not None],
        in_flight_lost=sum(1 for r in old if r.gateway_port == dead_port and r.aborted),
        exit_s=exit_s,
        exit_rc=exit_rc,
        refused_setup_s=[r.setup_s for r in refused if r.setup_s is not None],
    )


def spread(records: Sequence[CallRecord]) -> dict[int, int]:
    """Gateway SIP port -> calls it answered."""
    out: dict[int, int] = {}
    for r in records:
        if r.gateway_port is not None:
            out[r.gateway_port] = out.get(r.gateway_port, 0) + 1
    return out


# --- the benchmark ------------------------------------------------------------------------------
class Ports(Protocol):
    def one(self) -> int: ...

    def block(self, size: int) -> tuple[int, int]: ...


class PortPool:
    """Ports for one run: single ones from the kernel, RTP blocks from a range no other
    benchmark here uses (the gateway's allocator skips any taken port anyway)."""

    def __init__(self, rtp_base: int = 46000) -> None:
        self.next_block = rtp_base

    @staticmethod
    def one() -> int:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((LOCAL, 0))
                port = int(s.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind((LOCAL, port))
                except OSError:
                    continue
            return port
        raise RuntimeError("no free port")

    def block(self, size: int) -> tuple[int, int]:
        lo = self.next_block
        self.next_block += size
        if self.next_block > 60000:
            raise RuntimeError("out of RTP port blocks")
        return lo, lo + size - 1


@dataclass
class Cluster:
    """A worker, gateways on its Redis prefix (and any on other prefixes), the front."""

    workdir: Path
    redis_url: str
    pool: Ports
    timers: FrontTimers = FrontTimers()
    gateway_extra: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"vgfront-{uuid.uuid4().hex[:8]}")
    gateways: list[GatewayProc] = field(default_factory=list)
    worker: WorkerProc | None = None
    front: Kamailio | None = None
    prefixes: set[str] = field(default_factory=set)

    def start_worker(self, *extra: str) -> WorkerProc:
        self.prefixes.add(self.prefix)
        self.worker = WorkerProc(self.workdir, self.redis_url, self.prefix, self.pool.one())
        self.worker.start(*extra)
        return self.worker

    def add_gateway(
        self, name: str, *, prefix: str | None = None, stats: bool = False, rtp_ports: int = 400
    ) -> GatewayProc:
        p = prefix or self.prefix
        self.prefixes.add(p)
        gw = GatewayProc(
            name, self.workdir, self.redis_url, p, self.pool.one(), self.pool.one(),
            self.pool.block(rtp_ports), list(self.gateway_extra),
            stats=self.workdir / f"stats-{name}.json" if stats else None,
        )  # fmt: skip
        gw.start()
        self.gateways.append(gw)
        return gw

    def start_front(self, gateways: Sequence[GatewayProc], children: int = 2) -> Kamailio:
        self.front = Kamailio(
            self.workdir, public_port=self.pool.one(), gateways_port=self.pool.one(),
            destinations=[g.uri for g in gateways], timers=self.timers, children=children,
        )  # fmt: skip
        self.front.start()
        return self.front

    def close(self) -> None:
        if self.front is not None:
            self.front.stop()
        for gw in self.gateways:
            with contextlib.suppress(Exception):
                gw.stop()
        if self.worker is not None:
            self.worker.stop()
        for p in self.prefixes:
            with contextlib.suppress(Exception):
                delete_prefix(self.redis_url, p)


@contextlib.contextmanager
def cluster(
    workdir: Path, redis_url: str, timers: FrontTimers, gateway_extra: Sequence[str] = ()
) -> Iterator[Cluster]:
    c = Cluster(workdir, redis_url, PortPool(), timers, list(gateway_extra))
    try:
        yield c
    finally:
        c.close()


def _pct(values: Sequence[float]) -> dict[str, float]:
    from voxgate.bench.util import percentiles

    return percentiles(list(values))


def run_stop(
    c: Cluster, victim: GatewayProc, *, sig: signal.Signals, traffic: bool, rate: float, tag: str
) -> tuple[Failover, list[CallRecord]]:
    """Stop ``victim`` (calls arriving at ``rate`` through the front, or none), measure, start
    it again and wait until the front takes it back. The figures and the calls placed."""
    front = c.front
    assert front is not None
    run = None
    if traffic:
        run = start_calls(
            c.workdir, front.address, tag=tag, calls=int(rate * 6), rate=rate, hold_ms=300,
            local_port=c.pool.one(), media_port=c.pool.one(),
        )  # fmt: skip
        time.sleep(2.0)
    stopped_at = victim.send(sig)
    rc = victim.wait_exit(15)
    exit_s = time.time() - stopped_at if rc is not None else None
    # The front stamps the change itself: reading its log later loses nothing.
    down = front.wait_change("down", victim.uri, stopped_at, timeout=c.timers.probe_bound_s + 10)
    records: list[CallRecord] = []
    if run is not None:
        _, records = run.wait(120)
    fo = failover(
        records, sig=sig.name, traffic=traffic, stopped_at=stopped_at, down_at=down.at,
        dead_port=victim.sip_port, retried=front.retried(), silent=front.silent(),
        exit_s=exit_s, exit_rc=rc,
    )  # fmt: skip
    if victim.alive():  # it did not exit by itself within 15 s: a figure, then it goes
        victim.stop()
    restart = time.time()
    victim.start()
    victim.wait_status("/readyz", 200, 120)
    ready = time.time()
    up = front.wait_change("up", victim.uri, restart, timeout=30)
    fo.up_after_ready_s = up.at - ready
    return fo, records


def _ticks(pids: Sequence[int]) -> int:
    """utime + stime (clock ticks) of these processes, summed; gone ones count 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total


def _group(pgid: int) -> list[int]:
    """Every process of a process group (Kamailio's main process and the ones it forked)."""
    out: list[int] = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (d / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                    out.append(int(d.name))
    return out


class CpuMeter:
    """% of one core used by named sets of processes between ``start()`` and ``stop()``."""

    def __init__(self, procs: Mapping[str, Sequence[int]]) -> None:
        self.procs = dict(procs)
        self.t0 = 0.0
        self.a: dict[str, int] = {}

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.a = {k: _ticks(v) for k, v in self.procs.items()}

    def stop(self) -> dict[str, float]:
        from voxgate.bench.procs import CLK_TCK

        dt = time.monotonic() - self.t0
        return {
            k: round(100.0 * (_ticks(v) - self.a[k]) / CLK_TCK / dt, 1)
            for k, v in self.procs.items()
        }


def run_cores(
    workdir: Path, redis_url: str, *, calls: int, hold_s: float, rate: float, greeting: str
) -> dict[str, Any]:
    """The same N calls through the front to one gateway, then to two. Per gateway: its CPU
    idle (before the calls) and over the plateau (all calls up), and its media ticker's
    send-time error over the plateau; beside them the CPU of the worker, the front and sipp."""
    from voxgate.bench.calls import hist_delta, read_stats

    out: dict[str, Any] = {}
    for n in (1, 2):
        sub = workdir / f"cores-{n}"
        sub.mkdir()
        extra = ["--ivr-greeting", greeting, "--gateway-max-calls", str(calls + 10),
                 "--gateway-limit-invite-rate", "1000", "--gateway-limit-invite-burst", "1000",
                 "--log-level", "warning"]  # fmt: skip
        with cluster(sub, redis_url, FrontTimers(ping_interval_s=2), extra) as c:
            worker = c.start_worker("--worker-warm-background", "false")
            gws = [c.add_gateway(f"g{i}", stats=True, rtp_ports=4 * calls + 200) for i in range(n)]
            for g in gws:
                g.wait_status("/readyz", 200, 180)
            front = c.start_front(gws)
            front.wait_flags({g.uri: "A" for g in gws}, 15)
            assert front.proc is not None and worker.proc is not None
            pids = {g.name: [g.proc.pid] for g in gws if g.proc is not None}
            idle = CpuMeter(pids)
            idle.start()
            time.sleep(3.0)
            idle_pct = idle.stop()
            ramp = calls / rate
            run = start_calls(
                sub, front.address, tag="load", calls=calls, rate=rate,
                hold_ms=int((ramp + hold_s + 2) * 1000), local_port=c.pool.one(),
                media_port=c.pool.one(), timeout_s=int(ramp + hold_s + 60),
            )  # fmt: skip
            time.sleep(ramp + 2.0)  # all calls up
            meter = CpuMeter({**pids, "worker": [worker.proc.pid], "sipp": [run.proc.pid],
                              "kamailio": _group(front.proc.pid)})  # fmt: skip
            stats_a = [read_stats(g.stats) if g.stats else None for g in gws]
            meter.start()
            time.sleep(hold_s)
            cpu = meter.stop()
            stats_b = [read_stats(g.stats) if g.stats else None for g in gws]
            rc, records = run.wait(ramp + hold_s + 120)
            per_gw = []
            for g, sa, sb in zip(gws, stats_a, stats_b, strict=True):
                tick = hist_delta(sa, sb) if sb is not None else {}
                per_gw.append({
                    "gateway": g.name, "calls_up": (sb or {}).get("live_calls"),
                    "cpu_idle_pct": idle_pct[g.name], "cpu_pct": cpu[g.name],
                    "ticker_p50_ms": tick.get("p50"), "ticker_p99_ms": tick.get("p99"),
                    "ticker_max_ms": tick.get("max"),
                })  # fmt: skip
            out[f"{n}_gateway" + ("s" if n > 1 else "")] = {
                "calls": calls, "answered": sum(1 for r in records if r.answered is not None),
                "sipp_rc": rc, "gateways": per_gw, "plateau_s": hold_s,
                "cpu_pct": {k: cpu[k] for k in ("worker", "kamailio", "sipp")},
            }  # fmt: skip
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from voxgate.bench.util import cpu_model

    timers = FrontTimers(ping_interval_s=args.interval)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vgfront-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "conditions": {
            "cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
            "kamailio": _kamailio_version(), "timers": asdict(timers), "rate_cps": args.rate,
            "gateways": args.gateways, "transport": "UDP, loopback",
        },
    }  # fmt: skip
    if args.spread_calls > 0:  # 0: only the cores run
        extra = ["--gateway-limit-invite-rate", "1000", "--gateway-limit-invite-burst", "1000"]
        with cluster(work / "failover", redis_url=args.redis, timers=timers,
                     gateway_extra=extra) as c:  # fmt: skip
            c.workdir.mkdir(parents=True, exist_ok=True)
            c.start_worker()
            gws = [c.add_gateway(chr(ord("a") + i)) for i in range(args.gateways)]
            for g in gws:
                g.wait_status("/readyz", 200, 180)
            front = c.start_front(gws)
            front.wait_flags({g.uri: "A" for g in gws}, 15)
            run = start_calls(
                c.workdir, front.address, tag="spread", calls=args.spread_calls, rate=args.rate,
                hold_ms=300, local_port=c.pool.one(), media_port=c.pool.one(),
            )  # fmt: skip
            rc, records = run.wait(args.spread_calls / args.rate + 120)
            by_port = spread(records)
            result["spread"] = {
                "calls": len(records), "answered": sum(1 for r in records if r.answered),
                "per_gateway": {g.name: by_port.get(g.sip_port, 0) for g in gws},
                "setup_ms": {k: (v * 1000 if k != "n" else v) for k, v in
                             _pct([r.setup_s for r in records if r.setup_s is not None]).items()},
                "sipp_rc": rc,
            }  # fmt: skip
            stops: list[Failover] = []
            modes = [(signal.SIGTERM, True), (signal.SIGKILL, True),
                     (signal.SIGTERM, False), (signal.SIGKILL, False)]  # fmt: skip
            for i in range(args.stops):
                sig, traffic = modes[i % len(modes)]
                victim = gws[-1 - (i % (len(gws) - 1))] if len(gws) > 1 else gws[0]
                fo, _ = run_stop(
                    c, victim, sig=sig, traffic=traffic, rate=args.rate, tag=f"stop{i}"
                )
                stops.append(fo)
                print(f"# stop {i}: {sig.name} {'traffic' if traffic else 'idle'}: down after "
                      f"{fo.down_after_s:.3f} s, delayed {fo.delayed}, failed {fo.new_failed}",
                      file=sys.stderr)  # fmt: skip
            result["stops"] = [asdict(s) for s in stops]
            summary: dict[str, Any] = {}
            for traffic in (True, False):
                group = [s for s in stops if s.traffic == traffic]
                key = "with_traffic" if traffic else "idle"
                summary[key] = {
                    "stops": len(group),
                    "down_after_s": _pct([s.down_after_s for s in group]),
                    "last_delayed_after_s": _pct([s.last_delayed_after_s for s in group]),
                    "delayed_calls": sum(s.delayed for s in group),
                    "new_calls": sum(s.new_calls for s in group),
                    "new_failed": sum(s.new_failed for s in group),
                    "in_flight_lost": sum(s.in_flight_lost for s in group),
                    "delayed_setup_s": _pct([x for s in group for x in s.delayed_setup_s]),
                    "refused_setup_s": _pct([x for s in group for x in s.refused_setup_s]),
                    "up_after_ready_s": _pct(
                        [s.up_after_ready_s for s in group if s.up_after_ready_s is not None]
                    ),
                    "exit_s": _pct([s.exit_s for s in group if s.exit_s is not None]),
                }
            result["failover"] = summary
            result["front_errors"] = front.problems()
    if args.cores_calls:
        result["cores"] = run_cores(
            work, args.redis, calls=args.cores_calls, hold_s=args.cores_hold, rate=args.rate,
            greeting=args.greeting,
        )  # fmt: skip
    result["workdir"] = str(work)
    return result


def _kamailio_version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        binary = sbin("kamailio") or "kamailio"
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0].strip() if out.stdout else ""
    return ""


def _print(result: Mapping[str, Any]) -> None:
    c = result["conditions"]
    load = " ".join(f"{x:.2f}" for x in c["loadavg_at_start"])
    print(f"# Kamailio front: {c['kamailio']}; {c['cpu']} ({c['cores']} cores), load at start "
          f"{load}; timers {c['timers']}")  # fmt: skip
    if "spread" in result:
        s = result["spread"]
        setup = s["setup_ms"]
        print(f"spread: {s['answered']}/{s['calls']} answered at {c['rate_cps']} calls/s; per "
              f"gateway {s['per_gateway']}; setup ms p50 {setup['p50']:.1f} p95 "
              f"{setup['p95']:.1f} p99 {setup['p99']:.1f}")  # fmt: skip
    if result.get("failover"):
        print(f"{'failover':<13}{'stops':>6}{'down p50':>10}{'p95':>7}{'last delayed p95':>18}"
              f"{'delayed':>9}{'new':>6}{'failed':>8}{'lost up':>9}{'back p50':>9}")  # fmt: skip
    for key, f in (result.get("failover") or {}).items():
        if not f["stops"]:
            continue
        print(f"{key:<13}{f['stops']:>6}{f['down_after_s']['p50']:>10.3f}"
              f"{f['down_after_s']['p95']:>7.3f}{f['last_delayed_after_s']['p95']:>18.3f}"
              f"{f['delayed_calls']:>9}{f['new_calls']:>6}{f['new_failed']:>8}"
              f"{f['in_flight_lost']:>9}{f['up_after_ready_s']['p50']:>9.2f}")  # fmt: skip
    for name, r in (result.get("cores") or {}).items():
        per = ", ".join(
            f"{g['gateway']}: {g['calls_up']} calls {g['cpu_pct']}% CPU (idle "
            f"{g['cpu_idle_pct']}%), ticker p50/p99/max {g['ticker_p50_ms']}/"
            f"{g['ticker_p99_ms']}/{g['ticker_max_ms']} ms" for g in r["gateways"]
        )  # fmt: skip
        print(f"cores {name}: {r['answered']}/{r['calls']} answered; {per}; others "
              f"{r['cpu_pct']} (% of one core)")  # fmt: skip
    if result.get("front_errors"):
        print(f"front logged errors: {result['front_errors'][:5]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxgate bench front", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="Redis URL")
    p.add_argument("--gateways", type=int, default=2, help="gateways behind the front")
    p.add_argument("--rate", type=float, default=10.0, help="calls per second")
    p.add_argument(
        "--spread-calls", type=int, default=200,
        help="calls of the spread run (0: no spread and no stops, only --cores-calls)",
    )  # fmt: skip
    p.add_argument("--stops", type=int, default=8, help="gateway stops (TERM/KILL, traffic/idle)")
    p.add_argument("--interval", type=int, default=1, help="ds_ping_interval, s")
    p.add_argument(
        "--cores-calls",
        type=int,
        default=0,
        help="also: N calls through the front to 1 gateway, then 2 (0: skip)",
    )
    p.add_argument("--cores-hold", type=float, default=20.0, help="plateau measured, s")
    p.add_argument("--greeting", default="Hello.", help="IVR greeting of the cores run")
    p.add_argument("--keep", metavar="DIR", help="keep logs in DIR")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    if args.gateways < 2 and args.stops:
        p.error("--gateways: at least 2 (one is stopped while the others take the calls)")
    result = bench(args)
    if args.json:
        from voxgate.bench.util import json_default

        print(json.dumps(result, indent=2, default=json_default))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
