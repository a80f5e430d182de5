"""Thin asyncio adapters around the sans-I/O SIP transaction layer: UDP and TCP on one address,
TLS (RFC 3261 §26, ``sips:``) on another when configured.

Like aioquic's ``asyncio/protocol.py``: bytes in → ``layer.receive(..., now)``; drain events;
``Transmit`` → socket; everything else → the transaction user (``handler``); re-arm the one
timer from ``layer.get_timer()``. Time is ``loop.time()`` (monotonic).

TLS connections are TCP connections with the same framing (§18.3, ``StreamFramer``) and the
same limits; they are kept in one table with their kind, so a response or in-dialog request
goes back over the connection it belongs to (§18.2.2) and ``via_transport`` names it. Each
runs its TLS in a ``gateway.legs.sip.tls.TlsConnection`` (an ``ssl.SSLObject`` over memory
BIOs), and the handshake runs before any byte is read as SIP: plaintext on the TLS port, an
untrusted or expired certificate, a too-old protocol or a peer that never finishes are logged
(a few lines in a flood) and counted in ``tls_failures`` by reason (``gateway.legs.sip.tls``),
and only that connection is closed. Outbound TLS (``connect_tls``) verifies the peer's
certificate and host name; messages for it wait until the handshake is done, a failure is a
transport error for their transactions (§8.1.3.1: the UAC sees 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import typing
from collections.abc import Callable
from typing import Any, Literal

from gateway.legs.sip.tls import (
    FAILURE_REASONS,
    HANDSHAKE_TIMEOUT_S,
    TlsConnection,
    describe,
    failure_reason,
)
from gateway.sip import (
    Request,
    Response,
    SipEvent,
    SipParseError,
    StreamFramer,
    TransactionLayer,
    Transmit,
)
from gateway.sip.message import Address

log = logging.getLogger("voxgate.sip")

StreamKind = Literal["TCP", "TLS"]


class _Writer(typing.Protocol):
    """What the transport writes to: a TCP ``StreamWriter`` or a :class:`TlsConnection`."""

    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...


# RFC 3261 §18.1.1: over 1300 bytes a request should go over a congestion-controlled
# transport; the gateway's own messages stay far below that, so UDP is used for what it sends.
MAX_TCP_MESSAGE = 65535
# TCP connections held at once, and from one source IP: the connection table is bounded like
# the transaction table (gateway.sip.limits); one beyond is closed at once. A trunk or phone
# needs one connection (§18: requests reuse it), a PBX a few.
MAX_TCP_CONNECTIONS = 1024
MAX_TCP_PER_SOURCE = 32


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.owner.feed(data, (addr[0], addr[1]), reliable=False)

    def error_received(self, exc: Exception) -> None:
        log.debug("UDP error: %s", exc)


class SipTransport:
    def __init__(self, layer: TransactionLayer, handler: Callable[[SipEvent], None]) -> None:
        self.layer = layer
        self.handler = handler
        self._loop = asyncio.get_running_loop()
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tls: asyncio.Server | None = None
        self._conns: dict[Address, _Writer] = {}
        self._kinds: dict[Address, StreamKind] = {}
        # Outbound TLS connections still connecting: what is sent meanwhile waits here.
        self._pending: dict[Address, list[bytes]] = {}
        # Inbound TLS connections in their handshake (they hold a connection slot).
        self._handshaking: set[TlsConnection] = set()
        self._tls_server: ssl.SSLContext | None = None
        self._tls_client: ssl.SSLContext | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.host = ""
        self.port = 0
        self.tls_port = 0
        self.max_tcp_connections = MAX_TCP_CONNECTIONS
        self.max_tcp_per_source = MAX_TCP_PER_SOURCE
        self.tcp_refused = 0
        self.tls_failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)

    async def listen(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._udp, _ = await self._loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(host, port), family=family
        )
        bound = self._udp.get_extra_info("sockname")
        self.host, self.port = host, bound[1]
        # TCP on the same port (RFC 3261 §18: a UA must implement both).
        self._tcp = await asyncio.start_server(self._tcp_client, host, self.port, family=family)

    async def listen_tls(
        self, host: str, port: int, server: ssl.SSLContext, client: ssl.SSLContext
    ) -> None:
        """Accept SIP over TLS on ``host:port`` (5061 by convention, §26.2.2) with ``server``;
        ``client`` is the context of outbound TLS connections (``connect_tls``)."""
        self._tls_server, self._tls_client = server, client
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._tls = await self._loop.create_server(
            lambda: self._tls_protocol(server_side=True), host, port, family=family
        )
        self.tls_port = self._tls.sockets[0].getsockname()[1]

    @property
    def tls_enabled(self) -> bool:
        return self._tls_client is not None

    @property
    def now(self) -> float:
        return self._loop.time()

    # --- input ---------------------------------------------------------------------------
    def feed(
        self, data: bytes | Request | Response | SipParseError, addr: Address, *, reliable: bool
    ) -> None:
        try:
            self.layer.receive(data, addr, self.now, reliable=reliable)
        except Exception:
            # Nothing a peer sends may take the gateway down; the layer answers what it can.
            log.exception("SIP layer failed on input from %s", addr)
        self.service()

    def _admit(self, addr: Address) -> bool:
        """Whether one more TCP/TLS connection from ``addr`` fits the connection limits."""
        held = len(self._conns) + len(self._pending) + len(self._handshaking)
        from_source = sum(1 for a in self._conns if a[0] == addr[0]) + sum(
            1 for c in self._handshaking if c.peer[0] == addr[0]
        )
        if held >= self.max_tcp_connections or from_source >= self.max_tcp_per_source:
            self.tcp_refused += 1
            if self.tcp_refused in (1, 10, 100, 1000, 10000):  # a handful of lines in a flood
                log.warning("SIP TCP connection from %s closed: connection limit (%d so far)",
                            addr[0], self.tcp_refused)  # fmt: skip
            return False
        return True

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        addr: Address = (peer[0], peer[1])
        if not self._admit(addr):
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return
        await self._serve(reader, writer, addr, "TCP")

    def _tls_protocol(
        self,
        *,
        server_side: bool,
        key: Address | None = None,
        server_hostname: str | None = None,
    ) -> TlsConnection:
        """A TLS connection wired to this transport: in the connection table once its handshake
        is done (under the peer's address, or ``key``: the address an outbound one dialled),
        its bytes framed like TCP's (§18.3)."""
        framer = StreamFramer(max_message_size=MAX_TCP_MESSAGE)
        ctx = self._tls_server if server_side else self._tls_client
        assert ctx is not None

        def where(conn: TlsConnection) -> Address:
            return key or conn.peer

        def opened(conn: TlsConnection) -> bool:
            if server_side and not self._admit(conn.peer):
                return False
            if server_side:
                self._handshaking.add(conn)
            return True

        def ready(conn: TlsConnection) -> None:
            self._handshaking.discard(conn)
            addr = where(conn)
            self._conns[addr] = conn
            self._kinds[addr] = "TLS"
            for data in self._pending.pop(addr, []):
                conn.write(data)

        def received(conn: TlsConnection, data: bytes) -> None:
            for item in framer.feed(data):
                self.feed(item, where(conn), reliable=True)
            if framer.broken:
                conn.close()  # a framing error leaves no way to find the next message

        def failed(conn: TlsConnection, exc: BaseException) -> None:
            self._handshaking.discard(conn)
            addr = where(conn)
            self._tls_failed(addr, exc, "from" if server_side else "to")
            if not server_side:
                self._outbound_failed(addr)

        def closed(conn: TlsConnection) -> None:
            addr = where(conn)
            if self._conns.get(addr) is conn:
                del self._conns[addr]
                self._kinds.pop(addr, None)

        return TlsConnection(
            ctx, server_side=server_side, server_hostname=server_hostname, on_open=opened,
            on_ready=ready, on_data=received, on_failed=failed, on_closed=closed,
            handshake_timeout=HANDSHAKE_TIMEOUT_S,
        )  # fmt: skip

    def _tls_failed(self, addr: Address, exc: BaseException, direction: str) -> None:
        reason = failure_reason(exc)
        self.tls_failures[reason] = self.tls_failures.get(reason, 0) + 1
        n = sum(self.tls_failures.values())
        if n <= 20 or n in (100, 1000, 10000, 100000):  # a handful of lines in a flood
            log.warning("SIP TLS handshake %s %s:%d failed (%s): %s (%d failures so far)",
                        direction, addr[0], addr[1], reason, describe(exc), n)  # fmt: skip

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        addr: Address,
        kind: StreamKind,
    ) -> None:
        """Read SIP messages off one stream connection until it closes or breaks."""
        self._conns[addr] = writer
        self._kinds[addr] = kind
        framer = StreamFramer(max_message_size=MAX_TCP_MESSAGE)
        try:
            while data := await reader.read(65536):
                for item in framer.feed(data):
                    self.feed(item, addr, reliable=True)
                if framer.broken:
                    break  # a framing error leaves no way to find the next message
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # a TLS record that does not decrypt ends the connection like a reset
        finally:
            if self._conns.get(addr) is writer:
                del self._conns[addr]
                self._kinds.pop(addr, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # --- outbound TLS --------------------------------------------------------------------
    def connect_tls(self, addr: Address, server_hostname: str) -> None:
        """Open a TLS connection to ``addr`` unless one is open or opening; the peer's
        certificate must verify for ``server_hostname`` (RFC 5922 §7.2). Messages sent to
        ``addr`` meanwhile are queued; a failure reports a transport error for them."""
        if self._tls_client is None:
            raise RuntimeError("SIP over TLS is not configured (gateway.tls_listen)")
        if addr in self._pending or (addr in self._conns and self._kinds.get(addr) == "TLS"):
            return
        self._pending[addr] = []
        task = self._loop.create_task(self._tls_connect(addr, server_hostname))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tls_connect(self, addr: Address, server_hostname: str) -> None:
        """TCP to ``addr``; the handshake then runs in the connection (``_tls_protocol``)."""
        try:
            await asyncio.wait_for(
                self._loop.create_connection(
                    lambda: self._tls_protocol(server_side=False, key=addr,
                                               server_hostname=server_hostname),
                    addr[0], addr[1],
                ),
                HANDSHAKE_TIMEOUT_S,
            )  # fmt: skip
        except (OSError, TimeoutError) as exc:
            if addr in self._pending:
                self._tls_failed(addr, exc, "to")
                self._outbound_failed(addr)

    def _outbound_failed(self, addr: Address) -> None:
        """No TLS connection to ``addr``: what waited for it fails its transactions (§8.1.3.1)."""
        if self._pending.pop(addr, None) is not None:
            self.layer.transport_error(addr, self.now)
            self.service()

    # --- output --------------------------------------------------------------------------
    def via_transport(self, addr: Address) -> str:
        """The Via transport of a request sent to ``addr`` (§18.1.1: it names the transport the
        request actually goes over; requests reuse an open TCP or TLS connection with that
        peer, or the TLS connection being opened to it)."""
        if addr in self._pending:
            return "TLS"
        return self._kinds.get(addr, "UDP") if addr in self._conns else "UDP"

    def connection_open(self, addr: Address) -> bool:
        """A TCP/TLS connection with ``addr`` is open, or a TLS one is being opened."""
        writer = self._conns.get(addr)
        return addr in self._pending or (writer is not None and not writer.is_closing())

    def _reliable(self, addr: Address) -> bool:
        return addr in self._conns or addr in self._pending

    def send_request(self, request: Request, addr: Address) -> str:
        tid = self.layer.send_request(request, addr, self.now, reliable=self._reliable(addr))
        self.service()
        return tid

    def send_response(self, transaction_id: str, response: Response) -> None:
        try:
            self.layer.send_response(transaction_id, response, self.now)
        except Exception:
            log.exception("could not send %d on %s", response.status, transaction_id)
        self.service()

    def send_stateless(self, message: Request | Response, addr: Address) -> None:
        self.layer.send_stateless(message, addr, reliable=self._reliable(addr))
        self.service()

    def service(self) -> None:
        """Drain the layer's events (transmit or hand to the TU) and re-arm its timer."""
        while (event := self.layer.next_event()) is not None:
            if isinstance(event, Transmit):
                self._transmit(event)
                continue
            try:
                self.handler(event)
            except Exception:
                log.exception("SIP handler failed on %s", type(event).__name__)
        self._arm()

    def _transmit(self, t: Transmit) -> None:
        if t.reliable:
            queued = self._pending.get(t.addr)
            if queued is not None and t.addr not in self._conns:
                queued.append(t.data)  # an outbound TLS connection still handshaking
                return
            writer = self._conns.get(t.addr)
            if writer is None or writer.is_closing():
                self.layer.transport_error(t.addr, self.now)
                return
            writer.write(t.data)
        elif self._udp is not None:
            self._udp.sendto(t.data, t.addr)

    def _arm(self) -> None:
        due = self.layer.get_timer()
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, due
        if due is not None:
            self._timer = self._loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self.layer.handle_timer(self.now)
        self.service()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._udp is not None:
            self._udp.close()
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self._handshaking):
            conn.close()
        if self._tls is not None:
            self._tls.close()
        if self._tcp is not None:
            self._tcp.close()
            for w in list(self._conns.values()):
                w.close()
            with contextlib.suppress(Exception):
                await self._tcp.wait_closed()
        if self._tls is not None:
            with contextlib.suppress(Exception):
                await self._tls.wait_closed()


def local_ip_for(peer_ip: str) -> str:
    """The local address the OS routes towards ``peer_ip`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in peer_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer_ip, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1" if family == socket.AF_INET else "::1"
