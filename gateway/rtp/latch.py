"""Symmetric RTP latching (RFC 4961 "symmetric RTP", the usual SBC "comedia" behaviour).

Phones behind NAT, and softphones such as baresip that advertise a different interface in
their SDP, receive RTP where they send it from.  So we send to the SDP address only until the
first valid packet arrives, then to that packet's source address.

The rule against hijacking (anyone can spray UDP at our port):

1. A packet is *valid* only if it parsed as RTP and its payload type is one we negotiated.
2. Before latching, the first valid packet latches (address and SSRC).
3. Once latched, packets from the latched address are accepted (a new SSRC from the same
   address is taken as a sender restart, RFC 3550 §8.2, and adopted).
4. A packet from another address is accepted and re-latched only if

   a. it carries the latched SSRC (NAT rebinding; an off-path attacker cannot know the random
      32-bit SSRC), or
   b. the latched source has been silent for ``relatch_after`` seconds and the candidate
      has sent ``probation`` packets with consecutive sequence numbers and one SSRC
      (RFC 3550 §A.1's MIN_SEQUENTIAL idea): the phone moved or restarted behind a new NAT
      binding.

   Anything else is dropped and counted in ``rejected``.
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.rtp.packet import RtpPacket

Addr = tuple[str, int]


class SymmetricLatch:
    def __init__(
        self,
        sdp_addr: Addr | None,
        payload_types: Collection[int],
        *,
        relatch_after: float = 1.0,
        probation: int = 2,
    ) -> None:
        self.sdp_addr = sdp_addr
        self.payload_types = frozenset(payload_types)
        self.relatch_after = relatch_after
        self.probation = probation
        self.latched: Addr | None = None
        self.ssrc: int | None = None
        self.last_valid = 0.0
        self.rejected = 0
        self.relatches = 0
        self._candidate: tuple[Addr, int, int, int] | None = None  # addr, ssrc, last seq, count

    @property
    def remote(self) -> Addr | None:
        """Where to send: the latched source, else the SDP address (None: unknown)."""
        return self.latched or self.sdp_addr

    def reset(self, sdp_addr: Addr | None, payload_types: Collection[int] | None = None) -> None:
        """A re-INVITE changed the remote SDP: forget the latch and start over."""
        self.sdp_addr = sdp_addr
        if payload_types is not None:
            self.payload_types = frozenset(payload_types)
        self.latched = None
        self.ssrc = None
        self._candidate = None

    def accept(self, pkt: RtpPacket, addr: Addr, now: float) -> bool:
        """Whether to process ``pkt`` from ``addr``; latches as a side effect."""
        if pkt.payload_type not in self.payload_types:
            self.rejected += 1
            return False
        if self.latched is None:
            self._latch(addr, pkt.ssrc, now)
            return True
        if addr == self.latched:
            self.ssrc = pkt.ssrc
            self.last_valid = now
            self._candidate = None
            return True
        if pkt.ssrc == self.ssrc:
            self._latch(addr, pkt.ssrc, now)
            self.relatches += 1
            return True
        if now - self.last_valid >= self.relatch_after:
            cand = self._candidate
            same = cand is not None and cand[0] == addr and cand[1] == pkt.ssrc
            in_seq = same and cand is not None and (pkt.sequence_number - cand[2]) & 0xFFFF == 1
            count = cand[3] + 1 if in_seq and cand is not None else 1
            if count >= self.probation:
                self._latch(addr, pkt.ssrc, now)
                self.relatches += 1
                return True
            self._candidate = (addr, pkt.ssrc, pkt.sequence_number, count)
        self.rejected += 1
        return False

    def _latch(self, addr: Addr, ssrc: int, now: float) -> None:
        self.latched = addr
        self.ssrc = ssrc
        self.last_valid = now
        self._candidate = None
