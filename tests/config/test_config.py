"""Config: file < env < flags, every key overridable, clear one-line errors with exit 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from voxgate import cli
from voxgate.contract.config import (
    ConfigError,
    add_config_arguments,
    all_keys,
    load,
    load_from_args,
)

SAMPLE = Path(__file__).resolve().parents[2] / "voxgate.toml.sample"


def test_sample_file_parses_to_the_defaults() -> None:
    # The sample documents every key with its default value.
    assert load(SAMPLE, env={}) == load(None, env={})
    text = SAMPLE.read_text()
    for key, _, _ in all_keys():
        section, name = key.split(".")
        documented = f"\n{name} = " in text or f"\n[{section}.{name}]" in text
        assert documented, f"{key} missing from the sample"


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    f = tmp_path / "v.toml"
    f.write_text('[synth]\nconcurrency = 3\nthreads = 2\n[log]\nlevel = "debug"\n')
    cfg = load(f, env={"VOXGATE_SYNTH_THREADS": "5"}, overrides={"log.level": "error"})
    assert (cfg.synth.concurrency, cfg.synth.threads, cfg.log.level) == (3, 5, "error")


def test_every_key_has_a_flag_and_an_env_var() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    for key, _typ, default in all_keys():
        flag = "--" + key.replace(".", "-").replace("_", "-")
        value = json.dumps(default) if isinstance(default, dict) else str(default)
        args = parser.parse_args([flag, value])
        assert getattr(args, "cfg:" + key) == value
        env = {"VOXGATE_" + key.replace(".", "_").upper(): value}
        if key in ("synth.voice", "gateway.api_token", "gateway.trunk"):
            continue  # empty defaults with a meaning; a non-empty value is validated
        assert load(None, env=env) is not None


def test_aliases_map_onto_keys() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--redis", "redis://example:6380/1", "--concurrency", "7"])
    cfg = load_from_args(args, env={})
    assert cfg.bus.redis_url == "redis://example:6380/1"
    assert cfg.synth.concurrency == 7


@pytest.mark.parametrize(
    ("toml", "env", "key"),
    [
        ('[synth]\nengine = "espeak"\n', {}, "synth.engine"),
        ('[synth]\nconcurrency = "four"\n', {}, "synth.concurrency"),
        ("[synth]\nconcurrency = 0\n", {}, "synth.concurrency"),
        ("[synth]\nnope = 1\n", {}, "synth.nope"),
        ("[bogus]\nx = 1\n", {}, "bogus.x"),
        ("", {"VOXGATE_SYNTH_CONCURRENCY": "x"}, "synth.concurrency"),
        ("", {"VOXGATE_SYNTH_ENGIN": "onnx"}, "VOXGATE_SYNTH_ENGIN"),
        ('[synth]\nvoice = "/no/such/voice.onnx"\n', {}, "synth.voice"),
        ('[synth]\ndevice = "cuda"\n', {}, "synth.device"),  # onnx engine is CPU only
        ('[bus]\nkind = "redis"\nredis_url = "http://x"\n', {}, "bus.redis_url"),
        ("[synth\n", {}, "invalid TOML"),
        ('[gateway]\nsip_listen = "5060"\n', {}, "gateway.sip_listen"),
        ('[gateway]\nhttp_listen = "[::1:80"\n', {}, "gateway.http_listen"),
        ("[gateway]\nrtp_port_min = 20000\nrtp_port_max = 10000\n", {}, "gateway.rtp_port_min"),
        ('[gateway]\ntrunk = "example.com"\n', {}, "gateway.trunk"),
        ("[gateway]\nregister = true\n", {}, "gateway.register"),
        ("[gateway]\nsip_t1_ms = 20\n", {}, "gateway.sip_t1_ms"),
        ('[ivr.menu]\n"12" = "x"\n', {}, "ivr.menu"),
        ('[ivr]\nhangup_digits = "5"\n', {}, "ivr.hangup_digits"),
        ("", {"VOXGATE_IVR_MENU": "{not json"}, "ivr.menu"),
        ("", {"VOXGATE_IVR_MENU": '{"1": 5}'}, "ivr.menu"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, toml: str, env: dict[str, str], key: str) -> None:
    f = tmp_path / "v.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load(f, env=env)
    assert key in str(info.value)


def test_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "v.toml"
    f.write_text('[synth]\nengine = "espeak"\n')
    rc = cli.main(["synth", "hello", "-o", str(tmp_path / "o.wav"), "--config", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "synth.engine" in err[0]


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "absent.toml", env={})


def test_tables_from_toml_env_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "v.toml"
    f.write_text('[ivr]\nhangup_digits = ""\n[ivr.menu]\n"5" = "five"\n')
    assert load(f, env={}).ivr.menu == {"5": "five"}
    cfg = load(None, env={"VOXGATE_IVR_MENU": '{"0": "bye"}'})
    assert cfg.ivr.menu == {"0": "bye"}
    cfg = load(None, env={}, overrides={"ivr.menu": '{"0": "ciao"}'})
    assert cfg.ivr.menu == {"0": "ciao"}


def test_each_command_lists_only_the_keys_it_reads() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    def flags(command: str) -> set[str]:
        return {o for a in sub.choices[command]._actions for o in a.option_strings}

    worker, gateway, serve = flags("worker"), flags("gateway"), flags("serve")
    assert "--synth-engine" in worker and "--redis" in worker and "--worker-http-listen" in worker
    assert not {f for f in worker if f.startswith(("--gateway-", "--ivr-", "--webrtc-"))}
    assert "--sip-listen" not in worker and "--bargein-enabled" not in worker
    assert "--gateway-sip-listen" in gateway and "--ivr-greeting" in gateway
    assert "--synth-max-text-chars" in gateway  # the gateway enforces it before a request
    assert "--synth-engine" not in gateway and "--engine" not in gateway
    assert "--worker-name" not in gateway
    assert {"--synth-engine", "--gateway-sip-listen", "--ivr-greeting"} <= serve  # both sides
    assert "--gateway-sip-listen" not in flags("synth")


def test_unknown_keys_for_a_command_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown config keys"):
        add_config_arguments(argparse.ArgumentParser(), ["gateway", "synth.no_such_key"])
