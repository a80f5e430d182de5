"""Minimal classic-pcap reader (stdlib ``struct``): UDP payloads of Ethernet/IPv4 frames."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SIPP_DIR = Path("/usr/share/sip-tester")  # Debian sip-tester's bundled pcaps


@dataclass(frozen=True)
class UdpRecord:
    time: float
    src: tuple[str, int]
    dst: tuple[str, int]
    payload: bytes


def read_udp(path: Path) -> list[UdpRecord]:
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data)[0]
    if magic == 0xA1B2C3D4:
        endian = "<"
    elif magic == 0xD4C3B2A1:
        endian = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file")
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    if linktype != 1:
        raise ValueError(f"{path}: link type {linktype} is not Ethernet")
    out: list[UdpRecord] = []
    pos = 24
    while pos + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack_from(endian + "IIII", data, pos)
        frame = data[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17:
            continue
        src_ip = ".".join(map(str, ip[12:16]))
        dst_ip = ".".join(map(str, ip[16:20]))
        sport, dport, length = struct.unpack_from("!HHH", ip, ihl)
        payload = ip[ihl + 8 : ihl + length]
        out.append(UdpRecord(sec + usec / 1e6, (src_ip, sport), (dst_ip, dport), bytes(payload)))
    return out
