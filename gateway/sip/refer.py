"""REFER (RFC 3515) and its implicit subscription to the ``refer`` event package, sans-I/O.

The referrer's side (the gateway hands a caller on): :func:`build_refer` makes the in-dialog
REFER (Refer-To, Referred-By); :class:`ReferSubscription` reads what comes back — the REFER's
final response, then NOTIFYs carrying ``message/sipfrag`` status lines (RFC 3420) — and
decides the outcome: ``completed`` (a 2xx in a sipfrag), ``refused`` (the REFER itself got
4xx–6xx), ``failed`` (a sipfrag ≥ 300, the subscription ended or timed out without a final
status, or the REFER got no answer). Time is passed in (``now``); the one timer is
``get_timer``/``handle_timer``, as in the transaction layer.

The referee's side (someone asks the gateway to call elsewhere): :func:`refer_target` applies
§2.4.2's one-Refer-To rule, :func:`decline_refer` is the polite refusal, :func:`build_notify`
the NOTIFYs that report a REFER we accepted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from gateway.sip.dialog import Dialog
from gateway.sip.errors import SipParseError
from gateway.sip.fields import NameAddr
from gateway.sip.helpers import make_response
from gateway.sip.message import Request, Response
from gateway.sip.reasons import reason_phrase
from gateway.sip.syntax import WSP, get_param, is_token, parse_params
from gateway.sip.uri import Uri

REFER_EVENT = "refer"
SIPFRAG = "message/sipfrag"
# RFC 3420 §2: the version parameter names the SIP version of the fragment.
SIPFRAG_CONTENT_TYPE = "message/sipfrag;version=2.0"
# How long the referrer waits for a final sipfrag before it calls the transfer failed. The
# referee's own INVITE may ring for a while (Timer B is 32 s; people let phones ring ~30 s).
DEFAULT_TIMEOUT_S = 32.0
# The subscription a REFER we accepted creates lasts this long unless it ends first
# (RFC 3515 §2.4.4 leaves the duration to the notifier; §3.4: the notifier chooses).
NOTIFY_EXPIRES_S = 60

ReferResult = Literal["completed", "refused", "failed"]


# --- fields --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sipfrag:
    """The status line that starts a refer NOTIFY's body (RFC 3515 §2.4.5: "The body of a
    NOTIFY MUST begin with a SIP Response Status-Line"); header lines after it are ignored."""

    status: int
    reason: str

    @classmethod
    def parse(cls, body: bytes) -> Sipfrag:
        text = body.decode("utf-8", "replace").lstrip("\r\n")
        line = text.split("\n", 1)[0].rstrip("\r")
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if version.upper() != "SIP/2.0":
            raise SipParseError(f"sipfrag does not start with a SIP/2.0 status line: {line!r}")
        if len(code) != 3 or not code.isascii() or not code.isdigit() or code[0] not in "123456":
            raise SipParseError(f"bad status code in sipfrag: {line!r}")
        return cls(int(code), reason.strip(WSP))

    @property
    def final(self) -> bool:
        return self.status >= 200

    def __bytes__(self) -> bytes:
        return f"SIP/2.0 {self.status} {self.reason}\r\n".encode()


@dataclass(frozen=True, slots=True)
class SubscriptionState:
    """``Subscription-State`` (RFC 6665 §8.2.3): substate ``active``/``pending``/``terminated``
    (or an extension), with ``reason``, ``expires`` and ``retry-after``."""

    state: str
    reason: str | None = None
    expires: int | None = None
    retry_after: int | None = None

    @classmethod
    def parse(cls, text: str) -> SubscriptionState:
        value, _, params_text = text.strip(WSP).partition(";")
        value = value.strip(WSP).lower()
        if not is_token(value):
            raise SipParseError(f"bad Subscription-State {text!r}")
        params = parse_params(params_text, "Subscription-State") if params_text else ()
        return cls(
            value,
            reason=(get_param(params, "reason") or "").lower() or None,
            expires=_seconds(get_param(params, "expires"), "expires"),
            retry_after=_seconds(get_param(params, "retry-after"), "retry-after"),
        )

    def __str__(self) -> str:
        out = self.state
        if self.reason:
            out += f";reason={self.reason}"
        if self.expires is not None:
            out += f";expires={self.expires}"
        if self.retry_after is not None:
            out += f";retry-after={self.retry_after}"
        return out


@dataclass(frozen=True, slots=True)
class EventHeader:
    """``Event: package;id=...`` (RFC 6665 §8.2.1). For refer, ``id`` is the CSeq number of
    the REFER the NOTIFY reports on (RFC 3515 §2.4.6)."""

    package: str
    id: str | None = None

    @classmethod
    def parse(cls, text: str) -> EventHeader:
        value, _, params_text = text.strip(WSP).partition(";")
        package = value.strip(WSP).lower()
        if not package or not is_token(package):
            raise SipParseError(f"bad Event header field {text!r}")
        params = parse_params(params_text, "Event") if params_text else ()
        return cls(package, get_param(params, "id"))

    def __str__(self) -> str:
        return self.package + (f";id={self.id}" if self.id is not None else "")


def _seconds(value: str | None, what: str) -> int | None:
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise SipParseError(f"bad {what} in Subscription-State: {value!r}")
    return int(value)


# --- the referrer ---------------------------------------------------------------------------------
def build_refer(
    dialog: Dialog,
    target: Uri,
    *,
    sent_by: str,
    transport: str = "UDP",
    referred_by: NameAddr | None = None,
) -> Request:
    """An in-dialog REFER to ``target`` (RFC 3515 §2.4.1: exactly one Refer-To; the dialog's
    route set applies, and REFER being a target refresh request it carries our Contact).
    Referred-By (RFC 3892 §3) names who asks: our side of the dialog unless given."""
    by = referred_by if referred_by is not None else dialog.local_uri
    return dialog.create_request(
        "REFER",
        sent_by=sent_by,
        transport=transport,
        headers=[("Refer-To", f"<{target}>"), ("Referred-By", str(by))],
    )


@dataclass(frozen=True, slots=True)
class ReferOutcome:
    """How a transfer ended: ``status`` is the REFER's final response (refused) or the final
    sipfrag status (completed/failed); None when nothing final came."""

    result: ReferResult
    status: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class ReferProgress:
    """A provisional sipfrag (``SIP/2.0 180 Ringing``), or the REFER's 2xx (``accepted``)."""

    status: int
    reason: str
    accepted: bool = False


ReferEvent = ReferProgress | ReferOutcome


class ReferSubscription:
    """The referrer's view of one REFER and the subscription it creates (RFC 3515 §2.4.4).

    Feed it the REFER's responses (:meth:`receive_response`, :meth:`transaction_failed`) and
    every in-dialog NOTIFY that :meth:`matches`; answer each NOTIFY with what
    :meth:`receive_notify` returns. Drain :meth:`next_event` for progress and the one
    :class:`ReferOutcome`; ``outcome`` holds it too. A NOTIFY may overtake the 202 (both are
    sent at once over UDP), so one counts as acceptance.
    """

    def __init__(self, refer: Request, now: float, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.refer_cseq = refer.cseq.seq
        self.started = now
        self.timeout = timeout
        self.deadline = now + timeout
        self.accepted = False
        # The subscription is over (terminated by the notifier, expired, or given up by us):
        # later NOTIFYs for it are answered 481 (RFC 6665 §4.1.3), which ends it at the
        # notifier too (§4.2.2) — the polite way to drop a subscription nobody refreshes.
        self.ended = False
        self.expires_at: float | None = None
        self.outcome: ReferOutcome | None = None
        self.notifies = 0
        self._events: deque[ReferEvent] = deque()

    def next_event(self) -> ReferEvent | None:
        return self._events.popleft() if self._events else None

    # --- the REFER's transaction --------------------------------------------------------------
    def receive_response(self, response: Response, now: float) -> None:
        status = response.status
        if status < 200 or self.outcome is not None:
            return
        if status < 300:
            # 202 Accepted (RFC 3515 §2.4.2); a 200 is taken the same way.
            if not self.accepted:
                self.accepted = True
                self._events.append(ReferProgress(status, response.reason, accepted=True))
            return
        # §2.4.2: the referee declined (603), or does not do REFER (405/501), or anything else
        # 4xx-6xx: no subscription was created.
        self.ended = True
        self._finish("refused", status, response.reason or reason_phrase(status))

    def transaction_failed(self, *, timeout: bool) -> None:
        """The REFER got no final response (Timer F) or could not be sent (§8.1.3.1)."""
        if self.outcome is not None:
            return
        self.ended = True
        if timeout:
            self._finish("failed", 408, "no answer to the REFER")
        else:
            self._finish("failed", 503, "the REFER could not be sent")

    # --- NOTIFYs ------------------------------------------------------------------------------
    def matches(self, notify: Request) -> bool:
        """Whether an in-dialog NOTIFY reports on this REFER: ``Event: refer`` with no ``id``
        (allowed for a dialog's first REFER) or ``id`` = the REFER's CSeq (§2.4.6)."""
        if notify.method != "NOTIFY":
            return False
        try:
            event = EventHeader.parse(notify.headers.get("Event") or "")
        except SipParseError:
            return False
        return event.package == REFER_EVENT and event.id in (None, str(self.refer_cseq))

    def receive_notify(self, notify: Request, now: float) -> Response:
        """Apply a NOTIFY that :meth:`matches`; returns its response (200; 481 once the
        subscription is over; 400 for a Subscription-State that does not parse)."""
        if self.ended:
            return make_response(notify, 481, "Subscription Does Not Exist")
        raw_state = notify.headers.get("Subscription-State")
        try:
            # RFC 6665 §8.2.3 makes it mandatory; a NOTIFY without one is read as "active"
            # rather than lost (the sipfrag is what matters to a transfer).
            state = SubscriptionState.parse(raw_state) if raw_state else SubscriptionState("active")
        except SipParseError as exc:
            return make_response(notify, 400, str(exc)[:100])
        self.notifies += 1
        if not self.accepted:
            self.accepted = True
        frag: Sipfrag | None = None
        if notify.content_type == SIPFRAG:
            try:
                frag = Sipfrag.parse(notify.body)
            except SipParseError:
                frag = None  # §2.4.5 broken by the notifier: no news, but still answered 200
        if frag is not None and self.outcome is None:
            if not frag.final:
                self._events.append(ReferProgress(frag.status, frag.reason))
            elif frag.status < 300:
                self._finish("completed", frag.status, frag.reason)
            else:
                self._finish("failed", frag.status, frag.reason)
        if state.state == "terminated":
            self.ended = True
            if self.outcome is None:
                why = f" ({state.reason})" if state.reason else ""
                self._finish("failed", None, f"the subscription ended{why} without a final status")
        elif state.expires is not None:
            # RFC 6665 §4.1.2.4 / RFC 3515 §3.4: the notifier says how long it lasts.
            self.expires_at = now + state.expires
        return make_response(notify, 200)

    # --- the one timer --------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        if self.ended:
            return None
        if self.outcome is not None:
            return self.expires_at  # waiting only for the subscription to wind down
        if self.expires_at is not None:
            return min(self.deadline, self.expires_at)
        return self.deadline

    def handle_timer(self, now: float) -> None:
        if self.ended:
            return
        if self.expires_at is not None and now >= self.expires_at:
            self.ended = True
            if self.outcome is None:
                self._finish("failed", None, "the subscription expired without a final status")
            return
        if self.outcome is None and now >= self.deadline:
            # Given up: the subscription is dropped here (481 to any later NOTIFY).
            self.ended = True
            self._finish("failed", None, f"no final NOTIFY within {self.timeout:g} s of the REFER")

    def close(self, reason: str) -> None:
        """The dialog is gone (the call ended): no NOTIFY can come any more."""
        self.ended = True
        if self.outcome is None:
            self._finish("failed", None, reason)

    def _finish(self, result: ReferResult, status: int | None, reason: str) -> None:
        self.outcome = ReferOutcome(result, status, reason)
        self._events.append(self.outcome)


# --- the referee --------------------------------------------------------------------------------
def refer_target(refer: Request) -> NameAddr:
    """The one Refer-To of a REFER; SipParseError with status 400 when there are none or
    several (RFC 3515 §2.4.2: "MUST return a 400 (Bad Request)"), or when it does not parse."""
    values = refer.headers.get_all("Refer-To")
    if len(values) != 1:
        raise SipParseError(f"REFER needs exactly one Refer-To, found {len(values)}", 400)
    return NameAddr.parse(values[0], "Refer-To")


def decline_refer(refer: Request, why: str) -> Response:
    """The polite refusal of a REFER the gateway will not act on. RFC 3515 §2.4.2: a UA
    SHOULD seek approval (here: configured policy, ``gateway.accept_refer``) and when it is
    denied MAY decline the request. 603 Decline (RFC 3261 §21.6.2: the user "explicitly does
    not wish to" take part) says that and nothing more, where 403 would claim an
    authorisation problem the referrer might try to fix by authenticating; the Warning
    (§20.43, 399 miscellaneous) carries the reason for whoever reads the trace."""
    return make_response(refer, 603, headers=[("Warning", f'399 voxgate "{why}"'[:200])])


def build_notify(
    dialog: Dialog,
    refer_cseq: int,
    frag: Sipfrag,
    *,
    sent_by: str,
    transport: str = "UDP",
    expires: int = NOTIFY_EXPIRES_S,
) -> Request:
    """A NOTIFY reporting on the REFER with CSeq ``refer_cseq`` that we accepted: the status
    of our INVITE as a sipfrag (RFC 3515 §2.4.5), ``Event: refer;id=<CSeq>`` (§2.4.6 allows
    the id on the first REFER too) and Subscription-State ``active`` until a final status,
    then ``terminated;reason=noresource`` (§2.4.7)."""
    state = (
        SubscriptionState("terminated", reason="noresource")
        if frag.final
        else SubscriptionState("active", expires=expires)
    )
    return dialog.create_request(
        "NOTIFY",
        sent_by=sent_by,
        transport=transport,
        headers=[
            ("Event", str(EventHeader(REFER_EVENT, str(refer_cseq)))),
            ("Subscription-State", str(state)),
            ("Content-Type", SIPFRAG_CONTENT_TYPE),
        ],
        body=bytes(frag),
    )
