"""RTP media for SIP calls (RFC 3550, RFC 3551 G.711, RFC 4733 events, RFC 3389 CN).

Sans-I/O cores (packet, jitter, dtmf, latch, pacer, session) with thin asyncio adapters
(endpoint).  Media time is an integer sample count; outbound packets are paced against an
absolute schedule by one shared ticker.
"""

from gateway.rtp.codecs import CODECS, Codec, get_codec
from gateway.rtp.dtmf import DtmfDecoder, DtmfDigit, TelephoneEvent, dtmf_train
from gateway.rtp.endpoint import MediaTicker, RtpEndpoint
from gateway.rtp.jitter import JitterBuffer, JitterFrame, JitterStats
from gateway.rtp.latch import SymmetricLatch
from gateway.rtp.pacer import Pacer, PacerStats, SendTimeStats, Ticker
from gateway.rtp.packet import RtpError, RtpPacket, pack_rtp, seq_diff, ts_diff
from gateway.rtp.session import JitterConfig, RtpSession, TickResult

__all__ = [
    "CODECS",
    "Codec",
    "DtmfDecoder",
    "DtmfDigit",
    "JitterBuffer",
    "JitterConfig",
    "JitterFrame",
    "JitterStats",
    "MediaTicker",
    "Pacer",
    "PacerStats",
    "RtpEndpoint",
    "RtpError",
    "RtpPacket",
    "RtpSession",
    "SendTimeStats",
    "SymmetricLatch",
    "TelephoneEvent",
    "TickResult",
    "Ticker",
    "dtmf_train",
    "get_codec",
    "pack_rtp",
    "seq_diff",
    "ts_diff",
]
