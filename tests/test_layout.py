"""The layout's rules, read from the source: no import circles; the gateway and the worker
share only the contract; benchmarks and test clients stay out of the product."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxgate.bench.imports import cycles, edges, imports_between

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return edges(ROOT)


def test_no_import_circles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_gateway_and_synth_do_not_import_each_other(graph: dict[str, set[str]]) -> None:
    assert imports_between(graph, "gateway", ["synth"]) == []
    assert imports_between(graph, "synth", ["gateway"]) == []


def test_the_contract_imports_no_side(graph: dict[str, set[str]]) -> None:
    others = ["gateway", "synth", "dsp", "voxgate.bench", "voxgate.cli", "voxgate.serve"]
    assert imports_between(graph, "voxgate.contract", others) == []


def test_the_product_imports_no_benchmark_or_command(graph: dict[str, set[str]]) -> None:
    for pkg in ("gateway", "synth", "dsp", "voxgate.contract"):
        assert imports_between(graph, pkg, ["voxgate.bench", "voxgate.cli"]) == [], pkg


def test_the_checks_see_what_they_look_for(graph: dict[str, set[str]]) -> None:
    # Not vacuous: the known, allowed edges are found by the same functions.
    assert ("voxgate.serve", "gateway.app") in imports_between(graph, "voxgate.serve", ["gateway"])
    assert imports_between(graph, "gateway.call.calls", ["voxgate.contract"])
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
