"""RFC 4733 telephone-events (DTMF) in both directions, sans-I/O.

Receiving: one :class:`DtmfDigit` per key press however the packets arrive.

* The marker bit is not relied on (§2.5.1.3 sets it on the first packet, but that packet may
  be lost and some senders never set it): a new event is recognised by a new RTP timestamp,
  which is the event's start and is shared by all its packets (§2.3.1).
* The end packet is sent three times (§2.5.1.4); once a press is reported its timestamp is
  remembered and further packets for it are ignored, whatever their sequence numbers.
* An event whose first packets were lost is picked up from any later packet; one whose end
  packets were all lost is reported when the next event starts or, via :meth:`poll`, after
  ``timeout`` seconds without packets (§2.5.2.2 leaves the timeout to the receiver).
* Long events split into segments (§2.5.1.5: same event, a new timestamp where the previous
  segment's duration ended) are joined into one press.

Sending: :func:`dtmf_train` gives the payloads for one press: the first with the marker, all
with the same timestamp (the caller's), durations growing by one packet time, and the final
end-bit packet three times.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from gateway.rtp.packet import RtpPacket, ts_diff
from voxgate.contract.dtmf import DTMF_KEYS

DIGITS = DTMF_KEYS  # index = RFC 4733 event code
FLASH = "!"  # event 16 (hook flash), RFC 4733 §3.2
_EVENT = struct.Struct("!BBH")
MAX_DURATION = 0xFFFF  # §2.3.5: 16-bit duration in timestamp units


class TelephoneEventError(ValueError):
    pass


def event_code(digit: str) -> int:
    if digit == FLASH:
        return 16
    code = DIGITS.find(digit.upper()) if len(digit) == 1 else -1
    if code < 0:
        raise ValueError(f"not a DTMF digit: {digit!r}")
    return code


def event_digit(code: int) -> str | None:
    if 0 <= code < 16:
        return DIGITS[code]
    return FLASH if code == 16 else None


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """RFC 4733 §2.3 payload: event, E(nd) bit, volume (0..63, -dBm0), duration (ts units)."""

    event: int
    end: bool = False
    volume: int = 10
    duration: int = 0

    @classmethod
    def parse(cls, data: bytes) -> TelephoneEvent:
        if len(data) < 4:
            raise TelephoneEventError("telephone-event payload is shorter than 4 bytes")
        event, flags, duration = _EVENT.unpack_from(data)
        return cls(event, bool(flags & 0x80), flags & 0x3F, duration)

    def __bytes__(self) -> bytes:
        # The R bit (0x40) is reserved: sent as zero (§2.3.3).
        return _EVENT.pack(
            self.event, (0x80 if self.end else 0) | (self.volume & 0x3F), self.duration
        )


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    """One key press: the digit, its duration and the RTP timestamp it started at."""

    digit: str
    duration_ms: int
    start_ts: int


@dataclass(slots=True)
class _Current:
    start_ts: int  # first segment's timestamp (reported as start_ts)
    seg_ts: int  # timestamp of the segment being received
    event: int
    duration: int  # ts units, all segments
    seg_duration: int
    last_seen: float


class DtmfDecoder:
    """Feed it the telephone-event packets of one stream (``feed(pkt, now)``)."""

    def __init__(self, clock_rate: int = 8000, timeout: float = 0.5) -> None:
        self.clock_rate = clock_rate
        self.timeout = timeout
        self._current: _Current | None = None
        self._done: deque[int] = deque(maxlen=16)
        self.invalid = 0

    def feed(self, pkt: RtpPacket, now: float = 0.0) -> list[DtmfDigit]:
        try:
            ev = TelephoneEvent.parse(pkt.payload)
        except TelephoneEventError:
            self.invalid += 1
            return []
        if event_digit(ev.event) is None:
            return []  # a tone event (RFC 4734) or unknown code: not a key press
        ts = pkt.timestamp
        if ts in self._done:
            return []  # the end retransmissions (§2.5.1.4) or a late packet of a done press
        out: list[DtmfDigit] = []
        cur = self._current
        if cur is not None and ts != cur.seg_ts:
            if ev.event == cur.event and ts_diff(ts, cur.seg_ts) == cur.seg_duration:
                # §2.5.1.5 long-duration event: the next segment starts where this one ended.
                self._done.append(cur.seg_ts)
                cur.seg_ts, cur.seg_duration = ts, 0
            else:
                out += self._finish()  # its end packets were all lost
                cur = None
        if cur is None:
            cur = self._current = _Current(ts, ts, ev.event, 0, 0, now)
        cur.last_seen = now
        if ev.duration > cur.seg_duration:
            cur.duration += ev.duration - cur.seg_duration
            cur.seg_duration = ev.duration
        if ev.end:
            out += self._finish()
        return out

    def poll(self, now: float) -> list[DtmfDigit]:
        """Report a press whose end never arrived once ``timeout`` has passed."""
        cur = self._current
        if cur is not None and now - cur.last_seen >= self.timeout:
            return self._finish()
        return []

    def _finish(self) -> list[DtmfDigit]:
        cur = self._current
        self._current = None
        if cur is None:
            return []
        self._done.append(cur.seg_ts)
        digit = event_digit(cur.event)
        assert digit is not None
        return [DtmfDigit(digit, round(cur.duration * 1000 / self.clock_rate), cur.start_ts)]


def dtmf_train(
    digit: str,
    duration_ms: int = 160,
    *,
    ptime_ms: int = 20,
    clock_rate: int = 8000,
    volume: int = 10,
) -> list[tuple[bool, bytes]]:
    """``(marker, payload)`` for each packet of one press, one per packet time.

    §2.5.1.2: durations grow by one packet time from the start of the event; §2.5.1.3: the
    marker is set on the first packet only; §2.5.1.4: the final packet (E bit, full duration)
    is sent three times.  All share the event's start timestamp, which the caller sets.
    """
    code = event_code(digit)
    total = duration_ms * clock_rate // 1000
    step = ptime_ms * clock_rate // 1000
    if not 0 < total <= MAX_DURATION:
        raise ValueError(f"duration must be within 1-{MAX_DURATION * 1000 // clock_rate} ms")
    if not 0 <= volume <= 63:
        raise ValueError("volume must be within 0-63 (-dBm0)")
    out: list[tuple[bool, bytes]] = []
    d = step
    while d < total:
        out.append((not out, bytes(TelephoneEvent(code, False, volume, d))))
        d += step
    final = bytes(TelephoneEvent(code, True, volume, total))
    for _ in range(3):
        out.append((not out, final))
    return out
