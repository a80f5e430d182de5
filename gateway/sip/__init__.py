"""Sans-I/O SIP core: syntax (RFC 3261 §7/§19/§20/§25), transactions (§17, RFC 6026),
dialogs (§12), digest authentication (RFC 8760/7616/2617). No sockets, no clock: time is
passed in as ``now`` and output comes back as events (see ``layer.TransactionLayer``).

Layering, bottom up (pjsip's): ``syntax``/``uri``/``headers``/``fields`` → ``message`` and
``framing`` → ``transaction``/``layer`` → ``dialog``/``digest``/``helpers`` for the TU.
"""

from gateway.sip.dialog import (
    Dialog,
    DialogId,
    DialogState,
    make_dialog_response,
    no_dialog_response,
    uac_dialog_id,
    uas_dialog_id,
)
from gateway.sip.digest import DigestAuthenticator, build_authorization, parse_challenges
from gateway.sip.errors import SipParseError
from gateway.sip.events import (
    CancelReceived,
    MalformedMessage,
    RequestReceived,
    ResponseReceived,
    SipEvent,
    TransactionTerminated,
    TransactionTimeout,
    Transmit,
    TransportError,
)
from gateway.sip.fields import CSeq, NameAddr, Via
from gateway.sip.framing import StreamFramer
from gateway.sip.headers import Headers
from gateway.sip.helpers import (
    error_response,
    generate_branch,
    generate_call_id,
    generate_tag,
    make_cancel,
    make_response,
)
from gateway.sip.layer import TransactionLayer
from gateway.sip.message import Address, Request, Response, is_keepalive, parse, partial_request
from gateway.sip.transaction import SipStateError, State, TimerConfig
from gateway.sip.uri import AbsoluteUri, SipUri, Uri, parse_uri

__all__ = [
    "AbsoluteUri",
    "Address",
    "CSeq",
    "CancelReceived",
    "Dialog",
    "DialogId",
    "DialogState",
    "DigestAuthenticator",
    "Headers",
    "MalformedMessage",
    "NameAddr",
    "Request",
    "RequestReceived",
    "Response",
    "ResponseReceived",
    "SipEvent",
    "SipParseError",
    "SipStateError",
    "SipUri",
    "State",
    "StreamFramer",
    "TimerConfig",
    "TransactionLayer",
    "TransactionTerminated",
    "TransactionTimeout",
    "Transmit",
    "TransportError",
    "Uri",
    "Via",
    "build_authorization",
    "error_response",
    "generate_branch",
    "generate_call_id",
    "generate_tag",
    "is_keepalive",
    "make_cancel",
    "make_dialog_response",
    "make_response",
    "no_dialog_response",
    "parse",
    "parse_challenges",
    "parse_uri",
    "partial_request",
    "uac_dialog_id",
    "uas_dialog_id",
]  # fmt: skip
