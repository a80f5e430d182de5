"""Property tests of every parser that reads bytes from outside (issue 15 part 6).

The checks are ``voxgate.bench.fuzz``'s targets, the same functions ``voxgate bench fuzz``
drives coverage-guided with atheris for millions of inputs: a value or the documented error
type, never another exception; round trips where a serialiser exists. Here hypothesis feeds
them the seeds (sip-fixtures/), seeds mutated byte-wise and with the grammar's delimiters, and
raw bytes: a few hundred inputs a target (``VOXGATE_FUZZ_EXAMPLES``, default 120), so the
whole module stays well under 40 s in ``make test``. The hypothesis ``deadline`` (2 s an input,
on a shared 2-core box) catches a parser that hangs: catastrophic backtracking, a loop that
never consumes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.bench.fuzz import TARGETS

EXAMPLES = int(os.environ.get("VOXGATE_FUZZ_EXAMPLES", "120"))
# What the grammars split on and quote with, spliced in by the mutator (a random byte rarely
# is one of these: the parser's branches live behind them).
TOKENS = (
    b"\r\n", b"\n", b"\r\n ", b"\r\n\r\n", b" ", b"\t", b":", b";", b",", b"=", b'"', b"\\",
    b"<", b">", b"@", b"/", b"|", b"^", b"%", b"[", b"]", b"{", b"}", b"\x00", b"\xff",
    b"\xc3", b"\xed\xa0\x80", b"0", b"4294967296", b"-1", b"2^48", b"inline:", b"sip:",
    b"Content-Length: ", b"a=", b"m=audio ", b"tag=", b'"text": ', b"null", b"Digest ",
)  # fmt: skip
SEEDS: dict[str, list[bytes]] = {
    name: [s[: t.max_len] for s in t.seeds()] or [b""] for name, t in TARGETS.items()
}


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with up to 8 edits: insert bytes or a token, delete, overwrite, truncate,
    duplicate a slice (libFuzzer's mutators, without the coverage)."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.integers(0, 5))
        pos = draw(st.integers(0, len(data)))
        if op == 0:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == 1:
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif op == 2:
            del data[pos : pos + draw(st.integers(1, 32))]
        elif op == 3 and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif op == 4:
            del data[pos:]
        else:
            n = draw(st.integers(1, 64))
            data[pos:pos] = data[pos : pos + n]
    return bytes(data)


def inputs(name: str) -> st.SearchStrategy[bytes]:
    seeds = SEEDS[name]
    return st.one_of(
        st.sampled_from(seeds),
        mutated(seeds),
        mutated(seeds),
        st.binary(max_size=TARGETS[name].max_len // 8),
    )


def _property(name: str) -> Callable[[], None]:
    check = TARGETS[name].check

    @settings(
        max_examples=EXAMPLES,
        deadline=2000,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=inputs(name))
    def run(data: bytes) -> None:
        check(data)

    return run  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_parser_contract(name: str) -> None:
    _property(name)()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_seed_meets_the_contract(name: str) -> None:
    """The seeds themselves: the corpus the fuzzer starts from must not crash already."""
    seeds = TARGETS[name].seeds()
    assert seeds, f"{name}: no seeds (sip-fixtures/ missing?)"
    for seed in seeds:
        TARGETS[name].check(seed)
