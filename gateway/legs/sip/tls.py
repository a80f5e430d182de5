"""TLS for SIP (RFC 3261 §26.2, RFC 5922 §7): the contexts ``gateway.legs.sip.transport`` runs
its TLS connections with, the connection itself (:class:`TlsConnection`) and how a failed
handshake is named in logs and metrics.

:class:`TlsConnection` drives an ``ssl.SSLObject`` over memory BIOs on a plain TCP
transport, rather than ``loop.start_tls``: the handshake's outcome is ours to count and log
(asyncio's and uvloop's servers swallow handshake errors), and on uvloop bytes that arrive
before ``start_tls`` takes a server connection over go to the old protocol, losing the
ClientHello. The same code runs on both loops.

Standard library ``ssl`` only. TLS 1.2 is the minimum on both sides (RFC 7525 §3.1.1: 1.0 and
1.1 are not negotiated). The server presents ``gateway.tls_cert``/``tls_key``; with
``tls_verify_client`` it demands a client certificate that ``tls_ca_file`` verifies (mutual
TLS for a trunk, §26.3.2.2 "peer authentication"; no identity beyond the CA is checked). The
client verifies the server's certificate against ``tls_ca_file`` (or the system store) with
the host name of the URI it dials (RFC 5922 §7.2: the SIP domain against the
subjectAltName; an IP literal against an IP SAN), and presents the gateway's own certificate
when one is configured (trunks that require mutual TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import typing
from collections.abc import Callable

from voxgate.contract.config import ConfigError, GatewayConfig

MIN_VERSION = ssl.TLSVersion.TLSv1_2
# A peer that opens a connection and never finishes the handshake holds a connection slot
# (gateway.legs.sip.transport's per-source and total limits) at most this long.
HANDSHAKE_TIMEOUT_S = 10.0
# Labels of voxgate_sip_tls_failures_total, a small fixed set.
FAILURE_REASONS = (
    "plaintext", "certificate", "protocol", "timeout", "closed", "unreachable", "other",
)  # fmt: skip

_PLAINTEXT = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
              "PACKET_LENGTH_TOO_LONG", "RECORD_LENGTH_MISMATCH")  # fmt: skip
_PROTOCOL = ("UNSUPPORTED_PROTOCOL", "PROTOCOL_VERSION", "VERSION_TOO_LOW", "NO_SHARED_CIPHER",
             "NO_PROTOCOLS_AVAILABLE", "HANDSHAKE_FAILURE", "INAPPROPRIATE_FALLBACK")  # fmt: skip


def server_context(cfg: GatewayConfig) -> ssl.SSLContext:
    """The listener's context; raises ``ssl.SSLError``/``OSError`` for unusable files."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    if cfg.tls_verify_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cfg.tls_ca_file)
    return ctx


def client_context(cfg: GatewayConfig) -> ssl.SSLContext:
    """The context of outbound connections: the peer verified with its host name."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls_ca_file or None)
    ctx.minimum_version = MIN_VERSION
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    if cfg.tls_cert:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    return ctx


def failure_reason(exc: BaseException) -> str:
    """One of ``FAILURE_REASONS`` for a failed handshake (or connection attempt)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "certificate"
    if isinstance(exc, ssl.SSLError):
        code = (exc.reason or "").upper()
        if "CERTIFICATE" in code or "UNKNOWN_CA" in code or "CERT_" in code:
            return "certificate"  # ours or theirs refused: an alert from the peer says so
        if code in _PLAINTEXT:
            return "plaintext"
        if any(p in code for p in _PROTOCOL):
            return "protocol"
        if isinstance(exc, ssl.SSLEOFError) or "EOF" in code:
            return "closed"
        return "other"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "unreachable"  # nothing listens there (outbound)
    if isinstance(exc, ConnectionError | EOFError):
        return "closed"
    if isinstance(exc, OSError):
        return "unreachable"  # no route, no such host (outbound)
    return "other"


def describe(exc: BaseException) -> str:
    """A short log text for a handshake failure (the library's reason and verify message)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not accepted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def contexts(cfg: GatewayConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts; unusable certificate/key/CA files are a ``ConfigError``
    naming the key, so the gateway stops with one line at start."""
    try:
        return server_context(cfg), client_context(cfg)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"gateway.tls_cert/tls_key/tls_ca_file: cannot be used: {exc}") from None


class TlsConnection(asyncio.Protocol):
    """One SIP-over-TLS connection, either side: TLS records in and out of an ``SSLObject``
    over the TCP transport, application bytes to ``on_data``.

    ``on_open(conn)`` as the TCP connection opens (``peer`` known): False closes it at once,
    with no other callback (a connection limit). ``on_ready(conn)`` once the handshake is
    done (the peer verified as the context demands);
    ``on_failed(conn, exc)`` instead if it fails, times out (``HANDSHAKE_TIMEOUT_S``) or the
    peer goes away first; ``on_closed(conn)`` when an established connection ends. Nothing is
    raised into the event loop.
    """

    def __init__(
        self,
        ctx: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        on_open: Callable[[TlsConnection], bool] | None = None,
        on_ready: Callable[[TlsConnection], None],
        on_data: Callable[[TlsConnection, bytes], None],
        on_failed: Callable[[TlsConnection, BaseException], None],
        on_closed: Callable[[TlsConnection], None],
        handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                 server_hostname=server_hostname)  # fmt: skip
        self._on_open, self._on_ready, self._on_data = on_open, on_ready, on_data
        self._on_failed, self._on_closed = on_failed, on_closed
        self._timeout = handshake_timeout
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.established = False
        self.done = False  # failed or closed: no callback after that

    # --- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transports are not asyncio.Transport subclasses: duck-typed.
        self.transport = typing.cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = (str(peer[0]), int(peer[1]))
        if self._on_open is not None and not self._on_open(self):
            self.done = True
            self.transport.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)
        self._handshake()  # the client's ClientHello goes out now; a server waits

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        self._incoming.write(data)
        if not self.established:
            self._handshake()
        if self.established:
            self._read()

    def eof_received(self) -> bool | None:
        self._incoming.write_eof()
        if not self.established:
            self._fail(ConnectionResetError("the peer closed the connection in the handshake"))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.done:
            return
        if not self.established:
            self._fail(exc or ConnectionResetError("the connection closed in the handshake"))
            return
        self.done = True
        self._on_closed(self)

    # --- the writer side the SIP transport uses --------------------------------------------
    def write(self, data: bytes) -> None:
        if self.done or not self.established:
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError:
            self.close()
            return
        self._flush()

    def is_closing(self) -> bool:
        return self.done or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close with a TLS close_notify (RFC 8446 §6.1), then the TCP connection."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.established:
            # SSLWantReadError: our alert is out, the peer's need not be awaited.
            with contextlib.suppress(ssl.SSLError):
                self._ssl.unwrap()
            self._flush()
        self.transport.close()

    # --- inside ------------------------------------------------------------------------
    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, OSError, ValueError) as exc:
            self._flush()  # our alert to the peer, if any
            self._fail(exc)
            return
        self._flush()
        self.established = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._on_ready(self)

    def _read(self) -> None:
        while not self.done:
            try:
                data = self._ssl.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify from the peer
                self._flush()
                if self.transport is not None:
                    self.transport.close()
                break
            except ssl.SSLError:  # a record that does not decrypt: like a reset
                if self.transport is not None:
                    self.transport.abort()
                break
            if not data:
                break
            self._on_data(self, data)
        self._flush()  # TLS 1.3 key updates and the like

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _expired(self) -> None:
        self._timer = None
        if not self.established:
            self._fail(TimeoutError(f"no TLS handshake within {self._timeout:g} s"))

    def _fail(self, exc: BaseException) -> None:
        if self.done:
            return
        self.done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()  # after the flushed alert
        self._on_failed(self, exc)
