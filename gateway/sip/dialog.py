"""Dialogs (RFC 3261 §12) and the in-dialog request rules of §12.2, §13.2.2.4 and §13.3.1.4.

A :class:`Dialog` is plain state plus the rules that read and update it; the TU keeps them in
a ``dict[DialogId, Dialog]``. Nothing here sends anything.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.sip.errors import SipParseError
from gateway.sip.fields import NameAddr, Via
from gateway.sip.headers import Headers
from gateway.sip.helpers import generate_branch, make_response
from gateway.sip.message import Request, Response
from gateway.sip.uri import SipUri, Uri

# Requests that refresh the remote target (§12.2, RFC 3311, RFC 6665).
TARGET_REFRESH_METHODS = frozenset({"INVITE", "UPDATE", "SUBSCRIBE", "NOTIFY", "REFER"})


@dataclass(frozen=True, slots=True)
class DialogId:
    """§12: Call-ID, local tag, remote tag (each side names them from its own view)."""

    call_id: str
    local_tag: str
    remote_tag: str


def uas_dialog_id(request: Request) -> DialogId | None:
    """The dialog a received request belongs to (§12.2.2: our tag is in To), or None for a
    request outside any dialog (no To tag)."""
    to_tag = request.to_addr.tag
    if not to_tag:
        return None
    return DialogId(request.call_id, to_tag, request.from_addr.tag or "")


def uac_dialog_id(response: Response) -> DialogId | None:
    """The dialog a received response belongs to (our tag is in From), or None if untagged."""
    to_tag = response.to_addr.tag
    if not to_tag:
        return None
    return DialogId(response.call_id, response.from_addr.tag or "", to_tag)


def no_dialog_response(request: Request) -> Response:
    """§12.2.2: a request with a To tag that matches no dialog gets 481."""
    return make_response(request, 481)


def make_dialog_response(
    request: Request,
    status: int,
    *,
    to_tag: str,
    contact: NameAddr | None,
    reason: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    body: bytes = b"",
) -> Response:
    """A dialog-creating response of a UAS (§12.1.1): To tag, every Record-Route of the
    request in order, and our Contact (mandatory in a 2xx to INVITE)."""
    extra: list[tuple[str, str]] = [
        ("Record-Route", v) for v in request.headers.get_all("Record-Route")
    ]
    if contact is not None:
        extra.append(("Contact", str(contact)))
    extra.extend(headers)
    return make_response(request, status, reason, to_tag=to_tag, headers=extra, body=body)


class DialogState(enum.Enum):
    EARLY = "early"
    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: NameAddr  # our From (UAC) / To (UAS) without tag
    remote_uri: NameAddr
    remote_target: Uri
    route_set: list[NameAddr] = field(default_factory=list)
    local_seq: int | None = None
    remote_seq: int | None = None
    local_contact: NameAddr | None = None
    secure: bool = False
    state: DialogState = DialogState.CONFIRMED

    @property
    def id(self) -> DialogId:
        return DialogId(self.call_id, self.local_tag, self.remote_tag)

    # --- creation ---------------------------------------------------------------------------

    @classmethod
    def from_uac_response(cls, request: Request, response: Response) -> Dialog:
        """§12.1.2: the UAC's dialog from a 1xx (early) or 2xx (confirmed) with a To tag.
        Route set: Record-Route of the response, reversed; remote target: its Contact."""
        to = response.to_addr
        if not to.tag:
            raise SipParseError("response creates no dialog: To has no tag")
        contacts = response.contacts
        if not contacts and response.status >= 200:
            raise SipParseError("2xx creating a dialog lacks a Contact")
        target = contacts[0].uri if contacts else request.uri
        from_ = request.from_addr
        return cls(
            call_id=request.call_id,
            local_tag=from_.tag or "",
            remote_tag=to.tag,
            local_uri=_untagged(from_),
            remote_uri=_untagged(to),
            remote_target=target,
            route_set=list(reversed(response.record_routes)),
            local_seq=request.cseq.seq,
            remote_seq=None,
            local_contact=request.contacts[0] if request.contacts else None,
            secure=isinstance(request.uri, SipUri) and request.uri.secure,
            state=DialogState.CONFIRMED if response.status >= 200 else DialogState.EARLY,
        )

    @classmethod
    def from_uas_request(
        cls, request: Request, local_tag: str, local_contact: NameAddr | None
    ) -> Dialog:
        """§12.1.1: the UAS's dialog when it answers ``request`` with ``local_tag`` (send the
        response built by :func:`make_dialog_response`). Route set: Record-Route in order;
        remote target: the request's Contact; local sequence number empty."""
        contacts = request.contacts
        if not contacts:
            raise SipParseError("dialog-creating request lacks a Contact")
        return cls(
            call_id=request.call_id,
            local_tag=local_tag,
            remote_tag=request.from_addr.tag or "",
            local_uri=_untagged(request.to_addr),
            remote_uri=_untagged(request.from_addr),
            remote_target=contacts[0].uri,
            route_set=list(request.record_routes),
            local_seq=None,
            remote_seq=request.cseq.seq,
            local_contact=local_contact,
            secure=isinstance(request.uri, SipUri) and request.uri.secure,
            state=DialogState.CONFIRMED,
        )

    # --- requests we send -------------------------------------------------------------------

    def create_request(
        self,
        method: str,
        *,
        sent_by: str,
        transport: str = "UDP",
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Request:
        """A request within the dialog (§12.2.1.1). Not for ACK (``create_ack``) or CANCEL
        (:func:`gateway.sip.helpers.make_cancel`), which reuse their INVITE's CSeq."""
        if method in ("ACK", "CANCEL"):
            raise ValueError(f"{method} is not built with create_request")
        if self.local_seq is None:
            # §8.1.1.5: an initial value below 2**31.
            self.local_seq = secrets.randbelow(2**31 - 1)
        self.local_seq += 1
        return self._build(method, self.local_seq, sent_by, transport, headers, body)

    def create_ack(
        self,
        invite: Request,
        *,
        sent_by: str,
        transport: str = "UDP",
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
    ) -> Request:
        """The ACK for a 2xx to ``invite`` (§13.2.2.4): built like any in-dialog request but
        with the INVITE's CSeq number and its credentials; a new branch (it is a transaction
        of its own)."""
        extra = [
            (name, value)
            for name in ("Authorization", "Proxy-Authorization")
            for value in invite.headers.get_all(name)
        ]
        extra.extend(headers)
        return self._build("ACK", invite.cseq.seq, sent_by, transport, extra, body)

    def _build(
        self,
        method: str,
        seq: int,
        sent_by: str,
        transport: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> Request:
        uri, routes = self.request_target()
        h = Headers()
        h.add("Via", f"SIP/2.0/{transport.upper()} {sent_by};branch={generate_branch()};rport")
        for route in routes:
            h.add("Route", str(route))
        h.add("Max-Forwards", "70")
        h.add("From", str(self.local_uri.with_tag(self.local_tag)))
        h.add("To", str(self.remote_uri.with_tag(self.remote_tag)))
        h.add("Call-ID", self.call_id)
        h.add("CSeq", f"{seq} {method}")
        if method in TARGET_REFRESH_METHODS and self.local_contact is not None:
            h.add("Contact", str(self.local_contact))
        for name, value in headers:
            h.add(name, value)
        return Request(method, uri, h, body)

    def request_target(self) -> tuple[Uri, list[NameAddr]]:
        """Request-URI and Route set for the next request (§12.2.1.1): loose routing when
        the first route has ``lr``, else strict routing (the first route becomes the
        Request-URI and the remote target goes last)."""
        if not self.route_set:
            return self.remote_target, []
        first = self.route_set[0]
        if isinstance(first.uri, SipUri) and first.uri.lr:
            return self.remote_target, list(self.route_set)
        uri = first.uri
        if isinstance(uri, SipUri):
            # Parameters not allowed in a Request-URI are stripped (§19.1.1 table).
            uri = uri.without_params("method", "maddr", "ttl", "transport", "lr")
        return uri, [*self.route_set[1:], NameAddr(self.remote_target)]

    def next_hop(self) -> Uri:
        """Where the next request goes first (§8.1.2): the first Route, or the target."""
        uri, routes = self.request_target()
        return routes[0].uri if routes else uri

    # --- messages we receive ----------------------------------------------------------------

    def receive_request(self, request: Request) -> Response | None:
        """Apply §12.2.2 to an in-dialog request; returns the error response to send (500 for
        an out-of-order CSeq), or None if the request is fine for the TU to handle."""
        if request.method not in ("ACK", "CANCEL"):
            seq = request.cseq.seq
            if self.remote_seq is not None and seq < self.remote_seq:
                return make_response(request, 500, "Server Internal Error")
            self.remote_seq = seq
        if request.method in TARGET_REFRESH_METHODS:
            contacts = request.contacts
            if contacts and not contacts[0].wildcard:
                self.remote_target = contacts[0].uri
        return None

    def receive_response(self, request: Request, response: Response) -> None:
        """Apply a response to our in-dialog (or dialog-creating) request: early → confirmed
        with the route set recomputed on a 2xx (§13.2.2.4), target refresh on a 2xx
        (§12.2.1.2), and termination on 481/408 (§12.2.1.2)."""
        status = response.status
        if status in (481, 408):
            self.state = DialogState.TERMINATED
            return
        if 200 <= status < 300:
            if self.state is DialogState.EARLY:
                self.state = DialogState.CONFIRMED
                self.route_set = list(reversed(response.record_routes))
            if request.method in TARGET_REFRESH_METHODS:
                contacts = response.contacts
                if contacts:
                    self.remote_target = contacts[0].uri
        elif status >= 300 and self.state is DialogState.EARLY and request.method == "INVITE":
            self.state = DialogState.TERMINATED  # §12.3: a non-2xx final ends early dialogs

    def terminate(self) -> None:
        self.state = DialogState.TERMINATED


def _untagged(addr: NameAddr) -> NameAddr:
    return NameAddr(
        addr.uri,
        addr.display_name,
        tuple((n, v) for n, v in addr.params if n.lower() != "tag"),
    )


def top_via_branch(message: Request | Response) -> str | None:
    """Convenience for logging and tests."""
    vias = message.headers.values("Via")
    return Via.parse(vias[0]).branch if vias else None
