"""SIP and SIPS URIs (RFC 3261 §19.1, grammar §25.1) and, for other schemes, an opaque
absolute URI.

Components are stored unescaped (``%41`` becomes ``A``, once: RFC 4475 esc01) and re-escaped
minimally on output, so ``parse_uri(str(u)) == u`` for every parsed ``u``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from gateway.sip.errors import SipParseError
from gateway.sip.syntax import (
    ALPHANUM,
    HNV_UNRESERVED,
    PARAM_UNRESERVED,
    PASSWORD_CHARS,
    UNRESERVED,
    USER_UNRESERVED,
    percent_decode,
    percent_encode,
)

_USER_SAFE = UNRESERVED | USER_UNRESERVED
_PARAM_SAFE = UNRESERVED | PARAM_UNRESERVED
_HEADER_SAFE = UNRESERVED | HNV_UNRESERVED
_HOSTNAME_CHARS = ALPHANUM | frozenset("-.")
_SCHEME_CHARS = ALPHANUM | frozenset("+-.")

UriParams = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True, slots=True)
class SipUri:
    """``sip:`` / ``sips:`` URI. ``host`` is kept as written; IPv6 references keep brackets."""

    host: str
    user: str | None = None
    password: str | None = None
    port: int | None = None
    scheme: str = "sip"
    params: UriParams = ()
    headers: tuple[tuple[str, str], ...] = field(default=())

    def __str__(self) -> str:
        out = [self.scheme, ":"]
        if self.user is not None:
            out.append(percent_encode(self.user, _USER_SAFE))
            if self.password is not None:
                out.append(":" + percent_encode(self.password, PASSWORD_CHARS))
            out.append("@")
        out.append(self.host)
        if self.port is not None:
            out.append(f":{self.port}")
        for name, value in self.params:
            out.append(";" + percent_encode(name, _PARAM_SAFE))
            if value is not None:
                out.append("=" + percent_encode(value, _PARAM_SAFE))
        if self.headers:
            out.append(
                "?"
                + "&".join(
                    percent_encode(n, _HEADER_SAFE) + "=" + percent_encode(v, _HEADER_SAFE)
                    for n, v in self.headers
                )
            )
        return "".join(out)

    @property
    def secure(self) -> bool:
        return self.scheme == "sips"

    def param(self, name: str) -> str | None:
        """Value of URI parameter ``name`` (case-insensitive), ``""`` if valueless, else None."""
        key = name.lower()
        for n, v in self.params:
            if n.lower() == key:
                return "" if v is None else v
        return None

    def with_param(self, name: str, value: str | None) -> SipUri:
        key = name.lower()
        kept = tuple((n, v) for n, v in self.params if n.lower() != key)
        return replace(self, params=(*kept, (name, value)))

    def without_params(self, *names: str) -> SipUri:
        keys = {n.lower() for n in names}
        return replace(self, params=tuple((n, v) for n, v in self.params if n.lower() not in keys))

    @property
    def lr(self) -> bool:
        return self.param("lr") is not None

    @property
    def transport(self) -> str | None:
        value = self.param("transport")
        return value.lower() if value else None

    @property
    def host_for_connect(self) -> str:
        """The host without IPv6 brackets, as a socket API wants it."""
        return self.host[1:-1] if self.host.startswith("[") else self.host


@dataclass(frozen=True, slots=True)
class AbsoluteUri:
    """A URI of a scheme this stack does not interpret (``tel:``, ``http:``, ``isbn:``...).
    ``scheme`` is kept as written; compare it case-insensitively (§19.1.4)."""

    scheme: str
    opaque: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.opaque}"


Uri = SipUri | AbsoluteUri


def parse_uri(text: str) -> Uri:
    """Parse an absolute URI; SIP and SIPS URIs get their components, others stay opaque."""
    scheme, colon, rest = text.partition(":")
    if (
        not colon
        or not scheme
        or not scheme[0].isascii()
        or not scheme[0].isalpha()
        or any(c not in _SCHEME_CHARS for c in scheme)
    ):
        raise SipParseError(f"Bad URI {text!r}")
    if any(c in " \t\r\n" for c in text):
        raise SipParseError(f"Whitespace in URI {text!r}")
    lowered = scheme.lower()
    if lowered not in ("sip", "sips"):
        # <, > and " are no uric (RFC 3261 §25.1, absoluteURI): an addr-spec holding one
        # was written back as a name-addr that does not parse (found by fuzzing).
        if not rest or any(c in '<>"' or not c.isprintable() for c in rest):
            raise SipParseError(f"Bad URI {text!r}")
        return AbsoluteUri(scheme, rest)
    return _parse_sip_uri(lowered, rest, text)


def _parse_sip_uri(scheme: str, rest: str, text: str) -> SipUri:
    user = password = None
    # An unescaped "@" cannot occur in params or headers (§25.1), so the first one ends
    # userinfo even when the user part holds ";" or "?" (RFC 4475 semiuri, intmeth).
    at = rest.find("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        raw_user, colon, raw_password = userinfo.partition(":")
        if not raw_user:
            raise SipParseError(f"Empty user part in URI {text!r}")
        _check_chars(raw_user, _USER_SAFE, "user part", text)
        user = percent_decode(raw_user, "URI user part")
        if colon:
            _check_chars(raw_password, PASSWORD_CHARS, "password", text)
            password = percent_decode(raw_password, "URI password")
    hostport, qmark, raw_headers = rest.partition("?")
    hostport, _, raw_params = hostport.partition(";")
    host, port = _parse_hostport(hostport, text)
    params: list[tuple[str, str | None]] = []
    if raw_params:
        for item in raw_params.split(";"):
            name, eq, value = item.partition("=")
            if not name:
                raise SipParseError(f"Empty URI parameter in {text!r}")
            _check_chars(name, _PARAM_SAFE, "parameter", text)
            _check_chars(value, _PARAM_SAFE, "parameter", text)
            if eq and not value:
                raise SipParseError(f"Empty URI parameter value in {text!r}")
            params.append(
                (
                    percent_decode(name, "URI parameter"),
                    percent_decode(value, "URI parameter") if eq else None,
                )
            )
    headers: list[tuple[str, str]] = []
    if qmark:
        for item in raw_headers.split("&"):
            name, eq, value = item.partition("=")
            if not name or not eq:
                raise SipParseError(f"Bad URI header in {text!r}")
            _check_chars(name + value, _HEADER_SAFE, "header", text)
            headers.append(
                (percent_decode(name, "URI header"), percent_decode(value, "URI header"))
            )
    return SipUri(
        host=host,
        user=user,
        password=password,
        port=port,
        scheme=scheme,
        params=tuple(params),
        headers=tuple(headers),
    )


def _check_chars(value: str, allowed: frozenset[str], what: str, text: str) -> None:
    # Non-ASCII UTF-8 is not in the §25.1 URI grammar: reject it like any other stray octet.
    for c in value:
        if c not in allowed and c != "%":
            raise SipParseError(f"Bad character {c!r} in URI {what} of {text!r}")


def _parse_hostport(hostport: str, text: str) -> tuple[str, int | None]:
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise SipParseError(f"Bad IPv6 reference in URI {text!r}")
        host, after = hostport[: end + 1], hostport[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise SipParseError(f"Bad IPv6 reference in URI {text!r}") from None
        if after and not after.startswith(":"):
            raise SipParseError(f"Bad host in URI {text!r}")
        port_text = after[1:] if after else None
    else:
        host, colon, port_text_ = hostport.partition(":")
        port_text = port_text_ if colon else None
        if not host or any(c not in _HOSTNAME_CHARS for c in host):
            raise SipParseError(f"Bad host in URI {text!r}")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not port_text.isascii() or int(port_text) > 65535:
            raise SipParseError(f"Bad port in URI {text!r}")
        port = int(port_text)
    return host, port


def parse_host_port(text: str) -> tuple[str, int | None]:
    """``host[:port]`` as in Via sent-by (§20.42)."""
    return _parse_hostport(text, text)


def uri_equal(a: Uri, b: Uri) -> bool:
    """URI comparison per §19.1.4, simplified: scheme and host case-insensitive, user and
    password case-sensitive, parameters compared by name case-insensitively where both have
    them, and user/ttl/method/maddr/transport must match if present in either."""
    if isinstance(a, AbsoluteUri) or isinstance(b, AbsoluteUri):
        return str(a).lower() == str(b).lower()
    if (a.scheme, a.host.lower(), a.port, a.user, a.password) != (
        b.scheme,
        b.host.lower(),
        b.port,
        b.user,
        b.password,
    ):
        return False
    pa = {n.lower(): (v or "").lower() for n, v in a.params}
    pb = {n.lower(): (v or "").lower() for n, v in b.params}
    for key in ("user", "ttl", "method", "maddr", "transport"):
        if pa.get(key) != pb.get(key):
            return False
    return all(pa[k] == pb[k] for k in pa.keys() & pb.keys()) and sorted(a.headers) == sorted(
        b.headers
    )
