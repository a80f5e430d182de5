"""Cutting a stream transport's bytes into SIP messages (RFC 3261 §18.3, RFC 5626 §3.5.1).

On a stream, Content-Length is the only message boundary. A bad one loses the boundaries for
good: the framer reports a ``SipParseError`` with ``framing=True`` once and then discards
everything, and the transport must close the connection (RFC 4475 ncl). Errors inside a
correctly framed message (a bad header) are reported and the framer carries on.
"""

from __future__ import annotations

from gateway.sip.errors import SipParseError
from gateway.sip.message import Request, Response, find_header_end, parse

DEFAULT_MAX_MESSAGE_SIZE = 65535  # the largest UDP payload; ample for any signalling message


class StreamFramer:
    """Incremental framer: ``feed`` any chunks, get back every message completed so far.

    Feeding a stream in any split (one byte at a time or all at once) yields the same list.
    CRLF keep-alives between messages are skipped; ``pings`` counts RFC 5626 double-CRLF pings
    so the transport can answer each with a single CRLF pong.
    """

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.max_message_size = max_message_size
        self.broken = False
        self.pings = 0
        self._buffer = bytearray()
        self._crlf_run = 0

    def feed(self, data: bytes) -> list[Request | Response | SipParseError]:
        out: list[Request | Response | SipParseError] = []
        if self.broken:
            return out
        self._buffer += data
        while self._buffer:
            self._skip_keepalives()
            if not self._buffer:
                break
            end = find_header_end(self._buffer)
            if end is None:
                if len(self._buffer) > self.max_message_size:
                    out.append(self._break("Message too large"))
                break
            head_len = end[0] + end[1]
            try:
                length = _content_length(bytes(self._buffer[: end[0]]))
            except SipParseError as exc:
                out.append(self._break(exc.reason))
                break
            total = head_len + length
            if total > self.max_message_size:
                out.append(self._break("Message too large"))
                break
            if len(self._buffer) < total:
                break
            chunk = bytes(self._buffer[:total])
            del self._buffer[:total]
            try:
                out.append(parse(chunk))
            except SipParseError as exc:
                out.append(exc)
        return out

    def _skip_keepalives(self) -> None:
        i = 0
        buf = self._buffer
        while i < len(buf) and buf[i] in (0x0D, 0x0A):
            if buf[i] == 0x0A:
                self._crlf_run += 1
                if self._crlf_run == 2:
                    self.pings += 1
                    self._crlf_run = 0
            i += 1
        if i:
            del buf[:i]
        if buf:
            self._crlf_run = 0

    def _break(self, reason: str) -> SipParseError:
        self.broken = True
        self._buffer.clear()
        status = 513 if reason == "Message too large" else 400
        return SipParseError(reason, status, framing=True)


def _content_length(head: bytes) -> int:
    """Content-Length of a header section (either name form); 0 when absent. §18.3 makes it
    mandatory on streams; a peer that leaves it out of a body-less message is tolerated."""
    found: int | None = None
    for raw in head.split(b"\n")[1:]:
        name, colon, value = raw.partition(b":")
        if not colon or raw[:1] in (b" ", b"\t"):
            continue
        if name.strip().lower() not in (b"content-length", b"l"):
            continue
        text = value.strip()
        if not text.isdigit():
            raise SipParseError("Bad Content-Length header field")
        if found is not None and found != int(text):
            raise SipParseError("Multiple Content-Length header fields")
        found = int(text)
    return found or 0
