"""Static checks of deploy/: every file parses and agrees with the code it deploys.

Docker, kubectl and systemd do not run here, so each file is read the way its tool would read
it (YAML documents, Dockerfile instructions, unit-file sections) and checked against the real
program: VOXGATE_* names against the config loader's keys (``voxgate.contract.config.all_keys``),
subcommands and flags against the CLI parser (``voxgate.cli.build_parser``), settings by loading
each deployment's effective configuration with
``voxgate.contract.config.load_from_args``, ports against
that configuration, and the KEDA stream against ``RedisBus``'s own key names. Each checker
returns a list of problems; the tests at the bottom also feed them broken input to show they
catch it.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import copy
import fnmatch
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.api.auth import check_bind_safety
from voxgate.cli import build_parser
from voxgate.contract import config as vc
from voxgate.contract.bus.redis_bus import GROUP, RedisBus

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "compose.yaml"
KAMAILIO = DEPLOY / "kamailio"
FRONT_DOCKERFILE = DOCKER / "Dockerfile.kamailio"

# Where each image's Dockerfile is; k8s manifests and compose refer to images by these names.
IMAGES = {
    "voxgate-gateway": DOCKER / "Dockerfile.gateway",
    "voxgate-worker": DOCKER / "Dockerfile.worker",
    "voxgate-worker-cuda": DOCKER / "Dockerfile.worker-cuda",
}
# Config files the deployments point VOXGATE_CONFIG at, and the files behind them here.
CONFIG_FILES = {
    "/etc/voxgate/voxgate.toml": {
        "k8s": K8S / "voxgate.toml",
        # systemd: the units' header tells the operator to install the sample there.
        "systemd": ROOT / "voxgate.toml.sample",
    }
}
# Values for what only exists at deploy time: ${VAR:?...} in compose, secretKeyRef / fieldRef in
# Kubernetes. Realistic enough for the config loader to accept or reject them meaningfully.
PLACEHOLDERS = {
    "VOXGATE_GATEWAY_API_TOKEN": "t0k3n" * 8,
    "VOXGATE_GATEWAY_PUBLIC_ADDRESS": "192.0.2.10",
    "status.podIP": "10.0.0.5",
    "status.hostIP": "10.0.0.5",
}
SECRET_PLACEHOLDER = "s3cr3t" * 6
# Secrets created by the operator (not by kustomize, so a re-apply never resets them); each must
# be documented with its creation command.
EXTERNAL_SECRETS = {"voxgate-api-token"}
HEALTH_PATHS = {"/healthz", "/readyz", "/metrics"}


class CheckError(Exception):
    """One problem found in a deploy file (the message names the file and what is wrong)."""


# --- the configuration, read the way the loader reads it -------------------------------------


def env_name_map() -> dict[str, str]:
    """``VOXGATE_SECTION_KEY`` -> ``section.key`` for every key the loader knows.

    The loader turns a variable into a key by dropping ``ENV_PREFIX``, lowercasing and splitting
    at the first underscore; this is that mapping run backwards over ``all_keys()``, the same
    enumeration the loader validates against. ``test_env_name_map_roundtrips`` checks each name
    through ``load`` itself, so the two cannot drift apart.
    """
    out: dict[str, str] = {}
    for key, _typ, _default in vc.all_keys():
        section, _, name = key.partition(".")
        out[f"{vc.ENV_PREFIX}{section}_{name}".upper()] = key
    return out


def env_name_problem(name: str) -> str | None:
    """Why the loader would refuse ``name`` (None: it accepts it)."""
    if name in env_name_map():
        return None
    # Not a key: accepted only if the loader deliberately skips it (VOXGATE_CONFIG). Probe the
    # real loader with an empty file so nothing else can fail.
    try:
        vc.load(os.devnull, env={name: "x"})
    except vc.ConfigError as exc:
        return f"{name}: not a voxgate setting ({exc})"
    return None


def unknown_env_names(names: Iterable[str]) -> list[str]:
    return [p for n in sorted(set(names)) if (p := env_name_problem(n))]


def parse_cli(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` after the program name, parsed by voxgate's own parser (CheckError if refused)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(list(argv))
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        raise CheckError(f"voxgate {' '.join(argv)}: {msg[-1] if msg else 'refused'}") from None
    if getattr(args, "func", None) is None:
        raise CheckError(f"voxgate {' '.join(argv)}: no subcommand")
    return args


def voxgate_argv(argv: Sequence[str], where: str) -> list[str]:
    """The arguments after ``voxgate`` in a command line that must run voxgate."""
    if not argv or Path(argv[0]).name != "voxgate":
        raise CheckError(f"{where}: command {list(argv)} does not run voxgate")
    return list(argv[1:])


@dataclass
class Effective:
    command: str
    cfg: vc.Config
    env: dict[str, str]


def effective_config(
    argv: Sequence[str], env: Mapping[str, str], where: str, flavour: str
) -> Effective:
    """Load the configuration a process started with ``voxgate ARGV`` and ``env`` would get.

    VOXGATE_CONFIG/--config name a path on the target machine; it is mapped onto the file that
    this repository ships for it (``CONFIG_FILES``). No config file: /dev/null, so a stray
    ./voxgate.toml in the working directory cannot leak into the check.
    """
    args = parse_cli(argv)
    env = {k: v for k, v in env.items() if k.startswith(vc.ENV_PREFIX)}
    target = getattr(args, "config", None) or env.get("VOXGATE_CONFIG")
    if target:
        local = CONFIG_FILES.get(target, {}).get(flavour)
        if local is None or not local.is_file():
            raise CheckError(f"{where}: config file {target} is not shipped for {flavour}")
        path = str(local)
    else:
        path = os.devnull
    args.config = path
    env.pop("VOXGATE_CONFIG", None)
    try:
        cfg = vc.load_from_args(args, env=env)
    except vc.ConfigError as exc:
        raise CheckError(f"{where}: voxgate would refuse to start: {exc}") from None
    command = str(args.command)
    if command == "gateway":
        host, _ = vc.parse_hostport("gateway.http_listen", cfg.gateway.http_listen)
        try:
            check_bind_safety(host, cfg.gateway.api_token or None)
        except ValueError as exc:
            raise CheckError(f"{where}: gateway would refuse to start: {exc}") from None
    return Effective(command, cfg, env)


def worker_http_port(cfg: vc.Config, where: str) -> int:
    listen = getattr(cfg.worker, "http_listen", None)
    if listen is None:
        raise CheckError(
            f"{where}: voxgate.contract.config has no worker.http_listen (the worker's HTTP "
            "listener for /healthz, /readyz, /metrics), which the deployment files rely on"
        )
    if not listen:
        raise CheckError(f"{where}: worker.http_listen is empty (no listener), yet it is probed")
    return vc.parse_hostport("worker.http_listen", str(listen))[1]


def ports_of(eff: Effective, where: str) -> dict[str, int]:
    """The ports a process of this kind listens on, from its effective configuration."""
    if eff.command == "gateway":
        g = eff.cfg.gateway
        return {
            "sip": vc.parse_hostport("gateway.sip_listen", g.sip_listen)[1],
            "http": vc.parse_hostport("gateway.http_listen", g.http_listen)[1],
        }
    if eff.command == "worker":
        return {"http": worker_http_port(eff.cfg, where)}
    raise CheckError(f"{where}: deploys `voxgate {eff.command}`, expected gateway or worker")


_URL = re.compile(r"https?://(?:\[[^\]]+\]|[^/:'\"\s]+):(\d+)(/[^'\"\s]*)")


def health_url(argv: Sequence[str], where: str) -> tuple[int, str]:
    """(port, path) of the one HTTP URL a health-check command fetches."""
    urls = _URL.findall(" ".join(argv))
    if len(urls) != 1:
        raise CheckError(f"{where}: expected one http://HOST:PORT/PATH in {list(argv)}")
    port, path = urls[0]
    return int(port), path


# --- Dockerfiles -----------------------------------------------------------------------------

KEYWORDS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def parse_dockerfile(text: str, path: Path = Path("Dockerfile")) -> Dockerfile:
    """Instructions grouped into stages; line continuations joined, comments dropped."""
    logical: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # comment lines inside a continuation are skipped
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        logical.append((start, " ".join(p for p in buf if p)))
        buf = []
    if buf:
        raise CheckError(f"{path}:{start}: line continuation runs past the end of the file")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for n, line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in KEYWORDS:
            raise CheckError(f"{path}:{n}: unknown instruction {keyword}")
        ins = Instruction(keyword, args.strip(), n)
        if keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            if len(words) not in (1, 3) or (len(words) == 3 and name is None):
                raise CheckError(f"{path}:{n}: FROM {ins.args!r}: expected IMAGE [AS NAME]")
            stages.append(Stage(_expand(words[0], global_args), name))
        elif not stages:
            if keyword != "ARG":
                raise CheckError(f"{path}:{n}: {keyword} before the first FROM")
            name, _, default = ins.args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(ins)
    if not stages:
        raise CheckError(f"{path}: no FROM")
    return Dockerfile(path, global_args, stages)


def _expand(word: str, args: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), word)


def exec_form(ins: Instruction, where: str) -> list[str]:
    """A JSON-array (exec form) argument list; shell form is refused: no shell to forward
    SIGTERM, so draining on stop would not work."""
    try:
        argv = json.loads(ins.args)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise CheckError(f"{where}:{ins.line}: {ins.keyword} must be exec form (a JSON array)")
    return argv


def dockerfile_env(df: Dockerfile) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in df.final.all("ENV"):
        for word in shlex.split(ins.args):
            name, sep, value = word.partition("=")
            if not sep:
                raise CheckError(f"{df.path}:{ins.line}: ENV {word!r}: use NAME=value")
            env[name] = value
    return env


def dockerfile_command(df: Dockerfile) -> list[str]:
    """The container's default command line: ENTRYPOINT followed by CMD."""
    entry = df.final.last("ENTRYPOINT")
    cmd = df.final.last("CMD")
    if entry is None and cmd is None:
        raise CheckError(f"{df.path}: final stage has neither ENTRYPOINT nor CMD")
    argv: list[str] = []
    for ins in (entry, cmd):
        if ins is not None:
            argv += exec_form(ins, str(df.path))
    return argv


def exposed(df: Dockerfile) -> set[tuple[int, str]]:
    out: set[tuple[int, str]] = set()
    for ins in df.final.all("EXPOSE"):
        for word in ins.args.split():
            port, _, proto = word.partition("/")
            out.add((int(port), proto or "tcp"))
    return out


def dockerfile_effective(df: Dockerfile, extra_env: Mapping[str, str] | None = None) -> Effective:
    argv = voxgate_argv(dockerfile_command(df), str(df.path))
    env = dockerfile_env(df) | dict(extra_env or {})
    return effective_config(argv, env, str(df.path), "docker")


# COPY --from=STAGE and RUN --mount=...,from=STAGE,...
_FROM_FLAG = re.compile(r"(?:--|[\s,])from=([^\s,]+)")


def check_dockerfile(df: Dockerfile) -> list[str]:
    problems: list[str] = []
    where = str(df.path)
    final = df.final
    names = {s.name for s in df.stages[:-1] if s.name}
    if not names:
        problems.append(f"{where}: not multi-stage (no named builder stage)")
    sources = {
        m[1] for i in final.all("COPY") + final.all("RUN") for m in _FROM_FLAG.finditer(i.args)
    }
    uses_builder = bool(sources & names)
    if names and not uses_builder:
        problems.append(f"{where}: final stage takes nothing from the builder stage")
    user = final.last("USER")
    if user is None:
        problems.append(f"{where}: final stage has no USER (would run as root)")
    elif user.args.split(":")[0] in ("root", "0"):
        problems.append(f"{where}:{user.line}: final stage runs as root ({user.args})")
    try:
        # With the secret the operator passes at run time (the gateway image refuses to start
        # without one: test_dockerfile_roles).
        eff = dockerfile_effective(df, {"VOXGATE_GATEWAY_API_TOKEN": SECRET_PLACEHOLDER})
        ports = ports_of(eff, where)
    except CheckError as exc:
        return [*problems, str(exc)]
    problems += unknown_env_names(n for n in dockerfile_env(df) if n.startswith(vc.ENV_PREFIX))
    hc = final.last("HEALTHCHECK")
    if hc is None:
        problems.append(f"{where}: no HEALTHCHECK")
    else:
        _, sep, cmd = hc.args.partition("CMD ")
        if not sep:
            problems.append(f"{where}:{hc.line}: HEALTHCHECK without CMD")
        else:
            try:
                argv = exec_form(Instruction("HEALTHCHECK", cmd, hc.line), where)
                port, path = health_url(argv, where)
            except CheckError as exc:
                problems.append(str(exc))
            else:
                if port != ports["http"]:
                    problems.append(
                        f"{where}: HEALTHCHECK polls port {port}, but `voxgate {eff.command}` "
                        f"listens for HTTP on {ports['http']}"
                    )
                if path != "/healthz":
                    problems.append(f"{where}: HEALTHCHECK polls {path}, expected /healthz")
                if any(Path(a).name == "curl" for a in argv):
                    problems.append(f"{where}: HEALTHCHECK uses curl (not in slim images)")
    want = {(ports["http"], "tcp")}
    if eff.command == "gateway":
        want |= {(ports["sip"], "udp"), (ports["sip"], "tcp")}
    if missing := want - exposed(df):
        problems.append(f"{where}: EXPOSE lacks {sorted(missing)}")
    return problems


def load_dockerfile(path: Path) -> Dockerfile:
    return parse_dockerfile(path.read_text(), path)


# --- compose -----------------------------------------------------------------------------------

_INTERP = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error}: defaults as given, required values from
    PLACEHOLDERS (what the operator must export)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m[1], m[2], m[3]
        if op and "-" in op:
            return str(arg)
        return PLACEHOLDERS.get(name, "x")

    return _INTERP.sub(one, value)


@dataclass
class PortMapping:
    host: tuple[int, int] | None  # None: an ephemeral host port
    container: tuple[int, int]
    proto: str


def _port_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def parse_compose_port(spec: str | int | Mapping[str, Any]) -> PortMapping:
    """Short syntax ([IP:]HOST[-HI]:CONTAINER[-HI][/proto]) or the long mapping syntax."""
    if isinstance(spec, Mapping):
        target = _port_range(str(spec["target"]))
        published = spec.get("published")
        return PortMapping(
            _port_range(str(published)) if published else None, target, spec.get("protocol", "tcp")
        )
    text, _, proto = str(spec).partition("/")
    parts = text.rsplit(":", 2)
    container = _port_range(parts[-1])
    host = _port_range(parts[-2]) if len(parts) >= 2 and parts[-2] else None
    return PortMapping(host, container, proto or "tcp")


def service_env(service: Mapping[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.partition("=")[::2] for item in raw)
    return {str(k): interpolate(str(v)) for k, v in raw.items()}


def compose_effective(name: str, service: Mapping[str, Any]) -> Effective:
    where = f"compose.yaml: {name}"
    build = service.get("build")
    if not isinstance(build, Mapping):
        raise CheckError(f"{where}: no build section")
    dockerfile = COMPOSE.parent / str(build.get("context", ".")) / str(build["dockerfile"])
    if not dockerfile.resolve().is_file():
        raise CheckError(f"{where}: {build['dockerfile']} does not exist")
    df = load_dockerfile(dockerfile.resolve())
    argv = voxgate_argv(dockerfile_command(df), str(df.path))
    command = service.get("command")
    if command is not None:
        entry = df.final.last("ENTRYPOINT")
        base = exec_form(entry, str(df.path)) if entry else []
        cmd = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        argv = voxgate_argv(base + cmd, where)
    env = dockerfile_env(df) | service_env(service)
    return effective_config(argv, env, where, "docker")


def check_compose(doc: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    services = doc.get("services") or {}
    for want in ("redis", "kamailio", "worker"):
        if want not in services:
            problems.append(f"compose.yaml: no service {want!r}")
    gateways: dict[str, Effective] = {}
    for name, svc in services.items():
        where = f"compose.yaml: {name}"
        for dep, cond in (svc.get("depends_on") or {}).items():
            if dep not in services:
                problems.append(f"{where}: depends on unknown service {dep!r}")
            elif cond.get("condition") != "service_healthy":
                problems.append(f"{where}: should wait for {dep} with condition service_healthy")
            elif "healthcheck" not in services[dep]:
                problems.append(f"{where}: waits for {dep} to be healthy; it has no healthcheck")
        names = [k for k in service_env(svc) if k.startswith(vc.ENV_PREFIX)]
        problems += [f"{where}: {p}" for p in unknown_env_names(names)]
        if "build" not in svc or _is_front(svc):
            continue  # the front runs Kamailio, not voxgate: check_compose_front
        try:
            eff = compose_effective(name, svc)
            ports = ports_of(eff, where)
        except CheckError as exc:
            problems.append(str(exc))
            continue
        hc = svc.get("healthcheck")
        if hc is None:
            problems.append(f"{where}: no healthcheck")
        else:
            try:
                port, path = health_url([str(t) for t in hc["test"]], where)
            except CheckError as exc:
                problems.append(str(exc))
            else:
                if port != ports["http"] or path != "/healthz":
                    problems.append(
                        f"{where}: healthcheck polls :{port}{path}, expected "
                        f":{ports['http']}/healthz"
                    )
        published = [parse_compose_port(p) for p in svc.get("ports") or []]
        if eff.command == "worker" and any(p.host for p in published):
            problems.append(
                f"{where}: publishes a fixed host port; `--scale worker=N` replicas would collide"
            )
        if eff.command == "gateway":
            gateways[name] = eff
            if svc.get("network_mode") == "host":
                problems += _check_host_gateway(where, svc, eff, services)
            else:
                problems += _check_gateway_ports(where, eff.cfg, ports, published)
    if len(gateways) < 2:
        problems.append(f"compose.yaml: {len(gateways)} gateway(s); the front needs two or more")
    problems += _check_gateways_apart(gateways)
    if "kamailio" in services:
        problems += check_compose_front(services["kamailio"], gateways)
    return problems


def _check_gateway_ports(
    where: str, cfg: vc.Config, ports: Mapping[str, int], published: Sequence[PortMapping]
) -> list[str]:
    problems: list[str] = []

    def has(port: int, proto: str) -> bool:
        return any(
            p.proto == proto and p.container[0] <= port <= p.container[1] and p.host is not None
            for p in published
        )

    for port, proto in ((ports["sip"], "udp"), (ports["sip"], "tcp"), (ports["http"], "tcp")):
        if not has(port, proto):
            problems.append(f"{where}: port {port}/{proto} (from the config) is not published")
    # RTP: even ports in [rtp_port_min, rtp_port_max) (gateway.rtp.endpoint), published 1:1 so
    # the port written into SDP is the one the phone reaches.
    lo, hi = cfg.gateway.rtp_port_min, cfg.gateway.rtp_port_max
    rtp = [p for p in published if p.proto == "udp" and p.container[1] > p.container[0]]
    if len(rtp) != 1:
        problems.append(f"{where}: expected one published UDP range for RTP, got {len(rtp)}")
    else:
        r = rtp[0]
        if r.host != r.container:
            problems.append(
                f"{where}: RTP range must be published 1:1, got {r.host}->{r.container}"
            )
        if not (r.container[0] == lo and hi - 1 <= r.container[1] <= hi):
            problems.append(
                f"{where}: RTP range {r.container[0]}-{r.container[1]} does not match "
                f"gateway.rtp_port_min/max = {lo}-{hi}"
            )
    return problems


def _check_host_gateway(
    where: str, svc: Mapping[str, Any], eff: Effective, services: Mapping[str, Any]
) -> list[str]:
    """A gateway on the host's network: its ports are the host's (compose refuses `ports`
    there), SDP must carry the host's address, and Redis is reached where it is published."""
    problems: list[str] = []
    if svc.get("ports"):
        problems.append(f"{where}: network_mode host takes no `ports` (they are the host's)")
    if not eff.cfg.gateway.public_address:
        problems.append(
            f"{where}: no gateway.public_address: the front reaches it on loopback, so SDP "
            "would offer phones 127.0.0.1"
        )
    url = eff.cfg.bus.redis_url.split("//", 1)[-1].split("/")[0].split("@")[-1]
    host, _, port = url.partition(":")
    published = [parse_compose_port(p) for p in services.get("redis", {}).get("ports") or []]
    if host not in ("127.0.0.1", "localhost") or not any(
        p.host == (int(port or 6379),) * 2 and p.container == (6379, 6379) for p in published
    ):
        problems.append(
            f"{where}: on the host's network Redis must be published on loopback and reached "
            f"there; it uses {eff.cfg.bus.redis_url}"
        )
    return problems


def _check_gateways_apart(gateways: Mapping[str, Effective]) -> list[str]:
    """Gateways sharing a network must not share a SIP/HTTP port or RTP ports."""
    problems: list[str] = []
    names = sorted(gateways)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ga, gb = gateways[a].cfg.gateway, gateways[b].cfg.gateway
            pa = ports_of(gateways[a], a)
            pb = ports_of(gateways[b], b)
            for kind in ("sip", "http"):
                if pa[kind] == pb[kind]:
                    problems.append(f"compose.yaml: {a} and {b} both use {kind} port {pa[kind]}")
            if ga.rtp_port_min <= gb.rtp_port_max and gb.rtp_port_min <= ga.rtp_port_max:
                problems.append(f"compose.yaml: {a} and {b} have overlapping RTP ranges")
    return problems


# --- the Kamailio front (deploy/kamailio, deploy/docker/Dockerfile.kamailio) -------------------


def _is_front(svc: Mapping[str, Any]) -> bool:
    build = svc.get("build")
    return isinstance(build, Mapping) and Path(str(build.get("dockerfile"))).name == (
        FRONT_DOCKERFILE.name
    )


def cfg_defines(text: str) -> set[str]:
    """Names kamailio.cfg lets the command line set (``#!ifndef NAME`` / ``#!ifdef NAME``)."""
    return set(re.findall(r"^#!ifn?def\s+(\w+)", text, re.M))


def dispatcher_destinations(text: str) -> list[tuple[int, str]]:
    """(set id, destination URI) of every line of a dispatcher.list."""
    out: list[tuple[int, str]] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            out.append((int(words[0]), words[1]))
    return out


def front_image_problems(df: Dockerfile) -> list[str]:
    """Debian's kamailio package, the shipped config copied in, foreground, not root."""
    where = str(df.path.name)
    problems: list[str] = []
    if not df.final.base.startswith("debian:bookworm"):
        problems.append(f"{where}: base {df.final.base}: Kamailio 5.6 is Debian bookworm's")
    if not any("apt-get install" in i.args and " kamailio" in i.args for i in df.final.all("RUN")):
        problems.append(f"{where}: does not install Debian's kamailio package")
    copies = [i.args.split() for i in df.final.all("COPY")]
    dest = next((c[-1] for c in copies if c[0].rstrip("/") == "deploy/kamailio"), None)
    if dest is None:
        problems.append(f"{where}: does not copy deploy/kamailio/")
    user = df.final.last("USER")
    if user is None or user.args in ("root", "0"):
        problems.append(f"{where}: runs as root")
    if df.final.last("HEALTHCHECK") is None:
        problems.append(f"{where}: no HEALTHCHECK")
    try:
        argv = dockerfile_command(df)
    except CheckError as exc:
        return [*problems, str(exc)]
    if not argv or Path(argv[0]).name != "kamailio" or "-DD" not in argv or "-E" not in argv:
        problems.append(f"{where}: ENTRYPOINT {argv}: expected kamailio -DD -E (foreground)")
    cfg = argv[argv.index("-f") + 1] if "-f" in argv[:-1] else None
    if dest is not None and cfg != f"{dest.rstrip('/')}/kamailio.cfg":
        problems.append(f"{where}: runs config {cfg}, the copied one is {dest}kamailio.cfg")
    return problems


def front_defines(command: Sequence[str], where: str) -> dict[str, str]:
    """The ``-A NAME=VALUE`` pairs of the front's command (nothing else is expected there)."""
    if len(command) % 2 or any(flag != "-A" for flag in command[::2]):
        raise CheckError(f"{where}: command must be -A NAME=VALUE pairs, got {list(command)}")
    out: dict[str, str] = {}
    for d in command[1::2]:
        name, _, value = interpolate(str(d)).partition("=")
        out[name] = value
    return out


def check_compose_front(svc: Mapping[str, Any], gateways: Mapping[str, Effective]) -> list[str]:
    where = "compose.yaml: kamailio"
    if not _is_front(svc):
        return [f"{where}: not built from {FRONT_DOCKERFILE.name}"]
    problems = front_image_problems(load_dockerfile(FRONT_DOCKERFILE))
    if svc.get("image") != "voxgate-kamailio:latest":
        problems.append(f"{where}: image {svc.get('image')!r}, expected voxgate-kamailio:latest")
    if svc.get("network_mode") != "host":
        problems.append(f"{where}: not on the host's network (Record-Route must name an address "
                        "phones reach)")  # fmt: skip
    try:
        defines = front_defines([str(c) for c in svc.get("command") or []], where)
    except CheckError as exc:
        return [*problems, str(exc)]
    known = cfg_defines((KAMAILIO / "kamailio.cfg").read_text())
    problems += [
        f"{where}: -A {n}: not a define of kamailio.cfg" for n in defines if n not in known
    ]
    # The mounted directory over the image's copy: which repository file each path is.
    mounts: dict[str, Path] = {}
    for v in svc.get("volumes") or []:
        src, dst, *_ = str(v).split(":")
        mounts[dst.rstrip("/")] = (COMPOSE.parent / src).resolve()
    ds_list = defines.get("DS_LIST", '"/etc/kamailio/voxgate/dispatcher.list"').strip('"')
    parent, _, fname = ds_list.rpartition("/")
    local = mounts.get(parent, KAMAILIO) / fname
    if not local.is_file():
        return [*problems, f"{where}: DS_LIST {ds_list} is no file of deploy/kamailio"]
    dests = dispatcher_destinations(local.read_text())
    in_set = {uri for sid, uri in dests if sid == 1}
    for name, eff in sorted(gateways.items()):
        uri = f"sip:127.0.0.1:{ports_of(eff, name)['sip']}"
        if uri not in in_set:
            problems.append(f"{where}: {name} ({uri}) is not in {local.name} set 1: {in_set}")
    if len(in_set) != len(gateways):
        problems.append(f"{where}: {local.name} lists {sorted(in_set)}, compose runs "
                        f"{sorted(gateways)}")  # fmt: skip
    # Callers reach the front on the address the gateways write into SDP.
    public = {eff.cfg.gateway.public_address for eff in gateways.values()}
    sip_ports = {ports_of(eff, n)["sip"] for n, eff in gateways.items()}
    for key in ("LISTEN_PUBLIC", "LISTEN_PUBLIC_TCP", "LISTEN_GATEWAYS"):
        value = defines.get(key)
        if value is None:
            problems.append(f"{where}: no -A {key}")
            continue
        _proto, host, port = value.split()[0].split(":")
        if int(port) in sip_ports:
            problems.append(f"{where}: {key} port {port} is a gateway's SIP port")
        if key == "LISTEN_GATEWAYS" and host != "127.0.0.1":
            problems.append(f"{where}: {key} on {host}; the gateways are on 127.0.0.1")
        if key != "LISTEN_GATEWAYS" and {host} != public:
            problems.append(f"{where}: {key} on {host}, the gateways' SDP says {public}")
    return problems


# --- Kubernetes ----------------------------------------------------------------------------------


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def kustomization_files(kdir: Path) -> tuple[dict[str, Any], list[str]]:
    """The kustomization and every local file it names (resources, generators, patches)."""
    kust = load_yaml_docs(kdir / "kustomization.yaml")[0]
    named: list[str] = []
    for entry in kust.get("resources") or []:
        named.append(str(entry))
    for gen in (kust.get("configMapGenerator") or []) + (kust.get("secretGenerator") or []):
        named += [str(f).rpartition("=")[2] for f in gen.get("files") or []]
        named += [str(f) for f in gen.get("envs") or []]
    for patch in kust.get("patches") or []:
        if "path" in patch:
            named.append(str(patch["path"]))
    return kust, named


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def check_kustomization_listing(kdir: Path) -> list[str]:
    """Every file in the folder is used, and every file named exists (subfolders recursively)."""
    problems: list[str] = []
    _, named = kustomization_files(kdir)
    local = {n for n in named if "/" not in n.rstrip("/")}
    present = {p.name for p in kdir.iterdir() if p.is_file() and p.name != "kustomization.yaml"}
    for extra in sorted(present - local):
        problems.append(f"{_rel(kdir)}: {extra} is not listed in kustomization.yaml")
    for missing in sorted(local - present):
        problems.append(f"{_rel(kdir)}: kustomization.yaml lists missing {missing}")
    for n in named:
        if "/" in n.rstrip("/") and not (kdir / n / "kustomization.yaml").is_file():
            problems.append(f"{_rel(kdir)}: {n} is not a kustomization directory")
    for sub in sorted(p for p in kdir.iterdir() if p.is_dir()):
        for kd in sorted(q.parent for q in sub.rglob("kustomization.yaml")):
            problems += check_kustomization_listing(kd)
    return problems


def k8s_objects(kdir: Path = K8S) -> list[dict[str, Any]]:
    """The objects a plain `kubectl apply -k kdir` creates (resources, generated ConfigMaps)."""
    kust, _ = kustomization_files(kdir)
    objs: list[dict[str, Any]] = []
    for entry in kust.get("resources") or []:
        path = kdir / str(entry)
        if path.is_dir():
            objs += k8s_objects(path)
        else:
            objs += load_yaml_docs(path)
    for gen in kust.get("configMapGenerator") or []:
        data = {}
        for f in gen.get("files") or []:
            key, _, fname = str(f).rpartition("=")
            data[key or Path(fname).name] = (kdir / fname).read_text()
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"]}, "data": data})  # fmt: skip
    for patch in kust.get("patches") or []:
        ops = load_yaml_docs(kdir / str(patch["path"]))[0]
        target = patch["target"]
        hits = [o for o in objs if o.get("kind") == target["kind"]
                and o["metadata"]["name"] == target["name"]]  # fmt: skip
        if len(hits) != 1:
            raise CheckError(f"{kdir}: patch target {target} matches {len(hits)} objects")
        apply_json_patch(hits[0], ops)
    return objs


def apply_json_patch(doc: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> None:
    """RFC 6902 add/replace/remove (what the overlays use); a path that is not there fails,
    as it does in kustomize."""
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]
        ]
        node: Any = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key: Any = int(last) if isinstance(node, list) and last != "-" else last
        missing = (isinstance(node, list) and not 0 <= key < len(node)) or (
            isinstance(node, dict) and key not in node
        )
        if op["op"] in ("replace", "remove") and missing:
            raise CheckError(f"patch {op['op']} {op['path']}: no such path")
        if op["op"] == "remove":
            del node[key]
        elif op["op"] == "replace":
            node[key] = copy.deepcopy(op["value"])
        elif op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if key == "-" else key, copy.deepcopy(op["value"]))
            else:
                node[key] = copy.deepcopy(op["value"])
        else:
            raise CheckError(f"patch op {op['op']!r} not supported here")


def _image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def _pod_spec(dep: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


def container_env(
    container: Mapping[str, Any], objs: Sequence[Mapping[str, Any]], where: str
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: $(VAR) expanded, secrets and field
    references as placeholders (each reference must resolve to something that will exist)."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = str(item["name"])
        if "value" in item:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(item["value"]))
        else:
            ref = item.get("valueFrom") or {}
            if "secretKeyRef" in ref:
                secret = ref["secretKeyRef"]["name"]
                known = {o["metadata"]["name"] for o in objs if o.get("kind") == "Secret"}
                if secret not in known | EXTERNAL_SECRETS:
                    raise CheckError(f"{where}: env {name} refers to unknown Secret {secret}")
                value = SECRET_PLACEHOLDER
            elif "fieldRef" in ref:
                value = PLACEHOLDERS[ref["fieldRef"]["fieldPath"]]
            elif "configMapKeyRef" in ref:
                cm = _object(objs, "ConfigMap", ref["configMapKeyRef"]["name"], where)
                value = str(cm["data"][ref["configMapKeyRef"]["key"]])
            else:
                raise CheckError(f"{where}: env {name}: unsupported valueFrom {sorted(ref)}")
        env[name] = value
    return env


def _object(
    objs: Sequence[Mapping[str, Any]], kind: str, name: str, where: str
) -> Mapping[str, Any]:
    for o in objs:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    raise CheckError(f"{where}: no {kind} named {name}")


def k8s_effective(
    dep: Mapping[str, Any], container: Mapping[str, Any], objs: Sequence[Mapping[str, Any]]
) -> Effective:
    """The effective config of a container: its image's ENV, then its env, its config mount."""
    where = f"k8s Deployment {dep['metadata']['name']}/{container['name']}"
    image = _image_name(str(container["image"]))
    if image not in IMAGES:
        raise CheckError(f"{where}: image {container['image']} is not built by deploy/docker")
    df = load_dockerfile(IMAGES[image])
    # Kubernetes: `command` replaces ENTRYPOINT (and drops CMD), `args` replaces CMD.
    entry, cmd = df.final.last("ENTRYPOINT"), df.final.last("CMD")
    if "command" in container:
        argv = [str(a) for a in container["command"]]
    else:
        argv = exec_form(entry, str(df.path)) if entry else []
    if "args" in container:
        argv += [str(a) for a in container["args"]]
    elif "command" not in container and cmd is not None:
        argv += exec_form(cmd, str(df.path))
    env = dockerfile_env(df) | container_env(container, objs, where)
    # Every volume the config path lives on must be a ConfigMap this kustomization creates.
    pod = _pod_spec(dep)
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        vol = volumes.get(mount["name"])
        if vol is None:
            raise CheckError(f"{where}: mounts undeclared volume {mount['name']}")
        if "configMap" in vol:
            _object(objs, "ConfigMap", vol["configMap"]["name"], where)
    return effective_config(voxgate_argv(argv, where), env, where, "k8s")


def _container_ports(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for c in pod["containers"] for p in c.get("ports") or []]


def _port_matches(ref: int | str, declared: Sequence[Mapping[str, Any]], proto: str) -> bool:
    return any(
        (p.get("name") == ref or p["containerPort"] == ref) and p.get("protocol", "TCP") == proto
        for p in declared
    )


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_k8s_object_schema(obj: Mapping[str, Any], objs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Required fields per kind (a small hand-written subset of the API schema)."""
    problems: list[str] = []
    meta = obj.get("metadata") or {}
    where = f"k8s {obj.get('kind')} {meta.get('name')}"
    for key in ("apiVersion", "kind"):
        if not obj.get(key):
            problems.append(f"{where}: no {key}")
    if not meta.get("name"):
        problems.append(f"{where}: no metadata.name")
    if meta.get("namespace"):
        problems.append(f"{where}: has a namespace (manifests are namespace-free)")
    kind = obj.get("kind")
    deployments = [o for o in objs if o.get("kind") == "Deployment"]
    if kind == "Deployment":
        spec = obj.get("spec") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not _matches(selector, labels):
            problems.append(f"{where}: selector {selector} does not match template labels {labels}")
        pod = (spec.get("template") or {}).get("spec") or {}
        containers = pod.get("containers") or []
        if not containers:
            problems.append(f"{where}: no containers")
        for c in containers:
            cw = f"{where}/{c.get('name')}"
            if not c.get("name") or not c.get("image"):
                problems.append(f"{cw}: container without name or image")
            declared = c.get("ports") or []
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                if probe is None:
                    continue
                if "httpGet" in probe:
                    get = probe["httpGet"]
                    if get.get("path") not in HEALTH_PATHS:
                        problems.append(f"{cw}: {probe_name} path {get.get('path')!r} unknown")
                    if not _port_matches(get.get("port"), declared, "TCP"):
                        problems.append(
                            f"{cw}: {probe_name} port {get.get('port')} is not a containerPort"
                        )
                elif "tcpSocket" in probe:
                    if not _port_matches(probe["tcpSocket"].get("port"), declared, "TCP"):
                        problems.append(f"{cw}: {probe_name} tcpSocket port not declared")
                elif "exec" not in probe:
                    problems.append(f"{cw}: {probe_name} has no handler")
        annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations")
        if annotations and annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations.get("prometheus.io/port", 0))
            if not _port_matches(port, _container_ports(pod), "TCP"):
                problems.append(f"{where}: prometheus.io/port {port} is not a containerPort")
    elif kind == "Service":
        spec = obj.get("spec") or {}
        selector = spec.get("selector") or {}
        pods = [d for d in deployments
                if _matches(selector, d["spec"]["template"]["metadata"]["labels"])]  # fmt: skip
        if not pods:
            problems.append(f"{where}: selector {selector} matches no Deployment")
        for port in spec.get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            proto = port.get("protocol", "TCP")
            for d in pods:
                if not _port_matches(target, _container_ports(_pod_spec(d)), proto):
                    problems.append(
                        f"{where}: port {port.get('name')} targets {target}/{proto}, which "
                        f"{d['metadata']['name']} does not declare"
                    )
    elif kind == "PodDisruptionBudget":
        spec = obj.get("spec") or {}
        if ("minAvailable" in spec) == ("maxUnavailable" in spec):
            problems.append(f"{where}: needs exactly one of minAvailable / maxUnavailable")
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if not any(_matches(selector, d["spec"]["template"]["metadata"]["labels"])
                   for d in deployments):  # fmt: skip
            problems.append(f"{where}: selector {selector} matches no Deployment")
    elif kind == "ScaledObject":
        problems += check_scaled_object(obj, objs)
    elif kind == "ConfigMap":
        if not obj.get("data"):
            problems.append(f"{where}: no data")
    else:
        problems.append(f"{where}: kind {kind} is not checked here; add its schema")
    return problems


def check_scaled_object(obj: Mapping[str, Any], objs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The KEDA trigger watches the stream and group the workers really consume."""
    problems: list[str] = []
    where = f"k8s ScaledObject {obj['metadata']['name']}"
    spec = obj.get("spec") or {}
    try:
        target = _object(objs, "Deployment", spec["scaleTargetRef"]["name"], where)
    except (CheckError, KeyError) as exc:
        return [f"{where}: scaleTargetRef: {exc}"]
    container = _pod_spec(target)["containers"][0]
    try:
        eff = k8s_effective(target, container, objs)
    except CheckError as exc:
        return [str(exc)]
    # Constructing the bus opens no connection; its attribute is the key workers XREADGROUP.
    stream = RedisBus(eff.cfg.bus.redis_url, prefix=eff.cfg.bus.prefix).request_stream
    triggers = [t for t in spec.get("triggers") or [] if t.get("type") == "redis-streams"]
    if not triggers:
        problems.append(f"{where}: no redis-streams trigger")
    services = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Service"}
    for t in triggers:
        md = t.get("metadata") or {}
        if md.get("stream") != stream:
            problems.append(f"{where}: stream {md.get('stream')!r}, the workers read {stream!r}")
        if md.get("consumerGroup") != GROUP:
            problems.append(f"{where}: consumerGroup {md.get('consumerGroup')!r}, not {GROUP!r}")
        if not str(md.get("lagCount", "")).isdigit():
            problems.append(f"{where}: lagCount must be a whole number as a string")
        host, _, port = str(md.get("address", "")).rpartition(":")
        svc = services.get(host.split(".")[0])
        if svc is None or int(port or 0) not in [p["port"] for p in svc["spec"]["ports"]]:
            problems.append(f"{where}: address {md.get('address')} is not a Service port here")
        url_host = eff.cfg.bus.redis_url.split("//", 1)[-1].split("/")[0].split("@")[-1]
        if url_host.split(":")[0] != host.split(".")[0]:
            problems.append(f"{where}: watches {host}, the workers use {eff.cfg.bus.redis_url}")
    return problems


def check_k8s_deployments(objs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each voxgate Deployment's container against its effective configuration."""
    problems: list[str] = []
    for dep in (o for o in objs if o.get("kind") == "Deployment"):
        pod = _pod_spec(dep)
        for c in pod["containers"]:
            if _image_name(str(c["image"])) not in IMAGES:
                continue  # redis
            where = f"k8s Deployment {dep['metadata']['name']}/{c['name']}"
            try:
                eff = k8s_effective(dep, c, objs)
                ports = ports_of(eff, where)
            except CheckError as exc:
                problems.append(str(exc))
                continue
            names = [e["name"] for e in c.get("env") or []]
            problems += [
                f"{where}: {p}" for p in unknown_env_names(n for n in names if n.startswith("VOX"))
            ]
            declared = c.get("ports") or []
            want = [(ports["http"], "TCP")]
            if eff.command == "gateway":
                want += [(ports["sip"], "UDP"), (ports["sip"], "TCP")]
            for port, proto in want:
                if not _port_matches(port, declared, proto):
                    problems.append(f"{where}: containerPort {port}/{proto} not declared")
            for probe_name, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                get = (c.get(probe_name) or {}).get("httpGet") or {}
                if get.get("path") != path or get.get("port") not in (ports["http"], "http"):
                    problems.append(f"{where}: {probe_name} should GET {path} on {ports['http']}")
            grace = int(pod.get("terminationGracePeriodSeconds", 30))
            if eff.command == "gateway":
                if not pod.get("hostNetwork") or pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
                    problems.append(
                        f"{where}: needs hostNetwork + dnsPolicy ClusterFirstWithHostNet"
                    )
                sc = c.get("securityContext") or {}
                caps = sc.get("capabilities") or {}
                # Ports above 1023 need no privilege; below, only NET_BIND_SERVICE may be kept.
                allowed = ["NET_BIND_SERVICE"] if ports["sip"] < 1024 else []
                if caps.get("drop") != ["ALL"] or (caps.get("add") or []) != allowed:
                    problems.append(
                        f"{where}: capabilities {caps}, expected drop ALL add {allowed}"
                    )
                if sc.get("runAsUser") == 0 and not allowed:
                    problems.append(f"{where}: runs as root, though no port needs privileges")
            else:
                gpu = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
                on_gpu = eff.cfg.synth.device.startswith("cuda")
                if on_gpu != (gpu is not None) or (on_gpu and eff.cfg.synth.engine != "torch"):
                    problems.append(
                        f"{where}: engine {eff.cfg.synth.engine} on {eff.cfg.synth.device} but "
                        f"nvidia.com/gpu limit {gpu}"
                    )
                if grace <= eff.cfg.worker.default_deadline_s:
                    problems.append(
                        f"{where}: terminationGracePeriodSeconds {grace} does not cover "
                        f"worker.default_deadline_s {eff.cfg.worker.default_deadline_s}"
                    )
    return problems


def check_k8s(kdir: Path = K8S) -> list[str]:
    try:
        objs = k8s_objects(kdir)
    except CheckError as exc:
        return [str(exc)]
    problems: list[str] = []
    for obj in objs:
        problems += check_k8s_object_schema(obj, objs)
    problems += check_k8s_deployments(objs)
    kinds = {o["kind"] for o in objs}
    for want in ("Deployment", "Service", "PodDisruptionBudget", "ScaledObject", "ConfigMap"):
        if want not in kinds:
            problems.append(f"{_rel(kdir)}: no {want}")
    return problems


# --- systemd -------------------------------------------------------------------------------------


@dataclass
class Unit:
    path: Path
    sections: dict[str, dict[str, list[str]]]

    def get(self, section: str, key: str) -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def one(self, section: str, key: str) -> str | None:
        values = self.get(section, key)
        return values[-1] if values else None


def parse_unit(path: Path, text: str | None = None) -> Unit:
    """configparser (strict=False: systemd repeats keys) validates the structure; the values of
    repeated keys (Environment=) are gathered from the same lines, in order."""
    text = path.read_text() if text is None else text
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        cp.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise CheckError(f"{path}: {exc}") from None
    sections: dict[str, dict[str, list[str]]] = {s: {} for s in cp.sections()}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        sections[current].setdefault(key.strip(), []).append(value.strip())
    return Unit(path, sections)


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise CheckError(f"{path}: {line!r} is not NAME=value")
            env[key.strip()] = value.strip().strip('"')
    return env


# systemd specifiers as an instance of voxgate-worker@9091.service would see them.
SPECIFIERS = {"%i": "9091", "%I": "9091", "%H": "media1", "%C": "/var/cache", "%%": "%"}


def _specifiers(text: str) -> str:
    return re.sub(r"%.", lambda m: SPECIFIERS.get(m[0], m[0]), text)


def check_unit(unit: Unit, env_file: Path | None = SYSTEMD / "env.example") -> list[str]:
    where = _rel(unit.path)
    problems: list[str] = []
    for section in ("Unit", "Service", "Install"):
        if section not in unit.sections:
            problems.append(f"{where}: no [{section}]")
    svc = "Service"
    exec_start = unit.one(svc, "ExecStart")
    if exec_start is None:
        return [*problems, f"{where}: no ExecStart"]
    env: dict[str, str] = {}
    for line in unit.get(svc, "Environment"):
        for word in shlex.split(_specifiers(line)):
            k, _, v = word.partition("=")
            env[k] = v
    env_files = [f.lstrip("-") for f in unit.get(svc, "EnvironmentFile")]
    if env_files != ["/etc/voxgate/env"]:
        problems.append(f"{where}: EnvironmentFile should be /etc/voxgate/env, got {env_files}")
    elif env_file is not None:
        env |= read_env_file(env_file)  # EnvironmentFile= overrides Environment=
    problems += [f"{where}: {p}" for p in unknown_env_names(
        n for n in env if n.startswith(vc.ENV_PREFIX))]  # fmt: skip
    try:
        argv = voxgate_argv(shlex.split(_specifiers(exec_start)), where)
        eff = effective_config(argv, env, where, "systemd")
        ports = ports_of(eff, where)
    except CheckError as exc:
        return [*problems, str(exc)]
    expect = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }
    for key, value in expect.items():
        if unit.one(svc, key) != value:
            problems.append(f"{where}: {key}={unit.one(svc, key)}, expected {value}")
    user = unit.one(svc, "User")
    if unit.one(svc, "DynamicUser") != "yes" and user in (None, "root", "0"):
        problems.append(f"{where}: runs as root (set DynamicUser=yes or User=)")
    stop = unit.one(svc, "TimeoutStopSec")
    if stop is None or not stop.isdigit():
        problems.append(f"{where}: TimeoutStopSec (seconds) missing: draining needs a bound")
    elif eff.command == "worker" and int(stop) <= eff.cfg.worker.default_deadline_s:
        problems.append(f"{where}: TimeoutStopSec={stop} cuts off utterances in flight")
    ambient = " ".join(unit.get(svc, "AmbientCapabilities")).split()
    wanted = ["CAP_NET_BIND_SERVICE"] if eff.command == "gateway" and ports["sip"] < 1024 else []
    if ambient != wanted:
        problems.append(f"{where}: AmbientCapabilities={ambient}, expected {wanted}")
    return problems


# --- .dockerignore -------------------------------------------------------------------------------


def dockerignore_excludes(patterns: Sequence[str], path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes; a folder pattern covers
    everything beneath it."""
    excluded = False
    for pattern in patterns:
        neg = pattern.startswith("!")
        pat = pattern[1:] if neg else pattern
        pat = pat.strip().rstrip("/")
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pat[3:]) for part in path.split("/"))
        else:
            hit = pat == "**" or fnmatch.fnmatch(path, pat) or path.startswith(pat + "/")
        if hit:
            excluded = not neg
    return excluded


def read_dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def deploy_files() -> Iterator[Path]:
    for p in sorted(DEPLOY.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            yield p


# ================================== tests =======================================================


def test_every_yaml_file_parses() -> None:
    files = [p for p in deploy_files() if p.suffix in (".yaml", ".yml")]
    assert COMPOSE in files and len(files) >= 6
    for p in files:
        docs = load_yaml_docs(p)
        assert docs, f"{p}: empty"


def test_env_name_map_roundtrips() -> None:
    """Every derived name is accepted by the real loader and lands on its own key."""
    for name, key in env_name_map().items():
        typ = dict((k, t) for k, t, _ in vc.all_keys())[key]
        default = dict((k, d) for k, _, d in vc.all_keys())[key]
        value = json.dumps(default) if isinstance(default, dict) else str(default)
        if typ is bool:
            value = "true" if default else "false"
        cfg = vc.load(os.devnull, env={name: value})
        section, _, attr = key.partition(".")
        assert getattr(getattr(cfg, section), attr) == default, name


def test_env_name_checker_flags_wrong_names() -> None:
    assert unknown_env_names(["VOXGATE_GATEWAY_SIP_LISTEN", "VOXGATE_CONFIG"]) == []
    bad = unknown_env_names(["VOXGATE_GATEWAY_SIP_LISTN", "VOXGATE_SIP_LISTEN", "VOXGATE_X"])
    assert len(bad) == 3, bad


def test_every_voxgate_name_in_deploy_files_is_a_setting() -> None:
    """Any VOXGATE_* token anywhere in the shipped deployment files, comments included."""
    shipped = [p for p in deploy_files() if p.suffix != ".sh"]  # ensure-*.sh: test harness
    names: set[str] = set()
    for p in shipped:
        names |= set(re.findall(r"\bVOXGATE_[A-Z0-9_]*[A-Z0-9]\b", p.read_text()))
    assert "VOXGATE_GATEWAY_API_TOKEN" in names
    assert unknown_env_names(names) == []


def test_cli_check_rejects_unknown_subcommands_and_flags() -> None:
    assert parse_cli(["worker"]).command == "worker"
    with pytest.raises(CheckError):
        parse_cli(["wrker"])
    with pytest.raises(CheckError):
        parse_cli(["gateway", "--gateway-sip-lisen", "0.0.0.0:5060"])


@pytest.mark.parametrize("path", sorted(IMAGES.values()), ids=lambda p: p.name)
def test_dockerfile(path: Path) -> None:
    df = load_dockerfile(path)
    assert check_dockerfile(df) == []
    base = df.stages[0].base
    assert base.startswith("python:3.1") and base.endswith("-slim"), base


def test_dockerfile_roles() -> None:
    token = {"VOXGATE_GATEWAY_API_TOKEN": SECRET_PLACEHOLDER}
    roles = {name: dockerfile_effective(load_dockerfile(p), token) for name, p in IMAGES.items()}
    assert roles["voxgate-gateway"].command == "gateway"
    cpu, cuda = roles["voxgate-worker"], roles["voxgate-worker-cuda"]
    assert cpu.command == cuda.command == "worker"
    assert (cpu.cfg.synth.engine, cpu.cfg.synth.device) == ("onnx", "cpu")
    assert (cuda.cfg.synth.engine, cuda.cfg.synth.device) == ("torch", "cuda")
    assert load_dockerfile(IMAGES["voxgate-worker-cuda"]).final.base.startswith("nvidia/cuda:")
    # The gateway image listens on all interfaces, so it must be given a token to start at all.
    with pytest.raises(CheckError, match="refuse"):
        effective_config(["gateway"], dockerfile_env(load_dockerfile(IMAGES["voxgate-gateway"])),
                         "image without token", "docker")  # fmt: skip


GOOD_DOCKERFILE = """\
ARG PY=python:3.11-slim
FROM ${PY} AS builder
RUN pip wheel --wheel-dir /wheels .
FROM ${PY}
COPY --from=builder /wheels /wheels
ENV VOXGATE_GATEWAY_SIP_LISTEN=0.0.0.0:5060
EXPOSE 5060/udp 5060/tcp 8080/tcp
USER 10001
HEALTHCHECK CMD ["python", "-c", "urlopen('http://127.0.0.1:8080/healthz')"]
ENTRYPOINT ["/opt/voxgate/bin/voxgate"]
CMD ["gateway"]
"""


def test_dockerfile_parser_reads_stages_and_continuations() -> None:
    df = parse_dockerfile("FROM a AS b\nRUN x \\\n  # note\n  && y\nFROM c\nUSER 1\n")
    assert [s.base for s in df.stages] == ["a", "c"]
    assert df.stages[0].instructions[0].args == "x && y"
    with pytest.raises(CheckError, match="unknown instruction"):
        parse_dockerfile("FROM a\nRUNN x\n")
    with pytest.raises(CheckError, match="before the first FROM"):
        parse_dockerfile("RUN x\nFROM a\n")


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("USER 10001", "USER root", "runs as root"),
        ("USER 10001\n", "", "no USER"),
        ('CMD ["gateway"]', 'CMD ["gatewy"]', "invalid choice"),
        ('CMD ["gateway"]', "CMD gateway", "exec form"),
        ("8080/healthz", "8081/healthz", "polls port 8081"),
        ("8080/healthz", "8080/status", "expected /healthz"),
        ("VOXGATE_GATEWAY_SIP_LISTEN", "VOXGATE_GATEWAY_SIP_LISTN", "VOXGATE_GATEWAY_SIP_LISTN"),
        ("0.0.0.0:5060", "0.0.0.0:5070", "EXPOSE lacks [(5070, 'tcp'), (5070, 'udp')]"),
        ("COPY --from=builder", "COPY --from=other", "nothing from the builder"),
        ("EXPOSE 5060/udp", "EXPOSE", "EXPOSE lacks [(5060, 'udp')]"),
        ("0.0.0.0:5060", "0.0.0.0:99999", "expected HOST:PORT"),
    ],
)  # fmt: skip
def test_dockerfile_checker_catches(old: str, new: str, expect: str) -> None:
    assert old in GOOD_DOCKERFILE
    good = parse_dockerfile(GOOD_DOCKERFILE, Path("good"))
    assert check_dockerfile(good) == []
    bad = parse_dockerfile(GOOD_DOCKERFILE.replace(old, new), Path("bad"))
    problems = check_dockerfile(bad)
    assert any(expect in p for p in problems), problems


def test_compose() -> None:
    doc = load_yaml_docs(COMPOSE)[0]
    assert check_compose(doc) == []
    for name in ("gateway-a", "gateway-b"):
        gw = compose_effective(name, doc["services"][name])
        assert gw.command == "gateway"
        assert doc["services"][name]["network_mode"] == "host"
        assert gw.cfg.gateway.public_address == PLACEHOLDERS["VOXGATE_GATEWAY_PUBLIC_ADDRESS"]
    assert compose_effective("worker", doc["services"]["worker"]).command == "worker"
    for name in ("gateway-a", "gateway-b", "worker"):
        assert doc["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"
    front = doc["services"]["kamailio"]
    assert front["image"] == "voxgate-kamailio:latest"
    assert front["build"]["dockerfile"] == "deploy/docker/Dockerfile.kamailio"
    defines = front_defines([str(c) for c in front["command"]], "kamailio")
    assert defines["LISTEN_PUBLIC"] == "udp:192.0.2.10:5060"
    assert defines["DS_PING_INTERVAL"] == "2"


def test_front_image() -> None:
    assert front_image_problems(load_dockerfile(FRONT_DOCKERFILE)) == []
    bad = parse_dockerfile(
        FRONT_DOCKERFILE.read_text().replace("USER kamailio", "USER root"), FRONT_DOCKERFILE
    )
    assert any("root" in p for p in front_image_problems(bad))


def test_dispatcher_list_and_defines_parsers() -> None:
    assert dispatcher_destinations("# c\n1 sip:127.0.0.1:5070 8\n\n2 sip:h:1 # x\n") == [
        (1, "sip:127.0.0.1:5070"), (2, "sip:h:1"),
    ]  # fmt: skip
    names = cfg_defines((KAMAILIO / "kamailio.cfg").read_text())
    assert {"DS_LIST", "DS_PING_INTERVAL", "LISTEN_PUBLIC", "LISTEN_GATEWAYS"} <= names
    with pytest.raises(CheckError, match="-A NAME=VALUE"):
        front_defines(["-A", "X=1", "-f"], "k")


@pytest.mark.skipif(
    not (shutil.which("kamailio") or os.access("/usr/sbin/kamailio", os.X_OK)),
    reason="kamailio not installed (deploy/ensure-test-tools.sh installs it)",
)
def test_front_config_parses_with_the_compose_defines(tmp_path: Path) -> None:
    """``kamailio -c``: the shipped config with exactly compose's -A defines (the list path
    mapped onto the repository's file, the control socket into tmp_path)."""
    doc = load_yaml_docs(COMPOSE)[0]
    defines = front_defines([str(c) for c in doc["services"]["kamailio"]["command"]], "k")
    defines["DS_LIST"] = f'"{KAMAILIO / "dispatcher.list"}"'
    defines["CTL_SOCKET"] = f'"unix:{tmp_path / "ctl"}"'
    binary = shutil.which("kamailio") or "/usr/sbin/kamailio"
    argv = [binary, "-c", "-f", str(KAMAILIO / "kamailio.cfg")]
    for name, value in defines.items():
        argv += ["-A", f"{name}={value}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "192.0.2.10" in r.stdout + r.stderr  # the public listener as configured


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: d["services"]["gateway-a"].pop("network_mode"), "5070/udp"),
        (lambda d: d["services"]["gateway-a"].update(ports=["5070:5070/udp"]), "takes no"),
        (
            lambda d: d["services"]["gateway-b"]["environment"].update(
                VOXGATE_GATEWAY_RTP_PORT_MIN="14000"
            ),
            "overlapping RTP",
        ),
        (
            lambda d: d["services"]["gateway-b"]["environment"].update(
                VOXGATE_GATEWAY_SIP_LISTEN="0.0.0.0:5072"
            ),
            "not in dispatcher.list",
        ),
        (
            lambda d: d["services"]["gateway-a"]["environment"].update(
                VOXGATE_BUS_REDIS_URL="redis://redis:6379/0"
            ),
            "published on loopback",
        ),
        (lambda d: d["services"]["kamailio"]["command"].__setitem__(9, "DS_PING=2"), "DS_PING"),
        (
            lambda d: d["services"]["kamailio"]["command"].__setitem__(
                5, "LISTEN_GATEWAYS=udp:127.0.0.1:5071"
            ),
            "a gateway's SIP port",
        ),
        (lambda d: d["services"]["kamailio"].pop("network_mode"), "host's network"),
        (lambda d: d["services"].pop("gateway-b"), "needs two or more"),
        (lambda d: d["services"]["worker"].update(ports=["9091:9091"]), "collide"),
        (lambda d: d["services"]["worker"].update(command=["wrker"]), "invalid choice"),
        (
            lambda d: d["services"]["gateway-a"]["environment"].pop("VOXGATE_GATEWAY_API_TOKEN"),
            "refuse",
        ),
        (
            lambda d: d["services"]["worker"]["environment"].update(VOXGATE_SYNTH_ENGIN="onnx"),
            "VOXGATE_SYNTH_ENGIN",
        ),
    ],
)
def test_compose_checker_catches(mutate: Any, expect: str) -> None:
    doc = load_yaml_docs(COMPOSE)[0]
    mutate(doc)
    problems = check_compose(doc)
    assert any(expect in p for p in problems), problems


def test_compose_port_syntax() -> None:
    assert parse_compose_port("10000-10199:10000-10199/udp") == PortMapping(
        (10000, 10199), (10000, 10199), "udp"
    )
    assert parse_compose_port("127.0.0.1:8080:8080") == PortMapping(
        (8080, 8080), (8080, 8080), "tcp"
    )
    assert parse_compose_port("9091").host is None
    assert interpolate("${A:-d}/${VOXGATE_GATEWAY_PUBLIC_ADDRESS:?set it}") == "d/192.0.2.10"


def test_kustomization_lists_exactly_the_files_present(tmp_path: Path) -> None:
    assert check_kustomization_listing(K8S) == []
    # A stray manifest nobody applies, and a listed file that is gone, are both reported.
    kdir = tmp_path / "k"
    kdir.mkdir()
    (kdir / "kustomization.yaml").write_text("resources:\n  - a.yaml\n  - gone.yaml\n")
    (kdir / "a.yaml").write_text("{}\n")
    (kdir / "stray.yaml").write_text("{}\n")
    problems = check_kustomization_listing(kdir)
    assert any("stray.yaml is not listed" in p for p in problems), problems
    assert any("missing gone.yaml" in p for p in problems), problems


def test_k8s_manifests() -> None:
    assert check_k8s(K8S) == []
    objs = k8s_objects(K8S)
    gateway = _object(objs, "Deployment", "voxgate-gateway", "test")
    assert _pod_spec(gateway)["hostNetwork"] is True
    worker = _object(objs, "Deployment", "voxgate-worker", "test")
    eff = k8s_effective(worker, _pod_spec(worker)["containers"][0], objs)
    assert (eff.cfg.synth.engine, eff.cfg.synth.device) == ("torch", "cuda")
    assert eff.cfg.bus.kind == "redis"


def test_k8s_cpu_overlay() -> None:
    overlay = K8S / "overlays" / "cpu-workers"
    assert check_k8s(overlay) == []
    objs = k8s_objects(overlay)
    worker = _object(objs, "Deployment", "voxgate-worker", "test")
    c = _pod_spec(worker)["containers"][0]
    eff = k8s_effective(worker, c, objs)
    assert (eff.cfg.synth.engine, eff.cfg.synth.device) == ("onnx", "cpu")
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert "tolerations" not in _pod_spec(worker)


def test_keda_stream_is_the_bus_request_stream() -> None:
    objs = k8s_objects(K8S)
    so = _object(objs, "ScaledObject", "voxgate-worker", "test")
    md = so["spec"]["triggers"][0]["metadata"]
    assert md["stream"] == RedisBus("redis://x", prefix=vc.BusConfig().prefix).request_stream
    assert md["consumerGroup"] == GROUP


def _mutated(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (
            lambda o: _mutated(o, "Deployment", "voxgate-gateway")["spec"]["selector"][
                "matchLabels"
            ].update({"app.kubernetes.io/name": "gw"}),
            "does not match template labels",
        ),
        (
            lambda o: _pod_spec(_mutated(o, "Deployment", "voxgate-worker"))["containers"][0][
                "readinessProbe"
            ]["httpGet"].update(port=9999),
            "not a containerPort",
        ),
        (
            lambda o: _mutated(o, "Service", "voxgate-worker")["spec"]["ports"][0].update(
                targetPort=9999
            ),
            "does not declare",
        ),
        (
            lambda o: _mutated(o, "ScaledObject", "voxgate-worker")["spec"]["triggers"][0][
                "metadata"
            ].update(stream="synth:req"),
            "the workers read 'voxgate:synth:req'",
        ),
        (
            lambda o: _pod_spec(_mutated(o, "Deployment", "voxgate-worker"))["containers"][0][
                "env"
            ].append({"name": "VOXGATE_SYNTH_DEVIC", "value": "cpu"}),
            "VOXGATE_SYNTH_DEVIC",
        ),
        (
            lambda o: _pod_spec(_mutated(o, "Deployment", "voxgate-worker"))["containers"][0][
                "resources"
            ]["limits"].pop("nvidia.com/gpu"),
            "nvidia.com/gpu limit None",
        ),
        (
            lambda o: _pod_spec(_mutated(o, "Deployment", "voxgate-gateway")).update(
                hostNetwork=False
            ),
            "hostNetwork",
        ),
        (
            lambda o: _pod_spec(_mutated(o, "Deployment", "voxgate-gateway"))["containers"][0][
                "securityContext"
            ]["capabilities"].update(add=["NET_ADMIN"]),
            "expected drop ALL add []",
        ),
        (lambda o: o.append({"apiVersion": "v1", "kind": "Pod"}), "no metadata.name"),
    ],
)
def test_k8s_checker_catches(mutate: Any, expect: str) -> None:
    objs = k8s_objects(K8S)
    mutate(objs)
    problems: list[str] = []
    for obj in objs:
        problems += check_k8s_object_schema(obj, objs)
    problems += check_k8s_deployments(objs)
    assert any(expect in p for p in problems), problems


def test_json_patch_refuses_missing_paths() -> None:
    doc: dict[str, Any] = {"a": [{"b": 1}]}
    apply_json_patch(doc, [{"op": "replace", "path": "/a/0/b", "value": 2}])
    assert doc == {"a": [{"b": 2}]}
    with pytest.raises(CheckError):
        apply_json_patch(doc, [{"op": "remove", "path": "/a/0/c"}])


@pytest.mark.parametrize("name", ["voxgate-gateway.service", "voxgate-worker@.service"])
def test_systemd_unit(name: str) -> None:
    unit = parse_unit(SYSTEMD / name)
    assert check_unit(unit) == []
    argv = voxgate_argv(shlex.split(_specifiers(unit.one("Service", "ExecStart") or "")), name)
    assert parse_cli(argv).command == name.split("-")[1].split("@")[0].split(".")[0]


def test_systemd_worker_instances_get_their_own_port() -> None:
    unit = parse_unit(SYSTEMD / "voxgate-worker@.service")
    exec_start = unit.one("Service", "ExecStart") or ""
    assert "%i" in exec_start
    env = read_env_file(SYSTEMD / "env.example")
    eff = effective_config(
        voxgate_argv(shlex.split(_specifiers(exec_start)), "unit"), env, "unit", "systemd"
    )
    assert worker_http_port(eff.cfg, "unit") == int(SPECIFIERS["%i"])


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("ExecStart=/opt/voxgate/bin/voxgate gateway", "ExecStart=/opt/voxgate/bin/voxgate gw",
         "invalid choice"),
        ("ProtectSystem=strict", "ProtectSystem=full", "ProtectSystem=full"),
        ("DynamicUser=yes\n", "DynamicUser=yes\nAmbientCapabilities=CAP_NET_ADMIN\n",
         "AmbientCapabilities"),
        ("DynamicUser=yes", "DynamicUser=no", "runs as root"),
        ("Environment=VOXGATE_CONFIG=", "Environment=VOXGATE_CONFG=", "VOXGATE_CONFG"),
        ("TimeoutStopSec=30", "", "TimeoutStopSec"),
    ],
)  # fmt: skip
def test_systemd_checker_catches(old: str, new: str, expect: str) -> None:
    path = SYSTEMD / "voxgate-gateway.service"
    text = path.read_text()
    assert old in text
    problems = check_unit(parse_unit(path, text.replace(old, new)))
    assert any(expect in p for p in problems), problems


def test_systemd_env_example_loads() -> None:
    env = read_env_file(SYSTEMD / "env.example")
    assert unknown_env_names(env) == []
    # The shipped file starts a gateway as is: API on loopback, so no token needed yet.
    effective_config(["gateway"], env, "env.example", "systemd")


def test_dockerignore_keeps_what_the_images_copy() -> None:
    patterns = read_dockerignore()
    copied: set[str] = set()
    for path in IMAGES.values():
        for stage in load_dockerfile(path).stages:
            for ins in stage.all("COPY"):
                words = [w for w in ins.args.split() if not w.startswith("--")]
                if "--from=" not in ins.args:
                    copied |= {w.rstrip("/") for w in words[:-1]}
    assert copied >= {"pyproject.toml", "README.md", "gateway", "synth", "dsp", "voxgate"}
    for src in copied:
        assert (ROOT / src).exists(), src
        assert not dockerignore_excludes(patterns, src), src
        if (ROOT / src).is_dir():
            assert not dockerignore_excludes(patterns, f"{src}/__init__.py"), src
    # Package data the wheel must carry (the softphone page) is in the context too.
    assert not dockerignore_excludes(patterns, "gateway/static/phone.html")
    for junk in (".venv", ".git", "tests", ".venv/bin/python", "gateway/__pycache__/x.pyc"):
        assert dockerignore_excludes(patterns, junk), junk


def test_readme_describes_every_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for p in deploy_files():
        if p.name != "README.md":
            assert p.name in readme, f"deploy/README.md does not mention {p.relative_to(DEPLOY)}"
    for secret in EXTERNAL_SECRETS:
        assert f"create secret generic {secret}" in readme, secret


def test_readme_cluster_note_matches_key_layout() -> None:
    """The README's Redis Cluster advice must match the real key layout: if keys of one call
    carried a hash tag ({...}), the 'no hash tags' warning would be wrong, and vice versa."""
    bus = RedisBus("redis://x", prefix=vc.BusConfig().prefix)
    keys = [bus.request_stream, bus.audio_stream("c1"), bus.cancel_key("u1"), bus.worker_key("w")]
    tagged = all(re.search(r"\{[^}]+\}", k) for k in keys)
    readme = (DEPLOY / "README.md").read_text()
    assert ("no hash tags" in readme) != tagged, keys


# --- the worker's graph cache (synth.graph_cache_dir, issue 17) ---------------------------------


def _under(path: str, root: str) -> bool:
    return Path(path).is_absolute() and Path(path).is_relative_to(root)


def k8s_graph_cache_problems(objs: Sequence[dict[str, Any]]) -> list[str]:
    """The onnx worker's graph cache must sit on a writable, non-config volume: the root
    filesystem is read-only, so a cache anywhere else is not written (~3 s more at every
    start)."""
    worker = _object(objs, "Deployment", "voxgate-worker", "test")
    pod = _pod_spec(worker)
    c = pod["containers"][0]
    cache = k8s_effective(worker, c, objs).cfg.synth.graph_cache_dir
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        vol = volumes[m["name"]]
        if _under(cache, m["mountPath"]) and not m.get("readOnly"):
            if "emptyDir" in vol or "persistentVolumeClaim" in vol:
                return []
            return [f"graph cache {cache} is on volume {m['name']}, not an emptyDir or PVC"]
    return [f"graph cache {cache!r} is on no writable volume"]


def test_k8s_worker_graph_cache_is_on_a_pod_volume() -> None:
    objs = k8s_objects(K8S / "overlays" / "cpu-workers")
    assert k8s_graph_cache_problems(objs) == []
    # The check looks: the same Deployment without the mount is caught.
    worker = _object(objs, "Deployment", "voxgate-worker", "test")
    c = _pod_spec(worker)["containers"][0]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "graph-cache"]
    assert k8s_graph_cache_problems(objs) == [
        "graph cache '/var/cache/voxgate/onnx' is on no writable volume"
    ]


def test_compose_workers_share_a_named_graph_cache_volume() -> None:
    doc = load_yaml_docs(COMPOSE)[0]
    svc = doc["services"]["worker"]
    cache = compose_effective("worker", svc).cfg.synth.graph_cache_dir
    named = [v.split(":") for v in svc.get("volumes") or []]
    hits = [src for src, dst, *_ in named if _under(cache, dst)]
    assert hits and all(src in (doc.get("volumes") or {}) for src in hits), (cache, named)


def test_systemd_workers_share_one_cache_directory() -> None:
    unit = parse_unit(SYSTEMD / "voxgate-worker@.service")
    env: dict[str, str] = {}
    for line in unit.get("Service", "Environment"):
        env |= dict(w.partition("=")[::2] for w in shlex.split(_specifiers(line)))
    eff = effective_config(["worker"], env, "unit", "systemd")
    cache = eff.cfg.synth.graph_cache_dir
    dirs = " ".join(unit.get("Service", "CacheDirectory")).split()
    shared = [d for d in dirs if "%i" not in d and _under(cache, f"{SPECIFIERS['%C']}/{d}")]
    assert shared, (cache, dirs)  # on a CacheDirectory= every instance names, not a per-%i one
    # DynamicUser without a shared User= would give each instance its own UID (and systemd
    # would chown the shared directory back and forth between them).
    assert unit.one("Service", "DynamicUser") == "yes" and unit.one("Service", "User")
