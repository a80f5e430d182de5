"""Control-API access rules that need no HTTP library: bind safety, bearer tokens, loopback names.

Kept apart from ``gateway.api.routes`` so configuration checks (``check_bind_safety``) can run
before aiohttp is imported, e.g. while validating the config at start-up.
"""

from __future__ import annotations

import hmac
import ipaddress

TOKEN_SETTING = "gateway.api_token"
TOKEN_ENV = "VOXGATE_GATEWAY_API_TOKEN"


class UnsafeBindError(ValueError):
    """The control API would listen on a non-loopback address with no token configured."""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (bracketed or not, IPv4-mapped included).

    Any other hostname counts as non-loopback: what it resolves to is not ours to trust, and
    wildcard binds (``0.0.0.0``, ``::``, empty) listen on every interface.
    """
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = name.rstrip(".").lower()  # "localhost." is the same name, fully qualified
    if name == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(name.split("%", 1)[0])  # drop an IPv6 zone id ("::1%lo")
    except ValueError:
        return False
    # Python 3.11 says ::ffff:127.0.0.1 is not loopback; it is the IPv4 loopback seen over v6.
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def check_bind_safety(host: str, token: str | None) -> None:
    """Refuse a non-loopback listen address when no API token is set.

    The control API can place calls (toll fraud) and speak into live ones, so the gateway refuses
    to start on a public address without a token. Raises ``UnsafeBindError`` (a ``ValueError``).
    """
    if token or is_loopback_host(host):
        return
    shown = host if host else "<all interfaces>"
    raise UnsafeBindError(
        f"refusing to serve the control API on {shown}: it is not a loopback address and no "
        f"API token is set; the gateway refuses to start on a public address without one. "
        f"Set {TOKEN_SETTING} (environment: {TOKEN_ENV}) or listen on 127.0.0.1"
    )


def token_matches(presented: str, expected: str) -> bool:
    """Constant-time comparison, so response timing does not leak how much of a guess was right."""
    # compare_digest on str only accepts ASCII, so compare bytes. A header with bytes that are
    # not UTF-8 arrives with surrogate escapes; those must be a mismatch, not a crash.
    try:
        presented_bytes = presented.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        presented_bytes = b""
    return hmac.compare_digest(presented_bytes, expected.encode("utf-8"))


def bearer_token(authorization: str | None) -> str | None:
    """The token from an ``Authorization: Bearer <token>`` header value, else None.

    The scheme is case-insensitive (RFC 7235); anything that is not a bearer credential is None.
    """
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    credentials = credentials.strip()
    return credentials or None
