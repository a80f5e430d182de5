"""Config of who may call: [[gateway.accounts]] and [[gateway.trunks]] tables (TOML, or JSON
from the environment and flags), their errors naming the key, and the gatekeeper the gateway
builds from them (gateway.legs.sip.gatekeeper): auth "auto", the users file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.legs.sip.gatekeeper import build_gatekeeper
from gateway.sip.digest import hash_hex
from voxgate.contract.config import AccountConfig, ConfigError, TrunkConfig, load

TOML = """
[gateway]
auth_algorithms = "SHA-256, MD5"

[[gateway.accounts]]
username = "alice"
password = "secret"

[[gateway.accounts]]
username = "bob"
ha1 = "{md5}"
algorithms = "MD5"

[[gateway.trunks]]
name = "carrier"
allow = ["192.0.2.0/28", "2001:db8::/32"]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "v.toml"
    p.write_text(text)
    return p


def test_tables_from_toml(tmp_path: Path) -> None:
    md5 = hash_hex("MD5", "bob:voxgate:pw")
    cfg = load(write(tmp_path, TOML.format(md5=md5)), env={}).gateway
    assert cfg.accounts == [
        AccountConfig("alice", password="secret"),
        AccountConfig("bob", ha1=md5, algorithms="MD5"),
    ]
    assert cfg.trunks == [TrunkConfig("carrier", ["192.0.2.0/28", "2001:db8::/32"])]
    gate = build_gatekeeper(cfg, None)
    assert gate.mode == "invite" and gate.location is not None  # "auto" with accounts
    assert gate.digest is not None and "bob" in gate.digest and len(gate.digest) == 2
    assert gate.trunk_for("192.0.2.9") is not None


def test_tables_from_the_environment() -> None:
    env = {
        "VOXGATE_GATEWAY_ACCOUNTS": '[{"username": "alice", "password": "x"}]',
        "VOXGATE_GATEWAY_TRUNKS": '[{"name": "pbx", "allow": ["10.1.2.3"]}]',
        "VOXGATE_GATEWAY_AUTH": "all",
    }
    cfg = load(None, env=env).gateway
    assert cfg.accounts == [AccountConfig("alice", password="x")] and cfg.auth == "all"
    assert build_gatekeeper(cfg, None).mode == "all"


def test_the_default_is_open() -> None:
    gate = build_gatekeeper(load(None, env={}).gateway, None)
    assert gate.open and gate.digest is None and gate.location is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[[gateway.accounts]]\npassword = "x"\n', "gateway.accounts[0].username: missing"),
        ('[[gateway.accounts]]\nusername = "a"\n', "gateway.accounts[0]: needs password"),
        ('[[gateway.accounts]]\nusername = "a"\npassword = "x"\nha1 = "00"\n',
         "not both"),
        ('[[gateway.accounts]]\nusername = "a"\nha1 = "00"\n', "gateway.accounts[0].ha1"),
        ('[[gateway.accounts]]\nusername = "a:b"\npassword = "x"\n',
         "gateway.accounts[0].username"),
        ('[[gateway.accounts]]\nusername = "a"\npassword = "x"\nalgorithms = "SHA-1"\n',
         "gateway.accounts[0].algorithms"),
        ('[[gateway.accounts]]\nusername = "a"\npassword = "x"\n[[gateway.accounts]]\n'
         'username = "a"\npassword = "y"\n', "gateway.accounts[1].username"),
        ('[[gateway.accounts]]\nusername = "a"\npassword = "x"\nrole = "admin"\n',
         "gateway.accounts[0].role: unknown key"),
        ('[[gateway.trunks]]\nname = "t"\nallow = ["example.com"]\n', "gateway.trunks[0].allow"),
        ('[[gateway.trunks]]\nname = "t"\n', "gateway.trunks[0].allow"),
        ('[[gateway.trunks]]\nname = "t"\nallow = "10.0.0.1"\n', "gateway.trunks[0].allow"),
        ('[gateway]\nauth = "invite"\n', "gateway.auth"),
        ('[gateway]\nauth = "sometimes"\n', "gateway.auth"),
        ('[gateway]\nauth_algorithms = ""\n', "gateway.auth_algorithms"),
        ('[gateway]\nauth_realm = "a\\"b"\n', "gateway.auth_realm"),
        ('[gateway]\nauth_users_file = "/no/such/file"\n', "gateway.auth_users_file"),
        ('[gateway]\nregistrar_min_expires_s = 600\nregistrar_max_expires_s = 60\n',
         "gateway.registrar_max_expires_s"),
        ('[gateway]\naccounts = {username = "a"}\n', "gateway.accounts"),
    ],
)  # fmt: skip
def test_errors_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load(write(tmp_path, text), env={})


def test_a_bad_env_array_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.accounts: expected a JSON array"):
        load(None, env={"VOXGATE_GATEWAY_ACCOUNTS": "alice:secret"})


def test_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users"
    sha = hash_hex("SHA-256", "carol:voxgate:pw")
    users.write_text(f"# softphones\ndave:pa55\ncarol:::{sha}\n")
    cfg = load(None, env={"VOXGATE_GATEWAY_AUTH_USERS_FILE": str(users)}).gateway
    gate = build_gatekeeper(cfg, None)
    assert gate.digest is not None and "dave" in gate.digest and "carol" in gate.digest
    assert gate.mode == "invite"
    users.write_text("dave:pa55\nbroken\n")
    with pytest.raises(ConfigError, match=r"gateway\.auth_users_file: line 2"):
        build_gatekeeper(cfg, None)
    users.write_text("dave:pa55\n")
    both = load(None, env={"VOXGATE_GATEWAY_AUTH_USERS_FILE": str(users),
                           "VOXGATE_GATEWAY_ACCOUNTS": '[{"username": "dave", "password": "x"}]',
                           }).gateway  # fmt: skip
    with pytest.raises(ConfigError, match="twice"):
        build_gatekeeper(both, None)
