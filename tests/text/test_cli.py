"""``voxgate normalize``, through a parser built the way the console script builds it."""

from __future__ import annotations

import argparse
import io

import pytest

from synth.text.cli import register


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="voxgate")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_prints_spoken_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["normalize", "Pay $5 to Dr. Lee."]) == 0
    assert capsys.readouterr().out == "Pay five dollars to Doctor Lee.\n"


def test_chunks_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["normalize", "--chunks", "Sure, call 555-1234. Bye."]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Sure,",
        "call five five five, one two three four.",
        "Bye.",
    ]


def test_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("It is 72°F."))
    assert _run(["normalize", "-"]) == 0
    assert capsys.readouterr().out == "It is seventy two degrees Fahrenheit.\n"


def test_bad_chunk_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["normalize", "--chunks", "--max-words", "2", "Hi there."]) == 2
    assert "first_max_words" in capsys.readouterr().err
