"""The gateway's :class:`~gateway.sip.access.Gatekeeper` built from ``[gateway]`` config: the
accounts (``[[gateway.accounts]]`` and ``gateway.auth_users_file``), the trunks' allow-lists,
the auth mode and the registrar. The one piece of I/O is reading the users file, once, at
start; a bad line stops the start with a config error naming it."""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.call.control import ControlError
from gateway.sip.access import Gatekeeper, Mode, Trunk
from gateway.sip.auth import Account, AccountError, DigestServer, parse_users_file
from gateway.sip.limits import SourceLimits
from gateway.sip.registrar import LocationService, RegistrarSettings
from voxgate.contract.config import ConfigError, GatewayConfig, split_algorithms

log = logging.getLogger("voxgate.sip")


class NotRegisteredError(ControlError):
    """POST /api/calls to a local user (``"alice"``) with no live registration: 404."""

    status = 404
    code = "not_registered"


def accounts_from_config(cfg: GatewayConfig) -> list[Account]:
    accounts: list[Account] = []
    for i, entry in enumerate(cfg.accounts):
        realm = entry.realm or cfg.auth_realm
        algorithms = split_algorithms(entry.algorithms)
        try:
            if entry.password:
                account = Account.with_password(entry.username, realm, entry.password, algorithms)
            else:
                account = Account.with_ha1(
                    entry.username, realm, md5=entry.ha1, sha256=entry.ha1_sha256,
                    algorithms=algorithms,
                )  # fmt: skip
        except AccountError as exc:
            raise ConfigError(f"gateway.accounts[{i}]: {exc}") from None
        accounts.append(account)
    if cfg.auth_users_file:
        try:
            text = Path(cfg.auth_users_file).read_text(encoding="utf-8")
            accounts += parse_users_file(text, cfg.auth_realm)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"gateway.auth_users_file: cannot read it: {exc}") from None
        except AccountError as exc:
            raise ConfigError(f"gateway.auth_users_file: {exc}") from None
    return accounts


def build_gatekeeper(cfg: GatewayConfig, limits: SourceLimits | None) -> Gatekeeper:
    accounts = accounts_from_config(cfg)
    digest: DigestServer | None = None
    if accounts:
        try:
            digest = DigestServer(
                accounts, realm=cfg.auth_realm, algorithms=split_algorithms(cfg.auth_algorithms),
                nonce_ttl_s=cfg.auth_nonce_s,
            )  # fmt: skip
        except AccountError as exc:
            raise ConfigError(f"gateway.accounts: {exc}") from None
    mode: Mode
    if cfg.auth == "auto":
        mode = "invite" if digest is not None else "off"
    else:
        assert cfg.auth in ("off", "invite", "all"), cfg.auth  # GatewayConfig.validate
        mode = cfg.auth  # type: ignore[assignment]  # narrowed by the assertion
    trunks = [Trunk.parse(t.name, t.allow) for t in cfg.trunks]
    location = None
    if digest is not None:
        location = LocationService(RegistrarSettings(
            min_expires_s=cfg.registrar_min_expires_s,
            max_expires_s=cfg.registrar_max_expires_s,
            default_expires_s=min(3600, cfg.registrar_max_expires_s),
            max_per_aor=cfg.registrar_max_contacts,
            max_total=cfg.registrar_max_bindings,
            domain=cfg.domain,
        ))  # fmt: skip
    gate = Gatekeeper(mode=mode, trunks=trunks, digest=digest, location=location, limits=limits)
    if gate.open:
        log.info("SIP access: open (no accounts, no trunk allow-lists): anyone may call")
    else:
        listed = ", ".join(f"{t.name} ({len(t.networks)} networks)" for t in trunks) or "none"
        log.info("SIP access: auth %s, %d accounts (realm %s, %s), trunks: %s; registrar %s",
                 mode, len(digest) if digest else 0, cfg.auth_realm, cfg.auth_algorithms,
                 listed, "on" if location else "off")  # fmt: skip
    return gate
