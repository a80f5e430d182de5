"""One call's RTP media, sans-I/O: latch + jitter buffer + RFC 4733 decoder + pacer.

The asyncio adapter feeds datagrams to :meth:`RtpSession.receive` and calls
:meth:`RtpSession.tick` when the shared ticker says the call is due; the tick yields the
packet to send (to :attr:`RtpSession.remote`), the next inbound frame and any DTMF presses
whose end was never received.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.rtp.dtmf import DtmfDecoder, DtmfDigit
from gateway.rtp.jitter import Int16Array, JitterBuffer, JitterFrame
from gateway.rtp.latch import Addr, SymmetricLatch
from gateway.rtp.pacer import Pacer
from gateway.rtp.packet import RtpError, RtpPacket, is_rtcp
from gateway.sdp import MediaParams


@dataclass(frozen=True, slots=True)
class JitterConfig:
    target_ms: int = 60
    min_ms: int = 40
    max_ms: int = 200
    adaptive: bool = True
    plc_ms: int = 60


@dataclass(frozen=True, slots=True)
class TickResult:
    packet: bytes | None
    frame: JitterFrame
    digits: list[DtmfDigit] = field(default_factory=list)


def _payload_types(params: MediaParams) -> tuple[dict[int, str], set[int], set[int]]:
    """(audio PT → codec, telephone-event PTs, every PT we accept).

    We accept both the remote's and our own PT numbers: RFC 3264 §5.1 says the peer sends
    with ours, but plenty of phones send with theirs; for G.711 they are the same anyway.
    """
    audio = {params.payload_type: params.codec}
    if params.recv_payload_type is not None:
        audio[params.recv_payload_type] = params.codec
    events = {pt for pt in (params.dtmf_pt, params.recv_dtmf_pt) if pt is not None}
    accepted = set(audio) | events
    if params.cn_pt is not None:
        accepted.add(params.cn_pt)
    return audio, events, accepted


class RtpSession:
    def __init__(
        self,
        params: MediaParams,
        *,
        jitter: JitterConfig | None = None,
        ssrc: int | None = None,
        cn: bool = False,
    ) -> None:
        self.params = params
        self.jitter_config = jitter or JitterConfig()
        audio, self._event_pts, accepted = _payload_types(params)
        jc = self.jitter_config
        self.jitter = JitterBuffer(
            audio,
            clock_rate=params.clock_rate,
            frame_ms=params.ptime_ms,
            target_ms=jc.target_ms,
            min_ms=jc.min_ms,
            max_ms=jc.max_ms,
            adaptive=jc.adaptive,
            plc_ms=jc.plc_ms,
        )
        self.dtmf = DtmfDecoder(params.clock_rate)
        self.latch = SymmetricLatch(self._sdp_addr(params), accepted)
        self.pacer = Pacer(
            params.codec,
            params.payload_type,
            ptime_ms=params.ptime_ms,
            clock_rate=params.clock_rate,
            ssrc=ssrc,
            dtmf_pt=params.dtmf_pt,
            cn_pt=params.cn_pt if cn else None,
        )
        self.pacer.sending = params.sends
        self.invalid = 0
        self.rtcp = 0
        self.arrived: tuple[int, Int16Array] | None = None

    @staticmethod
    def _sdp_addr(params: MediaParams) -> Addr | None:
        if params.remote_port == 0 or params.remote_addr in ("0.0.0.0", "::"):
            return None  # RFC 3264 §8.4 hold: nowhere to send
        return (params.remote_addr, params.remote_port)

    def update(self, params: MediaParams) -> None:
        """Apply a re-negotiation (re-INVITE).  The outbound stream keeps its SSRC, sequence
        and timestamp (RFC 3550 §5.1: they continue); the latch restarts when the remote
        address changed."""
        old = self.params
        if params.codec != old.codec or params.ptime_ms != old.ptime_ms:
            raise ValueError("changing codec or ptime mid-call needs a new RtpSession")
        self.params = params
        audio, self._event_pts, accepted = _payload_types(params)
        self.jitter.set_payload_types(audio)
        if (params.remote_addr, params.remote_port) != (old.remote_addr, old.remote_port):
            self.latch.reset(self._sdp_addr(params), accepted)
        else:
            self.latch.payload_types = frozenset(accepted)
        self.pacer.sending = params.sends
        self.pacer.payload_type = params.payload_type
        self.pacer.dtmf_pt = params.dtmf_pt

    @property
    def remote(self) -> Addr | None:
        return self.latch.remote if self.params.sends else None

    # -- inbound ---------------------------------------------------------------------------
    def receive(self, data: bytes, addr: Addr, now: float) -> list[DtmfDigit]:
        """One datagram from ``addr`` at ``now``; returns completed key presses.

        ``arrived`` then holds the datagram's audio as (extended RTP timestamp, PCM), in
        arrival order and before any playout delay, for consumers that must not wait for the
        jitter buffer (the barge-in detector); None for anything without new audio."""
        self.arrived = None
        if is_rtcp(data):
            self.rtcp += 1  # rtcp-mux (RFC 5761): not interpreted
            return []
        try:
            pkt = RtpPacket.parse(data)
        except RtpError:
            self.invalid += 1
            return []
        if not self.latch.accept(pkt, addr, now):
            return []
        if not self.params.receives:
            return []
        self.jitter.push(pkt, now)
        self.arrived = self.jitter.decoded
        if pkt.payload_type in self._event_pts:
            return self.dtmf.feed(pkt, now)
        return []

    # -- the tick --------------------------------------------------------------------------
    @property
    def next_due(self) -> float:
        return self.pacer.next_due

    def start(self, at: float) -> None:
        self.pacer.start(at)

    def tick(self, now: float) -> TickResult:
        packet = self.pacer.tick(now)
        frame = self.jitter.pull()
        return TickResult(packet, frame, self.dtmf.poll(now))

    def media_stats(self) -> dict[str, float]:
        """The few counters ``/metrics`` aggregates over calls (see ``gateway.metrics``)."""
        j = self.jitter.stats()
        out = {
            "packets_received": float(j.received),
            "packets_lost": float(max(j.lost, 0)),  # RFC 3550 loss goes negative on duplicates
            "late_sends": float(self.pacer.late_sends),
        }
        if self.jitter.playing:  # a resting buffer delays nothing (JitterBuffer.set_playing)
            out["jitter_buffer_ms"] = float(j.depth_ms)
        return out

    def stats(self) -> dict[str, Any]:
        j = self.jitter.stats()
        p = self.pacer.stats()
        return {
            "inbound": asdict(j),
            "outbound": asdict(p),
            "latch": {
                "remote": self.latch.remote,
                "latched": self.latch.latched is not None,
                "rejected": self.latch.rejected,
                "relatches": self.latch.relatches,
            },
            "invalid": self.invalid,
            "rtcp": self.rtcp,
        }
