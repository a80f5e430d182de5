"""Building messages: responses (§8.2.6), CANCEL (§9.1), identifiers (§8.1.1.4, §8.1.1.7,
§19.3)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from gateway.sip.errors import SipParseError
from gateway.sip.fields import MAGIC_COOKIE, NameAddr
from gateway.sip.headers import Headers
from gateway.sip.message import Request, Response, partial_request


def generate_tag() -> str:
    """A From/To tag: §19.3 asks for at least 32 bits of randomness; this has 64."""
    return secrets.token_hex(8)


def generate_branch() -> str:
    """A Via branch unique in space and time, with the §8.1.1.7 magic cookie."""
    return MAGIC_COOKIE + secrets.token_hex(12)


def generate_call_id(host: str | None = None) -> str:
    """A globally unique Call-ID (§8.1.1.4): 128 random bits, optionally ``@host``."""
    local = secrets.token_hex(16)
    return f"{local}@{host}" if host else local


def make_response(
    request: Request,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
) -> Response:
    """A response to ``request`` per §8.2.6.2: Via (all, in order), From, To, Call-ID and
    CSeq copied; ``to_tag`` added to To unless the request already had one (then that one is
    kept, as the RFC requires). Timestamp is copied into a 100 (§8.2.6.1).

    Works on the partial request of a :class:`SipParseError` too: the fields are copied as
    text, never parsed, so a malformed message can still be answered 400.
    """
    out = Headers()
    for value in request.headers.get_all("Via"):
        out.add("Via", value)
    for name in ("From", "To", "Call-ID", "CSeq"):
        found = request.headers.get(name)
        if found is None:
            continue
        value = found
        if name == "To" and to_tag is not None and status != 100:
            try:
                to = NameAddr.parse(value, "To")
            except SipParseError:
                pass
            else:
                if to.tag is None:
                    value = str(to.with_tag(to_tag))
        out.add(name, value)
    if status == 100:
        stamp = request.headers.get("Timestamp")
        if stamp is not None:
            out.add("Timestamp", stamp)
    for name, value in headers:
        out.add(name, value)
    return Response(status, reason, out, body)


def error_response(error: SipParseError) -> Response | None:
    """The response a UAS should send for a request that failed to parse, or None when there
    is nothing to answer (a response, an ACK — §17.2.1 never answers ACK — or a message whose
    Via/From/To/Call-ID/CSeq are missing, so no response could be routed or matched)."""
    request = partial_request(error)
    if request is None or request.method == "ACK":
        return None
    if not all(name in request.headers for name in ("Via", "From", "To", "Call-ID", "CSeq")):
        return None
    return make_response(request, error.status, error.reason)


def make_cancel(invite: Request) -> Request:
    """CANCEL for a pending INVITE (§9.1): same Request-URI, Call-ID, To, From, CSeq number;
    one Via equal to the INVITE's top Via (so the branch matches); the same Route set."""
    out = Headers()
    out.add("Via", invite.headers.values("Via")[0])
    for name in ("Route",):
        for value in invite.headers.get_all(name):
            out.add(name, value)
    out.add("Max-Forwards", "70")
    for name in ("From", "To", "Call-ID"):
        out.add(name, invite.headers.get(name) or "")
    out.add("CSeq", f"{invite.cseq.seq} CANCEL")
    return Request("CANCEL", invite.uri, out)
