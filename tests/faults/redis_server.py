"""A redis-server of the test's own, on a free port, that the test may stop, kill and restart.

The shared server on 6379 is never touched: fault tests break only what they started. The
server runs in the foreground as our child (not ``--daemonize``), so we hold its pid.

- ``stop()``: SHUTDOWN SAVE, as ``systemctl stop redis`` does with a stock config: the data
  (streams, consumer groups and their pending entries, keys with their TTLs) is written to
  ``dump.rdb`` and loaded again by ``start()``.
- ``kill()``: SIGKILL, nothing saved; ``start(fresh=True)`` then comes up empty on the same
  port: a Redis that lost its data.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (make redis installs it)")
        self.binary = binary
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_tcp_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def client(self) -> Redis:
        return Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1.0)

    def start(self, *, fresh: bool = False) -> float:
        """Start it (again, on the same port); returns the time.time() it answered PING."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if fresh:
            (self.dir / "dump.rdb").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir),
             "--dbfilename", "dump.rdb", "--logfile", str(self.log_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.starts += 1
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as r:
                    if r.ping():
                        return time.time()
            except RedisConnectionError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 10 s")
            time.sleep(0.02)

    def stop(self) -> float:
        """SHUTDOWN SAVE and wait for the exit; returns the time.time() it was asked to."""
        assert self.proc is not None
        at = time.time()
        # A plain socket: redis-py's client retries the command (with backoff) when the server
        # closes the connection as it exits, which only delays the test.
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$4\r\nSAVE\r\n")
            self.proc.wait(10)
        return at

    def kill(self) -> float:
        """SIGKILL: whatever was not saved is lost; returns the time.time() of the kill."""
        assert self.proc is not None
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return at

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
