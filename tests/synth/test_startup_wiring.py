"""Cold-start wiring (issue 17): ``synth.graph_cache_dir`` and ``worker.warm_background`` from
the config down to the engine and the worker, and a ``voxgate worker`` that does not import the
gateway.

Real onnxruntime engines over real cache directories, and one real ``voxgate worker`` process
against the real Redis; the ToneEngine stand-in only where a test looks at the worker's
settings, not at audio.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from synth.app import build_engine, build_worker, graph_cache
from synth.engines.onnx_engine import OnnxEngine
from tests.conftest import REDIS_URL
from tests.fakes import ToneEngine
from voxgate.contract.bus.memory import MemoryBus
from voxgate.contract.config import ConfigError, load

ROOT = Path(__file__).resolve().parents[2]
VOXGATE = str(Path(sys.executable).with_name("voxgate"))


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


# -- synth.graph_cache_dir -------------------------------------------------------------------


def test_empty_means_the_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = graph_cache(load(None, env={}))
    assert cache is not None and cache.root == tmp_path / "xdg" / "voxgate" / "onnx"
    assert cache.root.is_dir()  # created up front, so a failure shows at start, once


def test_home_cache_when_xdg_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    cache = graph_cache(load(None, env={}))
    assert cache is not None and cache.root == tmp_path / ".cache" / "voxgate" / "onnx"


def test_off_and_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert graph_cache(load(None, env={"VOXGATE_SYNTH_GRAPH_CACHE_DIR": "off"})) is None
    monkeypatch.setenv("HOME", str(tmp_path))
    cache = graph_cache(load(None, env={}, overrides={"synth.graph_cache_dir": "~/graphs"}))
    assert cache is not None and cache.root == tmp_path / "graphs"


def test_a_dir_that_cannot_be_created_is_a_warning_and_no_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    cfg = load(None, env={"VOXGATE_SYNTH_GRAPH_CACHE_DIR": str(blocker / "onnx")})
    with caplog.at_level(logging.WARNING, "voxgate"):
        assert graph_cache(cfg) is None
    assert "synth.graph_cache_dir" in caplog.text and "without the graph cache" in caplog.text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_a_read_only_dir_is_still_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        cfg = load(None, env={}, overrides={"synth.graph_cache_dir": str(ro)})
        with caplog.at_level(logging.WARNING, "voxgate"):
            cache = graph_cache(cfg)
        assert cache is not None and cache.root == ro  # a pre-filled cache still serves
        assert "not writable" in caplog.text
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"VOXGATE_WORKER_WARM_BACKGROUND": "sometimes"}, "worker.warm_background"),
        ({"VOXGATE_SYNTH_GRAPH_CACHE_DIR": "off "}, "synth.graph_cache_dir"),
    ],
)
def test_bad_values_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load(None, env=env)


def test_build_engine_uses_the_configured_cache(tmp_path: Path) -> None:
    """Split and saved where the env var points, loaded from there next time; an impossible
    directory still gives a working engine."""
    env = {"VOXGATE_SYNTH_GRAPH_CACHE_DIR": str(tmp_path / "graphs")}
    first = build_engine(load(None, env=env))
    assert isinstance(first, OnnxEngine)
    assert first.load_how == "split and saved to the graph cache"
    assert len(entries(tmp_path / "graphs")) == 1
    second = build_engine(load(None, env=env))
    assert isinstance(second, OnnxEngine)
    assert second.load_how.startswith(f"loaded from the graph cache {tmp_path / 'graphs'}")

    (tmp_path / "a-file").write_text("")
    blocked = {"VOXGATE_SYNTH_GRAPH_CACHE_DIR": str(tmp_path / "a-file" / "graphs")}
    third = build_engine(load(None, env=blocked))
    assert isinstance(third, OnnxEngine) and third.load_how == "split (no cache)"
    assert sum(1 for c in third.stream("Hello.", seed=1) if c.audio.size) > 0


# -- worker.warm_background --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["true", "false"])
def test_build_worker_takes_warm_background_from_the_config(value: str) -> None:
    cfg = load(None, env={"VOXGATE_WORKER_WARM_BACKGROUND": value})
    expected = value == "true"
    assert build_worker(cfg, MemoryBus(), ToneEngine()).background_warm is expected
    # A caller's explicit choice (a benchmark's "old way") still wins over the config.
    forced = build_worker(cfg, MemoryBus(), ToneEngine(), background_warm=not expected)
    assert forced.background_warm is (not expected)


# -- the command line ----------------------------------------------------------------------------


def test_registering_the_commands_does_not_import_the_gateway() -> None:
    """``voxgate worker`` must not pay for the gateway's imports (~0.4 s of its 2 s budget)."""
    code = (
        "import sys; from voxgate import cli; cli.build_parser();"
        "print(sorted(m for m in ('gateway.app', 'synth.app', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("command", [[], ["serve"], ["worker"], ["gateway"], ["bench", "synth"]])
def test_help_still_works(command: list[str]) -> None:
    out = subprocess.run([VOXGATE, *command, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "usage: voxgate" in out.stdout


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"vgtest-cold-{uuid.uuid4().hex[:8]}"
    yield p
    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(f"{p}:*"))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.mark.redis
def test_voxgate_worker_fills_the_cache_named_by_the_env_and_gets_ready(
    tmp_path: Path, prefix: str
) -> None:
    """The deploy files' contract: VOXGATE_SYNTH_GRAPH_CACHE_DIR is where `voxgate worker`
    keeps its graphs (the k8s emptyDir, systemd's CacheDirectory=)."""
    cache_dir = tmp_path / "cache"
    env = {**os.environ, "VOXGATE_SYNTH_GRAPH_CACHE_DIR": str(cache_dir),
           "VOXGATE_WORKER_WARM_BACKGROUND": "true"}  # fmt: skip
    args = [VOXGATE, "worker", "--redis", REDIS_URL, "--bus-prefix", prefix,
            "--worker-name", "cold-test", "--worker-http-listen", ""]  # fmt: skip
    r = redis.Redis.from_url(REDIS_URL)
    proc = subprocess.Popen(args, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90  # a noisy 2-core box; ready takes ~5 s cold
        beat = None
        while beat is None and time.monotonic() < deadline and proc.poll() is None:
            beat = r.get(f"{prefix}:synth:worker:cold-test")
            time.sleep(0.05)
        assert beat is not None, f"no heartbeat (rc {proc.poll()})"
        assert json.loads(beat)["engine"] == "onnx"
        (entry,) = entries(cache_dir)
        assert (entry / "meta.json").is_file()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        r.close()
    assert proc.returncode == 0, err[-2000:]
    assert "split and saved to the graph cache" in err
