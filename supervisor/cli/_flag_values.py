"""How a flag's text becomes its value: the parsers the flags take (each
complaint says what the flag wants), and the flags built from a config
dataclass's fields (``flag(...)`` metadata, supervisor/gateway/_flag_spec.py)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from supervisor.gateway._flag_spec import flag_dest, flag_fields, flag_name, help_text

__all__ = [
    "add_field_flags",
    "byte_size",
    "durability",
    "field_values",
    "port",
    "positive",
    "store_outage",
    "websocket_url",
]


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text}") from None
    if not 0 <= value <= 65_535:
        raise argparse.ArgumentTypeError(f"must be within 0..65535 (0: any free port), got {text}")
    return value


def websocket_url(text: str) -> str:
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:  # a port out of range or not a number
        port = None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or port is None:
        raise argparse.ArgumentTypeError(f"need a ws:// or wss://host:port/path URL, got {text!r}")
    return text


def _finite(value: float, text: str, off: str = "") -> float:
    # float() takes "inf" and "1e999"; as a duration or rate infinity breaks
    # deadlines (or means "never", which only a flag taking 'none' offers).
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite{off}, got {text}")
    return value


def _number(kind: Callable[[str], float], text: str, expected: str) -> float:
    # argparse names the parse function in its complaint ("invalid parse
    # value"): say instead what the flag takes.
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    expected = "a whole number" if kind is int else "a number"

    def parse(text: str) -> float:
        value = _number(kind, text, expected)
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return _finite(value, text)

    return parse


def store_outage(text: str) -> tuple[float, float]:
    """``--store-outage AT:SECONDS``: when the demo's Redis dies, and for how long."""
    at, colon, seconds = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"expected AT:SECONDS (e.g. 3:2), got {text!r}")
    start = _finite(_number(float, at, "a number of seconds"), at)
    length = positive(float)(seconds)
    if not start >= 0:
        raise argparse.ArgumentTypeError(f"AT must be >= 0, got {at}")
    return start, length


#: The units `byte_size` takes: binary as the help prints them, decimal too.
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}
_BYTE_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def byte_size(text: str) -> int:
    """A positive count of bytes: ``4194304``, ``4MiB``, ``4 MiB``, ``64KiB``, ``1MB``."""
    match = _BYTE_SIZE.fullmatch(text)
    unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes (65536, 64KiB, 4 MiB, 1MB), got {text!r}"
        )
    exact = float(match.group(1)) * unit
    if exact != int(exact):
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, got {text}")
    value = int(exact)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _seconds_or_none(*, zero: bool) -> Callable[[str], float | None]:
    """Seconds, or 'none' (off); positive, or with ``zero`` >= 0; never infinite."""
    bound = ">= 0" if zero else "positive"

    def parse(text: str) -> float | None:
        if text.strip().lower() == "none":
            return None
        value = _number(float, text, "seconds (a number) or 'none'")
        if not (value >= 0 if zero else value > 0):
            raise argparse.ArgumentTypeError(f"must be {bound} or 'none', got {text}")
        return _finite(value, text, " ('none' turns it off)")

    return parse


def durability(text: str) -> int:
    """``replicas=K`` (K >= 0): the replicas each Redis commit waits for."""
    name, _, count = text.partition("=")
    if name != "replicas" or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected replicas=K (K >= 0), not {text!r}")
    return int(count)


def _non_negative(text: str) -> float:
    value = _number(float, text, "a number")
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return _finite(value, text)


#: How a field's flag reads its value (``FlagSpec.parse``; empty: by the default's
#: type); None: the text as typed.
_PARSERS: dict[str, Callable[[str], object] | None] = {
    "int": positive(int),
    "float": positive(float),
    "integer": int,
    "non-negative": _non_negative,
    "str": None,
    "port": port,
    "bytes": byte_size,
    "seconds|none": _seconds_or_none(zero=False),
    "seconds>=0|none": _seconds_or_none(zero=True),
}


def add_field_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, config: type, group: str
) -> None:
    """A flag for each field of the dataclass ``config`` whose ``flag(...)`` metadata
    names ``group``: its default the field's, its help the field's, the default
    written into the help from the field (so a default is written once)."""
    for field, spec in flag_fields(config, group):
        if isinstance(field.default, bool):  # a switch: off unless given
            parser.add_argument(
                flag_name(field, spec), action="store_true", help=help_text(field, spec)
            )
            continue
        parse = _PARSERS[spec.parse or type(field.default).__name__]
        typed: dict[str, Any] = {} if parse is None else {"type": parse}
        parser.add_argument(
            flag_name(field, spec),
            **typed,
            default=field.default,
            metavar=spec.metavar,
            help=help_text(field, spec),
        )


def field_values(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The values ``args`` holds for ``config``'s flag fields, by field name."""
    found: dict[str, Any] = {}
    for field, spec in flag_fields(config):
        dest = flag_dest(field, spec)
        if hasattr(args, dest):  # a group this command has not got
            found[field.name] = getattr(args, dest)
    return found
