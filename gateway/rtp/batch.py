"""The media tick across calls, batched (sans-I/O): every due call's outbound packet built in
one step.

One wake-up of the shared ticker finds the calls of a phase due together (about a tenth of
all calls).  Per call, only what has to be per call stays in Python: the pacer's schedule
(:meth:`Pacer.due_tick`) and the pull of the call's agent frame (``Pacer.source``, the call's
``pull_audio``).  Then for all of them at once:

- the frames are copied into the rows of one preallocated int16 block, and
  :func:`dsp.g711.encode_frames` gathers the G.711 of the whole block straight into the
  payload columns of a preallocated block of RTP packets;
- whether each frame is audible (the pacer's utterance accounting) is one ``any`` over the
  rows;
- the 12-byte RTP headers (RFC 3550 §5.1: V=2, no padding/extension/CSRC; marker and PT;
  sequence number; timestamp; SSRC) are written as columns of a structured view of the same
  block, big-endian;
- each packet is then one ``bytes`` copy of its row, ready for the socket (and SRTP).

Nothing is allocated per frame but that ``bytes`` and the source's frame.  The block grows
(doubling) when more calls are due at once than it holds, and is reused by every wake-up.

A call whose tick is not a plain frame (DTMF playing or waiting, comfort noise, on hold,
audio queued by ``enqueue``, a source that returned something other than one frame of int16)
takes the one-call path (:meth:`Pacer.finish_tick`) inside the same batch: the bytes are the
same either way, which the tests check packet for packet against per-call ticking.

A call whose step raises is left out of this wake-up (its exception is kept in
:attr:`OutboundBatch.failures` for the adapter to log); the others are sent as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from dsp.g711 import encode_frames
from gateway.rtp.pacer import Pacer

Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]
HEADER_SIZE = 12


class _Block:
    """Preallocated rows for the frames of one (codec, frame size) group of a wake-up, and
    the RTP packets they become."""

    __slots__ = ("capacity", "frames", "header", "law", "packet_size", "packets", "payload", "spf")

    def __init__(self, law: str, spf: int, capacity: int) -> None:
        self.law = law
        self.spf = spf
        self.packet_size = HEADER_SIZE + spf
        self.capacity = capacity
        self.frames: Int16Array = np.zeros((capacity, spf), dtype=np.int16)
        self.packets: UInt8Array = np.zeros((capacity, self.packet_size), dtype=np.uint8)
        self.payload: UInt8Array = self.packets[:, HEADER_SIZE:]
        # RFC 3550 §5.1 fixed header, in network byte order, one record per packet row.
        header_type = np.dtype(
            {
                "names": ["b0", "b1", "seq", "ts", "ssrc"],
                "formats": ["u1", "u1", ">u2", ">u4", ">u4"],
                "offsets": [0, 1, 2, 4, 8],
                "itemsize": self.packet_size,
            }
        )
        self.header = self.packets.view(header_type).reshape(capacity)
        self.header["b0"] = 0x80  # version 2, no padding, no extension, no CSRC


class OutboundBatch:
    """Builds one wake-up's outbound packets for many pacers (see the module docstring).

    ``build(pacers, now)`` returns, per pacer, its packet (None: nothing to send: not due,
    on hold, a CN pause, or its step failed); :attr:`scheduled` holds each pacer's due time
    before the step (the adapter measures send-time error against it; None: not ticked) and
    :attr:`failures` the exceptions of the steps that failed, by index.
    """

    def __init__(self, capacity: int = 32) -> None:
        self._capacity = max(capacity, 1)
        self._blocks: dict[tuple[str, int], _Block] = {}
        self.scheduled: list[float | None] = []
        self.failures: list[tuple[int, Exception]] = []
        self.batched = 0  # frames encoded through a block, over all builds
        self.single = 0  # ticks that took the one-call path

    def _block(self, law: str, spf: int, need: int) -> _Block:
        key = (law, spf)
        block = self._blocks.get(key)
        if block is None or block.capacity < need:
            cap = max(self._capacity, block.capacity if block is not None else 0)
            while cap < need:
                cap *= 2
            block = self._blocks[key] = _Block(law, spf, cap)
        return block

    def build(
        self,
        pacers: Sequence[Pacer],
        now: float,
        live: Callable[[int], bool] | None = None,
    ) -> list[bytes | None]:
        """``live(i)``: whether pacer ``i`` is still to be ticked, asked just before its step
        (an earlier call's pull may have ended it: removed from the schedule, it is skipped
        as the one-call ticker skips it)."""
        out: list[bytes | None] = [None] * len(pacers)
        scheduled: list[float | None] = [None] * len(pacers)
        self.scheduled = scheduled
        self.failures = []
        # Per call: the schedule and the pull.  Plain frames are grouped by (law, spf).
        groups: dict[tuple[str, int], tuple[list[int], list[int], list[Int16Array]]] = {}
        for i, p in enumerate(pacers):
            if live is not None and not live(i):
                continue
            try:
                scheduled[i] = p.next_due
                if not p.batchable:
                    out[i] = p.tick(now)
                    self.single += 1
                    continue
                k = p.due_tick(now)
                if k is None:
                    continue
                spf = p.spf
                assert p.source is not None  # batchable
                pcm = p.source(spf, k * spf)
                if (
                    pcm.shape != (spf,)
                    or pcm.dtype != np.int16
                    or not p.batchable  # the pull queued DTMF or audio: one at a time
                ):
                    out[i] = p.finish_tick(k, pcm)
                    self.single += 1
                    continue
            except Exception as exc:  # isolated: handed to the adapter, the others go on
                self.failures.append((i, exc))
                continue
            g = groups.get((p.codec.law, spf))
            if g is None:
                g = groups[(p.codec.law, spf)] = ([], [], [])
            g[0].append(i)
            g[1].append(k)
            g[2].append(pcm)
        for (law, spf), (index, ticks, frames) in groups.items():
            self._encode(law, spf, index, ticks, frames, pacers, out)
        return out

    def _encode(
        self,
        law: str,
        spf: int,
        index: list[int],
        ticks: list[int],
        frames: list[Int16Array],
        pacers: Sequence[Pacer],
        out: list[bytes | None],
    ) -> None:
        n = len(index)
        block = self._block(law, spf, n)
        rows = block.frames
        for j, pcm in enumerate(frames):
            rows[j] = pcm
        rows = rows[:n]
        # All payloads in one gather, written into the packets' payload columns.
        encode_frames(law, rows, block.payload[:n])
        audible = cast(list[bool], rows.any(axis=1).tolist())
        b1s: list[int] = []
        seqs: list[int] = []
        tss: list[int] = []
        ssrcs: list[int] = []
        for j in range(n):
            p = pacers[index[j]]
            b1, seq, ts = p.commit_frame(ticks[j], audible[j])
            b1s.append(b1)
            seqs.append(seq)
            tss.append(ts)
            ssrcs.append(p.ssrc)
        header = block.header[:n]
        header["b1"] = b1s
        header["seq"] = seqs
        header["ts"] = tss
        header["ssrc"] = ssrcs
        self.batched += n
        packets = block.packets
        for j in range(n):
            out[index[j]] = packets[j].tobytes()
