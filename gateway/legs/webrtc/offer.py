"""Checks on a browser's offer before aiortc sees it (sans-I/O).

aiortc accepts a lot and fails late (an offer without audio gives a call with no media; a
garbled one raises deep inside ``setRemoteDescription``), so the offer is checked here first
and every refusal names its reason: the signalling endpoint answers 400 with it.

What a usable offer needs (RFC 8829 JSEP, RFC 8834/8835):
* a session description that parses (RFC 8866);
* an active audio m-line (port ≠ 0) on a DTLS-SRTP profile (``UDP/TLS/RTP/SAVPF``) — the only
  kind aiortc can carry (no plain RTP/AVP, which is what SIP legs use);
* ICE credentials and a DTLS fingerprint (session or media level, RFC 8839 §5.4, RFC 8122 §5);
* a codec we can speak: Opus (RFC 7587, preferred: wideband) or G.711 as a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sdp import MediaDescription, SdpError, SessionDescription, parse

# Offers are a few kB; anything near this is not a browser.
MAX_SDP_BYTES = 64 * 1024
# Codecs we accept, best first, by rtpmap encoding name (lower case) and the static PTs of
# RFC 3551 for the G.711 pair.
CODECS = ("opus", "pcmu", "pcma")
_STATIC = {0: "pcmu", 8: "pcma"}


class OfferError(ValueError):
    """The offer cannot be answered; ``str()`` is the reason given to the browser."""


@dataclass(frozen=True, slots=True)
class CheckedOffer:
    sdp: str
    codec: str  # the best codec both sides have: "opus", "pcmu" or "pcma"
    has_datachannel: bool
    # The browser will send audio (sendrecv/sendonly): its silence then means it is gone.
    sends_audio: bool = True


def check_offer(body: dict[str, object]) -> CheckedOffer:
    """Validate ``{"sdp": ..., "type": "offer"}``; raise ``OfferError`` with the reason."""
    unknown = sorted(set(body) - {"sdp", "type"})
    if unknown:
        raise OfferError(f"unknown field {unknown[0]!r}; expected 'sdp' and 'type'")
    kind = body.get("type")
    if kind != "offer":
        raise OfferError(f"field 'type' must be \"offer\", got {kind!r}")
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferError("field 'sdp' must be a non-empty string")
    try:
        size = len(sdp.encode())
    except UnicodeEncodeError:  # JSON's "\ud800" decodes to a lone surrogate (found by fuzzing)
        raise OfferError("field 'sdp' is not valid Unicode (a lone surrogate)") from None
    if size > MAX_SDP_BYTES:
        raise OfferError(f"the SDP is over {MAX_SDP_BYTES} bytes")
    try:
        session = parse(sdp)
    except SdpError as exc:
        raise OfferError(f"malformed SDP: {exc}") from None
    audio = [m for m in session.media if m.media == "audio" and m.port != 0]
    if not audio:
        raise OfferError("the offer has no audio m-line (nothing to talk over)")
    m = audio[0]
    if "SAVP" not in m.proto:
        raise OfferError(
            f"audio is offered as {m.proto}; a browser leg needs DTLS-SRTP (UDP/TLS/RTP/SAVPF). "
            "Plain RTP phones should call the SIP port instead"
        )
    if _attr(session, m, "ice-ufrag") is None or _attr(session, m, "ice-pwd") is None:
        raise OfferError("the offer has no ICE credentials (a=ice-ufrag / a=ice-pwd)")
    if _attr(session, m, "fingerprint") is None:
        raise OfferError("the offer has no DTLS fingerprint (a=fingerprint)")
    codec = best_codec(m)
    if codec is None:
        names = sorted({r.encoding for r in m.rtpmaps.values()}) or m.formats
        raise OfferError(
            f"no common audio codec: offered {', '.join(names)}; this gateway speaks Opus, "
            "PCMU and PCMA"
        )
    datachannel = any(x.media == "application" and x.port != 0 for x in session.media)
    direction = session.media_direction(m)
    return CheckedOffer(
        sdp=sdp, codec=codec, has_datachannel=datachannel,
        sends_audio=direction in ("sendrecv", "sendonly"),
    )  # fmt: skip


def best_codec(m: MediaDescription) -> str | None:
    offered: set[str] = set()
    rtpmaps = m.rtpmaps
    for fmt in m.formats:
        if not fmt.isdigit():
            continue
        pt = int(fmt)
        rtpmap = rtpmaps.get(pt)
        if rtpmap is not None:
            offered.add(rtpmap.encoding.lower())
        elif pt in _STATIC:
            offered.add(_STATIC[pt])
    return next((c for c in CODECS if c in offered), None)


def _attr(session: SessionDescription, m: MediaDescription, name: str) -> str | None:
    """Media-level value, else session-level (RFC 8839 §5.4 allows either)."""
    value = m.attribute(name)
    if value is not None:
        return value
    return next((v or "" for n, v in session.attributes if n == name), None)
