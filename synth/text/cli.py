"""``voxgate normalize``: print the spoken form of a text (or its synthesis chunks)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "normalize",
        help="print the spoken form of TEXT as the TTS will read it",
        description="Normalize TEXT (numbers, money, dates, phone numbers, abbreviations...) "
        "into the words the agent will say.",
    )
    p.add_argument("text", help="text to normalize ('-' reads stdin)")
    p.add_argument("--chunks", action="store_true", help="print one synthesis chunk per line")
    p.add_argument("--first-max-words", type=int, default=8, help="first chunk limit (default 8)")
    p.add_argument("--max-words", type=int, default=60, help="chunk limit (default 60)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so "voxgate --help" stays fast.
    from synth.text.normalize import normalize
    from voxgate.contract.chunker import chunk_text

    text = sys.stdin.read() if args.text == "-" else args.text
    spoken = normalize(text)
    if args.chunks:
        try:
            chunks = chunk_text(spoken, args.first_max_words, args.max_words)
        except ValueError as exc:
            print(f"voxgate normalize: {exc}", file=sys.stderr)
            return 2
        for chunk in chunks:
            print(chunk)
    else:
        print(spoken)
    return 0
