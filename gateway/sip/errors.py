"""The one error type of the SIP syntax layer.

h11-style: a protocol error carries the status code a UAS should answer with (RFC 3261 §21),
so the layer above can turn any parse failure into a response without guessing.
"""

from __future__ import annotations


class SipParseError(ValueError):
    """Malformed SIP input.

    ``status``: the response a UAS should send (400, 416, 505, 501...), ``reason``: a reason
    phrase naming the problem (sent as the response's Reason-Phrase, RFC 3261 §21.4.1 allows
    any text). ``message`` is the request or response as far as it could be read (start line
    and raw header fields, unvalidated) so that a 400 can still be built with
    :func:`gateway.sip.helpers.make_response` from its Via/From/To/Call-ID/CSeq; ``None`` when
    not even the start line could be read (:func:`gateway.sip.message.partial_request` gives it
    back typed when it is a request). ``framing`` is true when the byte stream lost its message
    boundaries (bad Content-Length, size limit): a stream transport must then close the
    connection (RFC 3261 §18.3; RFC 4475 ncl).
    """

    def __init__(
        self,
        reason: str,
        status: int = 400,
        *,
        # ``object``: this module is the bottom of the syntax layer (syntax, uri, fields and
        # message all raise this error), so it cannot name Request/Response without importing
        # gateway.sip.message back; that module narrows the value (``partial_request``).
        message: object = None,
        framing: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.message = message
        self.framing = framing

    def __repr__(self) -> str:
        return f"SipParseError({self.reason!r}, status={self.status})"
