"""The flags built from a config's field metadata: each default is the field's,
in the parsed value and in ``--help`` alike (a default is written once)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from supervisor._cli import _gateway_config
from supervisor._cli_flags import parser
from supervisor._flag_spec import flag_fields, flag_name, shown_default, shown_size
from supervisor.gateway._config import GatewayConfig


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
    return parser().parse_args([command, *(["--bus", "redis://h"] if command == "worker" else [])])


def _dest(field: dataclasses.Field[object]) -> str:
    spec = field.metadata["flag"]
    return flag_name(field, spec).removeprefix("--").replace("-", "_")


def test_every_flag_field_of_the_gateway_config_is_a_serve_flag() -> None:
    fields = flag_fields(GatewayConfig)
    assert len(fields) >= 30
    flags = {s for a in _subcommand("serve")._actions for s in a.option_strings}
    assert {flag_name(field, spec) for field, spec in fields} <= flags


@pytest.mark.parametrize("command", ["serve", "demo", "worker"])
def test_every_generated_flag_has_the_dataclass_default(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _parsed(command)
    shown = _help(command, monkeypatch)
    checked = 0
    for field in dataclasses.fields(GatewayConfig):
        if "flag" not in field.metadata or not hasattr(args, _dest(field)):
            continue
        checked += 1
        assert getattr(args, _dest(field)) == field.default, field.name
        if field.default is not None:
            written = (shown_default(field.default), shown_size(field.default))
            assert any(f"default {text})" in shown for text in written), field.name
    assert checked >= (30 if command == "serve" else 1)


def test_serve_without_flags_builds_the_default_gateway_config() -> None:
    assert _gateway_config(parser().parse_args(["serve"])) == GatewayConfig()


@pytest.mark.parametrize(
    ("name", "default", "flag", "written"),
    [
        ("handshake_timeout_s", 7.5, "--handshake-timeout", "(default 7.5)"),
        ("replay_max_bytes_per_session", 8 << 20, "--replay-max-bytes", "(default 8 MiB)"),
        ("max_frame_bytes", 1 << 20, "--max-frame-bytes", "(default 1048576 = 1 MiB)"),
        ("disconnect_grace_s", 90.0, "--disconnect-grace", "(default 90)"),
        ("max_inputs_per_session", 7, "--max-inputs-per-session", "(default 7)"),
    ],
)
def test_a_default_changed_in_the_dataclass_shows_in_help_and_parsed_value(
    name: str, default: object, flag: str, written: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    field = {f.name: f for f in dataclasses.fields(GatewayConfig)}[name]
    dest = _dest(field)
    assert getattr(_parsed("serve"), dest) != default
    assert written not in _help("serve", monkeypatch)
    monkeypatch.setattr(field, "default", default)  # the one place a default lives
    assert getattr(_parsed("serve"), dest) == default
    help_line = next(a.help for a in _subcommand("serve")._actions if flag in a.option_strings)
    assert help_line is not None
    assert help_line.endswith(written)
    assert written in _help("serve", monkeypatch)


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
