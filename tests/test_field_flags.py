"""The flags built from a config's field metadata: each default is the field's,
in the parsed value and in ``--help`` alike (a default is written once)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from supervisor.cli._chaos import ChaosConfig
from supervisor.cli._commands import _chaos_config, _engine_config, _gateway_config
from supervisor.cli._flags import SECRET_ENV, parser
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._flag_spec import (
    flag_dest,
    flag_fields,
    flag_name,
    shown_default,
    shown_size,
)
from supervisor.gateway._servers import ServeOptions


def _subcommand(name: str) -> argparse.ArgumentParser:
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    raise AssertionError("duplex-supervisor has no subcommands")


def _help(command: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # unwrapped, so a help is found whole
    return " ".join(_subcommand(command).format_help().split())


def _parsed(command: str) -> argparse.Namespace:
    needed = {"worker": ["--bus", "redis://h"], "chaos": ["ws://h:1/v1"]}
    return parser().parse_args([command, *needed.get(command, [])])


def _dest(field: dataclasses.Field[object]) -> str:
    return flag_dest(field, field.metadata["flag"])


def test_every_flag_field_of_the_gateway_config_is_a_serve_flag() -> None:
    fields = flag_fields(GatewayConfig)
    assert len(fields) >= 30
    flags = {s for a in _subcommand("serve")._actions for s in a.option_strings}
    assert {flag_name(field, spec) for field, spec in fields} <= flags


@pytest.mark.parametrize(
    ("command", "config", "least"),
    [
        ("serve", GatewayConfig, 30),
        ("serve", EngineConfig, 2),
        ("serve", ServeOptions, 1),
        ("demo", GatewayConfig, 1),
        ("demo", EngineConfig, 2),
        ("demo", ChaosConfig, 6),
        ("chaos", ChaosConfig, 6),
        ("worker", GatewayConfig, 1),
        ("worker", EngineConfig, 2),
    ],
)
def test_every_generated_flag_has_the_dataclass_default(
    command: str, config: type, least: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _parsed(command)
    shown = _help(command, monkeypatch)
    checked = 0
    for field in dataclasses.fields(config):
        if "flag" not in field.metadata or not hasattr(args, _dest(field)):
            continue
        checked += 1
        assert getattr(args, _dest(field)) == field.default, field.name
        if field.default is not None and not isinstance(field.default, bool):  # no switch
            written = (shown_default(field.default), shown_size(field.default))
            assert any(f"default {text})" in shown for text in written), field.name
    assert checked >= least


def test_no_flags_build_the_default_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert _gateway_config(_parsed("serve")) == GatewayConfig()
    assert _engine_config(_parsed("serve")) == EngineConfig()
    assert _chaos_config(_parsed("chaos")) == ChaosConfig()


@pytest.mark.parametrize(
    ("command", "config", "name", "default", "written"),
    [
        ("serve", GatewayConfig, "handshake_timeout_s", 7.5, "(default 7.5)"),
        ("serve", GatewayConfig, "replay_max_bytes_per_session", 8 << 20, "(default 8 MiB)"),
        ("serve", GatewayConfig, "max_frame_bytes", 1 << 20, "(default 1048576 = 1 MiB)"),
        ("serve", GatewayConfig, "disconnect_grace_s", 90.0, "(default 90)"),
        ("serve", ServeOptions, "stats_interval_s", 45.0, "(default 45)"),
        ("demo", GatewayConfig, "max_inputs_per_session", 7, "(default 7)"),
        ("worker", EngineConfig, "event_rate_hz", 5.0, "(default 5)"),
        ("chaos", ChaosConfig, "drop_rate", 0.25, "(default 0.25)"),
    ],
)
def test_a_default_changed_in_the_dataclass_shows_in_help_and_parsed_value(
    command: str,
    config: type,
    name: str,
    default: object,
    written: str,
    *,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    field = {f.name: f for f in dataclasses.fields(config)}[name]
    flag = flag_name(field, field.metadata["flag"])
    assert getattr(_parsed(command), _dest(field)) != default
    assert written not in _help(command, monkeypatch)
    monkeypatch.setattr(field, "default", default)  # the one place a default lives
    assert getattr(_parsed(command), _dest(field)) == default
    actions = _subcommand(command)._actions
    help_line = next(a.help for a in actions if flag in a.option_strings)
    assert help_line is not None
    assert help_line.endswith(written)
    assert written in _help(command, monkeypatch)


def _readme_limits() -> dict[str, str]:
    """The README's serve limits table: flag -> the default it names."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("| flag | default | past it |", 1)[1].split("\n\n", 1)[0]
    found: dict[str, str] = {}
    for row in re.findall(r"^\| (`--.+?) \| (.+?) \|", table, re.MULTILINE):
        flags = re.findall(r"`(--[a-z-]+)`", row[0])
        defaults = [d.strip().removesuffix(" s") for d in row[1].split(" / ")]
        if len(flags) == len(defaults):
            found.update(zip(flags, defaults, strict=True))
    return found


def test_the_readmes_limits_table_names_the_dataclass_defaults() -> None:
    table = _readme_limits()
    generated = {flag_name(f, spec): f.default for f, spec in flag_fields(GatewayConfig)}
    named = set(table) & set(generated)
    assert len(named) >= 20
    for flag in named:
        assert table[flag] == shown_default(generated[flag]), flag
