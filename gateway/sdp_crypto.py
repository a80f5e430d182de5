"""SDES: SRTP master keys carried in SDP (RFC 4568 ``a=crypto``), sans-I/O.

What the offer/answer in :mod:`gateway.sdp` needs to negotiate SRTP (RFC 3711) on a SIP leg:

* :func:`parse_crypto` reads one ``a=crypto`` value (§9.1 grammar), :class:`CryptoAttribute`
  writes one back. Two crypto-suites are supported, AES_CM_128_HMAC_SHA1_80 and _32 (§6.2);
  the key-method is ``inline`` (§6.1) with a 30-byte master key || salt. A lifetime is read
  and kept (the sender rekeys by a new offer, §6.1); an MKI, several keys, a non-zero KDR,
  FEC or the UNENCRYPTED/UNAUTHENTICATED session parameters make that attribute unacceptable
  (the key layer cannot honour them: pylibsrtp has no MKI, libsrtp has no KDR). An unknown
  session parameter is unacceptable too unless it starts with "-" (§6.3.7: optional).
* :func:`answer_stream` is the answerer's choice for one media stream (§7.1.2): the first
  acceptable offered attribute, answered with the same tag and suite and our own key.
* :func:`offer_attributes` builds our offer (§7.1.1), :func:`pair` matches an answer to its
  offer by tag (§7.1.3) into the keys of both directions (:class:`SrtpParams`).

Which offers are accepted depends on ``gateway.srtp`` (:data:`SrtpMode`):

* ``off``: RTP/SAVP streams are rejected (so an offer with nothing else gets 488);
  ``a=crypto`` on RTP/AVP is ignored (plain answer).
* ``optional``: RTP/SAVP answered with SRTP; RTP/AVP with an acceptable ``a=crypto`` is
  answered RTP/AVP with ``a=crypto`` (the widespread "best effort SRTP" of baresip, Asterisk
  and FreeSWITCH: RFC 4568 defines ``a=crypto`` for SAVP only, RFC 5939 capability
  negotiation being the standard alternative); RTP/AVP without one is answered plain.
* ``required``: as optional, but a stream that would end up plain is rejected (488).

Keys come from :mod:`secrets` and never appear in a ``repr``, a log line or an error message:
:func:`redact_keys` scrubs ``inline:`` key material from any text (every SDP error goes
through it, see ``gateway.sdp.SdpProblem``).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

SrtpMode = Literal["off", "optional", "required"]
SRTP_MODES: tuple[SrtpMode, ...] = ("off", "optional", "required")
SAVP_PROTOS = ("RTP/SAVP", "RTP/SAVPF")


@dataclass(frozen=True, slots=True)
class CryptoSuite:
    """An SRTP crypto-suite of RFC 4568 §6.2 (both are AES-128 counter mode, HMAC-SHA1)."""

    name: str
    key_len: int  # master key, bytes
    salt_len: int  # master salt, bytes
    tag_bits: int  # SRTP authentication tag (SRTCP always uses 80 bits, §6.2.2)

    @property
    def inline_len(self) -> int:
        return self.key_len + self.salt_len


SUITES: dict[str, CryptoSuite] = {
    s.name: s
    for s in (
        CryptoSuite("AES_CM_128_HMAC_SHA1_80", 16, 14, 80),
        CryptoSuite("AES_CM_128_HMAC_SHA1_32", 16, 14, 32),
    )
}
# Our offer's order of preference (RFC 4568 §7.1.1: the offerer lists its preference first):
# the 80-bit tag first, as RFC 4568 §6.2.1 recommends it for general use.
OFFER_SUITES: tuple[str, ...] = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
# RFC 3711 §9.2: at most 2^48 SRTP packets under one master key (§6.1: a larger lifetime is
# invalid). 2^31 is the SRTCP limit; the gateway sends no RTCP.
MAX_LIFETIME = 1 << 48
MIN_WSH = 64  # RFC 4568 §6.3.7
_TAG = re.compile(r"[0-9]{1,9}")
_SUITE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_INLINE = re.compile(r"(inline:)[^\s|;]*", re.IGNORECASE)
# Session parameters (§6.3) the key layer cannot honour; a "-" prefix marks an optional one.
_UNSUPPORTED_PARAMS = (
    "UNENCRYPTED_SRTP", "UNENCRYPTED_SRTCP", "UNAUTHENTICATED_SRTP", "FEC_ORDER", "FEC_KEY",
)  # fmt: skip


class CryptoError(ValueError):
    """An ``a=crypto`` value that is malformed or asks for what we do not support. The message
    names the attribute's tag and the reason, never the key."""


def redact_keys(text: str) -> str:
    """``text`` with every ``inline:`` key replaced: for logs, errors and API output."""
    return _INLINE.sub(r"\1[redacted]", text)


def new_key(suite: str) -> bytes:
    """A fresh master key || master salt for ``suite`` (RFC 4568 §6.1, from ``secrets``)."""
    return secrets.token_bytes(SUITES[suite].inline_len)


@dataclass(frozen=True, slots=True)
class CryptoAttribute:
    """One ``a=crypto:<tag> <suite> inline:<key||salt>[|lifetime] [params]`` (§9.1).

    ``key`` is excluded from ``repr``; ``str()`` is the attribute value, key included, for the
    SDP body only.
    """

    tag: int
    suite: str
    key: bytes = field(repr=False)
    lifetime: int | None = None
    wsh: int | None = None

    def __str__(self) -> str:
        inline = base64.b64encode(self.key).decode("ascii")
        if self.lifetime is not None:
            exp = self.lifetime.bit_length() - 1
            inline += f"|2^{exp}" if self.lifetime == 1 << exp else f"|{self.lifetime}"
        params = f" WSH={self.wsh}" if self.wsh is not None else ""
        return f"{self.tag} {self.suite} inline:{inline}{params}"


def parse_crypto(value: str) -> CryptoAttribute:
    """Parse an ``a=crypto`` value; :class:`CryptoError` when it is malformed or unsupported."""
    parts = value.split()
    if len(parts) < 3:
        raise CryptoError("a=crypto needs a tag, a crypto-suite and key parameters")
    tag_s, suite, key_params, *session = parts
    if not _TAG.fullmatch(tag_s):
        raise CryptoError("a=crypto tag must be 1-9 digits")
    tag = int(tag_s)
    where = f"a=crypto tag {tag}"
    if suite not in SUITES:
        shown = suite if _SUITE_NAME.fullmatch(suite) else "(malformed)"
        raise CryptoError(f"{where}: crypto-suite {shown} is not supported")
    spec = SUITES[suite]
    if ";" in key_params:
        # §9.1: several key-params (one per MKI value) for one stream.
        raise CryptoError(f"{where}: several master keys (MKI) are not supported")
    method, colon, info = key_params.partition(":")
    if not colon or method.lower() != "inline":
        raise CryptoError(f"{where}: only the inline key method is supported (§6.1)")
    fields = info.split("|")
    if len(fields) > 3:
        raise CryptoError(f"{where}: malformed key parameters")
    b64, extra = fields[0], fields[1:]
    lifetime: int | None = None
    for item in extra:
        if ":" in item:
            raise CryptoError(f"{where}: an MKI is not supported")
        if lifetime is not None:
            raise CryptoError(f"{where}: malformed key parameters")
        lifetime = _lifetime(item, where)
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise CryptoError(f"{where}: the key is not valid base64") from None
    if len(key) != spec.inline_len:
        raise CryptoError(
            f"{where}: {suite} needs a {spec.inline_len}-byte key and salt, got {len(key)}"
        )
    wsh: int | None = None
    for param in session:
        name, _, arg = param.partition("=")
        upper = name.upper()
        if upper.startswith("-"):
            continue  # §6.3.7: optional to understand
        if upper == "KDR":
            if arg != "0":
                raise CryptoError(f"{where}: a key derivation rate (KDR) is not supported")
        elif upper == "WSH":
            if not arg.isdigit() or int(arg) < MIN_WSH:
                raise CryptoError(f"{where}: WSH must be a number >= {MIN_WSH}")
            wsh = int(arg)
        elif upper in _UNSUPPORTED_PARAMS:
            raise CryptoError(f"{where}: session parameter {upper} is not supported")
        else:
            shown = upper if _SUITE_NAME.fullmatch(upper) else "(malformed)"
            raise CryptoError(f"{where}: unknown session parameter {shown}")
    return CryptoAttribute(tag, suite, key, lifetime, wsh)


def _lifetime(text: str, where: str) -> int:
    """§9.1: ``lifetime = ["2^"] 1*DIGIT``; at most 2^48 packets (RFC 3711 §9.2)."""
    digits = text[2:] if text.startswith("2^") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
        raise CryptoError(f"{where}: malformed key lifetime")
    if text.startswith("2^"):
        if int(digits) > 48:
            raise CryptoError(f"{where}: the key lifetime exceeds 2^48")
        n = 1 << int(digits)
    else:
        n = int(digits)
    if not 0 < n <= MAX_LIFETIME:
        raise CryptoError(f"{where}: the key lifetime must be 1..2^48 packets")
    return n


def parse_all(values: Iterable[str]) -> tuple[list[CryptoAttribute], list[str]]:
    """Every acceptable attribute of a stream in the order given, and why the others are not."""
    good: list[CryptoAttribute] = []
    problems: list[str] = []
    tags: set[int] = set()
    for value in values:
        try:
            attr = parse_crypto(value)
        except CryptoError as exc:
            problems.append(str(exc))
            continue
        if attr.tag in tags:
            problems.append(f"a=crypto tag {attr.tag} is used twice (§9.1: tags are unique)")
            continue
        tags.add(attr.tag)
        good.append(attr)
    return good, problems


@dataclass(frozen=True, slots=True)
class StreamCrypto:
    """The answerer's decision for one stream: ``accept`` it (plain when ``attribute`` is
    None, else with that attribute in the answer), or reject it for ``reason``."""

    accept: bool
    attribute: CryptoAttribute | None = None
    reason: str = ""


def answer_stream(
    proto: str,
    offered: Sequence[str],
    mode: SrtpMode,
    previous: CryptoAttribute | None = None,
) -> StreamCrypto:
    """RFC 4568 §7.1.2 for one offered stream: its ``proto`` and its ``a=crypto`` values.

    ``previous`` is our attribute in this stream's last answer: its key is kept when the suite
    is the same (a re-INVITE that does not rekey our direction, §7.1.4)."""
    secure = proto in SAVP_PROTOS
    if mode == "off":
        if secure:
            return StreamCrypto(False, reason=f"{proto} offered but SRTP is off here")
        return StreamCrypto(True)
    good, problems = parse_all(offered)
    if not good:
        if not secure and mode == "optional":
            return StreamCrypto(True)  # plain RTP/AVP (any unusable a=crypto is ignored)
        why = "; ".join(problems) if problems else "no a=crypto attribute"
        head = "SRTP is required" if not secure else "no acceptable a=crypto"
        return StreamCrypto(False, reason=f"{head}: {why}"[:300])
    chosen = good[0]
    key = previous.key if previous is not None and previous.suite == chosen.suite else None
    return StreamCrypto(
        True, CryptoAttribute(chosen.tag, chosen.suite, key or new_key(chosen.suite))
    )


def offer_attributes(previous: Sequence[CryptoAttribute] = ()) -> list[CryptoAttribute]:
    """Our ``a=crypto`` lines, one per supported suite in preference order (§7.1.1), tags 1..n;
    a re-offer keeps the keys of ``previous`` (our last offer's attributes) by tag and suite."""
    keep = {(a.tag, a.suite): a.key for a in previous}
    return [
        CryptoAttribute(tag, suite, keep.get((tag, suite)) or new_key(suite))
        for tag, suite in enumerate(OFFER_SUITES, start=1)
    ]


@dataclass(frozen=True, slots=True)
class SrtpParams:
    """The negotiated SRTP of one stream: our key protects what we send, the peer's key
    unprotects what we receive (SDES: each side announces the key it sends with, §6.1)."""

    suite: str
    send_key: bytes = field(repr=False)
    recv_key: bytes = field(repr=False)


def pair(remote: Sequence[str], local: Sequence[str]) -> SrtpParams:
    """Match the two sides' ``a=crypto`` lines of one stream by tag (RFC 4568 §7.1.3: the
    answer carries one attribute, with the tag and suite of an offered one). Either side may
    be the offer; attributes that do not parse are skipped unless nothing else matches."""
    rgood, rprob = parse_all(remote)
    lgood, lprob = parse_all(local)
    by_tag = {a.tag: a for a in rgood}
    matches = [(mine, by_tag[mine.tag]) for mine in lgood if mine.tag in by_tag]
    if not matches:
        why = "; ".join(rprob + lprob) or "the answer's a=crypto tag matches no offered one"
        raise CryptoError(why[:300])
    if len(matches) > 1:
        raise CryptoError("several a=crypto attributes on both sides: no answer to pair")
    mine, theirs = matches[0]
    if mine.suite != theirs.suite:
        raise CryptoError(
            f"a=crypto tag {mine.tag}: the answer's crypto-suite differs from the offer's"
        )
    return SrtpParams(mine.suite, send_key=mine.key, recv_key=theirs.key)
