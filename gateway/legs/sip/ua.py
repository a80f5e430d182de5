"""The SIP user agent: answers and places calls (the transaction user over ``gateway.sip``).

UAS (RFC 3261 §8.2, §13.3, §15): INVITE → 100 (the layer) → [180 while ringing] → 200 with the
SDP answer; ACK starts the agent; BYE → 200; CANCEL → 487; OPTIONS → 200 with Allow/Accept;
re-INVITE → new answer (hold/unhold); INFO with DTMF → 200; 481 for requests in no dialog;
405 (with Allow) for other methods; 503 with Retry-After above the call limit, and to OPTIONS
and INVITE while no warmed-up worker serves (``gateway.readiness``); 400 for a bad SDP and 488
when no codec is common (RFC 3264 §6). New requests meet the per-source limits first
(``gateway.sip.limits``: rate, calls per source, lockout, transaction table): the UA hands its
``SourceLimits`` to the transaction layer, which refuses before it keeps any state, and counts
each inbound call against its source while it is up. Then who may call
(``gateway.sip.access``): a request outside a dialog from a source on no trunk's allow-list
may have to authenticate (401 with digest challenges, 403 for an unknown source when auth is
off), and REGISTER goes to the registrar; an outbound call to a registered softphone's AOR
goes to its contact.
UAC: INVITE to a URI (through the trunk when one is configured) with digest authentication
(RFC 8760), CANCEL while ringing, BYE once up.
TLS (RFC 3261 §26, ``gateway.tls_listen``): a call whose INVITE came over TLS, or placed to a
``sips:`` or ``transport=tls`` URI, keeps its signalling on TLS: Via, Contact (``sips:`` when
the Request-URI was, §8.1.1.8, else ``;transport=tls``) and in-dialog requests, which reuse
the call's connection while it is open (phones behind NAT are reachable no other way) and
otherwise open a verified one to the remote target. SRTP (``gateway.srtp``, SDES) is decided
in the offer/answer (``gateway.sdp``); a plain offer with srtp "required" gets 488.
Transfer (RFC 3515): ``SipLeg.refer`` sends an in-dialog REFER and follows its implicit
subscription (the NOTIFYs' sipfrag, ``gateway.sip.refer``); a REFER from the far end is
declined 603 unless ``gateway.accept_refer``, and then the referred call is placed as an
outbound call and its progress NOTIFYed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate

from gateway import sdp
from gateway.call.calls import Call, end_status
from gateway.call.control import (
    BadRequest,
    CallStateChanged,
    Conflict,
    ControlError,
    Event,
    TransferOutcome,
    Unavailable,
)
from gateway.call.manager import CallManager
from gateway.legs.sip import tls
from gateway.legs.sip.gatekeeper import NotRegisteredError, build_gatekeeper
from gateway.legs.sip.transport import SipTransport, local_ip_for
from gateway.readiness import WorkerReadiness
from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.sdp_crypto import SRTP_MODES, SrtpMode
from gateway.sip import (
    CancelReceived,
    Dialog,
    DigestAuthenticator,
    Headers,
    NameAddr,
    Request,
    RequestReceived,
    Response,
    ResponseReceived,
    SipEvent,
    SipParseError,
    SipUri,
    TransactionLayer,
    TransactionTimeout,
    TransportError,
    generate_branch,
    generate_call_id,
    generate_tag,
    make_cancel,
    make_dialog_response,
    make_response,
    no_dialog_response,
    parse_uri,
    uas_dialog_id,
)
from gateway.sip.access import NotRegistered, Route
from gateway.sip.limits import LimitSettings, SourceLimits
from gateway.sip.message import Address
from gateway.sip.reasons import reason_phrase
from gateway.sip.refer import (
    NOTIFY_EXPIRES_S,
    REFER_EVENT,
    EventHeader,
    ReferOutcome,
    ReferProgress,
    ReferSubscription,
    Sipfrag,
    build_notify,
    build_refer,
    decline_refer,
    refer_target,
)
from gateway.sip.transaction import State, TimerConfig
from voxgate.contract.config import GatewayConfig, parse_hostport
from voxgate.contract.dtmf import is_dtmf_key

log = logging.getLogger("voxgate.sip")

# REFER is listed though it is declined by default: "not now" (603) is a policy answer, where
# leaving it out would say the gateway does not know the method. NOTIFY carries the refer
# subscription's reports to our own REFERs.
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, REFER, NOTIFY"
RETRY_AFTER_S = 5
# Retry-After while no worker is warm yet (a worker warms up in seconds).
RETRY_AFTER_UNREADY_S = 2
USER_AGENT = "voxgate/0.1"


@dataclass
class SipLeg:
    """One SIP call: its dialog, the INVITE transaction, and its RTP endpoint."""

    ua: SipUA
    call: Call
    invite: Request
    peer: Address  # where the INVITE came from / went to
    local_ip: str
    endpoint: RtpEndpoint | None = None
    dialog: Dialog | None = None
    local_tag: str = ""
    invite_tid: str | None = None
    local_sdp: sdp.SessionDescription | None = None
    answered: bool = False
    ended: bool = False
    ring_task: asyncio.Task[None] | None = None
    auth: DigestAuthenticator | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # Our REFER under way (we transfer the far end), and a REFER of theirs we act on.
    referral: Referral | None = None
    referee_task: asyncio.Task[None] | None = None
    # The source IP this inbound call counts against (gateway.sip.limits), until it ends.
    counted_source: str | None = None
    # The signalling transport of the call: "TLS" keeps every request of the dialog on TLS.
    signalling: str = "UDP"

    # --- Leg protocol --------------------------------------------------------------------
    async def hangup(self, reason: str) -> None:
        if self.ended:
            return
        if self.call.info.direction == "outbound" and not self.answered:
            if self.invite_tid is not None:
                # §9.1: CANCEL a pending INVITE (only after a provisional response, but the
                # layer's CANCEL is harmless before: the callee answers it 481 or 200).
                self.ua.transport.send_request(make_cancel(self.invite), self.peer)
            await self.end(reason)
            return
        if self.call.info.direction == "inbound" and not self.answered and self.invite_tid:
            if self.ua.layer.transaction_state(self.invite_tid) is State.PROCEEDING:
                self.ua.transport.send_response(self.invite_tid, make_response(self.invite, 480))
            # Otherwise our 2xx is out and its ACK not in (a caller that never ACKs, a flood):
            # no final response may follow it, and §15 allows no BYE before the ACK.
            await self.end(reason)
            return
        if self.dialog is not None:
            addr = self.ua.in_dialog_addr(self)
            bye = self.dialog.create_request(
                "BYE", sent_by=self.ua.sent_by(self.local_ip, addr),
                transport=self.ua.transport.via_transport(addr),
            )  # fmt: skip
            self.ua.transport.send_request(bye, addr)
        await self.end(reason)

    async def send_dtmf(self, digits: str) -> None:
        session = self.endpoint.session if self.endpoint else None
        if session is None:
            raise Unavailable("no media session")
        for d in digits:
            session.pacer.send_dtmf(d)

    def media_stats(self) -> dict[str, float]:
        """RTP counters for ``/metrics`` (``gateway.metrics.MediaStatsLeg``); read at scrape
        time, and once more when the call ends (the session outlives its closed socket)."""
        session = self.endpoint.session if self.endpoint is not None else None
        stats = session.media_stats() if session is not None else {}
        srtp = self.endpoint.srtp if self.endpoint is not None else None
        if srtp is not None:
            stats["srtp_auth_failures"] = float(srtp.stats.auth_failures)
            stats["srtp_replays"] = float(srtp.stats.replays)
        return stats

    async def refer(
        self, target: str, *, timeout_s: float, on_progress: Callable[[int, str], None]
    ) -> TransferOutcome:
        """Blind transfer: REFER the far end to ``target`` (``ReferringLeg``)."""
        return await self.ua.refer(self, target, timeout_s=timeout_s, on_progress=on_progress)

    # --- lifecycle -----------------------------------------------------------------------
    async def end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        if self.ring_task is not None:
            self.ring_task.cancel()
        if self.referral is not None:
            self.referral.abandon("the call ended before the transfer's outcome")
        if self.referee_task is not None:
            self.referee_task.cancel()
        if self.endpoint is not None:
            self.ua.ticker.remove(self.endpoint)
            self.endpoint.close()
        if self.dialog is not None:
            self.ua.dialogs.pop(self.dialog.id, None)
        if self.counted_source is not None:
            self.ua.limits.call_ended(self.counted_source)
            self.counted_source = None
        if self.call.info.direction == "outbound" and self.invite_tid is not None:
            # Keep the client INVITE a while for 2xx retransmissions (and a 2xx crossing our
            # CANCEL), then forget it: Timer M's 64*T1 (RFC 6026 §8.4).
            tid = self.invite_tid
            asyncio.get_running_loop().call_later(64 * 0.5, self.ua.client_invites.pop, tid, None)
        self.ua.legs.discard(self)
        await self.call.ended(reason)

    def __hash__(self) -> int:
        return id(self)


class Referral:
    """The asyncio side of one :class:`ReferSubscription` (aioquic style): feeds it the REFER's
    response and the NOTIFYs, drains its events into ``on_progress`` and ``done``, and keeps
    its one timer armed on the loop's clock (the transport's ``now``)."""

    def __init__(self, sub: ReferSubscription, on_progress: Callable[[int, str], None]) -> None:
        self.sub = sub
        self.on_progress = on_progress
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[ReferOutcome] = self._loop.create_future()
        self._timer: asyncio.TimerHandle | None = None

    def on_response(self, response: Response) -> None:
        self.sub.receive_response(response, self._loop.time())
        self.pump()

    def on_failure(self, *, timeout: bool) -> None:
        self.sub.transaction_failed(timeout=timeout)
        self.pump()

    def pump(self) -> None:
        while (event := self.sub.next_event()) is not None:
            if isinstance(event, ReferProgress):
                try:
                    self.on_progress(event.status, event.reason)
                except Exception:
                    log.exception("transfer progress report failed")
            elif not self.done.done():
                self.done.set_result(event)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.sub.get_timer()
        if at is not None:
            self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.sub.handle_timer(self._loop.time())
        self.pump()

    def abandon(self, reason: str) -> None:
        """The dialog is gone: no more NOTIFYs can come."""
        self.sub.close(reason)
        self.pump()  # resolves ``done`` if it was still open; no timer is left armed


class SipUA:
    def __init__(
        self,
        cfg: GatewayConfig,
        manager: CallManager,
        ticker: MediaTicker,
        readiness: WorkerReadiness | None = None,
    ) -> None:
        self.cfg = cfg
        # None: always ready (a user agent without synthesis behind it, in tests).
        self.readiness = readiness
        self.manager = manager
        self.ticker = ticker
        self.limits = SourceLimits(LimitSettings.from_config(cfg))
        t1 = cfg.sip_t1_ms / 1000  # T2 caps retransmit intervals: never below T1 (§17.1.2.2)
        self.layer = TransactionLayer(TimerConfig(t1=t1, t2=max(4.0, t1)), limits=self.limits)
        # Who may call: trunk allow-lists, digest auth, the registrar (gateway.sip.access).
        self.gate = build_gatekeeper(cfg, self.limits)
        self.transport: SipTransport
        self.dialogs: dict[object, SipLeg] = {}
        self.legs: set[SipLeg] = set()
        self.pending_invites: dict[str, SipLeg] = {}  # server INVITE tid -> leg (not yet ACKed)
        self.client_invites: dict[str, SipLeg] = {}  # client INVITE tid -> leg
        self.client_refers: dict[str, Referral] = {}  # client REFER tid -> its referral
        self._tasks: set[asyncio.Task[None]] = set()
        # Ring this long (180 Ringing) before answering; a CANCEL in that window gets 487.
        self.answer_delay_s = cfg.answer_delay_ms / 1000
        self.closing = False  # close() has begun: new INVITEs and OPTIONS get 503

    async def start(self) -> None:
        host, port = parse_hostport("gateway.sip_listen", self.cfg.sip_listen)
        self.transport = SipTransport(self.layer, self._on_event)
        await self.transport.listen(host, port)
        if self.cfg.tls_listen:
            thost, tport = parse_hostport("gateway.tls_listen", self.cfg.tls_listen)
            server, client = tls.contexts(self.cfg)
            await self.transport.listen_tls(thost, tport, server, client)
            mutual = " (client certificates required)" if self.cfg.tls_verify_client else ""
            log.info("SIP over TLS listening on %s:%d%s", thost, self.transport.tls_port, mutual)
        self.manager.originate_hook = self.originate
        log.info("SIP listening on %s:%d (UDP and TCP)", host, self.transport.port)

    async def close(self) -> None:
        # Shutting down (SIGTERM): from here every new INVITE and OPTIONS gets 503 (RFC 3261
        # §21.5.4) while the calls up are hung up, so a dispatcher probing with OPTIONS, or a
        # caller whose INVITE lands in these last moments, goes to another gateway instead of
        # being answered by one that is about to vanish.
        self.closing = True
        for leg in list(self.legs):
            with contextlib.suppress(Exception):
                await leg.hangup("shutdown")
        await self.transport.close()

    # --- helpers -------------------------------------------------------------------------
    def local_address(self, peer_ip: str) -> str:
        return self.cfg.public_address or local_ip_for(peer_ip)

    def sent_by(self, local_ip: str, addr: Address | None = None) -> str:
        """Via sent-by (and Contact host:port) for a message to ``addr``: the TLS listener's
        port when it goes over TLS (§18.1.1: the port where we receive on that transport)."""
        host = f"[{local_ip}]" if ":" in local_ip else local_ip
        over_tls = addr is not None and self.transport.via_transport(addr) == "TLS"
        return f"{host}:{self.transport.tls_port if over_tls else self.transport.port}"

    def contact(
        self,
        local_ip: str,
        user: str | None = None,
        addr: Address | None = None,
        *,
        secure: bool = False,
    ) -> NameAddr:
        """Our Contact for a dialog with ``addr``. Over TLS it must lead back over TLS: a
        ``sips:`` URI when the request's was (``secure``, §8.1.1.8 / §12.1.1), otherwise
        ``;transport=tls`` at the TLS port."""
        over_tls = addr is not None and self.transport.via_transport(addr) == "TLS"
        scheme = "sips" if over_tls and secure else "sip"
        tail = ";transport=tls" if over_tls and not secure else ""
        hostport = self.sent_by(local_ip, addr)
        return NameAddr.parse(f"<{scheme}:{user or self.cfg.from_user}@{hostport}{tail}>")

    def in_dialog_addr(self, leg: SipLeg) -> Address:
        """Where in-dialog requests go: the remote target (or first route), resolved; the
        INVITE's source when the target cannot be resolved (NATed phones). A TLS call reuses
        its open connection (RFC 5923's reuse, what a phone behind NAT needs), else opens one
        to the target with the target's host name verified."""
        assert leg.dialog is not None
        if leg.extra.get("flow"):
            return leg.peer  # a registered phone reached through its REGISTER's flow (NAT)
        hop = leg.dialog.next_hop()
        if leg.signalling == "TLS":
            if self.transport.connection_open(leg.peer):
                return leg.peer
            addr = resolve_uri(hop, leg.peer)
            if self.transport.tls_enabled and not self.transport.connection_open(addr):
                host = hop.host_for_connect if isinstance(hop, SipUri) else addr[0]
                self.transport.connect_tls(addr, host)
            return addr
        return resolve_uri(hop, leg.peer)

    def _srtp_mode(self) -> SrtpMode:
        mode = self.cfg.srtp
        assert mode in SRTP_MODES, mode  # GatewayConfig.validate
        return mode  # type: ignore[return-value]  # narrowed by the assertion

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _respond(self, tid: str | None, response: Response) -> None:
        if tid is not None:
            response.headers.set("User-Agent", USER_AGENT)
            self.transport.send_response(tid, response)

    # --- events from the transaction layer -----------------------------------------------
    def _on_event(self, event: SipEvent) -> None:
        if isinstance(event, RequestReceived):
            self._on_request(event)
        elif isinstance(event, CancelReceived):
            leg = self.pending_invites.pop(event.transaction_id, None)
            if leg is not None and not leg.answered:
                # §9.2: the layer answered the CANCEL 200; the INVITE gets 487.
                self._respond(event.transaction_id, make_response(leg.invite, 487))
                self._spawn(leg.end("cancelled"))
        elif isinstance(event, ResponseReceived):
            self._on_response(event)
        elif isinstance(event, TransactionTimeout | TransportError):
            self._on_failure(event.transaction_id, event)

    def _on_request(self, ev: RequestReceived) -> None:
        req, tid = ev.request, ev.transaction_id
        did = uas_dialog_id(req)
        if did is not None:
            leg = self.dialogs.get(did)
            if leg is None:
                if req.method != "ACK":  # an ACK is never answered (§17.2.3)
                    self._respond(tid, no_dialog_response(req))
                return
            self._in_dialog(leg, req, tid, ev.addr)
            return
        method = req.method
        if method == "REGISTER" and self.gate.location is not None:
            self._respond(tid, self.gate.register(
                req, ev.addr, self.transport.now, date=formatdate(usegmt=True),
                reliable=self.transport.via_transport(ev.addr) != "UDP",
            ))  # fmt: skip
            return
        admission = self.gate.admit(req, ev.addr, self.transport.now)
        if admission.response is not None:  # 401 with challenges, or 403
            self._respond(tid, admission.response)
            return
        if method == "INVITE":
            self._spawn(self._incoming_invite(req, tid, ev.addr))
        elif method == "OPTIONS" and not self._ready():
            self._respond(tid, self._unready_response(req))
        elif method == "OPTIONS":
            self._respond(tid, make_response(req, 200, headers=[
                ("Allow", ALLOW), ("Accept", "application/sdp"), ("Accept-Language", "en"),
                ("Supported", ""),
            ]))  # fmt: skip
        elif method == "ACK":
            return
        elif method in ("BYE", "INFO"):
            self._respond(tid, make_response(req, 481))
        elif method == "NOTIFY":
            # RFC 6665 §4.1.3: a NOTIFY for no subscription of ours.
            self._respond(tid, make_response(req, 481, "Subscription Does Not Exist"))
        elif method == "REFER":
            # RFC 3515 allows REFER outside a dialog; the gateway only ever acts on one in a
            # call it holds (and then only with gateway.accept_refer).
            self._refuse_refer(req, tid, "REFER outside a call is not accepted")
        else:
            self._respond(tid, make_response(req, 405, headers=[("Allow", ALLOW)]))

    def _ready(self) -> bool:
        return not self.closing and (self.readiness is None or self.readiness.ready)

    def _unready_response(self, req: Request) -> Response:
        if self.closing:
            return make_response(
                req, 503, "Shutting Down", headers=[("Retry-After", str(RETRY_AFTER_S))]
            )
        return make_response(
            req, 503, "No Synthesis Worker Ready",
            headers=[("Retry-After", str(RETRY_AFTER_UNREADY_S))],
        )  # fmt: skip

    async def _incoming_invite(self, req: Request, tid: str | None, addr: Address) -> None:
        if tid is None:
            return
        if not self._ready():
            # Nobody could greet this caller yet: refuse (or hold the INVITE a while for a
            # worker; the transaction's 100 Trying stops retransmissions) rather than answer
            # into silence.
            wait_s = self.cfg.unready_wait_ms / 1000
            readiness = self.readiness
            if (
                not self.closing
                and readiness is not None
                and wait_s > 0
                and await readiness.wait(wait_s)
                and not self.closing
            ):
                await self._answer_invite(req, tid, addr)
                return
            self._respond(tid, self._unready_response(req))
            return
        await self._answer_invite(req, tid, addr)

    async def _answer_invite(self, req: Request, tid: str, addr: Address) -> None:
        if self.manager.full():
            self._respond(
                tid, make_response(req, 503, headers=[("Retry-After", str(RETRY_AFTER_S))])
            )
            return
        source = addr[0]
        if not self.limits.call_admitted(source):
            # INVITEs admitted together before any became a call: the cap holds here.
            refusal = self.limits.refuse_call(source)
            self._respond(tid, make_response(
                req, 503, headers=[("Retry-After", str(refusal.retry_after_s))]))  # fmt: skip
            return
        # Count the call against its source now, not once it exists: the awaits on the way
        # let other INVITEs from the same source in. Its leg takes the count over.
        self.limits.call_started(source)
        leg: SipLeg | None = None
        try:
            leg = await self._set_up_inbound(req, tid, addr)
        finally:
            if leg is None:
                self.limits.call_ended(source)

    async def _set_up_inbound(self, req: Request, tid: str, addr: Address) -> SipLeg | None:
        """Answer a new INVITE; the leg it created (which counts against its source), if any."""
        # §13.2.1: an INVITE without a body (late offer, common from PBXs and trunks) gets
        # our offer in the 200; the caller's answer comes in the ACK.
        offer: sdp.SessionDescription | None = None
        if req.body:
            try:
                offer = sdp.parse(req.body)
            except sdp.SdpError as exc:
                self._respond(tid, make_response(req, 400, f"Bad SDP: {exc}"[:120]))
                return None
        local_ip = self.local_address(addr[0])
        try:
            endpoint = await RtpEndpoint.open(
                bind_ip(self.cfg, local_ip), (self.cfg.rtp_port_min, self.cfg.rtp_port_max)
            )
        except OSError:
            log.exception("no RTP port for an incoming call")
            self._respond(
                tid, make_response(req, 503, headers=[("Retry-After", str(RETRY_AFTER_S))])
            )
            return None
        params: sdp.MediaParams | None = None
        srtp = self._srtp_mode()
        try:
            if offer is None:
                answer = sdp.make_offer(local_ip, endpoint.local_port, srtp=srtp)
            else:
                answer = sdp.answer(offer, local_ip, endpoint.local_port, srtp=srtp)
                params = sdp.negotiated(offer, answer)
        except sdp.SdpNegotiationError as exc:
            endpoint.close()
            self._respond(tid, make_response(req, 488, headers=[
                ("Warning", f'305 voxgate "{exc}"'[:200])]))  # fmt: skip
            return None
        try:
            call = self.manager.new_call("sip", "inbound", str(req.from_addr.uri), str(req.uri))
        except Unavailable:
            endpoint.close()
            self._respond(
                tid, make_response(req, 503, headers=[("Retry-After", str(RETRY_AFTER_S))])
            )
            return None
        leg = SipLeg(self, call, req, addr, local_ip, endpoint=endpoint, local_tag=generate_tag(),
                     invite_tid=tid, local_sdp=answer)  # fmt: skip
        call.leg = leg
        leg.counted_source = addr[0]
        leg.signalling = self.transport.via_transport(addr)
        self.legs.add(leg)
        self.pending_invites[tid] = leg
        if params is not None:
            self._start_media(leg, params)
        try:
            user = req.uri.user if isinstance(req.uri, SipUri) else None
            secure = isinstance(req.uri, SipUri) and req.uri.secure
            contact = self.contact(local_ip, user, addr, secure=secure)
            leg.dialog = Dialog.from_uas_request(req, leg.local_tag, contact)
        except SipParseError as exc:
            self.pending_invites.pop(tid, None)
            self._respond(tid, make_response(req, 400, str(exc)[:120]))
            await leg.end("bad request")
            return leg
        self.dialogs[leg.dialog.id] = leg
        if self.answer_delay_s > 0:
            self._respond(
                tid, make_dialog_response(req, 180, to_tag=leg.local_tag, contact=contact)
            )
            await asyncio.sleep(self.answer_delay_s)
            if leg.ended:
                return leg
        ok = make_dialog_response(
            req, 200, to_tag=leg.local_tag, contact=contact, body=bytes(answer),
            headers=[("Content-Type", "application/sdp"), ("Allow", ALLOW)],
        )  # fmt: skip
        self._respond(tid, ok)
        return leg

    def _start_media(self, leg: SipLeg, params: sdp.MediaParams) -> None:
        """Negotiation done: configure RTP, let the pacer pull the call's audio, start pacing
        (media flows from here on: silence until the agent talks)."""
        assert leg.endpoint is not None
        call = leg.call
        settings = call.manager.bargein
        on_arrival = settings is None or settings.on_arrival
        if on_arrival:
            call.feed_on_arrival()
        leg.endpoint.configure(
            params,
            on_dtmf=lambda d: call.on_dtmf(d.digit, d.duration_ms),
            on_audio=lambda frame: call.on_caller_audio(frame.pcm),
            on_arrival=call.on_caller_packet if on_arrival else None,
            playout_wanted=call.plays_caller_out,
        )
        attach_source(leg.endpoint, call)
        call.set_codec(params.codec)
        self.ticker.add(leg.endpoint)

    def _late_answer(self, leg: SipLeg, ack: Request) -> bool:
        """The SDP answer in the ACK of a late-offer call; False if it is missing or unusable."""
        assert leg.local_sdp is not None
        try:
            params = sdp.negotiated(sdp.parse(ack.body), leg.local_sdp)
        except (sdp.SdpError, sdp.SdpNegotiationError) as exc:
            log.warning("late-offer call %s: unusable answer in ACK: %s", leg.call.id, exc)
            return False
        self._start_media(leg, params)
        return True

    def _in_dialog(self, leg: SipLeg, req: Request, tid: str | None, addr: Address) -> None:
        assert leg.dialog is not None
        if req.method == "ACK":
            if not leg.answered and leg.invite_tid is not None:
                self.pending_invites.pop(leg.invite_tid, None)
                late = leg.endpoint is not None and leg.endpoint.session is None
                if late and not self._late_answer(leg, req):
                    # §13.3.1.4: a UAS that cannot use the answer ends the call with BYE.
                    leg.answered = True
                    self._spawn(leg.hangup("bad SDP answer in ACK"))
                    return
                leg.answered = True
                leg.call.set_state("answered")
                self._spawn(leg.call.start(self.manager.agent_for(leg.call)))
            return
        problem = leg.dialog.receive_request(req)
        if problem is not None:
            self._respond(tid, problem)
            return
        if req.method == "BYE":
            self._respond(tid, make_response(req, 200))
            self._spawn(leg.end("remote hangup"))
        elif req.method == "INVITE":
            self._reinvite(leg, req, tid)
        elif req.method == "INFO":
            digit = info_dtmf(req)
            if digit is None:
                self._respond(tid, make_response(req, 415, headers=[
                    ("Accept", "application/dtmf-relay, application/dtmf")]))  # fmt: skip
                return
            self._respond(tid, make_response(req, 200))
            leg.call.on_dtmf(digit, source="info")
        elif req.method == "OPTIONS":
            self._respond(tid, make_response(req, 200, headers=[("Allow", ALLOW)]))
        elif req.method == "NOTIFY":
            self._in_dialog_notify(leg, req, tid)
        elif req.method == "REFER":
            self._incoming_refer(leg, req, tid)
        else:
            self._respond(tid, make_response(req, 405, headers=[("Allow", ALLOW)]))

    def _reinvite(self, leg: SipLeg, req: Request, tid: str | None) -> None:
        """§14.2: a re-INVITE changes the session (hold/unhold per RFC 3264 §8.4)."""
        assert leg.dialog is not None and leg.endpoint is not None
        if not req.body:
            answer = leg.local_sdp  # an offerless re-INVITE: offer our current session again
            assert answer is not None
        else:
            try:
                offer = sdp.parse(req.body)
                answer = sdp.answer(offer, leg.local_ip, leg.endpoint.local_port,
                                    previous=leg.local_sdp, srtp=self._srtp_mode())  # fmt: skip
                params = sdp.negotiated(offer, answer)
            except sdp.SdpError as exc:
                self._respond(tid, make_response(req, 400, f"Bad SDP: {exc}"[:120]))
                return
            except sdp.SdpNegotiationError as exc:
                self._respond(tid, make_response(req, 488, headers=[
                    ("Warning", f'305 voxgate "{exc}"'[:200])]))  # fmt: skip
                return
            leg.endpoint.configure(params)
            leg.local_sdp = answer
            leg.call.set_state("held" if params.on_hold else "answered")
        contact = leg.dialog.local_contact
        self._respond(tid, make_dialog_response(
            req, 200, to_tag=leg.local_tag, contact=contact, body=bytes(answer),
            headers=[("Content-Type", "application/sdp")],
        ))  # fmt: skip

    # --- UAC -----------------------------------------------------------------------------
    async def originate(self, to: str, caller: str | None = None) -> Call:
        local = self._local_route(to)  # a softphone registered here: its contact, no trunk
        to = dial_uri(to, self.cfg.trunk) if local is None else str(local.request_uri)
        try:
            target = parse_uri(to)
        except SipParseError as exc:
            raise Unavailable(f"bad target URI {to!r}: {exc}") from None
        if not isinstance(target, SipUri):
            raise Unavailable(f"only sip:/sips: targets are supported, got {to!r}")
        hop_uri = parse_uri(self.cfg.trunk) if self.cfg.trunk and local is None else target
        over_tls = uses_tls(hop_uri) or target.secure
        if over_tls and not self.transport.tls_enabled:
            raise Unavailable(f"{to!r} needs SIP over TLS: set gateway.tls_listen")
        peer = resolve_uri(hop_uri, None) if local is None else local.addr
        local_ip = self.local_address(peer[0])
        endpoint = await RtpEndpoint.open(
            bind_ip(self.cfg, local_ip), (self.cfg.rtp_port_min, self.cfg.rtp_port_max)
        )
        offer = sdp.make_offer(local_ip, endpoint.local_port, srtp=self._srtp_mode())
        user = caller or self.cfg.from_user
        if over_tls:
            # The certificate must name the host we dial (RFC 5922 §7.2).
            host = hop_uri.host_for_connect if isinstance(hop_uri, SipUri) else peer[0]
            self.transport.connect_tls(peer, host)
        via = self.transport.via_transport(peer) if over_tls else "UDP"
        scheme = "sips" if target.secure else "sip"
        h = Headers()
        h.add("Via", f"SIP/2.0/{via} {self.sent_by(local_ip, peer)};branch={generate_branch()}"
                     ";rport")  # fmt: skip
        h.add("Max-Forwards", "70")
        h.add("From", f"<{scheme}:{user}@{self.sent_by(local_ip, peer)}>;tag={generate_tag()}")
        h.add("To", f"<{target if local is None else local.to}>")
        h.add("Call-ID", generate_call_id(local_ip))
        h.add("CSeq", "1 INVITE")
        h.add("Contact", str(self.contact(local_ip, user, peer, secure=target.secure)))
        h.add("Allow", ALLOW)
        h.add("User-Agent", USER_AGENT)
        h.add("Content-Type", "application/sdp")
        invite = Request("INVITE", target, h, bytes(offer))
        call = self.manager.new_call("sip", "outbound", str(target), f"sip:{user}@{local_ip}")
        leg = SipLeg(self, call, invite, peer, local_ip, endpoint=endpoint, local_sdp=offer)
        leg.signalling = "TLS" if over_tls else "UDP"
        if self.cfg.trunk_username and local is None:
            leg.auth = DigestAuthenticator(self.cfg.trunk_username, self.cfg.trunk_password)
        if local is not None and local.addr == local.binding.source:
            leg.extra["flow"] = True
        call.leg = leg
        self.legs.add(leg)
        self._send_invite(leg, invite)
        return call

    def _local_route(self, to: str) -> Route | None:
        try:
            return self.gate.route(to, self.transport.now)
        except NotRegistered as exc:
            raise NotRegisteredError(str(exc)) from None

    def _send_invite(self, leg: SipLeg, invite: Request) -> None:
        leg.invite = invite
        tid = self.transport.send_request(invite, leg.peer)
        leg.invite_tid = tid
        self.client_invites[tid] = leg

    def _on_response(self, ev: ResponseReceived) -> None:
        resp = ev.response
        if ev.transaction_id is None:
            return  # a stray 2xx (late fork): nothing of ours
        referral = self.client_refers.get(ev.transaction_id)
        if referral is not None:
            if resp.status >= 200:
                del self.client_refers[ev.transaction_id]
            referral.on_response(resp)
            return
        leg = self.client_invites.get(ev.transaction_id)
        if leg is None or resp.cseq.method != "INVITE":
            return
        status = resp.status
        if status < 200:
            return  # ringing: the call is already in state "ringing"
        if status >= 300:
            self.client_invites.pop(ev.transaction_id, None)
            leg.call.retry_after = retry_after_s(resp.headers.get("Retry-After"))
            if status in (401, 407) and leg.auth is not None and not leg.ended:
                retry = leg.auth.authorize(leg.invite, resp)
                if retry is not None:
                    self._send_invite(leg, retry)
                    return
            self._spawn(leg.end(f"{status} {resp.reason}"))
            return
        # 2xx: confirm the dialog, ACK it (§13.2.2.4), start media and the agent.
        if leg.dialog is None:
            try:
                leg.dialog = Dialog.from_uac_response(leg.invite, resp)
            except SipParseError as exc:
                log.warning("bad 2xx to our INVITE: %s", exc)
                self._spawn(leg.end("bad answer"))
                return
            self.dialogs[leg.dialog.id] = leg
        addr = self.in_dialog_addr(leg)
        ack = leg.dialog.create_ack(
            leg.invite, sent_by=self.sent_by(leg.local_ip, addr),
            transport=self.transport.via_transport(addr),
        )  # fmt: skip
        self.transport.send_stateless(ack, addr)
        if leg.ended and not leg.answered and not leg.extra.get("bye_sent"):
            # §9.1/§15: a 2xx that crossed our CANCEL (or came after we gave up) set up a
            # dialog at the callee; ACK it (above) and end it at once with a BYE.
            leg.extra["bye_sent"] = True
            bye = leg.dialog.create_request(
                "BYE",
                sent_by=self.sent_by(leg.local_ip, addr),
                transport=self.transport.via_transport(addr),
            )
            self.transport.send_request(bye, addr)
            self.dialogs.pop(leg.dialog.id, None)
            return
        if leg.answered or leg.ended:
            return  # a retransmitted 2xx: the ACK again is all it needs
        assert leg.endpoint is not None and leg.local_sdp is not None
        try:
            params = sdp.negotiated(sdp.parse(resp.body), leg.local_sdp)
        except (sdp.SdpError, sdp.SdpNegotiationError) as exc:
            log.warning("unusable SDP answer: %s", exc)
            self._spawn(leg.hangup("bad SDP answer"))
            return
        self._start_media(leg, params)
        leg.answered = True
        leg.call.set_state("answered")
        self._spawn(leg.call.start(self.manager.agent_for(leg.call)))

    def _on_failure(self, tid: str, event: SipEvent) -> None:
        referral = self.client_refers.pop(tid, None)
        if referral is not None:
            referral.on_failure(timeout=isinstance(event, TransactionTimeout))
            return
        leg = self.client_invites.pop(tid, None)
        if leg is not None and not leg.answered:
            self._spawn(
                leg.end("timeout" if isinstance(event, TransactionTimeout) else "unreachable")
            )
            return
        leg = self.pending_invites.pop(tid, None)
        if leg is not None and isinstance(event, TransactionTimeout) and event.timer == "L":
            # §13.3.1.4: no ACK for our 2xx: the dialog is confirmed; end it with a BYE.
            self._spawn(leg.hangup("no ACK"))

    # --- transfer: REFER (RFC 3515) ----------------------------------------------------------
    async def refer(
        self,
        leg: SipLeg,
        target: str,
        *,
        timeout_s: float,
        on_progress: Callable[[int, str], None],
    ) -> TransferOutcome:
        """Send a REFER to ``target`` in ``leg``'s dialog and wait for its outcome."""
        if leg.ended or leg.dialog is None or not leg.answered:
            return TransferOutcome("failed", None, "the call has no confirmed dialog to REFER in")
        if leg.referral is not None and not leg.referral.sub.ended:
            raise Conflict(f"call {leg.call.id} has a REFER under way")
        try:
            uri = parse_uri(target)
        except SipParseError as exc:
            raise BadRequest(f"bad target URI {target!r}: {exc}") from None
        addr = self.in_dialog_addr(leg)
        refer = build_refer(
            leg.dialog, uri, sent_by=self.sent_by(leg.local_ip, addr),
            transport=self.transport.via_transport(addr),
        )  # fmt: skip
        refer.headers.add("User-Agent", USER_AGENT)
        referral = Referral(ReferSubscription(refer, self.transport.now, timeout=timeout_s),
                            on_progress)  # fmt: skip
        leg.referral = referral
        log.info("call %s: REFER to %s", leg.call.id, target, extra=leg.call.log_fields)
        self.client_refers[self.transport.send_request(refer, addr)] = referral
        referral.pump()  # arms the timeout
        outcome = await referral.done
        log.info("call %s: transfer to %s %s (%s %s)", leg.call.id, target, outcome.result,
                 outcome.status, outcome.reason, extra=leg.call.log_fields)  # fmt: skip
        return TransferOutcome(outcome.result, outcome.status, outcome.reason)

    def _in_dialog_notify(self, leg: SipLeg, req: Request, tid: str | None) -> None:
        referral = leg.referral
        if referral is not None and referral.sub.matches(req):
            self._respond(tid, referral.sub.receive_notify(req, self.transport.now))
            referral.pump()
            return
        try:
            package = EventHeader.parse(req.headers.get("Event") or "").package
        except SipParseError:
            package = ""
        if package != REFER_EVENT:
            # RFC 6665 §4.1.3: an event package we do not subscribe to.
            self._respond(tid, make_response(req, 489, headers=[("Allow-Events", REFER_EVENT)]))
        else:
            # A refer NOTIFY for no REFER of ours, or for one we have given up on (§4.1.3:
            # 481, which ends the subscription at the notifier).
            self._respond(tid, make_response(req, 481, "Subscription Does Not Exist"))

    def _refuse_refer(self, req: Request, tid: str | None, why: str) -> None:
        try:
            target = refer_target(req)
        except SipParseError as exc:
            self._respond(tid, make_response(req, 400, exc.reason[:100]))
            return
        log.info("REFER to %s declined: %s", target.uri, why)
        self._respond(tid, decline_refer(req, why))

    def _incoming_refer(self, leg: SipLeg, req: Request, tid: str | None) -> None:
        """The far end asks us to call someone else (we are the referee, RFC 3515 §2.4.2)."""
        if not self.cfg.accept_refer:
            self._refuse_refer(req, tid, "transfer by REFER is not accepted here")
            return
        try:
            target = refer_target(req)
        except SipParseError as exc:
            self._respond(tid, make_response(req, 400, exc.reason[:100]))
            return
        uri = target.uri
        if not isinstance(uri, SipUri) or uri.headers:
            # A Refer-To with embedded headers (Replaces: attended transfer, RFC 3891) asks
            # for more than placing a call.
            self._refuse_refer(req, tid, "only sip:/sips: targets without headers are followed")
            return
        if leg.referee_task is not None and not leg.referee_task.done():
            self._refuse_refer(req, tid, "a REFER is already being acted on in this call")
            return
        assert leg.dialog is not None
        contact = leg.dialog.local_contact
        self._respond(tid, make_response(
            req, 202, headers=[("Contact", str(contact))] if contact is not None else [],
        ))  # fmt: skip
        log.info("call %s: REFER to %s accepted", leg.call.id, uri, extra=leg.call.log_fields)
        leg.referee_task = asyncio.ensure_future(self._follow_refer(leg, req.cseq.seq, str(uri)))

    async def _follow_refer(self, leg: SipLeg, refer_cseq: int, target: str) -> None:
        """Place the referred call and NOTIFY its progress (RFC 3515 §2.4.4): 100 Trying at
        once, then the final status (200 when it is answered), which ends the subscription."""
        self._notify_referrer(leg, refer_cseq, Sipfrag(100, "Trying"))
        try:
            info = await self.manager.originate(target, agent=leg.call.agent_spec)
        except (ControlError, OSError) as exc:
            log.warning("call %s: the referred call to %s failed: %s", leg.call.id, target, exc)
            self._notify_referrer(leg, refer_cseq, Sipfrag(503, "Service Unavailable"))
            return
        call = self.manager.calls.get(info.id)
        frag = Sipfrag(500, "Server Internal Error")
        if call is not None:
            frag = await _final_status(call, NOTIFY_WAIT_S)
        self._notify_referrer(leg, refer_cseq, frag)

    def _notify_referrer(self, leg: SipLeg, refer_cseq: int, frag: Sipfrag) -> None:
        if leg.ended or leg.dialog is None:
            return  # the referrer hung up already: nobody to tell
        addr = self.in_dialog_addr(leg)
        notify = build_notify(
            leg.dialog, refer_cseq, frag, sent_by=self.sent_by(leg.local_ip, addr),
            transport=self.transport.via_transport(addr),
        )  # fmt: skip
        self.transport.send_request(notify, addr)


# The referred call's final status is awaited this long, then it is given up (CANCEL) and the
# referrer told 408; the subscription we offered lasts as long (gateway.sip.refer).
NOTIFY_WAIT_S = float(NOTIFY_EXPIRES_S)


async def _final_status(call: Call, timeout: float) -> Sipfrag:
    """The sipfrag for a call we placed on a REFER's behalf: 200 once answered, its failure
    status when it ends first (486, 408 ...), 408 after ``timeout`` (the call is cancelled)."""
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[None] = loop.create_future()

    def watch(event: Event) -> None:
        wanted = ("answered", "ended")
        if isinstance(event, CallStateChanged) and event.state in wanted and not settled.done():
            settled.set_result(None)

    call.listeners.append(watch)
    try:
        if call.info.state == "ringing":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(settled), timeout)
    finally:
        call.listeners.remove(watch)
    state = call.info.state
    if state in ("answered", "held"):
        return Sipfrag(200, "OK")
    if state == "ringing":
        await call.hangup("no answer")
        return Sipfrag(408, "Request Timeout")
    status, _ = end_status(call.info.end_reason)
    if status is None or status < 300:
        return Sipfrag(500, "Server Internal Error")
    return Sipfrag(status, reason_phrase(status))


def dial_uri(to: str, trunk: str) -> str:
    """The Request-URI for ``to``: a ``sip:``/``sips:`` URI as it is; an E.164 number
    (``+14155550100``) as a telephone-number user at the trunk's host (RFC 3261 §19.1.6,
    ``user=phone``). A number without a trunk has nowhere to go: BadRequest."""
    if not to.startswith("+"):
        return to
    digits = to[1:]
    if not (digits.isascii() and digits.isdigit() and 1 <= len(digits) <= 15):
        raise BadRequest(f"{to!r} is not an E.164 number")
    if not trunk:
        raise BadRequest(f"no trunk to dial {to} through: set gateway.trunk")
    hop = parse_uri(trunk)
    if not isinstance(hop, SipUri):
        raise BadRequest(f"gateway.trunk {trunk!r} is not a sip: URI")
    port = f":{hop.port}" if hop.port is not None else ""
    return f"{hop.scheme}:{to}@{hop.host}{port};user=phone"


def retry_after_s(value: str | None) -> float | None:
    """Seconds of a Retry-After header (RFC 3261 §20.33: delta-seconds, then an optional
    comment and ``;duration=`` parameters, which are ignored); None when absent or garbled."""
    if value is None:
        return None
    head = value.strip().split(";", 1)[0].split("(", 1)[0].strip()
    return float(head) if head.isascii() and head.isdigit() else None


def bind_ip(cfg: GatewayConfig, local_ip: str) -> str:
    """RTP binds the SIP listen address when it is specific, else every interface."""
    host, _ = parse_hostport("gateway.sip_listen", cfg.sip_listen)
    return host if host not in ("0.0.0.0", "::") else ("::" if ":" in local_ip else "0.0.0.0")


def resolve_uri(uri: object, fallback: Address | None) -> Address:
    """A SIP URI's host:port as an address (A/AAAA lookup; no RFC 3263 NAPTR/SRV)."""
    if not isinstance(uri, SipUri):
        if fallback is None:
            raise Unavailable(f"cannot route to {uri}")
        return fallback
    port = uri.port or (5061 if uses_tls(uri) else 5060)
    host = uri.host_for_connect
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        if fallback is None:
            raise Unavailable(f"cannot resolve {host}") from None
        return fallback
    addr = info[0][4]
    return (str(addr[0]), int(addr[1]))


def uses_tls(uri: object) -> bool:
    """A ``sips:`` URI, or a ``sip:`` one with ``transport=tls`` (RFC 3261 §19.1.1, §26.2)."""
    if not isinstance(uri, SipUri):
        return False
    return uri.secure or (uri.param("transport") or "").lower() == "tls"


def info_dtmf(req: Request) -> str | None:
    """The digit of a SIP INFO DTMF body (application/dtmf-relay or application/dtmf)."""
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    text = req.body.decode("utf-8", "replace")
    digit = ""
    if ctype == "application/dtmf-relay":
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip().lower() == "signal":
                digit = value.strip()
    elif ctype == "application/dtmf":
        digit = text.strip()
    else:
        return None
    digit = {"10": "*", "11": "#"}.get(digit, digit).upper()
    return digit if is_dtmf_key(digit) else None


def attach_source(endpoint: RtpEndpoint, call: Call) -> None:
    """Let the pacer pull the call's agent audio one frame per tick."""
    session = endpoint.session
    assert session is not None
    session.pacer.source = call.pull_audio
