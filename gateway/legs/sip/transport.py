"""Thin asyncio adapters around the sans-I/O SIP transaction layer: UDP and TCP on one address.

Like aioquic's ``asyncio/protocol.py``: bytes in → ``layer.receive(..., now)``; drain events;
``Transmit`` → socket; everything else → the transaction user (``handler``); re-arm the one
timer from ``layer.get_timer()``. Time is ``loop.time()`` (monotonic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

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
        self._conns: dict[Address, asyncio.StreamWriter] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.host = ""
        self.port = 0
        self.max_tcp_connections = MAX_TCP_CONNECTIONS
        self.max_tcp_per_source = MAX_TCP_PER_SOURCE
        self.tcp_refused = 0

    async def listen(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._udp, _ = await self._loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(host, port), family=family
        )
        bound = self._udp.get_extra_info("sockname")
        self.host, self.port = host, bound[1]
        # TCP on the same port (RFC 3261 §18: a UA must implement both).
        self._tcp = await asyncio.start_server(self._tcp_client, host, self.port, family=family)

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

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        addr: Address = (peer[0], peer[1])
        if len(self._conns) >= self.max_tcp_connections or (
            sum(1 for a in self._conns if a[0] == addr[0]) >= self.max_tcp_per_source
        ):
            self.tcp_refused += 1
            if self.tcp_refused in (1, 10, 100, 1000, 10000):  # a handful of lines in a flood
                log.warning("SIP TCP connection from %s closed: connection limit (%d so far)",
                            addr[0], self.tcp_refused)  # fmt: skip
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return
        self._conns[addr] = writer
        framer = StreamFramer(max_message_size=MAX_TCP_MESSAGE)
        try:
            while data := await reader.read(65536):
                for item in framer.feed(data):
                    self.feed(item, addr, reliable=True)
                if framer.broken:
                    break  # a framing error leaves no way to find the next message
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.pop(addr, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # --- output --------------------------------------------------------------------------
    def via_transport(self, addr: Address) -> str:
        """The Via transport of a request sent to ``addr`` (§18.1.1: it names the transport the
        request actually goes over; requests reuse an open TCP connection from that peer)."""
        return "TCP" if addr in self._conns else "UDP"

    def send_request(self, request: Request, addr: Address) -> str:
        tid = self.layer.send_request(request, addr, self.now, reliable=addr in self._conns)
        self.service()
        return tid

    def send_response(self, transaction_id: str, response: Response) -> None:
        try:
            self.layer.send_response(transaction_id, response, self.now)
        except Exception:
            log.exception("could not send %d on %s", response.status, transaction_id)
        self.service()

    def send_stateless(self, message: Request | Response, addr: Address) -> None:
        self.layer.send_stateless(message, addr, reliable=addr in self._conns)
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
        if self._tcp is not None:
            self._tcp.close()
            for w in list(self._conns.values()):
                w.close()
            with contextlib.suppress(Exception):
                await self._tcp.wait_closed()


def local_ip_for(peer_ip: str) -> str:
    """The local address the OS routes towards ``peer_ip`` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in peer_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer_ip, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1" if family == socket.AF_INET else "::1"
