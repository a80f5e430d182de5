"""Incremental text chunker: cuts text arriving token by token into pieces to synthesize.

Rules (from the streaming-TTS source documents): the first chunk ends at the first clause
boundary (comma, colon, semicolon, dash) or after ``first_max_words`` words, whichever comes
first, so the caller hears something early; later chunks end at sentence boundaries (. ! ? and
newlines); no chunk is longer than ``max_words`` — a long sentence is cut at its last clause
boundary before the limit, else at the limit.

``Chunker.feed`` emits a chunk only once it is certain: a "." is a sentence end only after the
next character shows it is not a decimal point ("3.5") or part of an address, and after an
abbreviation only once the next word shows whether a sentence starts. Every decision depends
only on text already seen, so any split of the input into ``feed`` calls yields exactly the
chunks of ``chunk_text`` on the whole text.
"""

from __future__ import annotations

from voxgate.contract.words import ONES, SCALES, TENS

_TERMINATORS = ".!?"
_CLAUSE_MARKS = ",;:"
_DASHES = "—–"
_CLOSERS = "\"')]}»’”"
_OPENERS = "\"'([{«‘“"

# A period after these never ends a sentence: they stand before a name or an example.
NON_TERMINAL: frozenset[str] = frozenset(
    {
        "Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Mt", "Ft", "Rev", "Capt", "Sgt", "Gov", "Sen",
        "Rep", "Gen", "Col", "Lt", "Hon", "vs", "e.g", "i.e", "cf", "viz", "approx", "dept",
        "ext", "tel", "Apt", "Ste", "Fig", "fig", "Vol", "vol", "pp", "E.g", "I.e",
    }
)  # fmt: skip
# A period after these ends a sentence only if a capitalised word follows ("Acme Inc. is" vs
# "at Acme Inc. Then"); "No." before a number is "number".
AMBIGUOUS: frozenset[str] = frozenset(
    {
        "Inc", "Ltd", "Co", "Corp", "Jr", "Sr", "Bros", "etc", "No", "no", "Nos", "Ave", "Blvd",
        "Rd", "Ln", "Ct", "a.m", "p.m", "A.M", "P.M", "U.S", "U.K", "Ph.D",
    }
)  # fmt: skip


# Words a spelled-out amount is made of. The first chunk's word limit does not cut between two
# of them: "one thousand two hundred thirty | four dollars" would be spoken as two numbers.
NUMBER_WORDS: frozenset[str] = frozenset(
    {w for w in ONES + TENS if w} | {name for _, name in SCALES} | {"hundred", "point", "and"}
)
# How many words past ``first_max_words`` the first chunk may run to finish a number.
NUMBER_GRACE = 8


def _bare(word: str) -> str:
    return word.strip(_OPENERS + _CLOSERS).lower()


def _word_at(buf: str, i: int) -> str | None:
    """The word starting at ``i``, or None if it may still be growing (end of buffer)."""
    j = i
    while j < len(buf) and not buf[j].isspace():
        j += 1
    return buf[i:j] if j < len(buf) else None


def _skip_closers(buf: str, k: int) -> int:
    while k < len(buf) and buf[k] in _CLOSERS:
        k += 1
    return k


def _token_before(buf: str, i: int) -> tuple[str, int]:
    """The word ending at ``i`` (opening quotes stripped) and where it starts."""
    start = i
    while start > 0 and not buf[start - 1].isspace():
        start -= 1
    word = buf[start:i]
    return word.lstrip(_OPENERS), start


def _next_visible(buf: str, k: int) -> str | None:
    while k < len(buf) and buf[k].isspace():
        k += 1
    return buf[k] if k < len(buf) else None


def _period_ends_sentence(buf: str, i: int, k: int, final: bool) -> bool | None:
    """Is the single "." at ``i`` (followed by whitespace at ``k``) a sentence end? None: the
    text needed to decide has not arrived yet."""
    word, start = _token_before(buf, i)
    if word in NON_TERMINAL:
        return False
    if len(word) == 1 and word.isupper():
        # An initial ("J. Smith") unless it closes a spelled acronym ("P M.", "U S Eh.").
        previous = _token_before(buf, start - 1)[0] if start > 0 else ""
        return (len(previous) == 1 and previous.isupper()) or previous == "Eh"
    if word in AMBIGUOUS or ("." in word and word.replace(".", "").isalpha()):
        nxt = _next_visible(buf, k)
        if nxt is None:
            return True if final else None
        return nxt.isupper() or nxt in _OPENERS
    return True


def _sentence_end(buf: str, i: int, final: bool) -> tuple[bool | None, int]:
    """At a terminator: (is it a sentence end, where the chunk would end)."""
    j = i
    while j < len(buf) and buf[j] in _TERMINATORS:
        j += 1
    k = _skip_closers(buf, j)
    if k == len(buf):
        return (True if final else None), k
    if not buf[k].isspace():
        return False, k  # "3.5", "example.com", "e.g.,"
    if buf[i:j] == ".":
        return _period_ends_sentence(buf, i, k, final), k
    return True, k


def _clause_end(buf: str, i: int, final: bool) -> tuple[bool | None, int]:
    """At a comma, colon, semicolon or dash: (is it a clause boundary, where the chunk would
    end)."""
    c = buf[i]
    n = len(buf)
    if c in _CLAUSE_MARKS:
        k = _skip_closers(buf, i + 1)
        if k == n:
            return (True if final else None), k
        return buf[k].isspace(), k  # "1,234" and "3:45" are not boundaries
    if c in _DASHES:
        if i + 1 == n:
            return (True if final else None), n
        between_digits = i > 0 and buf[i - 1].isdigit() and buf[i + 1].isdigit()
        return not between_digits, i + 1  # "3–5" is a range
    # Hyphens: "--" anywhere, or a lone "-" standing between spaces.
    j = i
    while j < n and buf[j] == "-":
        j += 1
    if j == n:
        return (True if final else None), n
    if j - i >= 2:
        return True, j
    spaced = (i == 0 or buf[i - 1].isspace()) and buf[j].isspace()
    return spaced, j


def _find_cut(buf: str, limit: int, first: bool, final: bool) -> int | None:
    """Where the next chunk of ``buf`` ends, or None if that is not yet certain. In the first
    chunk any clause boundary cuts; later ones cut at sentence ends, and at the last clause
    boundary only when the sentence runs past ``limit`` words."""
    n = len(buf)
    first_limit = limit
    words = 0
    in_word = False
    word_end = 0  # end of the latest complete word
    last_clause: int | None = None
    i = 0
    while i < n:
        c = buf[i]
        if c.isspace():
            if c == "\n" and words:
                return i + 1
            if in_word:
                word_end, in_word = i, False
            i += 1
            continue
        if not in_word:
            if words == limit:  # this word would be one too many
                if first and limit < first_limit + NUMBER_GRACE:
                    nxt = _word_at(buf, i)
                    if nxt is None and not final:
                        return None  # can't tell yet whether a number goes on
                    prev, _ = _token_before(buf, word_end)
                    if _bare(prev) in NUMBER_WORDS and _bare(nxt or "") in NUMBER_WORDS:
                        limit += 1
                if words == limit:
                    return word_end if first or last_clause is None else last_clause
            words += 1
            in_word = True
        if c in _TERMINATORS:
            verdict, end = _sentence_end(buf, i, final)
            if verdict is None:
                return None
            if verdict:
                return end
            i = end
            continue
        if c in _CLAUSE_MARKS or c in _DASHES or c == "-":
            verdict, end = _clause_end(buf, i, final)
            if verdict is None:
                return None
            if verdict:
                if first:
                    return end
                last_clause = end
            i = max(end, i + 1)
            continue
        i += 1
    return n if final else None


def _speakable(chunk: str) -> bool:
    return any(c.isalnum() for c in chunk)


class Chunker:
    """Feed text as it arrives; get back the chunks that are complete.

    >>> c = Chunker()
    >>> c.feed("Sure, let me check")
    ['Sure,']
    >>> c.feed(". One moment.")
    ['let me check.']
    >>> c.flush()
    ['One moment.']
    """

    def __init__(self, first_max_words: int = 8, max_words: int = 60) -> None:
        if not 1 <= first_max_words <= max_words:
            raise ValueError("need 1 <= first_max_words <= max_words")
        self.first_max_words = first_max_words
        self.max_words = max_words
        self._buf = ""
        self._first = True

    def feed(self, text: str) -> list[str]:
        """Add ``text``; return the chunks that no later text can change."""
        self._buf += text
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of text: return everything left, cut by the same rules; reset for reuse."""
        chunks = self._drain(final=True)
        self._buf = ""
        self._first = True
        return chunks

    def _drain(self, final: bool) -> list[str]:
        chunks: list[str] = []
        while self._buf:
            limit = self.first_max_words if self._first else self.max_words
            cut = _find_cut(self._buf, limit, self._first, final)
            if cut is None:
                break
            chunk, self._buf = self._buf[:cut].strip(), self._buf[cut:]
            if _speakable(chunk):
                chunks.append(chunk)
                self._first = False
        return chunks


def chunk_text(text: str, first_max_words: int = 8, max_words: int = 60) -> list[str]:
    """One-shot twin of ``Chunker``: the chunks of a whole text."""
    chunker = Chunker(first_max_words, max_words)
    return chunker.feed(text) + chunker.flush()
