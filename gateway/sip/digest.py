"""HTTP Digest authentication for a SIP UAC: RFC 3261 §22, RFC 8760 (SHA-2 for SIP),
RFC 7616 (the algorithm) and RFC 2617 compatibility (qop-less challenges).

``parse_challenges`` reads WWW-Authenticate / Proxy-Authenticate, ``choose_challenge`` picks
the strongest supported algorithm, ``digest_response`` / ``build_authorization`` do the math
and :class:`DigestAuthenticator` turns a 401/407 into the retried request. The server side
(``gateway.sip.auth``) reuses the parser and ``hash_hex``/``response_from_ha1``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from gateway.sip.errors import SipParseError
from gateway.sip.fields import Via
from gateway.sip.helpers import generate_branch
from gateway.sip.message import Request, Response
from gateway.sip.syntax import TOKEN_CHARS, WSP, quote_string, skip_quoted, unquote_string


def _sha512_256(data: bytes) -> str:
    return hashlib.new("sha512_256", data).hexdigest()


_HASHES: dict[str, Callable[[bytes], str]] = {
    "MD5": lambda data: hashlib.md5(data).hexdigest(),
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
}
try:  # not every OpenSSL build has SHA-512/256
    _sha512_256(b"")
    _HASHES["SHA-512-256"] = _sha512_256
except ValueError:  # pragma: no cover
    pass

# RFC 8760 §2.4 lets local policy choose among several challenges: take the strongest.
_STRENGTH = {"SHA-512-256": 3, "SHA-256": 2, "MD5": 1}


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str
    params: tuple[tuple[str, str], ...]  # names lower case, values unquoted

    def get(self, name: str) -> str | None:
        for n, v in self.params:
            if n == name:
                return v
        return None

    @property
    def realm(self) -> str:
        return self.get("realm") or ""

    @property
    def nonce(self) -> str:
        return self.get("nonce") or ""

    @property
    def opaque(self) -> str | None:
        return self.get("opaque")

    @property
    def algorithm(self) -> str:
        """Upper-case algorithm name; MD5 when absent (RFC 2617 §3.2.1)."""
        return (self.get("algorithm") or "MD5").upper()

    @property
    def qop_options(self) -> tuple[str, ...]:
        value = self.get("qop")
        if value is None:
            return ()
        return tuple(q.strip().lower() for q in value.split(",") if q.strip())

    @property
    def stale(self) -> bool:
        return (self.get("stale") or "").lower() == "true"

    @property
    def userhash(self) -> bool:
        return (self.get("userhash") or "").lower() == "true"

    @property
    def supported(self) -> bool:
        base = self.algorithm.removesuffix("-SESS")
        qop_ok = not self.qop_options or bool({"auth", "auth-int"} & set(self.qop_options))
        return self.scheme.lower() == "digest" and base in _HASHES and qop_ok


def parse_challenges(value: str) -> list[Challenge]:
    """All challenges in one WWW-Authenticate/Proxy-Authenticate value (HTTP allows several
    per field; SIP usually sends one field each)."""
    challenges: list[tuple[str, list[tuple[str, str]]]] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and (value[i] in WSP or value[i] == ","):
            i += 1
        if i >= n:
            break
        start = i
        while i < n and value[i] in TOKEN_CHARS:
            i += 1
        token = value[start:i]
        if not token:
            raise SipParseError(f"Bad authentication challenge {value!r}")
        j = i
        while j < n and value[j] in WSP:
            j += 1
        if j < n and value[j] == "=":
            if not challenges:
                raise SipParseError("Authentication parameter before the scheme")
            j += 1
            while j < n and value[j] in WSP:
                j += 1
            if j < n and value[j] == '"':
                end = skip_quoted(value, j)
                param = unquote_string(value[j:end])
            else:
                end = j
                while end < n and value[end] not in ", \t":
                    end += 1
                param = value[j:end]
            challenges[-1][1].append((token.lower(), param))
            i = end
        else:
            challenges.append((token, []))
            i = j
    return [Challenge(scheme, tuple(params)) for scheme, params in challenges]


def choose_challenge(challenges: list[Challenge]) -> Challenge | None:
    """The challenge to answer: the strongest supported algorithm, the first one on a tie."""
    usable = [c for c in challenges if c.supported]
    if not usable:
        return None
    return max(usable, key=lambda c: _STRENGTH[c.algorithm.removesuffix("-SESS")])


def digest_response(
    challenge: Challenge,
    *,
    username: str,
    password: str,
    method: str,
    uri: str,
    cnonce: str,
    nc: int,
    qop: str | None,
    body: bytes = b"",
) -> str:
    """The ``response`` value of RFC 7616 §3.4.1 (RFC 2617 §3.2.2 when ``qop`` is None)."""
    algorithm = challenge.algorithm
    ha1 = hash_hex(algorithm.removesuffix("-SESS"), f"{username}:{challenge.realm}:{password}")
    return response_from_ha1(
        algorithm, ha1, nonce=challenge.nonce, method=method, uri=uri, cnonce=cnonce, nc=nc,
        qop=qop, body=body,
    )  # fmt: skip


def hash_hex(algorithm: str, text: str | bytes) -> str:
    """``H(data)`` of RFC 7616 §3.4 for ``algorithm`` (``MD5``, ``SHA-256``...; no ``-sess``):
    the lower-case hex digest. KeyError for an algorithm this build does not have."""
    # surrogateescape: header text holds a non-UTF-8 byte as a lone surrogate (the parser's
    # decoding); the hash is over the octets as sent (found by fuzzing: a realm or nonce
    # byte 0x80 raised UnicodeEncodeError out of verify and build_authorization).
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return _HASHES[algorithm.upper()](data)


def supported_algorithms() -> tuple[str, ...]:
    """The digest algorithms this build can compute, strongest first."""
    return tuple(sorted(_HASHES, key=lambda a: -_STRENGTH[a]))


def response_from_ha1(
    algorithm: str,
    ha1: str,
    *,
    nonce: str,
    method: str,
    uri: str,
    cnonce: str,
    nc: int,
    qop: str | None,
    body: bytes = b"",
) -> str:
    """The ``response`` value from a stored ``H(username:realm:password)`` (RFC 7616 §3.4.1,
    §3.4.2 for ``-sess``; RFC 2617 §3.2.2 when ``qop`` is None): what a server that keeps
    only HA1 (an htdigest file, ``ha1`` in config) needs to check a response."""
    algorithm = algorithm.upper()
    base = algorithm.removesuffix("-SESS")

    def hs(text: str) -> str:
        return hash_hex(base, text)

    if algorithm.endswith("-SESS"):
        ha1 = hs(f"{ha1}:{nonce}:{cnonce}")
    ha2 = hs(f"{method}:{uri}")
    if qop == "auth-int":
        ha2 = hs(f"{method}:{uri}:{hash_hex(base, body)}")
    if qop is None:
        return hs(f"{ha1}:{nonce}:{ha2}")
    return hs(f"{ha1}:{nonce}:{nc:08x}:{cnonce}:{qop}:{ha2}")


def build_authorization(
    challenge: Challenge,
    *,
    username: str,
    password: str,
    method: str,
    uri: str,
    body: bytes = b"",
    cnonce: str | None = None,
    nc: int = 1,
) -> str:
    """The Authorization / Proxy-Authorization value answering ``challenge``."""
    qop: str | None = None
    if challenge.qop_options:
        qop = "auth" if "auth" in challenge.qop_options else "auth-int"
    cnonce = cnonce or secrets.token_hex(16)
    response = digest_response(
        challenge,
        username=username,
        password=password,
        method=method,
        uri=uri,
        cnonce=cnonce,
        nc=nc,
        qop=qop,
        body=body,
    )
    user = username
    if challenge.userhash:  # RFC 7616 §3.4.4
        user = hash_hex(challenge.algorithm.removesuffix("-SESS"), f"{username}:{challenge.realm}")
    parts = [
        f"username={quote_string(user)}",
        f"realm={quote_string(challenge.realm)}",
        f"nonce={quote_string(challenge.nonce)}",
        f"uri={quote_string(uri)}",
        f"response={quote_string(response)}",
    ]
    if challenge.get("algorithm") is not None:
        parts.append(f"algorithm={challenge.get('algorithm')}")
    if qop is not None:
        parts += [f"cnonce={quote_string(cnonce)}", f"qop={qop}", f"nc={nc:08x}"]
    if challenge.opaque is not None:
        parts.append(f"opaque={quote_string(challenge.opaque)}")
    if challenge.userhash:
        parts.append("userhash=true")
    return "Digest " + ", ".join(parts)


class DigestAuthenticator:
    """Answers 401/407 for one set of credentials (§22.2). Keeps nonce counts, and refuses to
    retry a realm whose credentials were just rejected (a new challenge for the same realm
    that is not ``stale=true``) so that a wrong password cannot loop forever."""

    def __init__(self, username: str, password: str) -> None:
        self.username = username
        self.password = password
        self._nonce_counts: dict[str, int] = {}

    def authorize(self, request: Request, response: Response) -> Request | None:
        """The request to send next (a copy with credentials, CSeq + 1, a new branch), or
        None when there is nothing usable to answer."""
        if response.status == 401:
            challenge_name, auth_name = "WWW-Authenticate", "Authorization"
        elif response.status == 407:
            challenge_name, auth_name = "Proxy-Authenticate", "Proxy-Authorization"
        else:
            return None
        challenges: list[Challenge] = []
        for value in response.headers.get_all(challenge_name):
            try:
                challenges.extend(parse_challenges(value))
            except SipParseError:
                continue
        challenge = choose_challenge(challenges)
        if challenge is None:
            return None
        previous = _realm_credentials(request, auth_name, challenge.realm)
        if previous is not None and not challenge.stale:
            return None  # these credentials were refused for this realm
        nc = self._nonce_counts.get(challenge.nonce, 0) + 1
        self._nonce_counts[challenge.nonce] = nc
        value = build_authorization(
            challenge,
            username=self.username,
            password=self.password,
            method=request.method,
            uri=str(request.uri),
            body=request.body,
            nc=nc,
        )
        new = request.copy()
        kept = [(n, v) for n, v in new.headers if not (n == auth_name and v == previous)]
        new.headers = type(new.headers)(kept)
        new.headers.add(auth_name, value)
        cseq = request.cseq
        new.headers.set("CSeq", f"{cseq.seq + 1} {cseq.method}")
        vias = new.headers.values("Via")
        top = Via.parse(vias[0]).with_param("branch", generate_branch())
        new.headers.set("Via", ", ".join([str(top), *vias[1:]]))
        return new


def _realm_credentials(request: Request, header: str, realm: str) -> str | None:
    for value in request.headers.get_all(header):
        try:
            parsed = parse_challenges(value)
        except SipParseError:
            continue
        if parsed and parsed[0].realm == realm:
            return value
    return None
