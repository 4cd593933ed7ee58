"""A config field's command-line flag, carried in the field's metadata so the
field's default and the flag's help live in one place (the CLI builds the flag
from it: ``supervisor.cli._flags.add_field_flags``). No argparse here: the
config modules that use it stay free of the command line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, fields

__all__ = [
    "FlagSpec",
    "flag",
    "flag_dest",
    "flag_fields",
    "flag_name",
    "help_text",
    "shown_default",
    "shown_size",
]

_KEY = "flag"
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagSpec:
    #: The help, with ``{default}`` (the field's default as typed on the
    #: command line) or ``{default_size}`` (a byte count in KiB/MiB) in it.
    help: str
    #: The flags one ``add_field_flags`` call adds, in field order: where
    #: they stand in ``--help``.
    group: str
    #: The flag without ``--`` when it is not the field's name less ``_s``/``_hz``.
    name: str | None = None
    metavar: str | None = None
    #: How the value is read (a key of the CLI's parsers); empty: from the
    #: default's type (an int or a float: positive, a str: as typed).
    parse: str = ""


def flag(
    help: str,
    *,
    group: str,
    name: str | None = None,
    metavar: str | None = None,
    parse: str = "",
) -> Mapping[str, FlagSpec]:
    """``field(default=..., metadata=flag(...))``: the field is a flag of ``group``."""
    return {_KEY: FlagSpec(help=help, group=group, name=name, metavar=metavar, parse=parse)}


def flag_fields(config: type, group: str | None = None) -> list[tuple[Field[object], FlagSpec]]:
    """The fields of the dataclass ``config`` that are flags (of ``group``), in field order."""
    found = [(f, f.metadata[_KEY]) for f in fields(config) if _KEY in f.metadata]
    return [(f, spec) for f, spec in found if group is None or spec.group == group]


def flag_name(field: Field[object], spec: FlagSpec) -> str:
    """``--replay-ttl`` for ``replay_ttl_s``, unless the spec names it."""
    if spec.name is not None:
        return f"--{spec.name}"
    stem = field.name.removesuffix("_s").removesuffix("_hz")
    return "--" + stem.replace("_", "-")


def flag_dest(field: Field[object], spec: FlagSpec) -> str:
    """The attribute argparse stores the flag's value in: ``replay_ttl``."""
    return flag_name(field, spec).removeprefix("--").replace("-", "_")


def shown_default(value: object) -> str:
    """A default as one would type it: ``5`` for 5.0, ``none`` for None."""
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def shown_size(value: object) -> str:
    """A byte count in the largest binary unit that holds it whole: ``4 MiB``."""
    if isinstance(value, int):
        for unit, size in _UNITS:
            if value >= size and value % size == 0:
                return f"{value // size} {unit}"
    return f"{value} bytes"


def help_text(field: Field[object], spec: FlagSpec) -> str:
    """The spec's help with the field's default written in."""
    return spec.help.format(
        default=shown_default(field.default), default_size=shown_size(field.default)
    )
