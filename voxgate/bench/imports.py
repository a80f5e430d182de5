"""The import graph of voxgate's own packages, read from the source (no import is executed):
what the layout test holds the tree to, and what ``python -m voxgate.bench.imports --svg``
draws for docs/architecture.md."""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("gateway", "synth", "dsp", "voxgate")

# Rooms: the boxes of the picture, most specific prefix first.
ROOMS: tuple[tuple[str, str], ...] = (
    ("gateway.sip", "gateway/sip\nSIP core (sans-I/O)"),
    ("gateway.rtp", "gateway/rtp\nRTP, G.711, jitter, pacer"),
    ("gateway.sdp", "gateway/sdp\noffer/answer"),
    ("gateway.legs.webrtc", "gateway/legs/webrtc\nbrowser leg"),
    ("gateway.legs.sip", "gateway/legs/sip\nSIP leg"),
    ("gateway.api", "gateway/api\ncontrol API"),
    ("gateway.metrics", "gateway/api\ncontrol API"),
    ("gateway.app", "gateway/app\nprocess"),
    ("gateway.commands", "gateway/app\nprocess"),
    ("gateway.agents", "gateway/agents\nIVR"),
    ("gateway.media", "gateway/media\nplayout, barge-in"),
    ("gateway.stt", "gateway/stt\nspeech-to-text"),
    ("gateway.readiness", "gateway/readiness\na worker ready?"),
    ("gateway.call", "gateway/call\ncalls, events, control"),
    ("synth.text", "synth/text\nnormalizer"),
    ("synth.engines", "synth/engines\nPiper onnx | torch"),
    ("synth", "synth\nworker, render, cache"),
    ("dsp", "dsp\ntelephone chain"),
    ("voxgate.contract", "voxgate/contract\nbus, config, logs"),
    ("voxgate.bench", "voxgate/bench\nbenchmarks, test clients"),
    ("voxgate", "voxgate\ncli, serve"),
)


def modules(root: Path) -> dict[str, Path]:
    """Module name → file, for every module of :data:`PACKAGES` under ``root``."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            name = ".".join(f.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def edges(root: Path) -> dict[str, set[str]]:
    """Module → the modules of the tree it imports (function-level imports included; a
    package's ``__init__`` is not counted as a dependency on everything in it)."""
    mods = modules(root)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        tree = ast.parse(f.read_text(), str(f))
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                if n in mods and n != m and mods[n].name != "__init__.py":
                    out[m].add(n)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def imports_between(
    graph: dict[str, set[str]], src: str, dst: Iterable[str]
) -> list[tuple[str, str]]:
    """(importer, imported) pairs from modules under ``src`` to modules under any of ``dst``."""
    targets = tuple(dst)

    def under(m: str, prefix: str) -> bool:
        return m == prefix or m.startswith(prefix + ".")

    return sorted(
        (a, b)
        for a, bs in graph.items()
        if under(a, src)
        for b in bs
        if any(under(b, t) for t in targets)
    )


def room_of(module: str) -> str:
    for prefix, room in ROOMS:
        if module == prefix or module.startswith(prefix + "."):
            return room
    return module


def room_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, int]]:
    """Room → room → number of module imports between them."""
    out: dict[str, dict[str, int]] = {}
    for a, bs in graph.items():
        ra = room_of(a)
        for b in bs:
            rb = room_of(b)
            if ra != rb:
                out.setdefault(ra, {})
                out[ra][rb] = out[ra].get(rb, 0) + 1
    return out


# Column (left → right: the data path) and row of each room in the picture.
_PLACE: dict[str, tuple[float, float]] = {
    "voxgate\ncli, serve": (2.0, 5.0),
    "voxgate/bench\nbenchmarks, test clients": (4.2, 5.0),
    "gateway/app\nprocess": (1.0, 4.0),
    "gateway/api\ncontrol API": (3.0, 4.0),
    "gateway/agents\nIVR": (4.2, 4.0),
    "gateway/stt\nspeech-to-text": (5.4, 4.0),
    "gateway/readiness\na worker ready?": (-0.3, 4.6),
    "gateway/legs/sip\nSIP leg": (0.0, 3.0),
    "gateway/legs/webrtc\nbrowser leg": (1.2, 3.0),
    "gateway/call\ncalls, events, control": (2.5, 3.0),
    "synth\nworker, render, cache": (4.8, 3.0),
    "gateway/sip\nSIP core (sans-I/O)": (0.0, 2.0),
    "gateway/sdp\noffer/answer": (1.0, 2.0),
    "gateway/rtp\nRTP, G.711, jitter, pacer": (2.0, 2.0),
    "gateway/media\nplayout, barge-in": (3.1, 2.0),
    "synth/text\nnormalizer": (4.3, 2.0),
    "synth/engines\nPiper onnx | torch": (5.4, 2.0),
    "voxgate/contract\nbus, config, logs": (3.4, 1.0),
    "dsp\ntelephone chain": (5.0, 1.0),
}


def draw(graph: dict[str, set[str]], path: Path) -> None:
    """The room graph as an SVG (or PNG, by suffix): boxes placed by the data path, one arrow
    per room-to-room dependency, its width by the number of module imports."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    rooms = room_graph(graph)
    fig, ax = plt.subplots(figsize=(13, 7.5))
    ax.set_xlim(-0.8, 6.0)
    ax.set_ylim(0.4, 5.6)
    ax.axis("off")
    names = set(_PLACE) | set(rooms) | {b for bs in rooms.values() for b in bs}
    pos = {n: _PLACE.get(n, (5.5, 5.2)) for n in names}
    for a, bs in sorted(rooms.items()):
        for b, n in sorted(bs.items()):
            arrow = FancyArrowPatch(
                pos[a], pos[b], arrowstyle="-|>", mutation_scale=12,
                lw=0.5 + min(n, 12) * 0.25, color="#7a869a", alpha=0.7,
                connectionstyle="arc3,rad=0.08", shrinkA=28, shrinkB=28,
            )  # fmt: skip
            ax.add_patch(arrow)
    for name in sorted(names):
        x, y = pos[name]
        color = (
            "#dbe9ff" if name.startswith("gateway") else
            "#e3f5e1" if name.startswith(("synth", "dsp")) else
            "#fff1cc" if name.startswith("voxgate/contract") else "#eeeeee"
        )  # fmt: skip
        ax.text(
            x, y, name, ha="center", va="center", fontsize=8.5,
            bbox={"boxstyle": "round,pad=0.45", "fc": color, "ec": "#44546a"},
        )  # fmt: skip
    ax.set_title(
        "voxgate: rooms and who imports whom (arrows point to the imported; generated from the "
        "source by voxgate.bench.imports)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".", help="the repository root (default .)")
    p.add_argument("--svg", metavar="PATH", help="draw the room graph to PATH")
    args = p.parse_args(argv)
    graph = edges(Path(args.root))
    loops = cycles(graph)
    for c in loops:
        print("import circle:", ", ".join(c))
    if args.svg:
        draw(graph, Path(args.svg))
        print(f"wrote {args.svg}")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
