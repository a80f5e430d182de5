"""A campaign's contacts, parsed and validated all at once: from JSON (a list of
``{"to", "vars"}``) or from CSV (a header row with a ``to`` column; every other column is a var).

A campaign is never created half-valid: every bad row is collected with its number (the CSV line
number, counting the header as line 1, or the JSON list index) and its reason, and one
:class:`ContactsError` carries them all.

``to`` is a SIP or SIPS URI (RFC 3261 §19.1, parsed by :mod:`gateway.sip.uri`) or an E.164
number (ITU-T E.164: ``+``, a non-zero country code digit, at most 15 digits in all; visual
separators `` -.()`` as in RFC 3966 §5.1.1 are dropped). Duplicates are found after
normalising: the E.164 digits, or the URI re-printed with its scheme and host lower-cased
(RFC 3261 §19.1.4 compares both case-insensitively).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gateway.sip.errors import SipParseError
from gateway.sip.uri import SipUri, parse_uri

_SEPARATORS = str.maketrans("", "", " -.()")


@dataclass(frozen=True, slots=True)
class ContactLimits:
    """Input hygiene: what one campaign may hold (the REST API and CLI pass their own)."""

    max_contacts: int = 100_000
    max_bytes: int = 16 * 1024 * 1024
    max_vars: int = 32
    max_var_name: int = 64
    max_value_len: int = 1024


@dataclass(frozen=True, slots=True)
class Contact:
    """One contact: ``to`` normalised, ``vars`` as strings (for the agent's templates)."""

    to: str
    vars: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RowError:
    """``row``: the CSV line number (header = 1) or the JSON list index; None for the input as
    a whole (no contacts, too many, not JSON), so that it never reads as the first contact."""

    row: int | None
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"row": self.row, "reason": self.reason}


class ContactsError(ValueError):
    """The contacts were refused; ``errors`` lists every bad row (row None: the whole input)."""

    def __init__(self, errors: list[RowError]) -> None:
        self.errors = errors
        shown = "; ".join(
            f"row {e.row}: {e.reason}" if e.row is not None else e.reason for e in errors[:5]
        )
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} bad contact row(s): {shown}{more}")


def normalise_to(text: str) -> str:
    """The dialable, comparable form of ``to``; ``ValueError`` naming the problem otherwise."""
    raw = text.strip()
    if not raw:
        raise ValueError("'to' is empty")
    if raw.startswith("+") or raw[:1].isdigit() or raw[:1] == "(":
        digits = raw.translate(_SEPARATORS)
        if not digits.startswith("+"):
            raise ValueError(f"{raw!r} is not E.164: it must start with '+' and a country code")
        body = digits[1:]
        if not body.isascii() or not body.isdigit():
            raise ValueError(f"{raw!r} is not E.164: only digits may follow '+'")
        if not 8 <= len(body) <= 15:
            raise ValueError(f"{raw!r} is not E.164: {len(body)} digits, 8 to 15 expected")
        if body[0] == "0":
            raise ValueError(f"{raw!r} is not E.164: a country code never starts with 0")
        return "+" + body
    scheme = raw.partition(":")[0].lower()
    if scheme not in ("sip", "sips"):
        raise ValueError(f"{raw!r} is neither a sip:/sips: URI nor an E.164 number")
    try:
        uri = parse_uri(raw)
    except SipParseError as exc:
        raise ValueError(f"{raw!r} is not a valid SIP URI: {exc}") from None
    assert isinstance(uri, SipUri)  # the scheme was checked above
    return str(replace(uri, host=uri.host.lower()))


def parse_contacts_json(
    data: bytes | str | Sequence[object], limits: ContactLimits = ContactLimits()
) -> list[Contact]:
    """Contacts from a JSON list (or its text); raises :class:`ContactsError` with every bad row."""
    items: object = data
    if isinstance(data, (bytes, str)):
        _check_size(data, limits)
        try:
            items = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ContactsError([RowError(None, f"not JSON: {exc}")]) from None
    if not isinstance(items, list):
        raise ContactsError([RowError(None, 'contacts must be a JSON list of {"to", "vars"}')])
    _check_count(len(items), limits)
    checker = _Checker(limits)
    for index, item in enumerate(items):
        if isinstance(item, str):
            item = {"to": item}
        if not isinstance(item, dict):
            checker.bad(index, "a contact must be an object with 'to' and optional 'vars'")
            continue
        unknown = sorted(set(item) - {"to", "vars"})
        if unknown:
            checker.bad(index, f"unknown field(s) {', '.join(map(repr, unknown))}")
            continue
        to = item.get("to")
        if not isinstance(to, str):
            checker.bad(index, "'to' is missing or not a string")
            continue
        raw_vars = item.get("vars", {})
        if raw_vars is None:
            raw_vars = {}
        if not isinstance(raw_vars, dict):
            checker.bad(index, "'vars' must be an object")
            continue
        values: dict[str, str] = {}
        bad_value = None
        for name, value in raw_vars.items():
            if isinstance(value, bool):
                values[name] = "true" if value else "false"
            elif isinstance(value, (str, int, float)):
                values[name] = str(value)
            else:
                bad_value = f"var {name!r} must be a string or a number"
                break
        if bad_value is not None:
            checker.bad(index, bad_value)
            continue
        checker.add(index, to, values)
    return checker.result()


def parse_contacts_csv(data: bytes | str, limits: ContactLimits = ContactLimits()) -> list[Contact]:
    """Contacts from CSV with a header row; the ``to`` column is required, others are vars."""
    _check_size(data, limits)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ContactsError([RowError(None, f"not UTF-8: {exc}")]) from None
    elif data.startswith("\ufeff"):
        data = data[1:]
    reader = csv.reader(io.StringIO(data, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise ContactsError(
            [RowError(None, "empty CSV: a header row with a 'to' column is needed")]
        ) from None
    except csv.Error as exc:
        raise ContactsError([RowError(1, f"bad CSV: {exc}")]) from None
    names = [h.strip() for h in header]
    if "to" not in names:
        raise ContactsError([RowError(1, "the header row has no 'to' column")])
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes or "" in names:
        why = (
            f"repeated column(s) {', '.join(map(repr, dupes))}" if dupes else "an empty column name"
        )
        raise ContactsError([RowError(1, f"the header row has {why}")])
    checker = _Checker(limits)
    to_col = names.index("to")
    rows = 0
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue  # blank lines, e.g. a trailing newline
            rows += 1
            if rows > limits.max_contacts:
                _check_count(rows, limits)
            if len(cells) != len(names):
                checker.bad(line, f"{len(cells)} cells, the header has {len(names)}")
                continue
            values = {
                n: c for i, (n, c) in enumerate(zip(names, cells, strict=True)) if i != to_col
            }
            checker.add(line, cells[to_col], values)
    except csv.Error as exc:
        checker.bad(reader.line_num, f"bad CSV: {exc}")
    return checker.result()


class _Checker:
    """Collects good contacts and bad rows; duplicates name the row they repeat."""

    def __init__(self, limits: ContactLimits) -> None:
        self._limits = limits
        self._seen: dict[str, int] = {}
        self._contacts: list[Contact] = []
        self._errors: list[RowError] = []

    def bad(self, row: int, reason: str) -> None:
        self._errors.append(RowError(row, reason))

    def add(self, row: int, to: str, values: dict[str, str]) -> None:
        try:
            norm = normalise_to(to)
        except ValueError as exc:
            self.bad(row, str(exc))
            return
        lim = self._limits
        if len(values) > lim.max_vars:
            self.bad(row, f"{len(values)} vars, at most {lim.max_vars}")
            return
        for name, value in values.items():
            if not name or len(name) > lim.max_var_name:
                self.bad(
                    row, f"var name {name[:20]!r} must have 1 to {lim.max_var_name} characters"
                )
                return
            if len(value) > lim.max_value_len:
                self.bad(
                    row, f"var {name!r} is {len(value)} characters, at most {lim.max_value_len}"
                )
                return
        first = self._seen.get(norm)
        if first is not None:
            self.bad(row, f"duplicate of row {first} ({norm})")
            return
        self._seen[norm] = row
        self._contacts.append(Contact(norm, values))

    def result(self) -> list[Contact]:
        if self._errors:
            raise ContactsError(self._errors)
        if not self._contacts:
            raise ContactsError([RowError(None, "no contacts")])
        return self._contacts


def _check_size(data: bytes | str, limits: ContactLimits) -> None:
    size = len(data) if isinstance(data, bytes) else len(data.encode())
    if size > limits.max_bytes:
        raise ContactsError([RowError(None, f"{size} bytes, at most {limits.max_bytes}")])


def _check_count(count: int, limits: ContactLimits) -> None:
    if count > limits.max_contacts:
        raise ContactsError([RowError(None, f"more than {limits.max_contacts} contacts")])
