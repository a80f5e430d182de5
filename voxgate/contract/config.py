"""voxgate configuration: one TOML file, every key overridable.

Precedence (lowest to highest): built-in defaults < ``voxgate.toml`` < ``VOXGATE_<SECTION>_<KEY>``
environment variables < command-line flags (``--<section>-<key> VALUE``, plus a few documented
short aliases such as ``--redis``). Every error names the offending key; the CLI prints it on one
line and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from voxgate.contract.dtmf import is_dtmf_key

# The subcommand registry every package adds its commands to (argparse's private type).
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

ENV_PREFIX = "VOXGATE_"
DEFAULT_CONFIG_NAME = "voxgate.toml"


class ConfigError(Exception):
    """A bad configuration value; ``str()`` names the key (``section.key``)."""


@dataclass
class BusConfig:
    # "memory": one process holds gateway and worker (the embedded default);
    # "redis": gateway and workers are separate processes sharing a Redis server.
    kind: str = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every Redis key/stream voxgate writes, so several deployments can share a server.
    prefix: str = "voxgate"
    # Cap (approximate MAXLEN) of each call's audio stream.
    audio_maxlen: int = 2000
    # Seconds a cancel marker lives; longer than any utterance can take.
    cancel_ttl_s: float = 120.0
    # Seconds a call's audio stream outlives its last chunk (refreshed by every chunk): what a
    # gateway killed without hanging up leaves in Redis is gone this long after the last audio.
    audio_ttl_s: float = 600.0

    def validate(self) -> None:
        _choice("bus.kind", self.kind, ("memory", "redis"))
        if self.kind == "redis" and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ConfigError(f"bus.redis_url: not a redis URL: {self.redis_url!r}")
        _positive("bus.audio_maxlen", self.audio_maxlen)
        _positive("bus.cancel_ttl_s", self.cancel_ttl_s)
        _positive("bus.audio_ttl_s", self.audio_ttl_s)


MAX_PRERENDER = 200  # synth.prerender: prompts, not a script


@dataclass
class SynthConfig:
    engine: str = "onnx"
    device: str = "cpu"
    # Empty: the bundled en_US-joe-medium; otherwise the path to a Piper voice's .onnx
    # (its .onnx.json must sit beside it).
    voice: str = ""
    # Utterances synthesised at once by one worker.
    concurrency: int = 4
    # onnxruntime / torch intra-op threads per engine call (0: library default).
    threads: int = 1
    # Longest request text accepted, in characters; longer gets a clear error, not a truncation.
    max_text_chars: int = 5000
    # Narrowband EQ boost across 1-3 kHz, in dB.
    eq_gain_db: float = 2.0
    # Wideband profile output rate (48000 for WebRTC/Opus, 16000 for G.722-style legs).
    wideband_rate: int = 48000
    # Finished renderings kept for repeated prompts (greetings, menus), in MiB; 0 disables it,
    # and with it the sharing of one rendering by callers asking for the same prompt at once.
    cache_mb: int = 64
    # Prompts rendered into that cache at start, after the worker is ready, in the background
    # (narrowband and wideband at wideband_rate): an IVR's greeting and menus, exactly as the
    # gateway says them, so that even the first callers get them from the cache.
    prerender: list[str] = field(default_factory=list)
    # The onnx engine's split, optimised graphs, kept between starts so a worker is ready in
    # about a second (synth.engines.graph_cache). Empty: $XDG_CACHE_HOME/voxgate/onnx, else
    # ~/.cache/voxgate/onnx; "off": split the voice's graph at every start (~3 s more). A
    # directory that cannot be created is a warning at start and no cache, not an error.
    graph_cache_dir: str = ""
    # Batching across utterances (issue 16): every utterance's model calls run as one batch per
    # step on one thread (synth.engines.batching). "auto": on for torch on cuda, off otherwise.
    batching: str = "auto"
    # Most calls in one batch (0: by device: 256 on cuda, 8 on a CPU).
    batch_max: int = 0
    # Latency budget of one batch in ms (-1: by device: 25 on cuda, none on a CPU; 0: none).
    batch_budget_ms: float = -1.0
    # The torch decoder's precision: fp32, fp16 or bf16 (the encoder stays fp32).
    precision: str = "fp32"

    def validate(self) -> None:
        _choice("synth.engine", self.engine, ("onnx", "torch"))
        _choice("synth.batching", self.batching, ("auto", "on", "off"))
        _choice("synth.precision", self.precision, ("fp32", "fp16", "bf16"))
        if self.engine == "onnx" and self.precision != "fp32":
            raise ConfigError("synth.precision: the onnx engine runs fp32; use engine 'torch'")
        if self.batch_max < 0:
            raise ConfigError(f"synth.batch_max: must be >= 0, got {self.batch_max}")
        if self.batch_budget_ms < -1:
            raise ConfigError(f"synth.batch_budget_ms: -1, 0 or more, got {self.batch_budget_ms}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"synth.device: expected 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.engine == "onnx" and self.device != "cpu":
            raise ConfigError(
                "synth.device: the onnx engine runs on 'cpu'; use engine 'torch' for cuda"
            )
        if self.voice and not Path(self.voice).is_file():
            raise ConfigError(f"synth.voice: no such voice file: {self.voice!r}")
        _positive("synth.concurrency", self.concurrency)
        if self.threads < 0:
            raise ConfigError(f"synth.threads: must be >= 0, got {self.threads}")
        _positive("synth.max_text_chars", self.max_text_chars)
        if not -12.0 <= self.eq_gain_db <= 12.0:
            raise ConfigError(f"synth.eq_gain_db: must be within [-12, 12], got {self.eq_gain_db}")
        _choice("synth.wideband_rate", self.wideband_rate, (16000, 48000))
        if self.cache_mb < 0:
            raise ConfigError(f"synth.cache_mb: must be >= 0, got {self.cache_mb}")
        if len(self.prerender) > MAX_PRERENDER:
            raise ConfigError(f"synth.prerender: at most {MAX_PRERENDER} prompts")
        for i, text in enumerate(self.prerender):
            if not text.strip() or len(text) > self.max_text_chars:
                raise ConfigError(
                    f"synth.prerender[{i}]: a prompt of 1 to synth.max_text_chars "
                    f"({self.max_text_chars}) characters, got {len(text.strip())}"
                )
        if self.prerender and self.cache_mb == 0:
            raise ConfigError("synth.prerender: needs the render cache (synth.cache_mb > 0)")
        if self.graph_cache_dir != self.graph_cache_dir.strip() or "\x00" in self.graph_cache_dir:
            # A path with stray spaces is almost always a quoting slip (and "off " would
            # silently become a directory called that).
            raise ConfigError(
                "synth.graph_cache_dir: leading/trailing whitespace or NUL in "
                f"{self.graph_cache_dir!r}"
            )


@dataclass
class WorkerConfig:
    # Consumer name inside the group; empty: hostname-pid.
    name: str = ""
    # A request pending this long on a silent consumer is claimed by another worker (XAUTOCLAIM).
    claim_idle_ms: int = 10000
    # Default deadline for a request that carries none, in seconds.
    default_deadline_s: float = 30.0
    # `voxgate worker`'s HTTP listener: /healthz, /readyz (warmed up and the bus answers) and
    # /metrics (Prometheus). Empty disables it. `voxgate serve` shows worker metrics on the
    # gateway's /metrics instead.
    http_listen: str = "127.0.0.1:9091"
    # Warm only what the first request needs before reporting ready, the rest in the
    # background at low priority (ready ~1 s sooner). false: all of the warm-up before ready.
    warm_background: bool = True

    def validate(self) -> None:
        _positive("worker.claim_idle_ms", self.claim_idle_ms)
        _positive("worker.default_deadline_s", self.default_deadline_s)
        if self.http_listen:
            parse_hostport("worker.http_listen", self.http_listen)


AUTH_MODES = ("auto", "off", "invite", "all")
DIGEST_ALGORITHMS = ("SHA-256", "MD5", "SHA-512-256")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class AccountConfig:
    """One ``[[gateway.accounts]]`` entry: a user who may register and call in (digest, RFC
    8760). The secret is ``password``, or the stored ``ha1`` (MD5, an htdigest value) and/or
    ``ha1_sha256``: ``H(username:realm:password)``, so the password need not be on the box."""

    username: str
    password: str = ""
    ha1: str = ""
    ha1_sha256: str = ""
    # Empty: gateway.auth_realm (an HA1 is only valid for the realm it was made with).
    realm: str = ""
    # Comma-separated algorithms this user is challenged with; empty: gateway.auth_algorithms.
    algorithms: str = ""


@dataclass(frozen=True)
class TrunkConfig:
    """One ``[[gateway.trunks]]`` entry: a carrier or PBX whose source addresses (IPv4/IPv6
    addresses or CIDR blocks in ``allow``) may send calls without authenticating."""

    name: str
    allow: list[str] = field(default_factory=list)


def split_algorithms(value: str) -> list[str]:
    """``"SHA-256, MD5"`` -> ``["SHA-256", "MD5"]`` (upper case, order kept)."""
    return [a.strip().upper() for a in value.split(",") if a.strip()]


@dataclass
class GatewayConfig:
    # SIP over UDP and TCP on the same address.
    sip_listen: str = "0.0.0.0:5060"
    # Control API and the softphone page (/phone).
    http_listen: str = "127.0.0.1:8080"
    # Bearer token for the control API; required when http_listen is not loopback.
    api_token: str = ""
    # Address put in SDP and Contact; empty: the address the SIP request came in on.
    public_address: str = ""
    rtp_port_min: int = 10000
    rtp_port_max: int = 20000
    # Calls above this get 503 with Retry-After.
    max_calls: int = 200
    # What wakes the media ticker that paces every call's RTP: "timerfd" (Linux: a kernel
    # timer at the packet's due time, within ~0.1 ms), "loop" (the event loop's own timer:
    # under uvloop 0-1 ms late, its clock and epoll timeout being whole milliseconds) or
    # "auto" (timerfd where available).
    media_timer: str = "auto"
    # Outbound calls go through this trunk (sip:host[:port]); empty: straight to the To URI.
    trunk: str = ""
    trunk_username: str = ""
    trunk_password: str = ""
    # REGISTER with the trunk (and refresh before expiry) when set.
    register: bool = False
    register_expires_s: int = 600
    # SIP identity for outbound calls and registration.
    from_user: str = "voxgate"
    # Ring (180) this long before answering an incoming call, as a person would; 0 answers at once.
    answer_delay_ms: int = 0
    # SIP timer T1, the round-trip estimate every retransmission and transaction lifetime is
    # scaled from (RFC 3261 §17.1.1.1: 500 ms; larger is RECOMMENDED on high-latency links,
    # smaller only in closed private networks). Timers B, F, H, J and L are 64×T1.
    sip_t1_ms: int = 500
    # While no warmed-up worker is serving, OPTIONS and INVITE get 503 + Retry-After; with this
    # set, an INVITE is held up to this long for a worker first, then answered or refused.
    unready_wait_ms: int = 0
    # A REFER from the far end (RFC 3515: "call this other party instead") is declined with 603
    # unless this is set; then the gateway places the referred call itself and reports its
    # progress in NOTIFYs.
    accept_refer: bool = False
    # Who may call (gateway.sip.access). auth: "auto" ("invite" once an account exists, else
    # "off": anyone may call, today's open default), "off" (no challenges), "invite" (a new
    # INVITE from outside every trunk's allow-list must authenticate: 401, digest) or "all"
    # (every request outside a dialog but ACK and CANCEL, OPTIONS too). With trunks and auth
    # off, an INVITE from outside them gets 403. REGISTER is always authenticated.
    auth: str = "auto"
    auth_realm: str = "voxgate"
    # Digest algorithms offered, one WWW-Authenticate each, most preferred first (RFC 8760).
    auth_algorithms: str = "SHA-256, MD5"
    # A nonce's lifetime; an answer to an older one gets a new challenge with stale=true.
    auth_nonce_s: float = 300.0
    # More accounts, one a line: user:password, or htdigest's user:realm:md5-ha1 with an
    # optional :sha256-ha1 (README: "Who may call").
    auth_users_file: str = ""
    accounts: list[AccountConfig] = field(default_factory=list)
    trunks: list[TrunkConfig] = field(default_factory=list)
    # The registrar (softphones REGISTER to voxgate with an account): the SIP domain of the
    # AORs (empty: any host; the user part is the AOR), binding lifetimes (shorter requests
    # get 423 Interval Too Brief, longer ones are cut), and the bounds on bindings per AOR
    # and in all.
    domain: str = ""
    registrar_min_expires_s: int = 60
    registrar_max_expires_s: int = 3600
    registrar_max_contacts: int = 5
    registrar_max_bindings: int = 10000
    # Floods and abuse (gateway.sip.limits): per source IP, token buckets for new INVITE,
    # REGISTER and OPTIONS requests (rate a second, burst; rate 0: no limit). The defaults let
    # one trunk or PBX carry a busy call centre (100 calls/s, 200 at once); loopback is not
    # exempt. Over a limit: "reject" (503 + Retry-After) or "drop" (silence, nothing reflected).
    limit_action: str = "reject"
    limit_retry_after_s: int = 5
    limit_invite_rate: float = 100.0
    limit_invite_burst: int = 200
    limit_register_rate: float = 20.0
    limit_register_burst: int = 40
    limit_options_rate: float = 20.0
    limit_options_burst: int = 40
    # Calls one source may have up at once; 0: only max_calls (a trunk brings every call from
    # one address).
    limit_calls_per_source: int = 0
    # Failed authentications from one source within the window that lock it out; 0: never.
    limit_auth_failures: int = 10
    limit_auth_window_s: float = 60.0
    limit_lockout_s: float = 300.0
    # Sources remembered by the limit tables (least recently seen forgotten first).
    limit_sources: int = 10000
    # SIP transactions held at once; a new request beyond it is refused like a rate limit.
    max_transactions: int = 8192
    # SIP over TLS (RFC 3261 §26, sips: URIs, transport=tls): "" is off, else HOST:PORT
    # (5061 is the standard port). TLS 1.2 at least; tls_cert/tls_key (PEM) are the
    # gateway's certificate chain and key, for the listener and as the client certificate
    # on outbound connections. tls_ca_file (PEM) verifies the peer's certificate on outbound
    # connections (with its host name; empty: the system's CA store) and, with
    # tls_verify_client, inbound clients (mutual TLS for trunks: no valid certificate, no
    # connection).
    tls_listen: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca_file: str = ""
    tls_verify_client: bool = False
    # SRTP with SDES keys (RFC 4568, RFC 3711) on SIP legs: "off" (plain RTP; RTP/SAVP
    # offers get 488), "optional" (encrypt when the peer offers or accepts a=crypto) or
    # "required" (plain RTP offers get 488; outbound offers are RTP/SAVP).
    srtp: str = "off"

    def validate(self) -> None:
        for key, value in (
            ("gateway.sip_listen", self.sip_listen),
            ("gateway.http_listen", self.http_listen),
        ):
            parse_hostport(key, value)
        if not 1024 <= self.rtp_port_min < self.rtp_port_max <= 65535:
            raise ConfigError(
                "gateway.rtp_port_min/rtp_port_max: need 1024 <= min < max <= 65535, got "
                f"{self.rtp_port_min}-{self.rtp_port_max}"
            )
        _positive("gateway.max_calls", self.max_calls)
        if self.trunk and not self.trunk.startswith(("sip:", "sips:")):
            raise ConfigError(f"gateway.trunk: expected a sip: URI, got {self.trunk!r}")
        if self.register and not self.trunk:
            raise ConfigError("gateway.register: needs gateway.trunk")
        _positive("gateway.register_expires_s", self.register_expires_s)
        if not 0 <= self.answer_delay_ms <= 60000:
            raise ConfigError(
                f"gateway.answer_delay_ms: must be 0-60000, got {self.answer_delay_ms}"
            )
        if not 50 <= self.sip_t1_ms <= 10000:
            raise ConfigError(f"gateway.sip_t1_ms: must be 50-10000, got {self.sip_t1_ms}")
        if not 0 <= self.unready_wait_ms <= 60000:
            raise ConfigError(
                f"gateway.unready_wait_ms: must be 0-60000, got {self.unready_wait_ms}"
            )
        _validate_access(self)
        _choice("gateway.limit_action", self.limit_action, ("reject", "drop"))
        _choice("gateway.media_timer", self.media_timer, ("auto", "timerfd", "loop"))
        if not 0 <= self.limit_retry_after_s <= 3600:
            raise ConfigError(
                f"gateway.limit_retry_after_s: must be 0-3600, got {self.limit_retry_after_s}"
            )
        for name in ("invite", "register", "options"):
            rate, burst = getattr(self, f"limit_{name}_rate"), getattr(self, f"limit_{name}_burst")
            if rate < 0:
                raise ConfigError(f"gateway.limit_{name}_rate: must be >= 0, got {rate}")
            if rate > 0:
                _positive(f"gateway.limit_{name}_burst", burst)
        for key in ("limit_calls_per_source", "limit_auth_failures"):
            if getattr(self, key) < 0:
                raise ConfigError(f"gateway.{key}: must be >= 0, got {getattr(self, key)}")
        _positive("gateway.limit_auth_window_s", self.limit_auth_window_s)
        _positive("gateway.limit_lockout_s", self.limit_lockout_s)
        _positive("gateway.limit_sources", self.limit_sources)
        _positive("gateway.max_transactions", self.max_transactions)
        _choice("gateway.srtp", self.srtp, ("off", "optional", "required"))
        if self.tls_listen:
            parse_hostport("gateway.tls_listen", self.tls_listen)
            for key in ("tls_cert", "tls_key"):
                if not getattr(self, key):
                    raise ConfigError(f"gateway.{key}: needed with gateway.tls_listen")
        for key in ("tls_cert", "tls_key", "tls_ca_file"):
            path = getattr(self, key)
            if path and not Path(path).is_file():
                raise ConfigError(f"gateway.{key}: no such file: {path!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("gateway.tls_cert/tls_key: set both or neither")
        if self.tls_verify_client and not (self.tls_listen and self.tls_ca_file):
            raise ConfigError(
                "gateway.tls_verify_client: needs gateway.tls_listen and gateway.tls_ca_file"
            )


def _validate_access(cfg: GatewayConfig) -> None:
    """Accounts, trunks and the registrar's keys (gateway.sip.access)."""
    _choice("gateway.auth", cfg.auth, AUTH_MODES)
    _check_realm("gateway.auth_realm", cfg.auth_realm)
    _check_algorithms("gateway.auth_algorithms", cfg.auth_algorithms, required=True)
    if cfg.auth_nonce_s < 1:
        raise ConfigError(f"gateway.auth_nonce_s: must be >= 1, got {cfg.auth_nonce_s}")
    if cfg.auth_users_file and not Path(cfg.auth_users_file).is_file():
        raise ConfigError(f"gateway.auth_users_file: no such file: {cfg.auth_users_file!r}")
    seen: set[tuple[str, str]] = set()
    for i, acct in enumerate(cfg.accounts):
        key = f"gateway.accounts[{i}]"
        user = acct.username
        if (
            not user
            or user != user.strip()
            or not user.isprintable()
            or any(c in user for c in '"\\:@ ')
        ):
            raise ConfigError(f"{key}.username: not a usable user name: {user!r}")
        if acct.realm:
            _check_realm(f"{key}.realm", acct.realm)
        if acct.password and (acct.ha1 or acct.ha1_sha256):
            raise ConfigError(f"{key}: set password or ha1/ha1_sha256, not both")
        if not (acct.password or acct.ha1 or acct.ha1_sha256):
            raise ConfigError(f"{key}: needs password, ha1 or ha1_sha256")
        for name, length in (("ha1", 32), ("ha1_sha256", 64)):
            value = getattr(acct, name)
            if value and (len(value) != length or not set(value) <= _HEX_DIGITS):
                raise ConfigError(f"{key}.{name}: expected {length} hex digits")
        _check_algorithms(f"{key}.algorithms", acct.algorithms, required=False)
        realm = acct.realm or cfg.auth_realm
        if (user, realm) in seen:
            raise ConfigError(f"{key}.username: {user!r} is defined twice")
        seen.add((user, realm))
    names: set[str] = set()
    for i, trunk in enumerate(cfg.trunks):
        key = f"gateway.trunks[{i}]"
        if not trunk.name or trunk.name in names:
            raise ConfigError(f"{key}.name: needs a name of its own, got {trunk.name!r}")
        names.add(trunk.name)
        if not trunk.allow:
            raise ConfigError(f"{key}.allow: list the trunk's source addresses or CIDR blocks")
        for item in trunk.allow:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ConfigError(
                    f"{key}.allow: {item!r} is not an IPv4/IPv6 address or CIDR block"
                ) from None
    has_accounts = bool(cfg.accounts or cfg.auth_users_file)
    if cfg.auth in ("invite", "all") and not has_accounts:
        raise ConfigError(
            f"gateway.auth: {cfg.auth!r} needs gateway.accounts or gateway.auth_users_file"
        )
    if any(c.isspace() for c in cfg.domain):
        raise ConfigError(f"gateway.domain: a host name, got {cfg.domain!r}")
    _positive("gateway.registrar_min_expires_s", cfg.registrar_min_expires_s)
    if cfg.registrar_max_expires_s < cfg.registrar_min_expires_s:
        raise ConfigError(
            "gateway.registrar_max_expires_s: must be >= registrar_min_expires_s "
            f"({cfg.registrar_min_expires_s}), got {cfg.registrar_max_expires_s}"
        )
    _positive("gateway.registrar_max_contacts", cfg.registrar_max_contacts)
    _positive("gateway.registrar_max_bindings", cfg.registrar_max_bindings)


def _check_realm(key: str, realm: str) -> None:
    # The realm goes into a quoted-string of every challenge.
    if not realm or not realm.isprintable() or any(c in realm for c in '"\\'):
        raise ConfigError(f"{key}: not a usable realm: {realm!r}")


def _check_algorithms(key: str, value: str, *, required: bool) -> None:
    algorithms = split_algorithms(value)
    if required and not algorithms:
        raise ConfigError(f"{key}: name at least one of {', '.join(DIGEST_ALGORITHMS)}")
    for alg in algorithms:
        if alg not in DIGEST_ALGORITHMS:
            raise ConfigError(f"{key}: unknown digest algorithm {alg!r}")
    if len(set(algorithms)) != len(algorithms):
        raise ConfigError(f"{key}: an algorithm named twice in {value!r}")


@dataclass
class IvrConfig:
    """The embedded agent: a greeting, a DTMF menu, prompts per key, hang-up."""

    greeting: str = (
        "Thank you for calling voxgate. For our opening hours, press 1. "
        "For your account balance, press 2. To hear these options again, press 9. "
        "To end the call, press 0."
    )
    # Digit -> prompt spoken when it is pressed.
    menu: dict[str, str] = field(
        default_factory=lambda: {
            "1": "We are open Monday to Friday, from 8 AM to 6 PM, and on Saturdays from 9 to 1.",
            "2": "Your current balance is $1,234.56. "
            "Your next payment of $85 is due on 03/15/2026.",
            "0": "Thank you for calling. Goodbye.",
        }
    )
    # Digits that hang up once their prompt has been spoken.
    hangup_digits: str = "0"
    repeat_digit: str = "9"
    invalid: str = "Sorry, that is not a valid option."
    # Pressing a key while a prompt plays interrupts it.
    dtmf_interrupts: bool = True
    # Hang up after this long with no key pressed after the last prompt (0: never).
    idle_timeout_s: float = 30.0
    goodbye: str = "We did not receive any input. Goodbye."

    def validate(self) -> None:
        for digit in [*self.menu, *self.hangup_digits, *self.repeat_digit]:
            if not is_dtmf_key(digit):
                raise ConfigError(f"ivr.menu: {digit!r} is not a DTMF key (0-9 * # A-D)")
        for digit in self.hangup_digits:
            if digit not in self.menu:
                raise ConfigError(f"ivr.hangup_digits: {digit!r} has no prompt in ivr.menu")
        if not self.greeting.strip():
            raise ConfigError("ivr.greeting: must not be empty")
        if self.idle_timeout_s < 0:
            raise ConfigError(f"ivr.idle_timeout_s: must be >= 0, got {self.idle_timeout_s}")


@dataclass
class AgentConfig:
    """Which agent answers a call (a call placed through the API may name its own)."""

    # "ivr": the DTMF menu of [ivr] (the embedded default); "llm": a conversation through an
    # OpenAI-compatible chat endpoint ([llm]), hearing the caller with speech-to-text ([turn]);
    # "stream": a bot's WebSocket speaking Twilio Media Streams ([stream]); "flow": a call
    # flow of verbs (say, gather, transfer, ...) from a file or a webhook ([flow]).
    kind: str = "ivr"

    def validate(self) -> None:
        _choice("agent.kind", self.kind, AGENT_KINDS)


AGENT_KINDS = ("ivr", "llm", "stream", "flow")


@dataclass
class LlmConfig:
    """The ``llm`` agent's model: any OpenAI-compatible endpoint (vLLM, llama-server, Ollama,
    a hosted API, ``voxgate mock-llm``)."""

    # e.g. http://127.0.0.1:8000/v1 (chat completions are POSTed to {base_url}/chat/completions).
    base_url: str = ""
    model: str = "default"
    # The NAME of the environment variable holding the API key (never the key itself: config
    # files get committed and printed). Empty: no Authorization header.
    api_key_env: str = ""
    system_prompt: str = (
        "You are the voice agent of a call center, speaking with a caller on the phone. "
        "Answer in one or two short spoken sentences, without lists, markup or emojis. "
        "Use the tools to end the call or send keys when asked."
    )
    # Spoken when the call is answered (a call's vars may replace it: {"greeting": ...});
    # {name} placeholders are filled from the call's vars.
    greeting: str = "Hello, thank you for calling. How can I help you today?"
    temperature: float = 0.3
    max_tokens: int = 200
    # The endpoint must answer (first token) and keep streaming within this long.
    timeout_s: float = 8.0
    # Spoken when the model is unreachable, too slow or answers garbage; the call goes on.
    fallback: str = "Sorry, I did not catch that. Could you say it again?"
    # Conversation messages kept (besides the system prompt); older turns are dropped.
    max_history: int = 40

    def validate(self) -> None:
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm.base_url: expected an http(s) URL, got {self.base_url!r}")
        if self.api_key_env and not self.api_key_env.replace("_", "").isalnum():
            raise ConfigError(
                "llm.api_key_env: the NAME of an environment variable (not the key), "
                f"got {self.api_key_env!r}"
            )
        if not 0.0 <= self.temperature <= 2.0:
            raise ConfigError(f"llm.temperature: must be 0-2, got {self.temperature}")
        _positive("llm.max_tokens", self.max_tokens)
        _positive("llm.timeout_s", self.timeout_s)
        _positive("llm.max_history", self.max_history)
        if not self.fallback.strip():
            raise ConfigError("llm.fallback: must not be empty (it is what callers hear)")

    def api_key(self, env: Mapping[str, str] | None = None) -> str | None:
        if not self.api_key_env:
            return None
        env = os.environ if env is None else env
        key = env.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"llm.api_key_env: the environment variable {self.api_key_env} is not set"
            )
        return key


@dataclass
class StreamConfig:
    """The ``stream`` agent: voxgate dials a bot's WebSocket and speaks Twilio Media Streams to
    it, as Twilio's ``<Connect><Stream url=...>`` does, so a bot written for Twilio (pipecat's
    ``TwilioFrameSerializer``) takes voxgate's calls unmodified."""

    # The bot's WebSocket, ws:// or wss:// (a call placed through the API may name its own).
    url: str = ""
    # wss:// only: a PEM file of the private CA that signed the bot's certificate (then only
    # that CA is trusted); empty: the system's CAs. Certificates are always verified.
    ca_file: str = ""
    # The bot's WebSocket handshake must complete within this long (s).
    connect_timeout_s: float = 5.0
    # Turn the caller's audio 30 dB down while the bot's own voice may be echoing back on the
    # line (the barge-in detector's estimate), so the bot's VAD does not interrupt itself.
    echo_gate: bool = False
    # voxgate's own barge-in on the bot's audio; off: the bot owns turn-taking (it sends
    # "clear" when it is interrupted).
    barge_in: bool = False
    # Said when the bot is unreachable or breaks the protocol, before the call is hung up;
    # empty: hang up at once.
    fallback: str = "Sorry, we cannot take your call right now. Please try again later."
    # The accountSid given to bots in "start" (Twilio's shape: AC + 32 hex digits); set it to
    # the bot's TWILIO_ACCOUNT_SID, and the Twilio-compatible hang-up route then answers only
    # for that account. Empty: one is made up per gateway start and the route takes any.
    account_sid: str = ""

    def validate(self) -> None:
        if self.account_sid and not re.fullmatch(r"AC[0-9a-fA-F]{32}", self.account_sid):
            raise ConfigError(
                "stream.account_sid: expected AC followed by 32 hex digits (a Twilio account "
                f"SID), got {self.account_sid!r}"
            )
        if self.url:
            check_stream_url("stream.url", self.url)
        if self.ca_file and not Path(self.ca_file).is_file():
            raise ConfigError(f"stream.ca_file: no such file: {self.ca_file!r}")
        if not 0 < self.connect_timeout_s <= 60:
            raise ConfigError(
                f"stream.connect_timeout_s: must be > 0 and <= 60, got {self.connect_timeout_s}"
            )


def check_stream_url(key: str, url: str) -> None:
    """A bot's WebSocket URL: ws:// or wss://, with a host, no spaces."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigError(f"{key}: not a URL: {url!r} ({exc})") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ConfigError(f"{key}: expected a ws:// or wss:// URL with a host, got {url!r}")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ConfigError(f"{key}: must not contain whitespace or control characters")


@dataclass
class FlowConfig:
    """The ``flow`` agent (``gateway.flow``): call flows of verbs, as jambonz and TwiML write
    them, from a file checked at start and/or a webhook asked during the call."""

    # A TOML or JSON file of named flows (see docs/flows.md); checked whole at start. Empty
    # (and no url): the built-in flow, gateway/flow/default.toml — the IVR menu of [ivr]'s
    # defaults, what `make serve` answers calls with.
    file: str = ""
    # A webhook (http or https) that calls start by asking for verbs (then its verbs' action
    # URLs); with file set too, its verbs may go to the file's flows.
    url: str = ""
    # The file's flow a call starts with; empty: the file's own "start" (else "main").
    start: str = ""
    # Said before the call is hung up when the flow cannot go on (a webhook answering
    # garbage, slowly or with an error).
    fallback: str = "Sorry, we cannot take your call right now. Please try again later."
    # The NAME of the environment variable holding the webhook's HMAC-SHA256 secret (requests
    # then carry X-Voxgate-Signature); empty: requests are not signed.
    secret_env: str = ""
    # Each webhook request must be answered within this long (s).
    timeout_s: float = 5.0
    # Retries after a connection failure or a 5xx answer (not after a timeout or a 4xx).
    retries: int = 2
    # Longest webhook answer read, in bytes.
    max_response_bytes: int = 262144

    def validate(self) -> None:
        if self.file and not Path(self.file).is_file():
            raise ConfigError(f"flow.file: no such file: {self.file!r}")
        if self.url and (
            not self.url.startswith(("http://", "https://"))
            or any(c.isspace() or ord(c) < 0x20 for c in self.url)
        ):
            raise ConfigError(f"flow.url: expected an http(s) URL, got {self.url!r}")
        if self.start and not self.file:
            raise ConfigError("flow.start: names a flow of flow.file, which is not set")
        if not self.fallback.strip():
            raise ConfigError("flow.fallback: must not be empty (it is what callers hear)")
        if self.secret_env and not self.secret_env.replace("_", "").isalnum():
            raise ConfigError(
                "flow.secret_env: the NAME of an environment variable (not the secret), "
                f"got {self.secret_env!r}"
            )
        if not 0 < self.timeout_s <= 60:
            raise ConfigError(f"flow.timeout_s: must be > 0 and <= 60, got {self.timeout_s}")
        if not 0 <= self.retries <= 10:
            raise ConfigError(f"flow.retries: must be 0-10, got {self.retries}")
        if not 1024 <= self.max_response_bytes <= 16 * 1024 * 1024:
            raise ConfigError(
                f"flow.max_response_bytes: must be 1024-16777216, got {self.max_response_bytes}"
            )

    def secret(self, env: Mapping[str, str] | None = None) -> bytes | None:
        if not self.secret_env:
            return None
        env = os.environ if env is None else env
        value = env.get(self.secret_env)
        if not value:
            raise ConfigError(
                f"flow.secret_env: the environment variable {self.secret_env} is not set"
            )
        return value.encode()


@dataclass
class TurnConfig:
    """When the caller has finished speaking (the ``llm`` agent's turn-taking)."""

    # Silence (VAD) after speech before the end-of-turn model is asked.
    min_silence_ms: int = 300
    # Silence that ends the turn even when the model thinks the caller is not finished.
    max_silence_ms: int = 1500
    # The semantic end-of-turn model (smart-turn v3, bundled in pipecat-ai); off: silence only
    # (min_silence_ms ends the turn).
    smart_turn: bool = True
    # Probability of "finished" from which the model's verdict ends the turn.
    threshold: float = 0.5
    # webrtcvad mode on the caller's audio for turn-taking (0 least .. 3 most aggressive).
    vad_aggressiveness: int = 2
    # Longest single caller utterance transcribed in one piece; a monologue is cut there.
    max_segment_s: float = 15.0
    # Speech-to-text: CPU threads for the recogniser (shared by all calls, one decode at a time).
    stt_threads: int = 2

    def validate(self) -> None:
        if not 60 <= self.min_silence_ms <= 5000:
            raise ConfigError(f"turn.min_silence_ms: must be 60-5000, got {self.min_silence_ms}")
        if not self.min_silence_ms <= self.max_silence_ms <= 10000:
            raise ConfigError(
                "turn.max_silence_ms: must be between turn.min_silence_ms and 10000, got "
                f"{self.max_silence_ms}"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"turn.threshold: must be between 0 and 1, got {self.threshold}")
        if self.vad_aggressiveness not in (0, 1, 2, 3):
            raise ConfigError(
                f"turn.vad_aggressiveness: must be 0-3, got {self.vad_aggressiveness}"
            )
        if not 1.0 <= self.max_segment_s <= 120.0:
            raise ConfigError(f"turn.max_segment_s: must be 1-120, got {self.max_segment_s}")
        if not 1 <= self.stt_threads <= 64:
            raise ConfigError(f"turn.stt_threads: must be 1-64, got {self.stt_threads}")


@dataclass
class BargeinSettings:
    """Caller speech over the agent: VAD on inbound audio, echo-aware (gateway.media.bargein)."""

    enabled: bool = True
    # webrtcvad mode 0 (least) .. 3 (most aggressive at rejecting non-speech).
    aggressiveness: int = 2
    # Evidence needed from the speech onset to the barge-in decision: two 20 ms frames. 40
    # keeps 0 false barge-ins on -10..-25 dB echo at 20-250 ms (tests/bargein) and is 20 ms
    # sooner than 60; one frame (20) lets noise bursts through.
    min_speech_ms: int = 40
    # Non-speech after which the caller is taken to have stopped.
    hangover_ms: int = 300
    # How far a band must exceed the expected echo of the agent's voice to count as caller.
    echo_margin_db: float = 6.0
    # Cosine fade of the agent's audio on barge-in (and on a DTMF interrupt).
    fade_ms: float = 10.0
    # Analysis frame of the detector: 20 ms halves its CPU (~75 vs ~150 us per call per 20 ms
    # of audio) for a coarser onset estimate (p95 error ~55 vs ~30 ms); 10 ms is finer.
    frame_ms: int = 20
    # Caller speech starting within this long of the call's first inbound audio never barges
    # in: a microphone opening (a browser's first ~220 ms, a click) or an echo canceller still
    # converging is not a caller talking over a greeting that has barely begun.
    start_guard_ms: int = 250
    # SIP legs: the detector and the agents' ears (speech-to-text, a bridged bot) take each
    # caller packet as it arrives, not after the jitter buffer's playout delay (40-200 ms
    # sooner); the jitter buffer then only plays the caller out (recording, a bridged party).
    on_arrival: bool = True

    def validate(self) -> None:
        if not 0 <= self.start_guard_ms <= 5000:
            raise ConfigError(f"bargein.start_guard_ms: must be 0-5000, got {self.start_guard_ms}")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ConfigError(f"bargein.aggressiveness: must be 0-3, got {self.aggressiveness}")
        if not 0 <= self.min_speech_ms <= 2000:
            raise ConfigError(f"bargein.min_speech_ms: must be 0-2000, got {self.min_speech_ms}")
        if not 0 <= self.hangover_ms <= 5000:
            raise ConfigError(f"bargein.hangover_ms: must be 0-5000, got {self.hangover_ms}")
        if not 0 <= self.echo_margin_db <= 40:
            raise ConfigError(f"bargein.echo_margin_db: must be 0-40, got {self.echo_margin_db}")
        if not 1 <= self.fade_ms <= 50:
            raise ConfigError(f"bargein.fade_ms: must be 1-50, got {self.fade_ms}")
        _choice("bargein.frame_ms", self.frame_ms, (10, 20, 30))


@dataclass
class WebrtcConfig:
    """The browser leg (gateway/webrtc): softphone page at /phone, offers at /api/webrtc/offer."""

    enabled: bool = True
    # ICE servers for both peers, comma-separated (stun:host:3478, turn:host?transport=udp).
    # Empty by default: nothing leaves the machine unless an operator asks for it.
    ice_servers: str = ""
    # Credentials for the turn: URLs above.
    ice_username: str = ""
    ice_credential: str = ""
    # A browser that sends no audio for this long (tab closed, network gone) is hung up.
    media_timeout_s: float = 5.0
    # ICE + DTLS must complete within this long after the answer, or the call is dropped.
    connect_timeout_s: float = 15.0

    def ice_urls(self) -> list[str]:
        return [u.strip() for u in self.ice_servers.split(",") if u.strip()]

    def validate(self) -> None:
        for url in self.ice_urls():
            if not url.startswith(("stun:", "stuns:", "turn:", "turns:")):
                raise ConfigError(f"webrtc.ice_servers: expected stun:/turn: URLs, got {url!r}")
        _positive("webrtc.media_timeout_s", self.media_timeout_s)
        _positive("webrtc.connect_timeout_s", self.connect_timeout_s)


@dataclass
class RecordingConfig:
    """Call recording (``gateway.media.recording``): WAV files written off the media path."""

    # Where recordings are written (created when first needed).
    dir: str = "recordings"
    # File name under dir. Fields: {date} (YYYY-MM-DD, UTC), {time} (HHMMSS, UTC), {call_id},
    # {caller} (the other party's user part), {id} (the recording's id); every value is cut
    # down to [A-Za-z0-9._+-], so no caller string can leave dir.
    pattern: str = "{date}/{time}-{call_id}-{caller}.wav"
    # "both": stereo, caller left, agent right; "caller": mono, the caller only.
    channels: str = "both"
    # Record every call from its answer (otherwise only when an agent or the API asks).
    record_all: bool = False
    # Recordings older than this many days are deleted by an hourly sweep (0: kept forever).
    retention_days: int = 0
    # Audio the writer may fall behind the media path by before frames are dropped (s).
    max_queue_s: float = 10.0

    def validate(self) -> None:
        import string

        if not self.dir.strip():
            raise ConfigError("recording.dir: must not be empty")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.pattern) if f is not None}
        except ValueError as exc:
            raise ConfigError(f"recording.pattern: {exc}: {self.pattern!r}") from None
        unknown = sorted(fields - set(RECORDING_FIELDS))
        if unknown:
            known = ", ".join(RECORDING_FIELDS)
            raise ConfigError(f"recording.pattern: unknown field(s) {unknown}; known: {known}")
        parts = self.pattern.replace("\\", "/").split("/")
        if self.pattern.startswith("/") or ".." in parts or not self.pattern.endswith(".wav"):
            raise ConfigError(
                "recording.pattern: must be a relative path ending in .wav, without '..', got "
                f"{self.pattern!r}"
            )
        _choice("recording.channels", self.channels, ("both", "caller"))
        if self.retention_days < 0:
            raise ConfigError(f"recording.retention_days: must be >= 0, got {self.retention_days}")
        if not 0 < self.max_queue_s <= 600:
            raise ConfigError(
                f"recording.max_queue_s: must be > 0 and <= 600, got {self.max_queue_s}"
            )


RECORDING_FIELDS = ("date", "time", "call_id", "caller", "id")


@dataclass
class CampaignConfig:
    """Outbound campaigns (``gateway.campaign.service``): where their state lives, who this
    gateway is to the store, and the limits on what one campaign may hold.

    With ``[bus] kind = "redis"`` the state lives in the bus's Redis (``bus.redis_url``, under
    ``bus.prefix``), shared by every gateway on it; otherwise in the SQLite file ``db``.
    """

    # SQLite file of the campaigns when the bus is not Redis (created when first needed).
    db: str = "campaigns.sqlite"
    # This gateway's id in the store's claims. Empty: "<hostname>:<SIP port>", stable across
    # restarts, so a restarted gateway settles its own interrupted claims at once.
    owner: str = ""
    # A claim's lease: a gateway that dies holds its contacts this long before another one
    # settles them (live calls renew it every third of it).
    lease_s: float = 120.0
    # How often a gateway looks for campaigns created or resumed elsewhere (s).
    scan_s: float = 5.0
    # Contacts per campaign, and the size of a POST /api/campaigns body (bytes).
    max_contacts: int = 100_000
    max_request_bytes: int = 16 * 1024 * 1024
    # Answering-machine detection settings (``gateway.amd.detector.AmdConfig`` fields, as
    # strings: ``{"greeting" = "1500"}``); empty: the defaults.
    amd: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.owner != self.owner.strip() or any(c.isspace() for c in self.owner):
            raise ConfigError(f"campaign.owner: must not contain whitespace, got {self.owner!r}")
        if not self.db.strip():
            raise ConfigError("campaign.db: must not be empty")
        if not 5 <= self.lease_s <= 3600:
            raise ConfigError(f"campaign.lease_s: must be from 5 to 3600, got {self.lease_s}")
        if not 0 < self.scan_s <= 300:
            raise ConfigError(f"campaign.scan_s: must be > 0 and <= 300, got {self.scan_s}")
        if not 1 <= self.max_contacts <= 10_000_000:
            raise ConfigError(
                f"campaign.max_contacts: must be from 1 to 10000000, got {self.max_contacts}"
            )
        if not 1024 <= self.max_request_bytes <= 1024**3:
            raise ConfigError(
                "campaign.max_request_bytes: must be from 1024 to 1073741824, got "
                f"{self.max_request_bytes}"
            )
        # The AMD settings' names and values are checked by the gateway, which knows
        # ``AmdConfig`` (this module imports no side: tests/test_layout.py).
        for name in self.amd:
            if not name.isidentifier():
                raise ConfigError(f"campaign.amd: bad setting name {name!r}")


@dataclass
class LogConfig:
    level: str = "info"
    # "json" (structured, for operators) or "text".
    format: str = "text"

    def validate(self) -> None:
        _choice("log.level", self.level, ("debug", "info", "warning", "error"))
        _choice("log.format", self.format, ("json", "text"))


@dataclass
class Config:
    bus: BusConfig = field(default_factory=BusConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    ivr: IvrConfig = field(default_factory=IvrConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    bargein: BargeinSettings = field(default_factory=BargeinSettings)
    webrtc: WebrtcConfig = field(default_factory=WebrtcConfig)
    recording: RecordingConfig = field(default_factory=RecordingConfig)
    campaign: CampaignConfig = field(default_factory=CampaignConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate()
        if self.agent.kind == "llm" and not self.llm.base_url:
            raise ConfigError(
                "llm.base_url: the llm agent needs an OpenAI-compatible endpoint "
                "(set [llm] base_url, VOXGATE_LLM_BASE_URL or --llm-base-url, e.g. "
                "http://127.0.0.1:8000/v1)"
            )
        if self.agent.kind == "stream" and not self.stream.url:
            raise ConfigError(
                "stream.url: the stream agent needs the bot's WebSocket URL (set [stream] url, "
                "VOXGATE_STREAM_URL or --stream-url, e.g. ws://127.0.0.1:8765/ws)"
            )


# Short flags documented in the README, mapped onto section.key.
ALIASES: dict[str, str] = {
    "redis": "bus.redis_url",
    "engine": "synth.engine",
    "device": "synth.device",
    "voice": "synth.voice",
    "concurrency": "synth.concurrency",
    "sip-listen": "gateway.sip_listen",
    "http-listen": "gateway.http_listen",
}


def parse_hostport(key: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); port 0 picks a free one (tests)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(f"{key}: expected [IPV6]:PORT, got {value!r}")
        host = host[1:-1]
    return host, int(port)


def _choice(key: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{key}: must be > 0, got {value}")


def _field_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(key: str, typ: type, value: object) -> Any:
    """Turn a TOML value or an env/flag string into ``typ``; name the key on failure."""
    if isinstance(typ, types.UnionType):  # pragma: no cover - no optional keys yet
        typ = next(t for t in typing.get_args(typ) if t is not type(None))
    if typing.get_origin(typ) is list:
        # A TOML array (of tables, for [[gateway.accounts]]); from the environment or a flag,
        # the same as a JSON array.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a JSON array, got {value!r}") from None
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected an array, got {value!r}")
        (item_type,) = typing.get_args(typ)
        return [_coerce_item(f"{key}[{i}]", item_type, v) for i, v in enumerate(value)]
    if typing.get_origin(typ) is dict:
        # A TOML table; from the environment or a flag, the same as a JSON object.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a JSON object, got {value!r}") from None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError(f"{key}: expected a table of strings, got {value!r}")
        return dict(value)
    if isinstance(value, str) and typ is not str:
        text = value.strip()
        try:
            if typ is bool:
                low = text.lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            if typ is int:
                return int(text)
            if typ is float:
                return float(text)
        except ValueError:
            raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"{key}: expected bool, got {value!r}")
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}: expected int, got {value!r}")
    if not isinstance(value, typ):
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}")
    return value


def _coerce_item(key: str, typ: type, value: object) -> Any:
    """One element of an array key: a table becomes ``typ`` (a dataclass), field by field."""
    if not dataclasses.is_dataclass(typ):
        return _coerce(key, typ, value)
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table, got {value!r}")
    types_ = _field_types(typ)
    unknown = sorted(set(value) - set(types_))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key")
    required = [
        f.name
        for f in dataclasses.fields(typ)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for name in required:
        if name not in value:
            raise ConfigError(f"{key}.{name}: missing")
    return typ(**{name: _coerce(f"{key}.{name}", types_[name], v) for name, v in value.items()})


def _apply(cfg: Config, key: str, value: object) -> None:
    section_name, _, name = key.partition(".")
    section_types = {f.name: f.type for f in dataclasses.fields(Config)}
    if section_name not in section_types:
        raise ConfigError(f"{key}: unknown section {section_name!r}")
    section = getattr(cfg, section_name)
    types_ = _field_types(type(section))
    if name not in types_:
        raise ConfigError(f"{key}: unknown key")
    setattr(section, name, _coerce(key, types_[name], value))


def all_keys() -> list[tuple[str, type, object]]:
    """Every ``section.key`` with its type and default, in declaration order."""
    out: list[tuple[str, type, object]] = []
    defaults = Config()
    for f in dataclasses.fields(Config):
        section = getattr(defaults, f.name)
        for name, typ in _field_types(type(section)).items():
            out.append((f"{f.name}.{name}", typ, getattr(section, name)))
    return out


def add_config_arguments(
    parser: argparse.ArgumentParser, keys: Sequence[str] | None = None
) -> None:
    """Add ``--config`` and one ``--section-key`` flag per config key the command reads (plus
    the aliases of those keys).

    ``keys``: whole sections (``"gateway"``) and single keys (``"synth.max_text_chars"``);
    None: every key.  Keys left out are still read from the file and the environment; they
    just have no flag on this command (``voxgate worker --help`` shows no SIP settings)."""
    group = parser.add_argument_group("configuration (override voxgate.toml and VOXGATE_* env)")
    group.add_argument(
        "--config", metavar="FILE", help="config file (default: ./voxgate.toml if present)"
    )
    wanted = None if keys is None else set(keys)

    def shown(key: str) -> bool:
        return wanted is None or key in wanted or key.split(".", 1)[0] in wanted

    if wanted is not None:
        known = {k for k, _, _ in all_keys()} | {f.name for f in dataclasses.fields(Config)}
        unknown = sorted(wanted - known)
        if unknown:
            raise ValueError(f"add_config_arguments: unknown config keys {unknown}")
    for key, typ, default in all_keys():
        if not shown(key):
            continue
        flag = "--" + key.replace(".", "-").replace("_", "-")
        group.add_argument(
            flag,
            dest="cfg:" + key,
            metavar=typ.__name__.upper(),
            default=None,
            help=f"{key} (default {default!r})",
        )
    for alias, key in ALIASES.items():
        if not shown(key):
            continue
        group.add_argument(
            "--" + alias,
            dest="cfg:" + key,
            default=None,
            help=f"same as --{key.replace('.', '-').replace('_', '-')}",
        )


# What each command reads (its --help lists only these).  The gateway reads three keys of the
# worker's sections: the text limit it enforces before a request goes out, the rate browser
# legs play at, and the worker's deadline (its own give-up timer is that plus a margin).
GATEWAY_KEYS: tuple[str, ...] = (
    "bus", "gateway", "ivr", "agent", "llm", "stream", "flow", "turn", "bargein", "webrtc",
    "recording", "campaign", "log",
    "synth.max_text_chars", "synth.wideband_rate", "worker.default_deadline_s",
)  # fmt: skip
WORKER_KEYS: tuple[str, ...] = ("bus", "synth", "worker", "log")
SYNTH_KEYS: tuple[str, ...] = ("synth", "log")


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Build a validated Config from file, environment and overrides (``{"synth.engine": ...}``)."""
    env = os.environ if env is None else env
    cfg = Config()
    if path is None and Path(DEFAULT_CONFIG_NAME).is_file():
        path = DEFAULT_CONFIG_NAME
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config: no such file: {os.fspath(path)!r}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {os.fspath(path)}: invalid TOML: {exc}") from None
        for section_name, section in data.items():
            if not isinstance(section, dict):
                raise ConfigError(f"{section_name}: expected a [{section_name}] table")
            for name, value in section.items():
                _apply(cfg, f"{section_name}.{name}", value)
    known = {k for k, _, _ in all_keys()}
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX) or var in ("VOXGATE_CONFIG",):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        section_name, _, name = rest.partition("_")
        key = f"{section_name}.{name}"
        if key not in known:
            # A typo in an operator's environment must not be silently ignored.
            raise ConfigError(f"{var}: unknown setting (no key {key!r})")
        _apply(cfg, key, value)
    for key, value in (overrides or {}).items():
        if value is not None:
            _apply(cfg, key, value)
    cfg.validate()
    return cfg


def load_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Config:
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:") and v is not None}
    env_ = os.environ if env is None else env
    path = getattr(args, "config", None) or env_.get("VOXGATE_CONFIG")
    return load(path, env_, overrides)
