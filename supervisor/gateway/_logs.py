"""Logging for the command line: text or JSON lines, our loggers' level apart from the rest.

Our loggers are ``duplex_supervisor.*``; everything else (wsproto, h11,
pykka, uvicorn, Hypercorn, asyncio) is third-party and stays at WARNING
unless asked, so ``-v`` shows our DEBUG lines, not bytes on the wire.

`redact_query_strings` keeps a URL's query string (where a careless client
puts ``?token=``) out of the servers' log lines: uvicorn logs every WebSocket
it accepts, and access logs name each request's path.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

from supervisor._log_limit import ThirdPartyLogLimit

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging", "redact_query_strings"]

#: The loggers whose lines name a request's URL (the servers'; ours never do).
URL_LOGGERS = ("uvicorn.error", "uvicorn.access", "hypercorn.access", "hypercorn.error")

LOG_FORMATS = ("text", "json")
OURS = "duplex_supervisor"
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exc_info)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def _without_query(value: object) -> object:
    if isinstance(value, str) and value.startswith("/") and "?" in value:
        return value.partition("?")[0]
    return value


class QueryStringFilter(logging.Filter):
    """Cuts the query string off every URL path among a record's arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_query(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            # Hypercorn's access log: atoms by name, the path with its query in several.
            record.args = {key: _without_query(arg) for key, arg in record.args.items()}
        return True


_FILTER = QueryStringFilter()


def redact_query_strings() -> None:
    """Keep query strings out of the servers' log lines (idempotent)."""
    for name in URL_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)  # a filter is added once


def configure_logging(
    *,
    level: int,
    log_format: Literal["text", "json"] = "text",
    third_party_level: int = logging.WARNING,
    interval_s: float = 10.0,
) -> None:
    """One stderr handler on the root; ours at ``level``, the rest at ``third_party_level``
    and each of their messages at most once per ``interval_s`` (a client must not be
    able to fill the log through a server's own logger)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ThirdPartyLogLimit(interval_s, OURS))
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(third_party_level)
    logging.getLogger(OURS).setLevel(level)
    # Servers that set their own loggers' levels get ours.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "hypercorn.error", "asyncio"):
        logging.getLogger(name).setLevel(third_party_level)
    redact_query_strings()
