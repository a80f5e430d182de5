"""The sans-I/O transaction layer (RFC 3261 §17, §18 for the transport rules it needs).

Shaped like aioquic's ``QuicConnection``: the owner feeds input with ``receive(..., now)``,
asks for ``get_timer()``, calls ``handle_timer(now)`` when it expires and drains events with
``next_event()`` (``Transmit`` among them: this module never touches a socket or a clock).

What it does on its own, so that every TU gets it right:
- matches requests to server transactions (§17.2.3, with the RFC 2543 fallback) and absorbs
  retransmissions; matches responses to client transactions (§17.1.3);
- adds ``received``/``rport`` to the top Via of requests (§18.2.1, RFC 3581 §4) and sends
  responses where §18.2.2/RFC 3581 say;
- sends 100 Trying for an INVITE at once (§17.2.1; ``auto_trying``);
- answers a CANCEL: 481 if it matches no INVITE (§9.2), else 200 and ``CancelReceived``;
- answers a merged request 482 (§8.2.2.2);
- answers an unparseable request statelessly with the parser's status (400/416/505...);
- matches the ACK for a 2xx to the INVITE server transaction and stops the 2xx
  retransmissions (§13.3.1.4);
- asks its ``limits`` (``gateway.sip.limits``) before it parses a datagram from a source
  that is over its rate, and before it creates a server transaction for a new request, and
  answers a refused one statelessly (503 + Retry-After, §8.2.6 and §21.5.4; 403 to a
  source locked out after failed authentications) or drops it: a
  flood costs microseconds per request and never a transaction.
"""

from __future__ import annotations

from collections import deque

from gateway.sip.errors import SipParseError
from gateway.sip.events import (
    CancelReceived,
    MalformedMessage,
    RequestReceived,
    ResponseReceived,
    SipEvent,
    TransactionTerminated,
    Transmit,
)
from gateway.sip.fields import MAGIC_COOKIE, Via
from gateway.sip.headers import Headers
from gateway.sip.helpers import error_response, generate_branch, generate_tag, make_response
from gateway.sip.limits import Refusal, SourceLimits, peek_method
from gateway.sip.message import Address, Request, Response, is_keepalive, parse, partial_request
from gateway.sip.reasons import reason_phrase
from gateway.sip.syntax import split_top_level
from gateway.sip.transaction import (
    Input,
    InviteClientTransaction,
    InviteServerTransaction,
    NonInviteClientTransaction,
    NonInviteServerTransaction,
    ServerTransaction,
    State,
    TimerConfig,
    Transaction,
)


def has_rfc3261_branch(via: Via) -> bool:
    """§8.1.1.7: a branch starting with the magic cookie, with something after it (a bare
    cookie, RFC 4475 badbranch, gets the RFC 2543 treatment)."""
    branch = via.branch
    return branch is not None and branch.startswith(MAGIC_COOKIE) and len(branch) > 7


def server_transaction_key(request: Request, via: Via | None = None) -> str:
    """The §17.2.3 key. ACK matches the INVITE's transaction, hence method INVITE."""
    via = via or request.top_via
    method = "INVITE" if request.method == "ACK" else request.method
    if has_rfc3261_branch(via):
        return f"{via.branch}/{via.sent_by}/{method}"
    # RFC 2543 fallback: Request-URI, From tag, Call-ID, CSeq number and top Via (the To tag
    # is left out: a 2543 ACK carries the tag of our response, the INVITE did not).
    return "2543/" + "/".join(
        (str(request.uri), request.from_addr.tag or "", request.call_id,
         str(request.cseq.seq), method, str(via))
    )  # fmt: skip


def client_transaction_key(branch: str, method: str) -> str:
    """§17.1.3: branch of the top Via and the CSeq method."""
    return f"{branch}/{method}"


def response_address(via: Via, source: Address) -> Address:
    """Where to send a response on an unreliable transport: §18.2.2 with RFC 3581 §4.
    ``received`` (or the source IP) and ``rport`` (or the sent-by port, default 5060)."""
    maddr = via.param("maddr")
    default = 5061 if via.transport == "TLS" else 5060
    if maddr:
        return (maddr, via.port or default)
    host = via.received or source[0]
    if via.wants_rport:
        return (host, via.rport or source[1])
    return (host, via.port or default)


class TransactionLayer:
    def __init__(
        self,
        config: TimerConfig | None = None,
        *,
        auto_trying: bool = True,
        limits: SourceLimits | None = None,
    ) -> None:
        self.config = config or TimerConfig()
        self.auto_trying = auto_trying
        self.limits = limits
        self._transactions: dict[str, Transaction] = {}
        # (Call-ID, CSeq number, From tag, To tag) of INVITE server transactions that sent a
        # 2xx, to find them from the ACK (which has its own branch, §13.2.2.4).
        self._accepted: dict[tuple[str, int, str, str], InviteServerTransaction] = {}
        # (From tag, Call-ID, CSeq) of live server transactions, for §8.2.2.2.
        self._merge: dict[tuple[str, str, str], str] = {}
        self._events: deque[SipEvent] = deque()
        # get_timer()'s answer, recomputed only after something could have moved a deadline:
        # a shed or refused request touches no transaction, and the adapter asks for the timer
        # after every datagram, so a flood must not pay a walk over the whole table each time.
        self._timer_at: float | None = None
        self._timer_stale = True

    # --- the aioquic-style surface ----------------------------------------------------------

    def next_event(self) -> SipEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        if self._timer_stale:
            deadlines = [
                d for t in self._transactions.values() if (d := t.next_deadline()) is not None
            ]
            self._timer_at = min(deadlines, default=None)
            self._timer_stale = False
        return self._timer_at

    def handle_timer(self, now: float) -> None:
        self._timer_stale = True
        while True:
            due = [
                (deadline, name, txn)
                for txn in list(self._transactions.values())
                for deadline, name in txn.due_timers(now)
            ]
            if not due:
                return
            due.sort(key=lambda item: item[0])
            for deadline, name, txn in due:
                if txn.timers.get(name) == deadline and txn.state is not State.TERMINATED:
                    del txn.timers[name]
                    txn.fire(name, now)

    def receive(
        self,
        data: bytes | Request | Response | SipParseError,
        addr: Address,
        now: float,
        *,
        reliable: bool = False,
    ) -> None:
        """Input from the network: raw datagram bytes, a message the stream framer produced, or
        the framer's SipParseError."""
        if isinstance(data, bytes):
            if is_keepalive(data):
                return
            if self.limits is not None and self._shed(data, addr, now, reliable):
                return
            try:
                data = parse(data)
            except SipParseError as exc:
                data = exc
        if isinstance(data, SipParseError):
            self._malformed(data, addr, reliable)  # touches no transaction
        elif isinstance(data, Request):
            try:
                self._receive_request(data, addr, now, reliable)
            except SipParseError as exc:  # a field broke that parse() does not check
                exc.message = data
                self._malformed(exc, addr, reliable)
        else:
            self._timer_stale = True
            self._receive_response(data, addr, now)

    def send_request(
        self, request: Request, addr: Address, now: float, *, reliable: bool = False
    ) -> str:
        """Start a client transaction for ``request`` and return its id. The request needs a
        top Via with the local sent-by; a fresh branch is put in if it has none. Not for ACK:
        the ACK for a 2xx goes with ``send_stateless`` (§13.2.2.4), the one for a non-2xx is
        sent by the transaction itself."""
        self._timer_stale = True
        if request.method == "ACK":
            raise ValueError("ACK is not sent in a client transaction; use send_stateless")
        vias = request.headers.values("Via")
        if not vias:
            raise ValueError("request needs a Via header field with the local sent-by")
        via = Via.parse(vias[0])
        if via.branch is None:
            via = via.with_param("branch", generate_branch())
            request.headers.set("Via", ", ".join([str(via), *vias[1:]]))
        assert via.branch is not None
        key = client_transaction_key(via.branch, request.method)
        if key in self._transactions:
            raise ValueError(f"a client transaction {key} already exists")
        cls = InviteClientTransaction if request.method == "INVITE" else NonInviteClientTransaction
        txn = cls(self, key, request, addr, reliable)
        self._transactions[key] = txn
        txn.start(now)
        return key

    def send_response(self, transaction_id: str, response: Response, now: float) -> None:
        """Send ``response`` through server transaction ``transaction_id``."""
        self._timer_stale = True
        txn = self._transactions.get(transaction_id)
        if not isinstance(txn, ServerTransaction):
            raise KeyError(f"no server transaction {transaction_id}")
        txn.respond(response, now)
        if isinstance(txn, InviteServerTransaction) and 200 <= response.status < 300:
            to_tag = response.to_addr.tag or ""
            request = txn.request
            key = (request.call_id, request.cseq.seq, request.from_addr.tag or "", to_tag)
            self._accepted[key] = txn

    def send_stateless(
        self, message: Request | Response, addr: Address, *, reliable: bool = False
    ) -> None:
        """Transmit outside any transaction (ACK for 2xx, §13.2.2.4)."""
        self._transmit(bytes(message), addr, reliable)

    def transport_error(self, addr: Address, now: float) -> None:
        """The transport could not reach ``addr`` (ICMP error, connection failure)."""
        self._timer_stale = True
        for txn in list(self._transactions.values()):
            if txn.addr == addr:
                txn.fire(Input.TRANSPORT_ERROR, now)

    def transaction_state(self, transaction_id: str) -> State | None:
        txn = self._transactions.get(transaction_id)
        return txn.state if txn else None

    def transaction(self, transaction_id: str) -> Transaction | None:
        return self._transactions.get(transaction_id)

    @property
    def transaction_count(self) -> int:
        """Transactions held now, client and server (what ``max_transactions`` bounds)."""
        return len(self._transactions)

    # --- internals used by the transactions --------------------------------------------------

    def _emit(self, event: SipEvent) -> None:
        self._events.append(event)

    def _transmit(self, data: bytes, addr: Address, reliable: bool) -> None:
        self._events.append(Transmit(data, addr, reliable))

    def _terminated(self, txn: Transaction) -> None:
        self._transactions.pop(txn.id, None)
        if isinstance(txn, InviteServerTransaction):
            for key, value in list(self._accepted.items()):
                if value is txn:
                    del self._accepted[key]
        for merge_key, txn_id in list(self._merge.items()):
            if txn_id == txn.id:
                del self._merge[merge_key]
        self._events.append(TransactionTerminated(txn.id))

    # --- receive paths -----------------------------------------------------------------------

    def _malformed(self, error: SipParseError, addr: Address, reliable: bool) -> None:
        response = error_response(error)
        if response is not None:
            request = partial_request(error)
            assert request is not None
            try:
                dest = addr if reliable else response_address(request.top_via, addr)
            except SipParseError:
                dest = addr
            self._transmit(bytes(response), dest, reliable)
        self._emit(MalformedMessage(error, addr))

    def _receive_request(self, request: Request, addr: Address, now: float, reliable: bool) -> None:
        via = request.top_via
        key = server_transaction_key(request, via)
        self._stamp_via(request, via, addr)
        txn = self._transactions.get(key)
        if request.method == "ACK":
            self._timer_stale = True
            self._receive_ack(request, txn, addr, now)
            return
        if txn is not None:
            self._timer_stale = True
            txn.fire(Input.RECV_REQUEST, now, request)  # a retransmission
            return
        dest = addr if reliable else response_address(request.top_via, addr)
        if self.limits is not None:
            refusal = self.limits.check(
                addr[0], request.method, new_dialog=request.to_addr.tag is None, now=now,
                transactions=len(self._transactions),
            )  # fmt: skip
            if refusal is not None:
                if not refusal.drop:
                    # To the packet's source, like a shed one (see _shed).
                    self._transmit(bytes(self._refusal_response(request, refusal)), addr, reliable)
                return
        self._timer_stale = True
        cls = InviteServerTransaction if request.method == "INVITE" else NonInviteServerTransaction
        new: ServerTransaction = cls(self, key, request, dest, reliable)
        self._transactions[key] = new

        if request.method == "CANCEL":
            self._receive_cancel(new, request, addr, now)
            return
        merge_key = self._merge_key(request)
        if merge_key is not None:
            if merge_key in self._merge:
                # §8.2.2.2: same From tag, Call-ID and CSeq as a live transaction but not a
                # retransmission of it: the request reached us twice through a fork.
                new.respond(make_response(request, 482), now)
                return
            self._merge[merge_key] = key
        self._emit(RequestReceived(key, request, addr))
        if request.method == "INVITE" and self.auto_trying:
            new.respond(make_response(request, 100), now)

    def _receive_ack(
        self, ack: Request, txn: Transaction | None, addr: Address, now: float
    ) -> None:
        if isinstance(txn, InviteServerTransaction):
            txn.fire(Input.RECV_ACK, now, ack)  # non-2xx ACK (absorbed), or a 2xx ACK
            return
        key = (ack.call_id, ack.cseq.seq, ack.from_addr.tag or "", ack.to_addr.tag or "")
        accepted = self._accepted.get(key)
        if accepted is not None and accepted.state is State.ACCEPTED:
            accepted.fire(Input.RECV_ACK, now, ack)
            return
        self._emit(RequestReceived(None, ack, addr))

    def _receive_cancel(
        self, txn: ServerTransaction, cancel: Request, addr: Address, now: float
    ) -> None:
        invite_key = server_transaction_key(_as_invite(cancel))
        invite = self._transactions.get(invite_key)
        if not isinstance(invite, InviteServerTransaction):
            txn.respond(make_response(cancel, 481), now)  # §9.2
            return
        to_tag = invite.last_response.to_addr.tag if invite.last_response else None
        txn.respond(make_response(cancel, 200, to_tag=to_tag), now)
        if invite.state is State.PROCEEDING:
            self._emit(CancelReceived(invite.id, cancel, addr))
        # Otherwise a final response was sent already: the CANCEL has no effect (§9.2).

    def _receive_response(self, response: Response, addr: Address, now: float) -> None:
        try:
            via = response.top_via
            method = response.cseq.method
        except SipParseError:
            return
        if via.branch is None:
            return
        txn = self._transactions.get(client_transaction_key(via.branch, method))
        if txn is None:
            # §17.1.3 / RFC 6026 §8.4: a 2xx without a transaction is a stray fork answer; the
            # UAC core must still ACK (and may BYE) it. Other strays are dropped.
            if 200 <= response.status < 300 and method == "INVITE":
                self._emit(ResponseReceived(None, response, addr))
            return
        status = response.status
        if status < 200:
            inp = Input.RECV_1XX
        elif status < 300 and isinstance(txn, InviteClientTransaction):
            inp = Input.RECV_2XX
        else:
            inp = Input.RECV_FINAL
        txn.fire(inp, now, response)

    def _shed(self, data: bytes, addr: Address, now: float, reliable: bool) -> bool:
        """Refuse a datagram from a source over its limit before parsing it (True: done)."""
        assert self.limits is not None
        method = peek_method(data)
        if method is None:
            return False
        refusal = self.limits.shed(addr[0], method, now)
        if refusal is None:
            return False
        if not refusal.drop:
            reply = quick_refusal(data, refusal)
            if reply is not None:
                # To the packet's source, whatever its Via says (RFC 3581 §4 style): a refusal
                # is never reflected at a third party named in a forged Via.
                self._transmit(reply, addr, reliable)
        return True

    @staticmethod
    def _refusal_response(request: Request, refusal: Refusal) -> Response:
        """503 + Retry-After (403 for a locked-out source) outside any transaction (§8.2.6;
        §8.2.6.2: with a To tag)."""
        return make_response(
            request, refusal.status, to_tag=generate_tag(), headers=_refusal_headers(refusal)
        )

    @staticmethod
    def _merge_key(request: Request) -> tuple[str, str, str] | None:
        if request.to_addr.tag is not None:
            return None
        tag = request.from_addr.tag
        if tag is None:
            return None
        return (tag, request.call_id, str(request.cseq))

    @staticmethod
    def _stamp_via(request: Request, via: Via, addr: Address) -> None:
        """§18.2.1: add ``received`` when sent-by is not the source IP; RFC 3581 §4: fill in
        ``rport`` when asked (and then always add ``received``)."""
        new = via
        if via.wants_rport:
            new = new.with_param("rport", str(addr[1])).with_param("received", addr[0])
        elif via.host.strip("[]") != addr[0]:
            new = new.with_param("received", addr[0])
        if new is via:
            return
        # Rewrite the first value of the first Via line, keeping the rest of that line.
        items = list(request.headers)
        first = next(i for i, (n, _) in enumerate(items) if n == "Via")
        rest = [v.strip() for v in split_top_level(items[first][1], ",")[1:]]
        items[first] = ("Via", ", ".join([str(new), *rest]))
        request.headers = Headers(items)


# Header fields a response copies (§8.2.6.2), with their compact forms (§7.3.3).
_COPIED = {"via": "Via", "v": "Via", "from": "From", "f": "From", "to": "To", "t": "To",
           "call-id": "Call-ID", "i": "Call-ID", "cseq": "CSeq"}  # fmt: skip


def _refusal_headers(refusal: Refusal) -> list[tuple[str, str]]:
    # §20.33: Retry-After goes with 503; a lockout's 403 says no more than "refused".
    return [("Retry-After", str(refusal.retry_after_s))] if refusal.status == 503 else []


def quick_refusal(data: bytes, refusal: Refusal) -> bytes | None:
    """A 503 + Retry-After (or a lockout's 403) for a request datagram built from its header
    lines as text, without
    parsing or validating them (§8.2.6.2: Via, From, To with a tag added, Call-ID, CSeq); None
    when a field it needs is missing (the datagram is dropped)."""
    head = data.split(b"\n\r\n", 1)[0].split(b"\n\n", 1)[0].decode("utf-8", "surrogateescape")
    # §7.3.1: a line starting with SP/HTAB continues the field above (a folded To or Via
    # copied line by line lost its URI or sent-by: found by fuzzing, RFC 4475 wsinv).
    logical: list[str] = []
    for line in head.split("\n")[1:]:
        line = line.rstrip("\r")
        if line[:1] in (" ", "\t") and logical:
            logical[-1] = logical[-1] + " " + line.strip(" \t")
        else:
            logical.append(line)
    fields: list[tuple[str, str]] = []
    for line in logical:
        name, colon, value = line.partition(":")
        canonical = _COPIED.get(name.strip().lower()) if colon else None
        if canonical is not None:
            fields.append((canonical, value.strip()))
    names = {name for name, _ in fields}
    if names != {"Via", "From", "To", "Call-ID", "CSeq"}:
        return None
    lines = [f"SIP/2.0 {refusal.status} {reason_phrase(refusal.status)}"]
    for name, value in fields:
        if name == "To" and ";tag=" not in value.lower().replace(" ", ""):
            value = f"{value};tag={generate_tag()}"
        lines.append(f"{name}: {value}")
    lines += [f"{n}: {v}" for n, v in _refusal_headers(refusal)]
    lines += ["Content-Length: 0", "", ""]
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def _as_invite(cancel: Request) -> Request:
    """The INVITE a CANCEL refers to, as far as the §17.2.3 key cares (§9.2)."""
    invite = cancel.copy()
    invite.method = "INVITE"
    return invite
