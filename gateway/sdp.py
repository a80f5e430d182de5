"""SDP (RFC 8866, formerly RFC 4566) parse/serialize and the RFC 3264 offer/answer model.

Scope: what a G.711 telephony leg needs.  One audio stream (RTP/AVP or RTP/AVPF), PCMU/PCMA,
RFC 4733 telephone-event, RFC 3389 comfort noise, ptime/maxptime, direction attributes and
both hold styles (RFC 3264 §8.4 ``a=sendonly``/``a=inactive``, RFC 2543 ``c=IN IP4 0.0.0.0``).
SRTP keys by SDES (RFC 4568 ``a=crypto``, RTP/SAVP) per ``gateway.srtp``: the attribute
grammar and the choice live in :mod:`gateway.sdp_crypto`; ``answer``/``make_offer`` take the
mode and ``negotiated`` pairs both sides' keys into ``MediaParams.srtp``.

Errors carry the SIP status the signalling layer should answer with:

* :class:`SdpError` (400): the body is not syntactically valid SDP.
* :class:`SdpNegotiationError` (488 Not Acceptable Here): valid SDP we cannot accept (no audio
  stream, no common codec).

Both derive from :class:`SdpProblem`, so a SIP layer can ``except SdpProblem as e`` and use
``e.status_code``.

The model keeps attributes as an ordered list of ``(name, value)`` pairs exactly as parsed, so
``SessionDescription.parse(str(sdp)) == sdp`` and canonical input round-trips byte for byte;
rtpmap/fmtp/ptime/direction are derived views over that list.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gateway import sdp_crypto
from gateway.sdp_crypto import SAVP_PROTOS, SrtpMode, SrtpParams, redact_keys

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")

# RFC 3264 §6.1: the answer's direction mirrors the offer's.
_ANSWER_DIRECTION: dict[Direction, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}

# RFC 3551 §6 static payload types we speak; names are case-insensitive (RFC 4855 §3).
STATIC_PT: dict[str, int] = {"PCMU": 0, "PCMA": 8, "CN": 13}
_STATIC_NAME: dict[int, tuple[str, int]] = {0: ("PCMU", 8000), 8: ("PCMA", 8000), 13: ("CN", 8000)}
SUPPORTED_CODECS: tuple[str, ...] = ("PCMU", "PCMA")
TELEPHONE_EVENT = "telephone-event"
# RFC 4733 §2.4.1 / §7.1.1: without fmtp the receiver assumes events 0-15.
DEFAULT_EVENTS = "0-15"
# Packetisation we are willing to send and receive (ms); 20 ms is the RFC 3551 §4.5 default.
ALLOWED_PTIME: tuple[int, ...] = (10, 20, 30, 40)
DEFAULT_PTIME = 20
_RTP_PROTOS = ("RTP/AVP", "RTP/AVPF")
# Order of session-level lines, RFC 8866 §5.
_SESSION_ORDER = "vosiuepcbtrzka"
_MEDIA_ORDER = "micbka"


class SdpProblem(Exception):
    """Base of the SDP errors; ``status_code`` is the SIP response to send."""

    status_code = 400

    def __init__(self, message: str = "") -> None:
        # Messages quote SDP lines; an SDES key (a=crypto inline:...) must never reach a log
        # line or a response's reason phrase.
        super().__init__(redact_keys(message))


class SdpError(SdpProblem, ValueError):
    """Malformed SDP (SIP 400 Bad Request)."""

    status_code = 400


class SdpNegotiationError(SdpProblem):
    """Well-formed SDP that cannot be accepted (SIP 488 Not Acceptable Here)."""

    status_code = 488


# --------------------------------------------------------------------------------------------
# Wire types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Origin:
    """``o=<username> <sess-id> <sess-version> <nettype> <addrtype> <unicast-address>``."""

    username: str
    session_id: str
    session_version: int
    nettype: str
    addrtype: str
    address: str

    def __str__(self) -> str:
        return (
            f"{self.username} {self.session_id} {self.session_version} "
            f"{self.nettype} {self.addrtype} {self.address}"
        )


@dataclass(frozen=True, slots=True)
class Connection:
    """``c=<nettype> <addrtype> <connection-address>`` (address may carry ``/ttl[/n]``)."""

    nettype: str
    addrtype: str
    address: str

    @property
    def host(self) -> str:
        """The address without a multicast TTL / count suffix (IPv4 ``/ttl``, RFC 8866 §5.7)."""
        return self.address.split("/", 1)[0]

    @property
    def is_hold(self) -> bool:
        """RFC 2543 style hold (RFC 3264 §8.4): the connection address is all zeros."""
        host = self.host
        return host in ("0.0.0.0", "::")

    def __str__(self) -> str:
        return f"{self.nettype} {self.addrtype} {self.address}"


@dataclass(frozen=True, slots=True)
class RtpMap:
    """``a=rtpmap:<pt> <encoding>/<clock>[/<channels>]``."""

    payload_type: int
    encoding: str
    clock_rate: int
    channels: int | None = None

    def __str__(self) -> str:
        tail = f"/{self.channels}" if self.channels is not None else ""
        return f"{self.payload_type} {self.encoding}/{self.clock_rate}{tail}"


Attribute = tuple[str, str | None]


@dataclass(slots=True)
class MediaDescription:
    """One ``m=`` section.  ``formats`` are kept as strings (RFC 8866 §5.14 ``<fmt>``)."""

    media: str
    port: int
    proto: str
    formats: list[str]
    port_count: int | None = None
    information: str | None = None
    connections: list[Connection] = field(default_factory=list)
    bandwidths: list[str] = field(default_factory=list)
    key: str | None = None
    attributes: list[Attribute] = field(default_factory=list)

    # -- derived views -------------------------------------------------------------------
    def attribute(self, name: str) -> str | None:
        """Value of the first ``a=name:value`` (``""`` for a flag), or None when absent."""
        for key, value in self.attributes:
            if key == name:
                return "" if value is None else value
        return None

    def attribute_values(self, name: str) -> list[str]:
        return [v for k, v in self.attributes if k == name and v is not None]

    @property
    def connection(self) -> Connection | None:
        return self.connections[0] if self.connections else None

    @property
    def rtpmaps(self) -> dict[int, RtpMap]:
        """rtpmap per payload type, with RFC 3551 defaults for static PTs lacking one."""
        maps: dict[int, RtpMap] = {}
        for value in self.attribute_values("rtpmap"):
            rm = parse_rtpmap(value)
            maps.setdefault(rm.payload_type, rm)
        for fmt in self.formats:
            if fmt.isdigit() and int(fmt) in _STATIC_NAME and int(fmt) not in maps:
                name, rate = _STATIC_NAME[int(fmt)]
                maps[int(fmt)] = RtpMap(int(fmt), name, rate)
        return maps

    @property
    def fmtp(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for value in self.attribute_values("fmtp"):
            pt, _, params = value.partition(" ")
            if pt.isdigit():
                out.setdefault(int(pt), params.strip())
        return out

    @property
    def ptime(self) -> int | None:
        return _ms_attr(self.attribute("ptime"), "ptime")

    @property
    def maxptime(self) -> int | None:
        return _ms_attr(self.attribute("maxptime"), "maxptime")

    @property
    def direction(self) -> Direction | None:
        """The media-level direction attribute, or None (then the session level applies)."""
        return _direction_of(self.attributes)

    def payload_types(self) -> list[int]:
        return [int(f) for f in self.formats if f.isdigit()]

    def lines(self) -> list[str]:
        port = f"{self.port}/{self.port_count}" if self.port_count is not None else str(self.port)
        out = [f"m={self.media} {port} {self.proto} {' '.join(self.formats)}"]
        if self.information is not None:
            out.append(f"i={self.information}")
        out += [f"c={c}" for c in self.connections]
        out += [f"b={b}" for b in self.bandwidths]
        if self.key is not None:
            out.append(f"k={self.key}")
        out += [_attr_line(a) for a in self.attributes]
        return out


@dataclass(slots=True)
class SessionDescription:
    """A parsed session description; ``str()`` serializes it with CRLF line ends."""

    origin: Origin
    name: str = "-"
    version: int = 0
    information: str | None = None
    uri: str | None = None
    emails: list[str] = field(default_factory=list)
    phones: list[str] = field(default_factory=list)
    connection: Connection | None = None
    bandwidths: list[str] = field(default_factory=list)
    # t= lines, each with the r= lines that follow it.
    times: list[tuple[str, list[str]]] = field(default_factory=lambda: [("0 0", [])])
    zone: str | None = None
    key: str | None = None
    attributes: list[Attribute] = field(default_factory=list)
    media: list[MediaDescription] = field(default_factory=list)

    @classmethod
    def parse(cls, data: str | bytes) -> SessionDescription:
        return parse(data)

    @property
    def direction(self) -> Direction | None:
        """Session-level direction attribute (RFC 8866 §6.7), or None."""
        return _direction_of(self.attributes)

    def media_connection(self, m: MediaDescription) -> Connection | None:
        """RFC 8866 §5.7: a media-level ``c=`` overrides the session-level one."""
        return m.connection or self.connection

    def media_direction(self, m: MediaDescription) -> Direction:
        """Media-level direction, else session-level, else ``sendrecv`` (RFC 3264 §5.1)."""
        return m.direction or self.direction or "sendrecv"

    def lines(self) -> list[str]:
        out = [f"v={self.version}", f"o={self.origin}", f"s={self.name}"]
        if self.information is not None:
            out.append(f"i={self.information}")
        if self.uri is not None:
            out.append(f"u={self.uri}")
        out += [f"e={e}" for e in self.emails]
        out += [f"p={p}" for p in self.phones]
        if self.connection is not None:
            out.append(f"c={self.connection}")
        out += [f"b={b}" for b in self.bandwidths]
        for t, repeats in self.times:
            out.append(f"t={t}")
            out += [f"r={r}" for r in repeats]
        if self.zone is not None:
            out.append(f"z={self.zone}")
        if self.key is not None:
            out.append(f"k={self.key}")
        out += [_attr_line(a) for a in self.attributes]
        for m in self.media:
            out += m.lines()
        return out

    def __str__(self) -> str:
        return "".join(line + "\r\n" for line in self.lines())

    def __bytes__(self) -> bytes:
        return str(self).encode("utf-8")


def _attr_line(attr: Attribute) -> str:
    name, value = attr
    return f"a={name}" if value is None else f"a={name}:{value}"


def _direction_of(attributes: Iterable[Attribute]) -> Direction | None:
    for name, value in attributes:
        if value is None and name in DIRECTIONS:
            return name  # type: ignore[return-value]  # narrowed by the membership test
    return None


def _ms_attr(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        ms = float(value.strip())
    except ValueError:
        raise SdpError(f"invalid a={name} value: {value!r}") from None
    if not 0 < ms <= 1000:
        raise SdpError(f"invalid a={name} value: {value!r}")
    return round(ms)


def parse_rtpmap(value: str) -> RtpMap:
    """Parse the value of ``a=rtpmap:`` (RFC 8866 §6.6)."""
    pt_s, _, spec = value.strip().partition(" ")
    parts = spec.strip().split("/")
    if not pt_s.isdigit() or int(pt_s) > 127 or len(parts) not in (2, 3) or not parts[0]:
        raise SdpError(f"invalid a=rtpmap value: {value!r}")
    try:
        clock = int(parts[1])
        channels = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise SdpError(f"invalid a=rtpmap value: {value!r}") from None
    if clock <= 0:
        raise SdpError(f"invalid a=rtpmap value: {value!r}")
    return RtpMap(int(pt_s), parts[0], clock, channels)


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------


def _parse_connection(value: str) -> Connection:
    parts = value.split()
    if len(parts) != 3:
        raise SdpError(f"invalid c= line: {value!r}")
    nettype, addrtype, address = parts
    if nettype != "IN" or addrtype not in ("IP4", "IP6"):
        raise SdpError(f"invalid c= line: {value!r}")
    host = address.split("/", 1)[0]
    _check_address(addrtype, host, f"invalid c= line: {value!r}")
    return Connection(nettype, addrtype, address)


def _check_address(addrtype: str, host: str, message: str) -> None:
    """Literal addresses must match their type; RFC 8866 also allows FQDNs, which pass."""
    looks_literal = ":" in host or host.replace(".", "").isdigit()
    if not host or not looks_literal:
        if not host or any(ch.isspace() for ch in host):
            raise SdpError(message)
        return
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise SdpError(message) from None
    if (ip.version == 4) != (addrtype == "IP4"):
        raise SdpError(message)


def _parse_origin(value: str) -> Origin:
    parts = value.split()
    if len(parts) != 6 or not parts[2].isdigit():
        raise SdpError(f"invalid o= line: {value!r}")
    username, sess_id, version, nettype, addrtype, address = parts
    if nettype != "IN" or addrtype not in ("IP4", "IP6"):
        raise SdpError(f"invalid o= line: {value!r}")
    return Origin(username, sess_id, int(version), nettype, addrtype, address)


def _parse_media(value: str) -> MediaDescription:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"invalid m= line: {value!r}")
    media, port_s, proto, *formats = parts
    port_s, slash, count_s = port_s.partition("/")
    if not port_s.isdigit() or int(port_s) > 65535 or (slash and not count_s.isdigit()):
        raise SdpError(f"invalid m= line: {value!r}")
    return MediaDescription(
        media=media,
        port=int(port_s),
        proto=proto,
        formats=formats,
        port_count=int(count_s) if slash else None,
    )


def _parse_attribute(value: str) -> Attribute:
    name, colon, rest = value.partition(":")
    if not name or any(ch.isspace() for ch in name):
        raise SdpError(f"invalid a= line: {value!r}")
    return (name, rest if colon else None)


def parse(data: str | bytes) -> SessionDescription:
    """Parse an SDP body.  Raises :class:`SdpError` (400) with a message naming the line.

    Accepts LF as well as CRLF line ends (RFC 8866 §5 asks parsers to be tolerant) and skips
    blank lines and type letters it does not know; everything else is strict.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SdpError("SDP is not valid UTF-8") from None
    else:
        text = data
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        raise SdpError("empty SDP")
    if not lines[0].startswith("v="):
        raise SdpError("SDP must start with a v= line")

    version: int | None = None
    origin: Origin | None = None
    name: str | None = None
    sess = SessionDescription(origin=Origin("-", "0", 0, "IN", "IP4", "0.0.0.0"), times=[])
    current: MediaDescription | None = None

    for number, line in enumerate(lines, start=1):
        if len(line) < 2 or line[1] != "=" or not line[0].isalpha():
            raise SdpError(f"invalid SDP line {number}: {line!r}")
        kind, value = line[0], line[2:]
        if kind == "m":
            current = _parse_media(value)
            sess.media.append(current)
            continue
        if current is not None:
            if kind not in _MEDIA_ORDER:
                if kind in _SESSION_ORDER:
                    raise SdpError(f"{kind}= line not allowed in a media section: {line!r}")
                continue  # unknown type letter: ignored
            _media_line(current, kind, value)
            continue
        if kind not in _SESSION_ORDER:
            continue  # unknown type letter at session level: ignored
        # RFC 8866 §5 fixes the order of session-level lines, but deployed phones get it
        # wrong (c= after t=, b= after c= of another kind) and nothing here depends on it:
        # out-of-order lines are accepted (robustness principle); duplicates are not.
        if kind == "v":
            if value.strip() != "0":
                raise SdpError(f"unsupported SDP version: {value!r}")
            if version is not None:
                raise SdpError("duplicate v= line")
            version = 0
        elif kind == "o":
            if origin is not None:
                raise SdpError("duplicate o= line")
            origin = _parse_origin(value)
        elif kind == "s":
            if name is not None:
                raise SdpError("duplicate s= line")
            name = value
        elif kind == "i":
            sess.information = value
        elif kind == "u":
            sess.uri = value
        elif kind == "e":
            sess.emails.append(value)
        elif kind == "p":
            sess.phones.append(value)
        elif kind == "c":
            if sess.connection is not None:
                raise SdpError("duplicate session-level c= line")
            sess.connection = _parse_connection(value)
        elif kind == "b":
            sess.bandwidths.append(value)
        elif kind == "t":
            t = value.split()
            if len(t) != 2 or not all(x.isdigit() for x in t):
                raise SdpError(f"invalid t= line: {value!r}")
            sess.times.append((value, []))
        elif kind == "r":
            if not sess.times:
                raise SdpError("r= line without t= line")
            sess.times[-1][1].append(value)
        elif kind == "z":
            sess.zone = value
        elif kind == "k":
            sess.key = value
        elif kind == "a":
            sess.attributes.append(_parse_attribute(value))

    if origin is None:
        raise SdpError("missing o= line")
    if name is None:
        raise SdpError("missing s= line")
    if not sess.times:
        raise SdpError("missing t= line")
    sess.origin = origin
    sess.name = name
    _validate_attributes(sess.attributes)
    for m in sess.media:
        _validate_attributes(m.attributes)
        if m.proto in _RTP_PROTOS or m.proto in SAVP_PROTOS:
            m.rtpmaps  # noqa: B018  # validates every rtpmap eagerly: malformed SDP is a 400
            for fmt in m.formats:
                if not fmt.isdigit() or int(fmt) > 127:
                    raise SdpError(f"invalid RTP payload type in m= line: {fmt!r}")
    return sess


def _media_line(m: MediaDescription, kind: str, value: str) -> None:
    if kind == "i":
        m.information = value
    elif kind == "c":
        m.connections.append(_parse_connection(value))
    elif kind == "b":
        m.bandwidths.append(value)
    elif kind == "k":
        m.key = value
    elif kind == "a":
        m.attributes.append(_parse_attribute(value))


def _validate_attributes(attributes: Sequence[Attribute]) -> None:
    for name, value in attributes:
        if name in ("ptime", "maxptime"):
            _ms_attr(value or "", name)
        elif name == "rtpmap":
            parse_rtpmap(value or "")
        elif name == "fmtp" and not (value or "").partition(" ")[0].isdigit():
            raise SdpError(f"invalid a=fmtp value: {value!r}")
        elif name in DIRECTIONS and value is not None:
            raise SdpError(f"a={name} takes no value")
    if sum(1 for n, v in attributes if n in DIRECTIONS and v is None) > 1:
        raise SdpError("more than one direction attribute")


# --------------------------------------------------------------------------------------------
# Offer / answer (RFC 3264)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediaParams:
    """What the RTP layer needs after negotiation.

    ``payload_type``/``dtmf_pt`` are the numbers to *send* with (the remote side's SDP names
    the numbers it wants to receive, RFC 3264 §5.1); ``recv_payload_type``/``recv_dtmf_pt``
    are the ones we advertised.  ``direction`` is from *our* point of view: ``sendonly``
    means we send and do not receive; a remote hold (``a=sendonly``, ``a=inactive`` or
    ``c=0.0.0.0``) therefore removes ``send`` from it.
    """

    remote_addr: str
    remote_port: int
    payload_type: int
    codec: str
    clock_rate: int = 8000
    dtmf_pt: int | None = None
    ptime_ms: int = DEFAULT_PTIME
    direction: Direction = "sendrecv"
    recv_payload_type: int | None = None
    recv_dtmf_pt: int | None = None
    cn_pt: int | None = None
    # SRTP keys of both directions (SDES, RFC 4568) when the stream is encrypted.
    srtp: SrtpParams | None = None

    @property
    def sends(self) -> bool:
        return self.direction in ("sendrecv", "sendonly")

    @property
    def receives(self) -> bool:
        return self.direction in ("sendrecv", "recvonly")

    @property
    def on_hold(self) -> bool:
        """The remote side put us on hold (we must not send)."""
        return not self.sends

    @property
    def samples_per_frame(self) -> int:
        return self.clock_rate * self.ptime_ms // 1000


def _addrtype(ip: str) -> str:
    try:
        return "IP6" if ipaddress.ip_address(ip).version == 6 else "IP4"
    except ValueError:
        return "IP4"  # an FQDN: RFC 8866 allows it, IP4 is the usual assumption


def _new_origin(local_ip: str, previous: SessionDescription | None) -> Origin:
    if previous is not None:
        o = previous.origin
        return replace(o, session_version=o.session_version + 1)
    # RFC 8866 §5.2: sess-id and version are numeric; a random 62-bit value fits an NTP-ish
    # 64-bit field and is unique enough.
    sid = str(secrets.randbits(62))
    return Origin("-", sid, 1, "IN", _addrtype(local_ip), local_ip)


def _finish_version(sdp: SessionDescription, previous: SessionDescription | None) -> None:
    """RFC 3264 §8: same o= as before with the version +1, unless nothing changed at all."""
    if previous is None:
        return
    if [ln for ln in sdp.lines() if not ln.startswith("o=")] == [
        ln for ln in previous.lines() if not ln.startswith("o=")
    ]:
        sdp.origin = previous.origin


def codec_of(rtpmap: RtpMap) -> str | None:
    """Canonical name of a codec we support (PCMU/PCMA at 8 kHz, mono), else None."""
    name = rtpmap.encoding.upper()
    if name in SUPPORTED_CODECS and rtpmap.clock_rate == 8000 and rtpmap.channels in (None, 1):
        return name
    return None


def _is_event(rm: RtpMap) -> bool:
    return rm.encoding.lower() == TELEPHONE_EVENT and rm.clock_rate == 8000


def _is_cn(rm: RtpMap) -> bool:
    return rm.encoding.upper() == "CN" and rm.clock_rate == 8000


def choose_ptime(offered: int | None, maxptime: int | None) -> int:
    """Packetisation for the answer: honour an offered 10/20/30/40 ms, else 20 ms.

    RFC 3264 §6.1 leaves ptime to each side's receive preference; we send what the peer asked
    for when it is one of the common G.711 values and within its maxptime (RFC 8866 §6.5).
    """
    limit = maxptime if maxptime is not None else max(ALLOWED_PTIME)
    if offered in ALLOWED_PTIME and offered <= limit:
        return offered
    if limit >= DEFAULT_PTIME:
        return DEFAULT_PTIME
    fitting = [p for p in ALLOWED_PTIME if p <= limit]
    return max(fitting) if fitting else min(ALLOWED_PTIME)


def answer(
    offer: SessionDescription,
    local_ip: str,
    local_port: int,
    supported: Sequence[str] = SUPPORTED_CODECS,
    prefer: str | None = None,
    *,
    previous: SessionDescription | None = None,
    comfort_noise: bool = False,
    session_name: str = "voxgate",
    srtp: SrtpMode = "off",
) -> SessionDescription:
    """Build the RFC 3264 §6 answer to ``offer``.

    * m-lines keep the offer's order; the first usable RTP audio stream is accepted, every
      other stream (video, a second audio, SRTP, ...) is rejected with port 0 (§6).
    * Codec: ``prefer`` if it was offered, else the first offered codec in ``supported``;
      PCMU/PCMA are recognised by static PT or by rtpmap name at a dynamic PT (§6.1: the
      answer uses the offer's PT numbers).
    * telephone-event (RFC 4733) at the offered PT with the offered fmtp (default 0-15);
      CN (RFC 3389) only when ``comfort_noise`` and offered.
    * ptime: see :func:`choose_ptime`; direction mirrored (§6.1), and a hold by
      ``c=0.0.0.0`` (§8.4) means we must not send, so ``send`` is dropped from the answer.
    * ``previous``: our last SDP in this dialog; the o= line is kept with the version +1
      (§8), or unchanged when the new body is identical; our SRTP key is kept with it.
    * ``srtp``: which streams are accepted with or without ``a=crypto`` and when the answer
      carries one (``gateway.sdp_crypto.answer_stream``, RFC 4568 §7.1.2).

    Raises :class:`SdpNegotiationError` (488) when no audio stream has a common codec, or
    none meets the SRTP mode (the reason says which).
    """
    wanted = [c.upper() for c in supported]
    for c in wanted:
        if c not in SUPPORTED_CODECS:
            raise ValueError(f"unsupported codec {c!r}; expected PCMU and/or PCMA")
    if prefer is not None and prefer.upper() not in wanted:
        raise ValueError(f"preferred codec {prefer!r} is not in supported")

    out = SessionDescription(
        origin=_new_origin(local_ip, previous),
        name=session_name,
        connection=Connection("IN", _addrtype(local_ip), local_ip),
    )
    accepted = False
    saw_audio = False
    crypto_problems: list[str] = []
    previous_crypto = _own_crypto(previous)
    for m in offer.media:
        reply = None
        if not accepted:
            reply = _answer_media(offer, m, wanted, prefer, comfort_noise)
        if reply is not None:
            decision = sdp_crypto.answer_stream(
                m.proto, m.attribute_values("crypto"), srtp, previous_crypto
            )
            if not decision.accept:
                crypto_problems.append(decision.reason)
                reply = None
            elif decision.attribute is not None:
                # §7.1.2: one attribute, the chosen one's tag and suite with our key; before
                # the direction attribute, which stays last.
                reply.attributes.insert(-1, ("crypto", str(decision.attribute)))
        if m.media == "audio" and m.port != 0:
            saw_audio = True
        if reply is None:
            out.media.append(_rejected(m))
            continue
        reply.port = local_port
        accepted = True
        out.media.append(reply)
    if not accepted:
        if not saw_audio:
            raise SdpNegotiationError("no audio stream in the offer")
        if crypto_problems:
            raise SdpNegotiationError(crypto_problems[0])
        raise SdpNegotiationError("no common codec: we support " + ", ".join(wanted))
    _finish_version(out, previous)
    return out


def _is_rtp(proto: str) -> bool:
    """RTP/AVP(F), or its SRTP profile RTP/SAVP(F) (RFC 3711 §12): whether SRTP is acceptable
    is the SRTP mode's decision (``gateway.sdp_crypto``), not the codec negotiation's."""
    return proto in _RTP_PROTOS or proto in SAVP_PROTOS


def _own_crypto(previous: SessionDescription | None) -> sdp_crypto.CryptoAttribute | None:
    """Our a=crypto in the active audio stream of our last SDP (kept across a re-answer)."""
    m = _audio_section(previous) if previous is not None else None
    if m is None:
        return None
    good, _ = sdp_crypto.parse_all(m.attribute_values("crypto"))
    return good[0] if len(good) == 1 else None


def _rejected(m: MediaDescription) -> MediaDescription:
    # RFC 3264 §6: port 0; at least one format must still be listed, so echo the offer's.
    return MediaDescription(m.media, 0, m.proto, list(m.formats) or ["0"])


def _answer_media(
    offer: SessionDescription,
    m: MediaDescription,
    wanted: list[str],
    prefer: str | None,
    comfort_noise: bool,
) -> MediaDescription | None:
    if m.media != "audio" or m.port == 0 or not _is_rtp(m.proto):
        return None
    conn = offer.media_connection(m)
    if conn is None:
        raise SdpError("no c= line for the audio stream (RFC 8866 §5.7)")
    maps = m.rtpmaps
    offered: list[tuple[str, int]] = []
    for pt in m.payload_types():
        rm = maps.get(pt)
        name = codec_of(rm) if rm is not None else None
        if name in wanted and name is not None and all(name != n for n, _ in offered):
            offered.append((name, pt))
    if not offered:
        return None
    choice = offered[0]
    if prefer is not None:
        choice = next((o for o in offered if o[0] == prefer.upper()), choice)
    formats = [str(choice[1])]
    attrs: list[Attribute] = []
    # rtpmap even for static PTs: optional (RFC 3551) but widely expected.
    attrs.append(("rtpmap", f"{choice[1]} {maps[choice[1]].encoding}/8000"))
    event_pt = next((pt for pt in m.payload_types() if pt in maps and _is_event(maps[pt])), None)
    if event_pt is not None:
        formats.append(str(event_pt))
        attrs.append(("rtpmap", f"{event_pt} {maps[event_pt].encoding}/8000"))
        attrs.append(("fmtp", f"{event_pt} {m.fmtp.get(event_pt) or DEFAULT_EVENTS}"))
    if comfort_noise:
        cn_pt = next((pt for pt in m.payload_types() if pt in maps and _is_cn(maps[pt])), None)
        if cn_pt is not None:
            formats.append(str(cn_pt))
            attrs.append(("rtpmap", f"{cn_pt} CN/8000"))
    attrs.append(("ptime", str(choose_ptime(m.ptime, m.maxptime))))
    direction = _ANSWER_DIRECTION[offer.media_direction(m)]
    if conn.is_hold:
        # RFC 3264 §8.4: the peer asked not to receive media; we must not send to 0.0.0.0.
        direction = "recvonly" if direction in ("sendrecv", "recvonly") else "inactive"
    attrs.append((direction, None))
    return MediaDescription("audio", 0, m.proto, formats, attributes=attrs)


def make_offer(
    local_ip: str,
    port: int,
    codecs: Sequence[str] = SUPPORTED_CODECS,
    ptime: int = DEFAULT_PTIME,
    *,
    dtmf_pt: int | None = 101,
    events: str = "0-16",
    direction: Direction = "sendrecv",
    comfort_noise: bool = False,
    previous: SessionDescription | None = None,
    session_name: str = "voxgate",
    srtp: SrtpMode = "off",
) -> SessionDescription:
    """An offer for an outbound call (or a re-offer when ``previous`` is our last SDP).

    Hold is ``direction="sendonly"`` (RFC 3264 §8.4 recommends it over c=0.0.0.0).
    ``srtp`` "required": RTP/SAVP with an ``a=crypto`` per supported suite (RFC 4568 §7.1.1);
    "optional": the same attributes on RTP/AVP, so a callee without SRTP still answers (plain);
    a re-offer keeps the keys of ``previous``.
    """
    if ptime not in ALLOWED_PTIME:
        raise ValueError(f"ptime must be one of {ALLOWED_PTIME}, got {ptime}")
    names = [c.upper() for c in codecs]
    if not names or any(c not in SUPPORTED_CODECS for c in names):
        raise ValueError(f"codecs must be a non-empty subset of {SUPPORTED_CODECS}, got {codecs}")
    if dtmf_pt is not None and not 96 <= dtmf_pt <= 127:
        raise ValueError(f"dtmf_pt must be a dynamic payload type (96-127), got {dtmf_pt}")
    formats = [str(STATIC_PT[c]) for c in names]
    attrs: list[Attribute] = [("rtpmap", f"{STATIC_PT[c]} {c}/8000") for c in names]
    if dtmf_pt is not None:
        formats.append(str(dtmf_pt))
        attrs += [("rtpmap", f"{dtmf_pt} {TELEPHONE_EVENT}/8000"), ("fmtp", f"{dtmf_pt} {events}")]
    if comfort_noise:
        formats.append("13")
        attrs.append(("rtpmap", "13 CN/8000"))
    attrs.append(("ptime", str(ptime)))
    proto = "RTP/AVP"
    if srtp != "off":
        proto = "RTP/SAVP" if srtp == "required" else "RTP/AVP"
        before = _audio_section(previous) if previous is not None else None
        kept, _ = sdp_crypto.parse_all(before.attribute_values("crypto") if before else [])
        attrs += [("crypto", str(a)) for a in sdp_crypto.offer_attributes(kept)]
    attrs.append((direction, None))
    out = SessionDescription(
        origin=_new_origin(local_ip, previous),
        name=session_name,
        connection=Connection("IN", _addrtype(local_ip), local_ip),
        media=[MediaDescription("audio", port, proto, formats, attributes=attrs)],
    )
    _finish_version(out, previous)
    return out


def _audio_section(sdp: SessionDescription) -> MediaDescription | None:
    for m in sdp.media:
        if _active_audio(m):
            return m
    return None


def _active_audio(m: MediaDescription) -> bool:
    return m.media == "audio" and m.port != 0 and _is_rtp(m.proto)


def _paired_audio(
    remote: SessionDescription, local: SessionDescription | None
) -> tuple[MediaDescription | None, MediaDescription | None]:
    """The audio stream of an offer/answer pair: RFC 3264 §6 keeps the offer's m-lines in the
    answer, in order, so the stream is the first index active on both sides (an offer's
    earlier stream that the answer rejected, e.g. RTP/SAVP with SRTP off, is skipped)."""
    if local is None:
        return _audio_section(remote), None
    lm = _audio_section(local)
    if len(remote.media) != len(local.media):
        return _audio_section(remote), lm  # not a well-formed pair: the first of each
    for r, m in zip(remote.media, local.media, strict=True):
        if _active_audio(r) and _active_audio(m):
            return r, m
    return None, lm


def _srtp_of(rm: MediaDescription, lm: MediaDescription | None) -> SrtpParams | None:
    """SRTP keys of the paired stream (RFC 4568 §7.1.3), None for plain RTP. An RTP/SAVP
    stream without a matching pair of a=crypto lines cannot carry media: 488."""
    theirs = rm.attribute_values("crypto")
    ours = lm.attribute_values("crypto") if lm is not None else []
    secure = rm.proto in SAVP_PROTOS or (lm is not None and lm.proto in SAVP_PROTOS)
    if theirs and ours:
        try:
            return sdp_crypto.pair(theirs, ours)
        except sdp_crypto.CryptoError as exc:
            raise SdpNegotiationError(f"SRTP: {exc}") from None
    if secure:
        raise SdpNegotiationError("SRTP: an RTP/SAVP stream without a=crypto on both sides")
    return None  # best-effort SRTP declined (or never offered): plain RTP


def _first_codec(m: MediaDescription, also_in: MediaDescription | None) -> tuple[str, int] | None:
    maps = m.rtpmaps
    for pt in m.payload_types():
        rm = maps.get(pt)
        name = codec_of(rm) if rm is not None else None
        if name is not None and (also_in is None or _pt_for(also_in, "codec", name) is not None):
            return name, pt
    return None


def _pt_for(m: MediaDescription, pred: str, codec: str | None = None) -> int | None:
    maps = m.rtpmaps
    for pt in m.payload_types():
        rm = maps.get(pt)
        if rm is None:
            continue
        if pred == "codec" and codec_of(rm) == codec:
            return pt
        if pred == "event" and _is_event(rm):
            return pt
        if pred == "cn" and _is_cn(rm):
            return pt
    return None


def negotiated(remote: SessionDescription, local: SessionDescription | None = None) -> MediaParams:
    """Media parameters for the RTP session.

    ``remote`` is the peer's SDP (their offer to us, or their answer to our offer): it gives
    the address/port to send to and the PT numbers to send with.  ``local`` is our own SDP in
    the same exchange (our answer, or our offer); when given, the codec, ptime and direction
    come from the answer side of the pair: for an inbound call pass ``(offer, our_answer)``,
    for an outbound call ``(their_answer, our_offer)``.  Only the remote SDP is needed when
    that is the answer.

    Raises :class:`SdpNegotiationError` when there is no usable audio stream or codec.
    """
    rm, lm = _paired_audio(remote, local)
    if local is not None and lm is None and _audio_section(remote) is not None:
        raise SdpNegotiationError("no active audio stream in the local SDP")
    if rm is None:
        raise SdpNegotiationError("no active audio stream")
    conn = remote.media_connection(rm)
    if conn is None:
        raise SdpError("no c= line for the audio stream (RFC 8866 §5.7)")

    # RFC 3264 §6.1/§7: the answer's order is the preference.  Our answers list one codec and
    # a remote answer lists its choice first, so "first codec of the remote SDP that the local
    # SDP also has" is the negotiated codec in both directions.
    first = _first_codec(rm, lm)
    if first is None:
        raise SdpNegotiationError("no common codec")
    codec, send_pt = first
    recv_pt = _pt_for(lm, "codec", codec) if lm is not None else None
    # Send at the packetisation the peer asked to receive (RFC 3264 §6.1), within our set.
    local_ptime = lm.ptime if lm is not None else None
    ptime = choose_ptime(rm.ptime or local_ptime, rm.maxptime)

    if local is not None and lm is not None:
        ours = local.media_direction(lm)
        theirs = remote.media_direction(rm)
        direction = _intersect(ours, _ANSWER_DIRECTION[theirs])
    else:
        direction = _ANSWER_DIRECTION[remote.media_direction(rm)]
    if conn.is_hold:
        direction = "recvonly" if direction in ("sendrecv", "recvonly") else "inactive"

    dtmf_pt = _pt_for(rm, "event")
    recv_dtmf = _pt_for(lm, "event") if lm is not None else None
    if lm is not None and (dtmf_pt is None) != (recv_dtmf is None):
        dtmf_pt = recv_dtmf = None  # only one side does RFC 4733: nobody does
    cn_pt = _pt_for(rm, "cn")
    if lm is not None and _pt_for(lm, "cn") is None:
        cn_pt = None
    return MediaParams(
        remote_addr=conn.host,
        remote_port=rm.port,
        payload_type=send_pt,
        codec=codec,
        clock_rate=8000,
        dtmf_pt=dtmf_pt,
        ptime_ms=ptime,
        direction=direction,
        recv_payload_type=recv_pt,
        recv_dtmf_pt=recv_dtmf,
        cn_pt=cn_pt,
        srtp=_srtp_of(rm, lm),
    )


def _intersect(a: Direction, b: Direction) -> Direction:
    send = a in ("sendrecv", "sendonly") and b in ("sendrecv", "sendonly")
    recv = a in ("sendrecv", "recvonly") and b in ("sendrecv", "recvonly")
    if send and recv:
        return "sendrecv"
    if send:
        return "sendonly"
    return "recvonly" if recv else "inactive"


def offer_changed(previous: SessionDescription, offer: SessionDescription) -> bool:
    """RFC 3264 §8: a re-offer with the same o= version must be identical (a session refresh).

    True when the remote's new offer modifies the session (its version moved on, or the
    session id changed); False for a refresh the previous answer still covers.
    """
    p, o = previous.origin, offer.origin
    return (p.username, p.session_id, p.address) != (o.username, o.session_id, o.address) or (
        p.session_version != o.session_version
    )
