"""Registration with a SIP trunk (RFC 3261 §10): REGISTER, digest auth, refresh before expiry.

The registrar's answer decides the binding's lifetime (§10.2.4: the Expires in the 2xx, per
Contact or as a header); we refresh at 80 % of it (at least 5 s before it runs out) and retry
after failures with a back-off. ``close()`` removes the binding (Expires: 0, §10.2.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.legs.sip.transport import SipTransport
from gateway.sip import (
    DigestAuthenticator,
    Headers,
    NameAddr,
    Request,
    Response,
    ResponseReceived,
    SipParseError,
    SipUri,
    TransactionTimeout,
    TransportError,
    generate_branch,
    generate_call_id,
    generate_tag,
    parse_uri,
)
from gateway.sip.events import SipEvent
from gateway.sip.message import Address

log = logging.getLogger("voxgate.sip.register")

RETRY_S = (5.0, 15.0, 30.0, 60.0)


class Registrar:
    def __init__(
        self,
        transport: SipTransport,
        *,
        registrar: str,
        peer: Address,
        user: str,
        local_ip: str,
        expires_s: int,
        username: str = "",
        password: str = "",
    ) -> None:
        uri = parse_uri(registrar)
        if not isinstance(uri, SipUri):
            raise ValueError(f"registrar must be a sip: URI, got {registrar!r}")
        self.transport = transport
        self.registrar = uri
        self.peer = peer
        self.user = user
        self.local_ip = local_ip
        self.expires_s = expires_s
        self.auth = DigestAuthenticator(username, password) if username else None
        self.call_id = generate_call_id(local_ip)
        self.tag = generate_tag()
        self.cseq = 0
        self.tid: str | None = None
        self.request: Request | None = None
        self.registered = False
        self.granted_s = 0
        self.failures = 0
        self.last_status: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._done: asyncio.Event = asyncio.Event()  # set on each final outcome
        self._closing = False

    # --- requests ------------------------------------------------------------------------
    def _build(self, expires: int) -> Request:
        self.cseq += 1
        host = f"[{self.local_ip}]" if ":" in self.local_ip else self.local_ip
        sent_by = f"{host}:{self.transport.port}"
        aor = f"sip:{self.user}@{self.registrar.host}"
        h = Headers()
        h.add("Via", f"SIP/2.0/UDP {sent_by};branch={generate_branch()};rport")
        h.add("Max-Forwards", "70")
        h.add("From", f"<{aor}>;tag={self.tag}")
        h.add("To", f"<{aor}>")
        h.add("Call-ID", self.call_id)  # §10.2: the same Call-ID for every refresh
        h.add("CSeq", f"{self.cseq} REGISTER")
        h.add("Contact", f"<sip:{self.user}@{sent_by}>")
        h.add("Expires", str(expires))
        h.add("User-Agent", "voxgate/0.1")
        return Request("REGISTER", SipUri(scheme="sip", host=self.registrar.host,
                                          port=self.registrar.port), h)  # fmt: skip

    def register(self, expires: int | None = None) -> None:
        self._cancel_timer()
        self._done.clear()
        self.request = self._build(self.expires_s if expires is None else expires)
        self.tid = self.transport.send_request(self.request, self.peer)

    async def start(self) -> None:
        self.register()

    async def wait(self, timeout: float) -> bool:
        """Wait for the outcome of the REGISTER in flight; True if registered."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout)
        return self.registered

    async def close(self, timeout: float = 2.0) -> None:
        self._closing = True
        self._cancel_timer()
        if self.registered:
            self.register(expires=0)
            await self.wait(timeout)

    # --- responses -----------------------------------------------------------------------
    def on_event(self, event: SipEvent) -> bool:
        """Handle ``event`` if it is about our REGISTER; True when consumed."""
        if isinstance(event, ResponseReceived) and event.transaction_id == self.tid:
            self._on_response(event)
            return True
        if (
            isinstance(event, TransactionTimeout | TransportError)
            and event.transaction_id == self.tid
        ):
            self.last_status = 408
            self._failed("no answer from the registrar")
            return True
        return False

    def _on_response(self, ev: ResponseReceived) -> None:
        resp = ev.response
        if resp.status < 200:
            return
        self.last_status = resp.status
        assert self.request is not None
        if resp.status in (401, 407) and self.auth is not None:
            retry = self.auth.authorize(self.request, resp)
            if retry is not None:
                self.cseq = retry.cseq.seq
                self.request = retry
                self.tid = self.transport.send_request(retry, self.peer)
                return
        if resp.status == 423:
            # §10.2.8: Interval Too Brief; retry with the registrar's Min-Expires.
            minimum = resp.headers.get("Min-Expires")
            if minimum and minimum.strip().isdigit() and int(minimum) > self.expires_s:
                self.expires_s = int(minimum)
                self.register()
                return
        if 200 <= resp.status < 300:
            if self._closing:
                self.registered = False
                self._done.set()
                return
            self.granted_s = self._granted(resp)
            self.registered = self.granted_s > 0
            self.failures = 0
            log.info("registered with %s for %d s", self.registrar, self.granted_s)
            self._schedule(max(1.0, min(self.granted_s * 0.8, self.granted_s - 5.0)))
            self._done.set()
            return
        self._failed(f"{resp.status} {resp.reason}")

    def _granted(self, resp: Response) -> int:
        """§10.2.4: our Contact's expires param, else the Expires header, else what we asked."""
        ours = f"sip:{self.user}@"
        for value in resp.headers.values("Contact"):
            try:
                c = NameAddr.parse(value)
            except SipParseError:
                continue
            exp = c.param("expires")
            if str(c.uri).startswith(ours) and exp is not None and exp.strip().isdigit():
                return int(exp)
        header = resp.headers.get("Expires")
        if header and header.strip().isdigit():
            return int(header.strip())
        return self.expires_s

    def _failed(self, why: str) -> None:
        self.registered = False
        self._done.set()
        if self._closing:
            return
        delay = RETRY_S[min(self.failures, len(RETRY_S) - 1)]
        self.failures += 1
        log.warning(
            "registration with %s failed (%s); retrying in %.0f s", self.registrar, why, delay
        )
        self._schedule(delay)

    def _schedule(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(delay, self.register)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
