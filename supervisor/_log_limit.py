"""At most one log line per kind per interval: what a client or an outage can
repeat (a store that is down, a storm of bad frames) is logged once, and the
lines held back are counted into the next one.

Thread-safe: the gateway logs from its loop, a session store from every
actor thread that writes through it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

__all__ = ["LogLimiter", "ThirdPartyLogLimit"]


@dataclass(slots=True)
class _Line:
    last_logged: float
    #: The summary of held-back lines goes out at their own level.
    level: int = logging.WARNING
    suppressed: int = 0


@dataclass(slots=True)
class LogLimiter:
    """At most one log line per kind per ``interval_s``; the rest are counted and
    reported in one summary line (on the next line of that kind after the
    interval, or by `flush`)."""

    logger: logging.Logger
    interval_s: float
    _lines: dict[str, _Line] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def log(
        self,
        level: int,
        kind: str,
        message: str,
        *args: object,
        now: float,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log unless a line of ``kind`` went out within the interval; ``True`` if logged."""
        with self._lock:
            line = self._lines.get(kind)
            if line is not None and now - line.last_logged < self.interval_s:
                line.suppressed += 1
                return False
            suppressed = line.suppressed if line is not None else 0
            self._lines[kind] = _Line(last_logged=now, level=level)
        if suppressed:
            message += " (and %d more like it in the last %.0f s, not logged)"
            args = (*args, suppressed, self.interval_s)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def flush(self, now: float) -> None:
        """One summary line per kind whose lines were held back; forget quiet kinds."""
        with self._lock:
            for kind, line in list(self._lines.items()):
                if line.suppressed:
                    self.logger.log(
                        line.level,
                        "%s: %d more lines like the last one, not logged",
                        kind,
                        line.suppressed,
                    )
                    self._lines[kind] = _Line(last_logged=now, level=line.level)
                elif now - line.last_logged >= self.interval_s:
                    del self._lines[kind]


class ThirdPartyLogLimit(logging.Filter):
    """A handler's filter: the lines of other libraries' loggers (uvicorn's, Hypercorn's,
    asyncio's), which a client can cause too ("Invalid HTTP request received",
    an accept error), at most once per message per ``interval_s``.

    Ours (``duplex_supervisor.*``) pass untouched: they are limited where they
    are logged. The count of lines held back goes into the next one let through.
    """

    def __init__(self, interval_s: float, ours: str = "duplex_supervisor") -> None:
        super().__init__()
        self._interval_s = interval_s
        self._ours = ours
        self._lines: dict[tuple[str, str], _Line] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == self._ours or record.name.startswith(self._ours + "."):
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            line = self._lines.get(key)
            if line is not None and now - line.last_logged < self._interval_s:
                line.suppressed += 1
                return False
            if len(self._lines) > 1000:
                self._lines.clear()  # bounded: many distinct messages restart the count
            self._lines[key] = _Line(last_logged=now, level=record.levelno)
        if line is not None and line.suppressed:
            record.msg = (
                f"{record.getMessage()} (and {line.suppressed} more like it in the last "
                f"{self._interval_s:.0f} s, not logged)"
            )
            record.args = None
        return True
