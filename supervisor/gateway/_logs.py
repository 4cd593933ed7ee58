"""Logging for the command line: text or JSON lines, our loggers' level apart from the rest.

Our loggers are ``duplex_supervisor.*``; everything else (wsproto, h11,
pykka, uvicorn, Hypercorn, asyncio) is third-party and stays at WARNING
unless asked, so ``-v`` shows our DEBUG lines, not bytes on the wire.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

from supervisor._log_limit import ThirdPartyLogLimit

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

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
