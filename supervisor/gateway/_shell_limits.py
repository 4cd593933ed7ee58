"""What the ASGI servers' classes of ours share: the connection counts before the
upgrade, their refusals, and one log limiter (see `supervisor.gateway._uvicorn`
and `supervisor.gateway._hypercorn`)."""

from __future__ import annotations

import logging
import time

from supervisor._log_limit import LogLimiter
from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._limits import AddressCounter
from supervisor.gateway._listener import REFUSALS

__all__ = ["ShellLimits", "refusal_bytes"]

logger = logging.getLogger("duplex_supervisor.supervisor")


def refusal_bytes(status: bytes) -> bytes:
    """A whole HTTP answer with ``status`` (``b"503 Service Unavailable"``), no body."""
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class ShellLimits:
    """The connection caps (total and per address) counted at accept, as the trio
    server counts them, and the rate-limited log of what clients cause."""

    def __init__(self, config: GatewayConfig, counters: GatewayCounters | None = None) -> None:
        self.config = config
        self.connections = AddressCounter(
            config.max_connections, config.max_connections_per_address
        )
        self.counters = counters or GatewayCounters()
        self.log = LogLimiter(logger, config.log_interval_s)

    def _log(self, level: int, kind: str, message: str, *args: object) -> None:
        self.log.log(level, kind, message, *args, now=time.monotonic())

    def admit(self, peer: str) -> bytes | None:
        """Count a new connection from ``peer``; ``None``, or the HTTP answer that
        refuses it (counted and logged: it passed a cap)."""
        refusal = self.connections.refusal(peer)
        if refusal is None:
            self.connections.take(peer)
            return None
        refused = self.counters.refused
        refused[refusal] = refused.get(refusal, 0) + 1
        self._log(logging.WARNING, "refused", "refused a connection: %s cap reached", refusal)
        return refusal_bytes(REFUSALS[refusal])

    def shed(self) -> None:
        """One connection shed for want of descriptors (counted)."""
        refused = self.counters.refused
        refused["descriptors"] = refused.get("descriptors", 0) + 1
