"""Header field names and the ordered, case-insensitive header container (RFC 3261 §7.3).

Names are case-insensitive and have compact forms (§7.3.3, §20; later RFCs add more); the
container stores the canonical long form for known fields and the name as written for unknown
ones. Header lines keep their order, duplicates included (§7.3.1: the order of fields with the
same name is significant).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gateway.sip.syntax import split_top_level

# §7.3.3 / §20 compact forms, plus o/u (RFC 6665), r (RFC 3515), b (RFC 3892),
# x (RFC 4028), y/n (RFC 4474), a/j/d (RFC 3841).
COMPACT_FORMS: dict[str, str] = {
    "a": "Accept-Contact",
    "b": "Referred-By",
    "c": "Content-Type",
    "d": "Request-Disposition",
    "e": "Content-Encoding",
    "f": "From",
    "i": "Call-ID",
    "j": "Reject-Contact",
    "k": "Supported",
    "l": "Content-Length",
    "m": "Contact",
    "n": "Identity-Info",
    "o": "Event",
    "r": "Refer-To",
    "s": "Subject",
    "t": "To",
    "u": "Allow-Events",
    "v": "Via",
    "x": "Session-Expires",
    "y": "Identity",
}

_KNOWN = [
    "Accept", "Accept-Contact", "Accept-Encoding", "Accept-Language", "Alert-Info", "Allow",
    "Allow-Events", "Authentication-Info", "Authorization", "Call-ID", "Call-Info", "Contact",
    "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Length",
    "Content-Type", "CSeq", "Date", "Error-Info", "Event", "Expires", "From", "Identity",
    "Identity-Info", "In-Reply-To", "Max-Forwards", "Min-Expires", "Min-SE", "MIME-Version",
    "Organization", "P-Asserted-Identity", "Path", "Priority", "Privacy", "Proxy-Authenticate",
    "Proxy-Authorization", "Proxy-Require", "RAck", "Reason", "Record-Route", "Refer-To",
    "Referred-By", "Reject-Contact", "Replaces", "Reply-To", "Request-Disposition", "Require",
    "Retry-After", "Route", "RSeq", "Server", "Service-Route", "Session-Expires", "Subject",
    "Supported", "Timestamp", "To", "Unsupported", "User-Agent", "Via", "Warning",
    "WWW-Authenticate",
]  # fmt: skip
_CANONICAL: dict[str, str] = {n.lower(): n for n in _KNOWN}

# Fields whose grammar is a comma-separated list (§7.3.1: "header-name: value *(, value)").
# Authorization-style fields are not: their commas separate auth-params of one value.
LIST_FIELDS = frozenset(
    n.lower()
    for n in (
        "Accept", "Accept-Contact", "Accept-Encoding", "Accept-Language", "Alert-Info", "Allow",
        "Allow-Events", "Call-Info", "Contact", "Content-Encoding", "Content-Language",
        "Error-Info", "In-Reply-To", "P-Asserted-Identity", "Path", "Proxy-Require", "Reason",
        "Record-Route", "Reject-Contact", "Request-Disposition", "Require", "Route",
        "Service-Route", "Supported", "Unsupported", "Via", "Warning",
    )
)  # fmt: skip


def canonical_name(name: str) -> str:
    """Long, canonically spelled form of a header name (compact forms expanded)."""
    if len(name) == 1:
        long = COMPACT_FORMS.get(name.lower())
        if long is not None:
            return long
    return _CANONICAL.get(name.lower(), name)


class Headers:
    """Ordered multi-map of header fields, looked up case-insensitively by any form of name."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = [(canonical_name(n), v) for n, v in items]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"

    def copy(self) -> Headers:
        h = Headers()
        h._items = list(self._items)
        return h

    def get(self, name: str) -> str | None:
        """Value of the first field called ``name``, or None."""
        key = canonical_name(name).lower()
        for n, v in self._items:
            if n.lower() == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        """Values of every field line called ``name``, in order (not comma-split)."""
        key = canonical_name(name).lower()
        return [v for n, v in self._items if n.lower() == key]

    def values(self, name: str) -> list[str]:
        """Every value of ``name``: lines in order, comma-separated lists split (outside quotes
        and angle brackets) for fields whose grammar is a list. Unknown fields are not split
        (RFC 4475 wsinv: an unknown field is one opaque value)."""
        key = canonical_name(name).lower()
        out: list[str] = []
        for line in self.get_all(name):
            if key in LIST_FIELDS:
                out.extend(v.strip(" \t") for v in split_top_level(line, ","))
            else:
                out.append(line)
        return out

    def add(self, name: str, value: str) -> None:
        self._items.append((canonical_name(name), value))

    def insert(self, index: int, name: str, value: str) -> None:
        self._items.insert(index, (canonical_name(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every ``name`` field with one line; keeps the first one's position."""
        key = canonical_name(name).lower()
        for i, (n, _) in enumerate(self._items):
            if n.lower() == key:
                self._items[i] = (canonical_name(name), value)
                self._items[i + 1 :] = [
                    (n2, v2) for n2, v2 in self._items[i + 1 :] if n2.lower() != key
                ]
                return
        self.add(name, value)

    def remove(self, name: str) -> None:
        key = canonical_name(name).lower()
        self._items = [(n, v) for n, v in self._items if n.lower() != key]
