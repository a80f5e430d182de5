"""The four transaction state machines of RFC 3261 §17, with RFC 6026's Accepted state.

Each machine is a transition table keyed by (state, input), h11 style: an input that has no
entry for the current state is absorbed (that is what §17 prescribes for every case it does not
list, e.g. a response retransmission in Completed of a non-INVITE client transaction). The
actions taken on a transition are in ``_act``. Time is only ever passed in: timers are
deadlines that the owning :class:`gateway.sip.layer.TransactionLayer` fires. The layer creates
the transactions, so this module only knows it as a :class:`TransactionOwner`.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gateway.sip.events import (
    RequestReceived,
    ResponseReceived,
    SipEvent,
    TransactionTimeout,
    TransportError,
)
from gateway.sip.headers import Headers
from gateway.sip.message import Address, Request, Response


@dataclass(frozen=True, slots=True)
class TimerConfig:
    """§17.1.1.1 / Table 4. T1: RTT estimate; T2: cap on non-INVITE and 2xx retransmission
    intervals; T4: how long a message may linger in the network. ``timer_d``: at least 32 s on
    unreliable transports. ``retransmit_2xx_reliable``: §13.3.1.4 makes 2xx retransmission an
    end-to-end job of the UAS core, even over a reliable first hop (a UDP hop may lie beyond
    a proxy); off by default because the gateway talks to phones directly, so a reliable
    connection is end to end."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0
    timer_d: float = 32.0
    retransmit_2xx_reliable: bool = False

    @property
    def t64(self) -> float:
        """64*T1: Timers B, F, H, J (unreliable), L and M."""
        return 64 * self.t1


class TransactionOwner(Protocol):
    """What a transaction needs from the layer that runs it (in practice
    :class:`gateway.sip.layer.TransactionLayer`, which matches this structurally): the timer
    values, and the three callbacks through which a transaction reports output. A protocol
    rather than the class itself because the layer imports this module to create transactions;
    naming it here would import it back."""

    @property
    def config(self) -> TimerConfig: ...

    def _emit(self, event: SipEvent) -> None: ...

    def _transmit(self, data: bytes, addr: Address, reliable: bool) -> None: ...

    def _terminated(self, txn: Transaction) -> None: ...


class SipStateError(RuntimeError):
    """The TU asked a transaction for something its state does not allow (h11's
    LocalProtocolError): e.g. a second final response."""


class State(enum.Enum):
    CALLING = "Calling"
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    COMPLETED = "Completed"
    CONFIRMED = "Confirmed"
    ACCEPTED = "Accepted"
    TERMINATED = "Terminated"


class Input(enum.Enum):
    RECV_1XX = "1xx received"
    RECV_2XX = "2xx received"
    RECV_FINAL = "300-699 received"  # for non-INVITE: any 200-699
    RECV_REQUEST = "request retransmission"
    RECV_ACK = "ACK received"
    SEND_1XX = "TU sends 1xx"
    SEND_2XX = "TU sends 2xx"
    SEND_FINAL = "TU sends 300-699"  # for non-INVITE: any 200-699
    TIMER_A = "A"
    TIMER_B = "B"
    TIMER_D = "D"
    TIMER_E = "E"
    TIMER_F = "F"
    TIMER_G = "G"
    TIMER_H = "H"
    TIMER_I = "I"
    TIMER_J = "J"
    TIMER_K = "K"
    TIMER_L = "L"
    TIMER_M = "M"
    TIMER_2XX = "2xx retransmit"  # §13.3.1.4, run by the INVITE server transaction here
    TRANSPORT_ERROR = "transport error"


S, I = State, Input  # noqa: E741  (table shorthand)
Table = dict[tuple[State, Input], State]


def _to_terminated(states: tuple[State, ...], inp: Input) -> Table:
    return {(s, inp): S.TERMINATED for s in states}


class Transaction(abc.ABC):
    TABLE: ClassVar[Table]
    INITIAL: ClassVar[State]

    def __init__(
        self,
        layer: TransactionOwner,
        transaction_id: str,
        request: Request,
        addr: Address,
        reliable: bool,
    ) -> None:
        self.layer = layer
        self.id = transaction_id
        self.request = request
        self.addr = addr
        self.reliable = reliable
        self.state = self.INITIAL
        self.timers: dict[Input, float] = {}
        self.intervals: dict[Input, float] = {}

    @property
    def config(self) -> TimerConfig:
        return self.layer.config

    def next_deadline(self) -> float | None:
        return min(self.timers.values(), default=None)

    def fire(self, inp: Input, now: float, message: Request | Response | None = None) -> bool:
        """Apply input ``inp``; returns False if the table absorbed it (no transition)."""
        new = self.TABLE.get((self.state, inp))
        if new is None:
            return False
        old, self.state = self.state, new
        self._act(old, inp, now, message)
        if new is S.TERMINATED and old is not S.TERMINATED:
            self.timers.clear()
            self.layer._terminated(self)
        return True

    def due_timers(self, now: float) -> list[tuple[float, Input]]:
        return sorted((t, name) for name, t in self.timers.items() if t <= now)

    def _start(self, timer: Input, delay: float, now: float) -> None:
        self.timers[timer] = now + delay
        self.intervals[timer] = delay

    def _stop(self, *timers: Input) -> None:
        for timer in timers:
            self.timers.pop(timer, None)

    def _send(self, message: Request | Response) -> None:
        self.layer._transmit(bytes(message), self.addr, self.reliable)

    @abc.abstractmethod
    def _act(self, old: State, inp: Input, now: float, message: Request | Response | None) -> None:
        """The actions of a transition (each §17 machine defines its own)."""


class InviteClientTransaction(Transaction):
    """§17.1.1 + RFC 6026 §7.2 (Figure 5 with Accepted)."""

    INITIAL = S.CALLING
    TABLE: ClassVar[Table] = {
        (S.CALLING, I.TIMER_A): S.CALLING,
        (S.CALLING, I.RECV_1XX): S.PROCEEDING,
        (S.PROCEEDING, I.RECV_1XX): S.PROCEEDING,
        (S.CALLING, I.RECV_2XX): S.ACCEPTED,
        (S.PROCEEDING, I.RECV_2XX): S.ACCEPTED,
        (S.ACCEPTED, I.RECV_2XX): S.ACCEPTED,
        (S.CALLING, I.RECV_FINAL): S.COMPLETED,
        (S.PROCEEDING, I.RECV_FINAL): S.COMPLETED,
        (S.COMPLETED, I.RECV_FINAL): S.COMPLETED,
        (S.CALLING, I.TIMER_B): S.TERMINATED,
        (S.COMPLETED, I.TIMER_D): S.TERMINATED,
        (S.ACCEPTED, I.TIMER_M): S.TERMINATED,
        **_to_terminated((S.CALLING, S.PROCEEDING, S.COMPLETED), I.TRANSPORT_ERROR),
    }

    def start(self, now: float) -> None:
        self._send(self.request)
        if not self.reliable:
            self._start(I.TIMER_A, self.config.t1, now)
        self._start(I.TIMER_B, self.config.t64, now)

    def _act(self, old: State, inp: Input, now: float, message: Request | Response | None) -> None:
        if inp is I.TIMER_A:
            # §17.1.1.2: retransmit, and double the interval (Timer A is not capped by T2).
            self._send(self.request)
            self._start(I.TIMER_A, 2 * self.intervals[I.TIMER_A], now)
        elif inp is I.RECV_1XX:
            self._stop(I.TIMER_A, I.TIMER_B)
            self._deliver(message)
        elif inp is I.RECV_2XX:
            if old is not S.ACCEPTED:
                self._stop(I.TIMER_A, I.TIMER_B)
                self._start(I.TIMER_M, self.config.t64, now)  # RFC 6026 §8.4
            self._deliver(message)  # every 2xx goes to the TU, which ACKs each
        elif inp is I.RECV_FINAL:
            assert isinstance(message, Response)
            self._send(self._ack_for(message))  # §17.1.1.3, for retransmissions too
            if old is not S.COMPLETED:
                self._stop(I.TIMER_A, I.TIMER_B)
                self._deliver(message)
                if self.reliable:
                    self.fire(I.TIMER_D, now)  # Timer D = 0 on reliable transports
                else:
                    self._start(I.TIMER_D, self.config.timer_d, now)
        elif inp is I.TIMER_B:
            self.layer._emit(TransactionTimeout(self.id, "B"))
        elif inp is I.TRANSPORT_ERROR:
            self.layer._emit(TransportError(self.id, self.addr))

    def _deliver(self, message: Request | Response | None) -> None:
        assert isinstance(message, Response)
        self.layer._emit(ResponseReceived(self.id, message, self.addr))

    def _ack_for(self, response: Response) -> Request:
        """§17.1.1.3: the ACK for a non-2xx final response is part of this transaction."""
        req = self.request
        headers = Headers()
        headers.add("Via", req.headers.values("Via")[0])
        for value in req.headers.get_all("Route"):
            headers.add("Route", value)
        headers.add("Max-Forwards", "70")
        headers.add("From", req.headers.get("From") or "")
        headers.add("To", response.headers.get("To") or "")
        headers.add("Call-ID", req.headers.get("Call-ID") or "")
        headers.add("CSeq", f"{req.cseq.seq} ACK")
        return Request("ACK", req.uri, headers)


class NonInviteClientTransaction(Transaction):
    """§17.1.2 (Figure 6)."""

    INITIAL = S.TRYING
    TABLE: ClassVar[Table] = {
        (S.TRYING, I.TIMER_E): S.TRYING,
        (S.PROCEEDING, I.TIMER_E): S.PROCEEDING,
        (S.TRYING, I.RECV_1XX): S.PROCEEDING,
        (S.PROCEEDING, I.RECV_1XX): S.PROCEEDING,
        (S.TRYING, I.RECV_FINAL): S.COMPLETED,
        (S.PROCEEDING, I.RECV_FINAL): S.COMPLETED,
        (S.TRYING, I.TIMER_F): S.TERMINATED,
        (S.PROCEEDING, I.TIMER_F): S.TERMINATED,
        (S.COMPLETED, I.TIMER_K): S.TERMINATED,
        **_to_terminated((S.TRYING, S.PROCEEDING), I.TRANSPORT_ERROR),
    }

    def start(self, now: float) -> None:
        self._send(self.request)
        if not self.reliable:
            self._start(I.TIMER_E, self.config.t1, now)
        self._start(I.TIMER_F, self.config.t64, now)

    def _act(self, old: State, inp: Input, now: float, message: Request | Response | None) -> None:
        if inp is I.TIMER_E:
            self._send(self.request)
            # §17.1.2.2: doubling up to T2 in Trying; every T2 once in Proceeding.
            if self.state is S.TRYING:
                interval = min(2 * self.intervals[I.TIMER_E], self.config.t2)
            else:
                interval = self.config.t2
            self._start(I.TIMER_E, interval, now)
        elif inp is I.RECV_1XX:
            assert isinstance(message, Response)
            self.layer._emit(ResponseReceived(self.id, message, self.addr))
        elif inp is I.RECV_FINAL:
            assert isinstance(message, Response)
            self._stop(I.TIMER_E, I.TIMER_F)
            self.layer._emit(ResponseReceived(self.id, message, self.addr))
            if self.reliable:
                self.fire(I.TIMER_K, now)
            else:
                self._start(I.TIMER_K, self.config.t4, now)
        elif inp is I.TIMER_F:
            self.layer._emit(TransactionTimeout(self.id, "F"))
        elif inp is I.TRANSPORT_ERROR:
            self.layer._emit(TransportError(self.id, self.addr))


class ServerTransaction(Transaction):
    last_response: Response | None = None

    def respond(self, response: Response, now: float) -> None:
        status = response.status
        if status < 200:
            inp = I.SEND_1XX
        elif status < 300 and isinstance(self, InviteServerTransaction):
            inp = I.SEND_2XX
        else:
            inp = I.SEND_FINAL
        if not self.fire(inp, now, response):
            raise SipStateError(
                f"cannot send {status} in state {self.state.value} of transaction {self.id}"
            )


class InviteServerTransaction(ServerTransaction):
    """§17.2.1 + RFC 6026 §7.1 (Figure 7 with Accepted). The Accepted state also runs the
    UAS core's 2xx retransmission until the ACK (§13.3.1.4), so that the TU need not keep a
    timer of its own: the layer matches the ACK (a different transaction) to this one by
    dialog and CSeq."""

    INITIAL = S.PROCEEDING
    acked = False
    TABLE: ClassVar[Table] = {
        (S.PROCEEDING, I.RECV_REQUEST): S.PROCEEDING,
        (S.PROCEEDING, I.SEND_1XX): S.PROCEEDING,
        (S.PROCEEDING, I.SEND_2XX): S.ACCEPTED,
        (S.PROCEEDING, I.SEND_FINAL): S.COMPLETED,
        (S.ACCEPTED, I.SEND_2XX): S.ACCEPTED,
        (S.ACCEPTED, I.RECV_ACK): S.ACCEPTED,
        (S.ACCEPTED, I.TIMER_2XX): S.ACCEPTED,
        (S.ACCEPTED, I.TIMER_L): S.TERMINATED,
        (S.COMPLETED, I.RECV_REQUEST): S.COMPLETED,
        (S.COMPLETED, I.TIMER_G): S.COMPLETED,
        (S.COMPLETED, I.RECV_ACK): S.CONFIRMED,
        (S.COMPLETED, I.TIMER_H): S.TERMINATED,
        (S.CONFIRMED, I.TIMER_I): S.TERMINATED,
        **_to_terminated((S.PROCEEDING, S.COMPLETED, S.ACCEPTED), I.TRANSPORT_ERROR),
    }

    def _act(self, old: State, inp: Input, now: float, message: Request | Response | None) -> None:
        cfg = self.config
        if inp is I.RECV_REQUEST:
            # §17.2.1: a retransmitted INVITE gets the last provisional (Proceeding) or the
            # final response (Completed) again.
            if self.last_response is not None:
                self._send(self.last_response)
        elif inp in (I.SEND_1XX, I.SEND_2XX, I.SEND_FINAL):
            assert isinstance(message, Response)
            self.last_response = message
            self._send(message)
            if inp is I.SEND_2XX and old is S.PROCEEDING:
                self._start(I.TIMER_L, cfg.t64, now)
                if not self.reliable or cfg.retransmit_2xx_reliable:
                    self._start(I.TIMER_2XX, cfg.t1, now)
            elif inp is I.SEND_FINAL:
                if not self.reliable:
                    self._start(I.TIMER_G, cfg.t1, now)
                self._start(I.TIMER_H, cfg.t64, now)
        elif inp is I.TIMER_2XX:
            assert self.last_response is not None
            self._send(self.last_response)
            self._start(I.TIMER_2XX, min(2 * self.intervals[I.TIMER_2XX], cfg.t2), now)
        elif inp is I.TIMER_G:
            assert self.last_response is not None
            self._send(self.last_response)
            self._start(I.TIMER_G, min(2 * self.intervals[I.TIMER_G], cfg.t2), now)
        elif inp is I.RECV_ACK:
            if old is S.ACCEPTED:
                # The ACK for our 2xx: stop retransmitting and hand it to the TU.
                assert isinstance(message, Request)
                self._stop(I.TIMER_2XX)
                if not self.acked:
                    self.acked = True
                    self.layer._emit(RequestReceived(self.id, message, self.addr))
            else:
                self._stop(I.TIMER_G, I.TIMER_H)
                if self.reliable:
                    self.fire(I.TIMER_I, now)
                else:
                    self._start(I.TIMER_I, cfg.t4, now)
        elif inp is I.TIMER_H:
            self.layer._emit(TransactionTimeout(self.id, "H"))
        elif inp is I.TIMER_L:
            if not self.acked:
                self.layer._emit(TransactionTimeout(self.id, "L"))
        elif inp is I.TRANSPORT_ERROR:
            self.layer._emit(TransportError(self.id, self.addr))


class NonInviteServerTransaction(ServerTransaction):
    """§17.2.2 (Figure 8)."""

    INITIAL = S.TRYING
    TABLE: ClassVar[Table] = {
        (S.TRYING, I.SEND_1XX): S.PROCEEDING,
        (S.PROCEEDING, I.SEND_1XX): S.PROCEEDING,
        (S.PROCEEDING, I.RECV_REQUEST): S.PROCEEDING,
        (S.TRYING, I.SEND_FINAL): S.COMPLETED,
        (S.PROCEEDING, I.SEND_FINAL): S.COMPLETED,
        (S.COMPLETED, I.RECV_REQUEST): S.COMPLETED,
        (S.COMPLETED, I.TIMER_J): S.TERMINATED,
        **_to_terminated((S.TRYING, S.PROCEEDING, S.COMPLETED), I.TRANSPORT_ERROR),
    }

    def _act(self, old: State, inp: Input, now: float, message: Request | Response | None) -> None:
        if inp is I.RECV_REQUEST:
            assert self.last_response is not None
            self._send(self.last_response)
        elif inp in (I.SEND_1XX, I.SEND_FINAL):
            assert isinstance(message, Response)
            self.last_response = message
            self._send(message)
            if inp is I.SEND_FINAL:
                if self.reliable:
                    self.fire(I.TIMER_J, now)
                else:
                    self._start(I.TIMER_J, self.config.t64, now)
        elif inp is I.TRANSPORT_ERROR:
            self.layer._emit(TransportError(self.id, self.addr))
