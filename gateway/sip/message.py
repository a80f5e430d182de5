"""SIP requests and responses: ``parse(data)`` and ``bytes(message)`` (RFC 3261 §7, §20, §25).

``parse`` reads one complete message with datagram semantics (§18.3): a Content-Length shorter
than what follows the header section drops the extra octets (RFC 4475 dblreq), a longer one is
an error (clerr), and a missing one means the rest of the datagram. Stream transports go
through :class:`gateway.sip.framing.StreamFramer`, which cuts the stream into such messages.

Validation is eager for the fields a UA depends on (Via, From, To, Call-ID, CSeq, Max-Forwards,
Content-Length, Contact, Route, Record-Route and the Request-URI), so that a message which
parses can be used without further checks. Everything else is kept as text.
"""

from __future__ import annotations

import abc
import re

from gateway.sip.errors import SipParseError
from gateway.sip.fields import CSeq, NameAddr, Via
from gateway.sip.headers import Headers
from gateway.sip.syntax import WSP, is_token, is_word
from gateway.sip.uri import AbsoluteUri, SipUri, Uri, parse_uri

SIP_VERSION = "SIP/2.0"
Address = tuple[str, int]

# Methods of RFC 3261 and its common extensions: a CSeq mismatch on any other method is
# answered 501 rather than 400 (RFC 4475 mismatch02).
KNOWN_METHODS = frozenset(
    {
        "ACK", "BYE", "CANCEL", "INFO", "INVITE", "MESSAGE", "NOTIFY", "OPTIONS", "PRACK",
        "PUBLISH", "REFER", "REGISTER", "SUBSCRIBE", "UPDATE",
    }
)  # fmt: skip
_VERSION_RE = re.compile(r"SIP/(\d+)\.(\d+)", re.IGNORECASE)
_SINGLE_FIELDS = ("To", "From", "Call-ID", "CSeq", "Max-Forwards", "Content-Length")
_REQUIRED_FIELDS = ("To", "From", "Call-ID", "CSeq", "Via")  # §8.1.1
_ALLOWED_REQUEST_SCHEMES = ("sip", "sips", "tel")  # others: 416 (§8.2.2.1)


class Message(abc.ABC):
    """What requests and responses share: header fields and body, and typed accessors that
    parse the fields on each access (the header list stays the single source of truth)."""

    __slots__ = ("body", "headers")

    def __init__(self, headers: Headers | None = None, body: bytes = b"") -> None:
        self.headers = headers if headers is not None else Headers()
        self.body = body

    @abc.abstractmethod
    def start_line(self) -> str:
        """The request or status line (``Request`` and ``Response`` define it)."""

    def __bytes__(self) -> bytes:
        lines = [self.start_line()]
        wrote_length = False
        for name, value in self.headers:
            if name == "Content-Length":
                # The body decides: a stale Content-Length must never reach the wire.
                if wrote_length:
                    continue
                value = str(len(self.body))
                wrote_length = True
            lines.append(f"{name}: {value}")
        if not wrote_length:
            lines.append(f"Content-Length: {len(self.body)}")
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8", "surrogateescape") + self.body

    def __eq__(self, other: object) -> bool:
        """Semantic equality: start line, header fields in order (Content-Length aside, since
        serialization recomputes it) and body."""
        if not isinstance(other, Message) or type(self) is not type(other):
            return NotImplemented
        return (
            self.start_line() == other.start_line()
            and _without_length(self.headers) == _without_length(other.headers)
            and self.body == other.body
        )

    __hash__ = None  # type: ignore[assignment]

    @abc.abstractmethod
    def copy(self) -> Message:
        """An independent copy (headers and body), of the concrete type."""

    # --- typed accessors -----------------------------------------------------------------

    @property
    def via(self) -> list[Via]:
        return [Via.parse(v) for v in self.headers.values("Via")]

    @property
    def top_via(self) -> Via:
        values = self.headers.values("Via")
        if not values:
            raise SipParseError("Missing Via header field")
        return Via.parse(values[0])

    @property
    def from_addr(self) -> NameAddr:
        return NameAddr.parse(self._required("From"), "From")

    @property
    def to_addr(self) -> NameAddr:
        return NameAddr.parse(self._required("To"), "To")

    @property
    def call_id(self) -> str:
        return self._required("Call-ID")

    @property
    def cseq(self) -> CSeq:
        return CSeq.parse(self._required("CSeq"))

    @property
    def max_forwards(self) -> int | None:
        value = self.headers.get("Max-Forwards")
        if value is None:
            return None
        if not value.isascii() or not value.isdigit() or int(value) > 255:
            raise SipParseError("Bad Max-Forwards header field")
        return int(value)

    @property
    def contacts(self) -> list[NameAddr]:
        return [NameAddr.parse(v, "Contact") for v in self.headers.values("Contact")]

    @property
    def routes(self) -> list[NameAddr]:
        return [_route(v, "Route") for v in self.headers.values("Route")]

    @property
    def record_routes(self) -> list[NameAddr]:
        return [_route(v, "Record-Route") for v in self.headers.values("Record-Route")]

    @property
    def expires(self) -> int | None:
        value = self.headers.get("Expires")
        if value is None:
            return None
        value = value.strip()
        if not value.isascii() or not value.isdigit():
            raise SipParseError("Bad Expires header field")
        return int(value)

    @property
    def content_type(self) -> str | None:
        value = self.headers.get("Content-Type")
        return value.split(";", 1)[0].strip().lower() if value else None

    def _required(self, name: str) -> str:
        value = self.headers.get(name)
        if value is None:
            raise SipParseError(f"Missing {name} header field")
        return value


class Request(Message):
    __slots__ = ("method", "uri", "version")

    def __init__(
        self,
        method: str,
        uri: Uri,
        headers: Headers | None = None,
        body: bytes = b"",
        version: str = SIP_VERSION,
    ) -> None:
        super().__init__(headers, body)
        self.method = method
        self.uri = uri
        self.version = version

    def start_line(self) -> str:
        return f"{self.method} {self.uri} {self.version}"

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.uri}>"

    def copy(self) -> Request:
        return Request(self.method, self.uri, self.headers.copy(), self.body, self.version)


class Response(Message):
    __slots__ = ("reason", "status", "version")

    def __init__(
        self,
        status: int,
        reason: str | None = None,
        headers: Headers | None = None,
        body: bytes = b"",
        version: str = SIP_VERSION,
    ) -> None:
        from gateway.sip.reasons import reason_phrase

        super().__init__(headers, body)
        self.status = status
        self.reason = reason_phrase(status) if reason is None else reason
        self.version = version

    def start_line(self) -> str:
        return f"{self.version} {self.status} {self.reason}"

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}>"

    def copy(self) -> Response:
        return Response(self.status, self.reason, self.headers.copy(), self.body, self.version)


def _without_length(headers: Headers) -> list[tuple[str, str]]:
    return [(n, v) for n, v in headers if n != "Content-Length"]


def _route(value: str, what: str) -> NameAddr:
    # §20.30/§20.34: route-param = name-addr: the brackets are mandatory.
    if "<" not in value:
        raise SipParseError(f"{what} URI must be enclosed in <>")
    return NameAddr.parse(value, what)


# --- parsing ------------------------------------------------------------------------------


def partial_request(error: SipParseError) -> Request | None:
    """The request ``error`` was raised for, as far as it could be read (start line and raw
    header fields, see :class:`SipParseError`), or None when the bad message was a response or
    not even its start line could be read. Here rather than on the error: ``errors`` sits below
    this module (everything here raises its error) and cannot name ``Request``."""
    message = error.message
    return message if isinstance(message, Request) else None


def is_keepalive(data: bytes) -> bool:
    """True for a CRLF keep-alive (RFC 5626 §3.5.1) rather than a message."""
    return not data.strip(b"\r\n")


def find_header_end(data: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """(index, length) of the blank line ending the header section, CRLF CRLF or, liberally,
    LF LF; None if not there yet."""
    crlf = data.find(b"\r\n\r\n", start)
    lf = data.find(b"\n\n", start)
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 4
    if lf >= 0:
        return lf, 2
    return None


def parse(data: bytes) -> Request | Response:
    """Parse one SIP message (datagram semantics, see the module docstring).

    Raises :class:`SipParseError` (and nothing else) for any malformed input.
    """
    # §7.5: CRLFs before the start line are ignored (keep-alives on the same path).
    start = 0
    while data[start : start + 2] == b"\r\n" or data[start : start + 1] == b"\n":
        start += 2 if data[start : start + 1] == b"\r" else 1
    end = find_header_end(data, start)
    if end is None:
        head, rest = data[start:], b""
    else:
        head, rest = data[start : end[0]], data[end[0] + end[1] :]
    if not head.strip():
        raise SipParseError("Empty message")
    text = head.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    message, version_error = _parse_start_line(lines[0])
    _parse_header_lines(lines[1:], message)
    if version_error is not None:
        version_error.message = message
        raise version_error
    try:
        length = _validate(message)
    except SipParseError as exc:
        exc.message = message
        raise
    if length is None:
        message.body = rest  # §18.3: no Content-Length over UDP: the rest of the datagram
    elif length > len(rest):
        raise SipParseError("Content-Length larger than the message body", message=message)
    else:
        message.body = rest[:length]  # §18.3: extra octets after the body are discarded
    return message


def _parse_start_line(line: str) -> tuple[Request | Response, SipParseError | None]:
    if line[:4].upper() == "SIP/":
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not _VERSION_RE.fullmatch(version):
            raise SipParseError("Bad Status-Line")
        if len(code) != 3 or not code.isascii() or not code.isdigit() or int(code) < 100:
            raise SipParseError("Bad status code in Status-Line")
        response = Response(int(code), reason.strip(WSP))
        return response, _version_error(version)
    parts = line.split()
    if len(parts) < 3:
        raise SipParseError("Bad Request-Line")
    method, version = parts[0], parts[-1]
    if not is_token(method):
        raise SipParseError("Bad method in Request-Line")
    if not _VERSION_RE.fullmatch(version):
        raise SipParseError("Bad SIP-Version in Request-Line")
    raw_uri = " ".join(parts[1:-1])
    problem: SipParseError | None = None
    uri: Uri
    if len(parts) > 3:
        # RFC 4475 lwsruri: LWS inside the Request-URI. (Extra SP *between* the elements, as
        # in lwsstart and trws, is accepted: str.split() already ignored it.)
        problem = SipParseError("Whitespace in Request-URI")
        uri = AbsoluteUri("invalid", raw_uri)
    elif raw_uri.startswith("<"):
        problem = SipParseError("Request-URI must not be enclosed in <>")  # ltgtruri
        uri = AbsoluteUri("invalid", raw_uri)
    else:
        try:
            uri = parse_uri(raw_uri)
        except SipParseError as exc:
            problem = SipParseError(f"Bad Request-URI: {exc.reason}")
            uri = AbsoluteUri("invalid", raw_uri)
    request = Request(method, uri)
    return request, _version_error(version) or problem


def _version_error(version: str) -> SipParseError | None:
    if version.upper() != SIP_VERSION:
        return SipParseError("Version Not Supported", 505)  # RFC 4475 badvers
    return None


def _parse_header_lines(lines: list[str], message: Request | Response) -> None:
    items: list[tuple[str, str]] = []
    bad = False
    for line in lines:
        if line[:1] in (" ", "\t"):
            # §7.3.1: a line starting with whitespace continues the previous field; the fold
            # is equivalent to one SP.
            if not items:
                raise SipParseError("Header continuation line without a header field")
            name, value = items[-1]
            items[-1] = (name, f"{value} {line.strip(WSP)}".strip(WSP))
            continue
        if not line:
            continue
        name, colon, value = line.partition(":")
        name = name.rstrip(WSP)
        if not colon or not is_token(name):
            # Keep reading: the other fields let the caller still answer 400.
            bad = True
            continue
        items.append((name, value.strip(WSP)))
    message.headers = Headers(items)
    if bad:
        raise SipParseError("Malformed header line", message=message)


def _validate(message: Request | Response) -> int | None:
    headers = message.headers
    missing = [n for n in _REQUIRED_FIELDS if n not in headers]
    if missing:
        raise SipParseError(
            f"Missing {', '.join(missing)} header field{'s' if len(missing) > 1 else ''}"
        )
    for name in _SINGLE_FIELDS:
        if len(headers.get_all(name)) > 1:
            # RFC 4475 multi01, mcl01
            raise SipParseError(f"Multiple {name} header fields", framing=name == "Content-Length")
    length_text = headers.get("Content-Length")
    length = None
    if length_text is not None:
        if not length_text.isascii() or not length_text.isdigit():
            raise SipParseError("Bad Content-Length header field", framing=True)  # ncl
        length = int(length_text)
    for field, parse_one in (("Via", Via.parse), ("Contact", _contact)):
        for value in headers.values(field):
            try:
                parse_one(value)
            except SipParseError as exc:
                raise SipParseError(f"Bad {field} header field: {exc.reason}") from None
    for field in ("Route", "Record-Route"):
        for value in headers.values(field):
            try:
                _route(value, field)
            except SipParseError as exc:
                raise SipParseError(f"Bad {field} header field: {exc.reason}") from None
    for field in ("From", "To"):
        try:
            NameAddr.parse(headers.get(field) or "", field)
        except SipParseError as exc:
            raise SipParseError(f"Bad {field} header field: {exc.reason}") from None
    call_id = headers.get("Call-ID") or ""
    local, _, host = call_id.partition("@")
    if not is_word(local) or (_ and not is_word(host)):
        raise SipParseError("Bad Call-ID header field")
    cseq = message.cseq
    message.max_forwards  # noqa: B018  (validates)
    contacts = headers.values("Contact")
    if "*" in contacts and len(contacts) > 1:
        raise SipParseError("Bad Contact header field: '*' must be alone")
    if isinstance(message, Request):
        if cseq.method != message.method:
            # RFC 4475 mismatch01 (400) and mismatch02 (unknown method: 501)
            status = 400 if message.method in KNOWN_METHODS else 501
            raise SipParseError("CSeq method does not match Request-Line", status)
        uri = message.uri
        if isinstance(uri, SipUri) and uri.headers:
            raise SipParseError("Request-URI must not contain headers")  # escruri, §19.1.1
        if uri.scheme.lower() not in _ALLOWED_REQUEST_SCHEMES and uri.scheme != "invalid":
            raise SipParseError("Unsupported URI Scheme", 416)  # §8.2.2.1, RFC 4475 unkscm
    return length


def _contact(value: str) -> NameAddr:
    return NameAddr.parse(value, "Contact")
