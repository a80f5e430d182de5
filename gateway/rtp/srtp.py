"""SRTP protect/unprotect for one SIP leg (RFC 3711), over libsrtp through ``pylibsrtp``.

The keys come from SDES (:class:`gateway.sdp_crypto.SrtpParams`): ours protects what we send,
the peer's unprotects what arrives. The RTP path stays plain: the endpoint unprotects each
datagram before :meth:`RtpSession.receive` parses it and protects each packet the pacer built
before it goes on the socket; nothing here keeps time.

Inbound, rtcp-mux (RFC 5761 §4: RTCP told apart by its packet type) packets are SRTCP and
unprotected with ``unprotect_rtcp``, so the session counts them as before; anything that does
not authenticate, is a replay (libsrtp's 128-packet window, RFC 3711 §3.3.2) or cannot be
processed at all is dropped and counted, never raised. The gateway sends no RTCP.

AES_CM_128_HMAC_SHA1_32 protects RTP with a 32-bit tag and RTCP with an 80-bit one
(RFC 4568 §6.2.2); libsrtp's profile does both.
"""

from __future__ import annotations

from dataclasses import dataclass

import pylibsrtp

from gateway.rtp.packet import is_rtcp
from gateway.sdp_crypto import SrtpParams

_PROFILES: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
# pylibsrtp.Error messages (libsrtp's srtp_err_status_t) that mean a replayed packet.
_REPLAY = ("replay check failed (bad index)", "replay check failed (index too old)")
_AUTH = "authentication failure"


@dataclass(slots=True)
class SrtpStats:
    """Packets dropped on the way in, by cause (``media_stats`` exports the first two)."""

    auth_failures: int = 0  # SRTP or SRTCP that did not authenticate (wrong key, tampered)
    replays: int = 0  # a packet index seen before or older than the replay window
    errors: int = 0  # anything else libsrtp refused (too short, too long, garbage)
    protect_errors: int = 0  # outbound packets libsrtp could not protect (not sent)


def _session(key: bytes, suite: str, ssrc_type: int) -> pylibsrtp.Session:
    # SSRC_ANY_*: a template stream, so a peer that changes its SSRC (a re-INVITE, a PBX
    # switching the source) is still accepted under the same master key (RFC 3711 §3.2.3).
    policy = pylibsrtp.Policy(key=key, ssrc_type=ssrc_type, srtp_profile=_PROFILES[suite])
    return pylibsrtp.Session(policy)


class SrtpContext:
    """Both directions of one stream's SRTP."""

    def __init__(self, params: SrtpParams) -> None:
        if params.suite not in _PROFILES:
            raise ValueError(f"unsupported SRTP crypto-suite {params.suite!r}")
        self.params = params
        self.stats = SrtpStats()
        self._tx = _session(params.send_key, params.suite, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        self._rx = _session(params.recv_key, params.suite, pylibsrtp.Policy.SSRC_ANY_INBOUND)

    def rekey(self, params: SrtpParams) -> None:
        """A re-negotiation (re-INVITE): a direction whose key and suite are unchanged keeps
        its libsrtp state (rollover counter, replay window: RFC 3711 §3.3.1); a changed one
        starts afresh under the new key."""
        old = self.params
        if params.suite not in _PROFILES:
            raise ValueError(f"unsupported SRTP crypto-suite {params.suite!r}")
        if (params.send_key, params.suite) != (old.send_key, old.suite):
            self._tx = _session(params.send_key, params.suite, pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        if (params.recv_key, params.suite) != (old.recv_key, old.suite):
            self._rx = _session(params.recv_key, params.suite, pylibsrtp.Policy.SSRC_ANY_INBOUND)
        self.params = params

    def protect(self, packet: bytes) -> bytes | None:
        """The SRTP packet for an RTP packet we built; None (counted) if libsrtp refuses."""
        try:
            return self._tx.protect(packet)
        except (pylibsrtp.Error, ValueError, TypeError):
            self.stats.protect_errors += 1
            return None

    def unprotect(self, datagram: bytes) -> bytes | None:
        """The plain RTP (or RTCP) of an inbound datagram; None (counted) when it must be
        dropped."""
        try:
            if is_rtcp(datagram):
                return self._rx.unprotect_rtcp(datagram)
            return self._rx.unprotect(datagram)
        except pylibsrtp.Error as exc:
            reason = str(exc)
            if reason == _AUTH:
                self.stats.auth_failures += 1
            elif reason in _REPLAY:
                self.stats.replays += 1
            else:
                self.stats.errors += 1
        except (ValueError, TypeError):  # longer than libsrtp's buffer, and the like
            self.stats.errors += 1
        return None


def srtp_for(params: SrtpParams | None, current: SrtpContext | None) -> SrtpContext | None:
    """The leg's context after a (re-)negotiation: None for plain RTP, the current one rekeyed
    where it exists (its counters carry on), else a new one."""
    if params is None:
        return None
    if current is None:
        return SrtpContext(params)
    current.rekey(params)
    return current
