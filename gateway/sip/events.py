"""Events the transaction layer hands to its user (aioquic/h11 style: frozen, slotted, and
checking their own fields)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sip.errors import SipParseError
from gateway.sip.message import Address, Request, Response


def _check_addr(addr: object) -> None:
    if not (
        isinstance(addr, tuple)
        and len(addr) == 2
        and isinstance(addr[0], str)
        and isinstance(addr[1], int)
    ):
        raise TypeError(f"address must be (host, port), got {addr!r}")


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send ``data`` to ``addr`` (a datagram, or a write on the stream to ``addr``)."""

    data: bytes
    addr: Address
    reliable: bool = False

    def __post_init__(self) -> None:
        _check_addr(self.addr)


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A new request for the TU. ``transaction_id`` names its server transaction, to be used
    with ``send_response``. For an ACK it is the INVITE server transaction whose 2xx it
    acknowledges (§13.3.1.4), or None when it matches none (ACKs have no transaction)."""

    transaction_id: str | None
    request: Request
    addr: Address

    def __post_init__(self) -> None:
        _check_addr(self.addr)
        if not isinstance(self.request, Request):
            raise TypeError("request must be a Request")


@dataclass(frozen=True, slots=True)
class CancelReceived:
    """A CANCEL matched the pending INVITE server transaction ``transaction_id`` (§9.2). The
    layer has already answered the CANCEL 200; the TU should now answer the INVITE 487."""

    transaction_id: str
    request: Request
    addr: Address


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response for client transaction ``transaction_id``. Retransmitted 2xx to an INVITE are
    delivered too (RFC 6026 Accepted state) so the TU can re-send its ACK. ``None``: a 2xx that
    matched no transaction (a late fork); the TU should ACK and BYE it."""

    transaction_id: str | None
    response: Response
    addr: Address

    def __post_init__(self) -> None:
        _check_addr(self.addr)
        if not isinstance(self.response, Response):
            raise TypeError("response must be a Response")


@dataclass(frozen=True, slots=True)
class TransactionTimeout:
    """Timer ``timer`` ended the transaction without an answer: "B" (INVITE), "F"
    (non-INVITE): treat as 408 (§8.1.3.1); "H": the ACK for our non-2xx never came; "L": the
    ACK for our 2xx never came (§13.3.1.4: confirm the dialog, then send BYE)."""

    transaction_id: str
    timer: str


@dataclass(frozen=True, slots=True)
class TransportError:
    """The transport reported a failure towards the transaction's peer (§17.1.4, §17.2.4);
    the transaction is terminated. For a client transaction treat as 503 (§8.1.3.1)."""

    transaction_id: str
    addr: Address


@dataclass(frozen=True, slots=True)
class TransactionTerminated:
    transaction_id: str


@dataclass(frozen=True, slots=True)
class MalformedMessage:
    """Input that did not parse. If it was a request that could be answered, the layer has
    already sent ``error.status`` back statelessly."""

    error: SipParseError
    addr: Address


SipEvent = (
    Transmit
    | RequestReceived
    | CancelReceived
    | ResponseReceived
    | TransactionTimeout
    | TransportError
    | TransactionTerminated
    | MalformedMessage
)
