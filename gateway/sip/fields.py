"""Typed views of the header fields a UA needs: name-addr/addr-spec (From, To, Contact,
Route, Record-Route; §20.10, §25.1), Via (§20.42, RFC 3581), CSeq (§20.16).

All are frozen values with ``parse(text)`` and ``str(value)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.sip.errors import SipParseError
from gateway.sip.syntax import (
    TOKEN_CHARS,
    WSP,
    Params,
    format_params,
    get_param,
    has_param,
    is_token,
    parse_params,
    quote_string,
    set_param,
    skip_quoted,
    unquote_string,
)
from gateway.sip.uri import SipUri, Uri, parse_host_port, parse_uri

MAGIC_COOKIE = "z9hG4bK"  # §8.1.1.7: branch IDs of RFC 3261 elements start with this


@dataclass(frozen=True, slots=True)
class NameAddr:
    """``[display-name] <uri> *(;param)`` or ``addr-spec *(;param)``. ``display_name`` is
    unquoted; ``params`` are header parameters (tag, expires, q...), not URI parameters."""

    uri: Uri
    display_name: str | None = None
    params: Params = ()
    wildcard: bool = False  # Contact: * (§10.2.2)

    @classmethod
    def parse(cls, text: str, what: str = "address") -> NameAddr:
        text = text.strip(WSP)
        if not text:
            raise SipParseError(f"Empty {what}")
        if text == "*":
            return cls(uri=SipUri(host="*"), wildcard=True)
        display: str | None = None
        rest: str
        if text.startswith('"'):
            try:
                end = skip_quoted(text, 0)
            except SipParseError:
                raise SipParseError(f"Unterminated quoted display name in {what}") from None
            display = unquote_string(text[:end])
            rest = text[end:].lstrip(WSP)
            if not rest.startswith("<"):
                raise SipParseError(f"Expected <URI> after display name in {what}")
        else:
            lt = text.find("<")
            semi = text.find(";")
            if lt >= 0 and (semi < 0 or lt < semi):
                # *(token LWS) display name; LWS before "<" may be missing (RFC 4475 lwsdisp).
                name = text[:lt].strip(WSP)
                if name:
                    if not all(c in TOKEN_CHARS or c in WSP for c in name):
                        raise SipParseError(f"Bad display name in {what}")
                    display = " ".join(name.split())
                rest = text[lt:]
            else:
                rest = ""
        if rest:
            gt = rest.find(">")
            if gt < 0:
                raise SipParseError(f"Missing '>' in {what}")
            # Elements may ignore LWS inside the brackets (RFC 4475 badaspec).
            uri = parse_uri(rest[1:gt].strip(WSP))
            after = rest[gt + 1 :].lstrip(WSP)
        else:
            # addr-spec form: the URI ends at the first ";"; a URI here cannot contain
            # ",", ";" or "?" (§20.10), so its parameters are header parameters (RFC 4475
            # cparam01) and a "?" means the sender forgot the brackets (regbadct).
            spec, sep, tail = text.partition(";")
            spec = spec.strip(WSP)
            if "?" in spec or "," in spec:
                raise SipParseError(f"URI with '?' or ',' must be enclosed in <> in {what}")
            uri = parse_uri(spec)
            after = ";" + tail if sep else ""
        params: Params = ()
        if after:
            if not after.startswith(";"):
                raise SipParseError(f"Unexpected text after URI in {what}")
            params = parse_params(after[1:], what)
        return cls(uri=uri, display_name=display, params=params)

    def __str__(self) -> str:
        if self.wildcard:
            return "*"
        name = ""
        if self.display_name is not None:
            name = (
                self.display_name
                if self.display_name and all(is_token(p) for p in self.display_name.split(" "))
                else quote_string(self.display_name)
            ) + " "
        return f"{name}<{self.uri}>{format_params(self.params)}"

    def param(self, name: str) -> str | None:
        return get_param(self.params, name)

    def has_param(self, name: str) -> bool:
        return has_param(self.params, name)

    def with_param(self, name: str, value: str | None) -> NameAddr:
        return replace(self, params=set_param(self.params, name, value))

    @property
    def tag(self) -> str | None:
        return self.param("tag")

    def with_tag(self, tag: str) -> NameAddr:
        return self.with_param("tag", tag)


@dataclass(frozen=True, slots=True)
class Via:
    """One Via value. ``transport`` is upper case; ``port`` is None when absent."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()
    protocol: str = "SIP/2.0"

    @classmethod
    def parse(cls, text: str) -> Via:
        text = text.strip(WSP)
        if not text:
            raise SipParseError("Empty Via header field value")
        # sent-protocol = protocol-name SLASH protocol-version SLASH transport, with LWS
        # allowed around the slashes (§25.1 SLASH = SWS "/" SWS; RFC 4475 wsinv).
        parts = text.split("/", 2)
        if len(parts) != 3:
            raise SipParseError("Bad Via sent-protocol")
        name, version = parts[0].strip(), parts[1].strip()
        rest = parts[2].lstrip()
        transport, _, rest = _split_ws(rest)
        if not is_token(name) or not is_token(version) or not is_token(transport):
            raise SipParseError("Bad Via sent-protocol")
        if f"{name}/{version}".upper() != "SIP/2.0":
            raise SipParseError(f"Unsupported Via protocol {name}/{version}", 505)
        sent_by, semi, raw_params = rest.partition(";")
        sent_by = sent_by.strip()
        if not sent_by:
            raise SipParseError("Missing Via sent-by")
        # LWS may surround the ":" of host:port (§25.1 HCOLON); remove it.
        sent_by = "".join(sent_by.split())
        host, port = parse_host_port(sent_by)
        params = parse_params(raw_params, "Via") if semi else ()
        return cls(transport=transport.upper(), host=host, port=port, params=params)

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.protocol}/{self.transport} {self.host}{port}{format_params(self.params)}"

    def param(self, name: str) -> str | None:
        return get_param(self.params, name)

    def with_param(self, name: str, value: str | None) -> Via:
        return replace(self, params=set_param(self.params, name, value))

    @property
    def branch(self) -> str | None:
        return self.param("branch")

    @property
    def sent_by(self) -> str:
        """``host[:port]`` as the transaction key of §17.2.3 wants it (port defaulted)."""
        default = 5061 if self.transport == "TLS" else 5060
        return f"{self.host.lower()}:{self.port or default}"

    @property
    def received(self) -> str | None:
        return self.param("received")

    @property
    def rport(self) -> int | None:
        """RFC 3581 rport value; None when absent or empty (a request's bare ``;rport``)."""
        value = self.param("rport")
        return int(value) if value and value.isdigit() else None

    @property
    def wants_rport(self) -> bool:
        return has_param(self.params, "rport")

    @property
    def reliable(self) -> bool:
        return self.transport in ("TCP", "TLS", "SCTP", "TLS-SCTP", "WS", "WSS")


def _split_ws(text: str) -> tuple[str, str, str]:
    for i, c in enumerate(text):
        if c in WSP:
            return text[:i], c, text[i:].lstrip(WSP)
    return text, "", ""


MAX_CSEQ = 2**32 - 1  # §8.1.1.5 / RFC 4475 scalar02: "larger than 2**32 - 1" is invalid


@dataclass(frozen=True, slots=True)
class CSeq:
    seq: int
    method: str

    @classmethod
    def parse(cls, text: str) -> CSeq:
        parts = text.split()
        if len(parts) != 2:
            raise SipParseError("Bad CSeq header field")
        number, method = parts
        if not number.isascii() or not number.isdigit():
            raise SipParseError("Bad CSeq number")
        if int(number) > MAX_CSEQ:
            raise SipParseError("CSeq number out of range")
        if not is_token(method):
            raise SipParseError("Bad CSeq method")
        return cls(int(number), method)

    def __str__(self) -> str:
        return f"{self.seq} {self.method}"
