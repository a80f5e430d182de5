"""Character classes and small tokenizers of the RFC 3261 §25 grammar.

Everything here works on ``str`` decoded from UTF-8 with ``surrogateescape`` so that arbitrary
octets survive a parse/serialize round trip.
"""

from __future__ import annotations

import string

from gateway.sip.errors import SipParseError

ALPHANUM = frozenset(string.ascii_letters + string.digits)
# §25.1: token = 1*(alphanum / "-" / "." / "!" / "%" / "*" / "_" / "+" / "`" / "'" / "~")
TOKEN_CHARS = ALPHANUM | frozenset("-.!%*_+`'~")
# §25.1: word additionally allows ( ) < > : \ DQUOTE / [ ] ? { }
WORD_CHARS = TOKEN_CHARS | frozenset('()<>:\\"/[]?{}')
MARK = frozenset("-_.!~*'()")
UNRESERVED = ALPHANUM | MARK
USER_UNRESERVED = frozenset("&=+$,;?/")
PASSWORD_CHARS = UNRESERVED | frozenset("&=+$,")
PARAM_UNRESERVED = frozenset("[]/:&+$")
HNV_UNRESERVED = frozenset("[]/?:+$")
WSP = " \t"
HEXDIGITS = frozenset(string.hexdigits)


def is_token(text: str) -> bool:
    return bool(text) and all(c in TOKEN_CHARS for c in text)


def is_word(text: str) -> bool:
    return bool(text) and all(c in WORD_CHARS for c in text)


def unquote_string(text: str) -> str:
    """Contents of a quoted-string (§25.1), with quoted-pairs expanded. ``text`` includes the
    surrounding DQUOTEs."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise SipParseError(f"Bad quoted string {text!r}")
    out: list[str] = []
    i, end = 1, len(text) - 1
    while i < end:
        c = text[i]
        if c == "\\":
            if i + 1 >= end:
                raise SipParseError(f"Bad quoted string {text!r}")
            out.append(text[i + 1])
            i += 2
            continue
        if c == '"':
            raise SipParseError(f"Bad quoted string {text!r}")
        out.append(c)
        i += 1
    return "".join(out)


def quote_string(text: str) -> str:
    """A quoted-string for ``text``: backslash-escape ``"`` and ``\\`` (§25.1 quoted-pair)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def skip_quoted(text: str, start: int) -> int:
    """Index just past the quoted-string opening at ``text[start] == '"'``."""
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    raise SipParseError("Unterminated quoted string")


def split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside quoted strings and angle brackets (§7.3.1: a comma inside
    ``"..."`` or ``<...>`` does not separate header field values)."""
    parts: list[str] = []
    depth = 0
    i = last = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i = skip_quoted(text, i)
            continue
        if c == "<":
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[last:i])
            last = i + 1
        i += 1
    parts.append(text[last:])
    return parts


Params = tuple[tuple[str, str | None], ...]


def parse_params(text: str, what: str) -> Params:
    """Parse ``;name[=value]`` pairs (generic-param, §25.1). ``text`` starts after the first
    ``;``. Values are kept as written (a quoted-string keeps its quotes) so they serialize back
    unchanged; LWS around ``=`` is dropped (§7.3.1)."""
    params: list[tuple[str, str | None]] = []
    for raw in split_top_level(text, ";"):
        item = raw.strip(WSP)
        if not item:
            raise SipParseError(f"Empty parameter in {what}")
        name, eq, value = item.partition("=")
        name = name.strip(WSP)
        if not is_token(name):
            raise SipParseError(f"Bad parameter name {name!r} in {what}")
        if not eq:
            params.append((name, None))
            continue
        value = value.strip(WSP)
        if not value:
            raise SipParseError(f"Empty value for parameter {name!r} in {what}")
        if value.startswith('"'):
            unquote_string(value)  # validates
        elif not (is_token(value) or _is_host_value(value)):
            raise SipParseError(f"Bad value for parameter {name!r} in {what}")
        params.append((name, value))
    return tuple(params)


def _is_host_value(value: str) -> bool:
    # gen-value = token / host / quoted-string; host covers IPv6 references.
    return value.startswith("[") and value.endswith("]") and ":" in value


def format_params(params: Params) -> str:
    return "".join(f";{n}" if v is None else f";{n}={v}" for n, v in params)


def get_param(params: Params, name: str) -> str | None:
    """The value of the first parameter ``name`` (case-insensitive, §7.3.1); ``""`` for a
    parameter without a value; ``None`` when absent. Quoted values are unquoted."""
    key = name.lower()
    for n, v in params:
        if n.lower() == key:
            if v is None:
                return ""
            return unquote_string(v) if v.startswith('"') else v
    return None


def has_param(params: Params, name: str) -> bool:
    key = name.lower()
    return any(n.lower() == key for n, _ in params)


def set_param(params: Params, name: str, value: str | None) -> Params:
    """Replace (or append) parameter ``name``."""
    key = name.lower()
    out = [(n, v) for n, v in params if n.lower() != key]
    out.append((name, value))
    return tuple(out)


def percent_decode(text: str, what: str) -> str:
    """Expand ``escaped`` (``% HEX HEX``, §25.1) once: never recursively (RFC 4475 esc01)."""
    if "%" not in text:
        return text
    out = bytearray()
    i = 0
    raw = text.encode("utf-8", "surrogateescape")
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # '%'
            h = raw[i + 1 : i + 3]
            if len(h) != 2 or not all(chr(x) in HEXDIGITS for x in h):
                raise SipParseError(f"Bad escape in {what}")
            out.append(int(h, 16))
            i += 3
        else:
            out.append(b)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def percent_encode(text: str, safe: frozenset[str]) -> str:
    out: list[str] = []
    for c in text:
        if c in safe:
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape"))
    return "".join(out)
