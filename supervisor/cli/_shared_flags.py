"""The flags more than one command shares: the gateway's secret (never on
argv: a file or the environment) and the logging flags."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from supervisor.gateway._logs import LOG_FORMATS

__all__ = ["SECRET_ENV", "add_logging_flags", "add_secret_flags", "read_secret"]

SECRET_ENV = "DUPLEX_SUPERVISOR_SECRET"  # noqa: S105 - a variable name, not a secret
_LEVELS = ("debug", "info", "warning", "error")


class _RefuseSecretOnArgv(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        parser.error(
            "argument --secret: a secret on the command line is visible to every user "
            f"(ps, /proc); use --secret-file PATH or ${SECRET_ENV}"
        )


def add_secret_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        help=f"{what}: read it from this file (one line; default: ${SECRET_ENV}, or none)",
    )
    parser.add_argument(
        "--secret",
        action=_RefuseSecretOnArgv,
        nargs="?",
        help="refused: a secret in argv is visible in ps; use --secret-file or the "
        f"environment variable {SECRET_ENV}",
    )


def read_secret(args: argparse.Namespace) -> str | None:
    path = getattr(args, "secret_file", None)
    if path is None:
        return os.environ.get(SECRET_ENV) or None
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise OSError(exc.errno, f"--secret-file {path}: {exc.strerror or exc}") from None
    if not secret:
        raise ValueError(f"--secret-file {path}: the file is empty")
    return secret


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log our own lines at DEBUG (same as --log-level debug)",
    )
    group.add_argument(
        "--log-level",
        choices=_LEVELS,
        default=argparse.SUPPRESS,
        help="level of duplex-supervisor's own loggers (default: info for serve, "
        "warning otherwise)",
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="text lines, or one JSON object per line (default text)",
    )
    group.add_argument(
        "--third-party-log-level",
        choices=_LEVELS,
        default=argparse.SUPPRESS,
        help="level of every other library's loggers: wsproto, pykka, uvicorn, Hypercorn "
        "(default warning)",
    )
