"""Word error rate, the measure speech-to-text accuracy is judged by: words compared after
case and punctuation are dropped, errors counted as the word-level Levenshtein distance
(substitutions, insertions, deletions) over the reference's word count."""

from __future__ import annotations

import re


def words(text: str) -> list[str]:
    """Lower-case words, apostrophes kept ("didn't"), everything else a separator."""
    return re.sub(r"[^a-z' ]+", " ", text.lower()).split()


def edit_distance(a: list[str], b: list[str]) -> int:
    """Word-level Levenshtein distance (one row at a time)."""
    prev = list(range(len(b) + 1))
    for i, wa in enumerate(a, 1):
        cur = [i]
        for j, wb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (wa != wb)))
        prev = cur
    return prev[-1]
