"""On-disk cache of a voice's split, optimised ONNX graphs, so a worker starts in about a second.

Splitting joe-medium's graph (shape inference and three extractions, :func:`split_piper_graph`)
takes ~3 s of a worker's start and needs the onnx package (~0.6 s to import); the flow
self-check and onnxruntime's graph optimisation another ~0.5 s. All of it depends only on the
voice file, this code's split format, the onnxruntime version and the CPU (an ``ORT_ENABLE_ALL``
graph may hold fused kernels chosen for this CPU's instruction set), so the first worker saves
the result and later ones load it with optimisation off (the saved graph is the optimised one;
its output is bit-identical, measured).

Layout: ``<root>/<key>/{front_a,front_b,decoder}.onnx`` plus ``meta.json`` (the split's tensor
names, the voice architecture, the self-check's verdict, each file's size). ``key`` hashes the
voice file's SHA-256 with everything else the graphs depend on (:func:`cache_key`).

Writers never expose a partial entry: one is built in a private temp directory beside the
final one, ``meta.json`` last, then renamed into place. ``rename(2)`` of a directory is atomic
and fails when the target exists, so of two workers starting together one wins and the other
drops its copy. A reader treats an entry with unreadable meta, a missing file or a file of
another size (a crash mid-write of an older layout, a truncated copy) as absent; the engine
also discards an entry onnxruntime refuses to load, and rebuilds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("voxgate.worker.cache")

# Bump when split_piper_graph's output or meta.json's content changes meaning. 2: the decoder
# is saved as its 2-D rewrite (onnx_engine.decoder_as_2d), meta.json says so (decoder_2d).
# 3: the decoder also rewritten for NCHWc (graph_rewrite.decoder_for_nchwc, decoder_passes in
# meta.json) and front_b's convolutions 2-D (front_b_2d). 4: front_a's too (front_a_2d).
SPLIT_FORMAT = 4
GRAPHS = ("front_a", "front_b", "decoder")
META = "meta.json"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/voxgate/onnx`` (XDG base directory spec), else ``~/.cache/...``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "voxgate" / "onnx"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file (~0.1 s for a 63 MB medium voice)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def voice_sha256(path: Path, memo_dir: Path) -> str:
    """:func:`file_sha256` of a voice, remembered by the file's identity (device, inode, size,
    mtime in ns, as git's index does) in ``memo_dir/hashes.json``: hashing 63 MB on every start
    would cost ~0.1 s of the ~2 s budget. Any write to the file changes its mtime, so a changed
    voice is hashed again."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    memo_path = memo_dir / "hashes.json"
    memo: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(memo_path.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            memo = {str(k): str(v) for k, v in loaded.items()}
    known = memo.get(ident, "")
    if len(known) == 64:
        return known
    digest = file_sha256(path)
    memo = {k: v for k, v in memo.items() if not k.startswith(f"{path.resolve()}|")}
    memo[ident] = digest
    with contextlib.suppress(OSError):  # a read-only cache only costs the hash next time
        memo_dir.mkdir(parents=True, exist_ok=True)
        tmp = memo_dir / f".hashes-{uuid.uuid4().hex[:12]}.tmp"
        tmp.write_text(json.dumps(memo, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(memo_path)  # atomic: a concurrent reader sees the old or the new memo
    return digest


def cpu_identity() -> str:
    """What an optimised graph may depend on: the machine, the CPU model and its feature flags."""
    model, flags = "", ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        for line in text.splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name == "model name" and not model:
                model = value.strip()
            elif name in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    return f"{platform.machine()}|{model}|{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def cache_key(voice_sha256: str, ort_version: str, cpu: str, opt_level: str) -> str:
    """The entry name: the voice file's hash and everything else the cached graphs depend on."""
    parts = {
        "voice_sha256": voice_sha256,
        "format": SPLIT_FORMAT,
        "onnxruntime": ort_version,
        "cpu": cpu,
        "opt_level": opt_level,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return f"{voice_sha256[:16]}-{digest[:16]}"


@dataclass(frozen=True, slots=True)
class CacheEntry:
    path: Path
    meta: dict[str, Any]

    def graph(self, name: str) -> Path:
        return self.path / f"{name}.onnx"


class GraphFile:
    """A cached graph file that reads as its ``onnx.ModelProto``, parsed on first attribute
    access (only tests and tools look inside; sessions load the file by path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._proto: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._proto is None:
            import onnx

            self._proto = onnx.load(str(self.path))
        return getattr(self._proto, name)


class GraphCache:
    """Entries under ``root`` (created on first write)."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root else default_cache_dir()

    def lookup(self, key: str) -> CacheEntry | None:
        """The complete entry for ``key``, or None (an incomplete one is discarded)."""
        path = self.root / key
        try:
            meta = json.loads((path / META).read_text(encoding="utf-8"))
        except FileNotFoundError:
            # The entry may have been renamed into place between the read and this check (a
            # worker starting alongside committed it): read again before calling it broken, or
            # a complete entry would be discarded.
            if not path.exists():
                return None
            try:
                meta = json.loads((path / META).read_text(encoding="utf-8"))
            except FileNotFoundError:
                self.discard(key, "no meta.json")
                return None
            except (OSError, ValueError) as exc:
                self.discard(key, f"unreadable meta.json: {exc}")
                return None
        except (OSError, ValueError) as exc:
            self.discard(key, f"unreadable meta.json: {exc}")
            return None
        problem = self._check(path, meta, key)
        if problem:
            self.discard(key, problem)
            return None
        return CacheEntry(path, meta)

    @staticmethod
    def _check(path: Path, meta: Any, key: str) -> str:
        if not isinstance(meta, dict) or meta.get("key") != key:
            return "meta.json is for another key"
        files = meta.get("files")
        if not isinstance(files, dict) or set(files) != set(GRAPHS):
            return "meta.json lists other files"
        for name, size in files.items():
            try:
                actual = (path / f"{name}.onnx").stat().st_size
            except OSError:
                return f"{name}.onnx is missing"
            if actual != size:
                return f"{name}.onnx is {actual} bytes, meta.json says {size}"
        return ""

    def discard(self, key: str, why: str) -> None:
        """Remove an entry: renamed aside first (atomic), so no reader sees it half-deleted."""
        path = self.root / key
        log.warning("graph cache: discarding %s (%s)", path, why)
        trash = self.root / f".trash-{uuid.uuid4().hex[:12]}"
        try:
            path.rename(trash)
        except OSError:
            return  # gone already (another worker discarded it) or not ours to remove
        shutil.rmtree(trash, ignore_errors=True)

    def staging(self) -> Path:
        """A private directory to build an entry in (same filesystem as the entries)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        path.chmod(0o755)  # mkdtemp's 0700 would hide the entry from workers of other users
        return path

    def commit(self, staging: Path, key: str, meta: dict[str, Any]) -> CacheEntry:
        """Write ``meta.json`` into ``staging`` and move it into place as entry ``key``.

        ``meta["files"]`` is filled in here from the graphs in ``staging``. If another process
        committed ``key`` first, its entry stands and ours is removed.
        """
        meta = {**meta, "key": key}
        meta["files"] = {name: (staging / f"{name}.onnx").stat().st_size for name in GRAPHS}
        tmp = staging / f"{META}.tmp"
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(staging / META)
        for name in GRAPHS:  # the graphs' data on disk before the entry becomes visible
            fd = os.open(staging / f"{name}.onnx", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        final = self.root / key
        try:
            staging.rename(final)
        except OSError:
            # ENOTEMPTY/EEXIST: a worker starting alongside committed the same key first.
            shutil.rmtree(staging, ignore_errors=True)
            log.info("graph cache: %s was written by another process meanwhile", final)
            return CacheEntry(final, meta)
        log.info("graph cache: saved %s", final)
        return CacheEntry(final, meta)
