"""What the engine bus's callers use with it, none of it Redis: a call to the
bus retried while Redis is unreachable (`call_until_reachable`), what a worker
receives (`Delivery`) and the gateway's side of fencing (`LeaseFence`).
Importable, like the bus, from `supervisor.engine_bus`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread

from actors._errors import StoreUnavailableError
from supervisor.messages import EngineMessage, GatewayMessage

__all__ = ["RETRY_S", "Delivery", "LeaseFence", "call_until_reachable"]

logger = logging.getLogger("duplex_supervisor.supervisor")

T = TypeVar("T")

#: How long a call to an unreachable Redis waits before it is tried again.
RETRY_S = 0.2


async def call_until_reachable(call: Callable[..., T], *args: object) -> T:
    """``call(*args)`` on a worker thread, tried again while Redis is unreachable
    (a restart): what a worker or a gateway sends is delayed, never dropped."""
    while True:
        try:
            return await anyio.to_thread.run_sync(call, *args, abandon_on_cancel=True)
        except StoreUnavailableError as exc:
            logger.warning("engine bus: %s; trying again", exc)
            await anyio.sleep(RETRY_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One entry of the input stream, as a worker received it."""

    entry_id: str
    message: GatewayMessage
    #: Another worker had it first (claimed after the visibility timeout).
    redelivered: bool


class LeaseFence:
    """The gateway's side of fencing: per session the lease generation it holds;
    an engine message from an older one is refused and counted."""

    def __init__(self) -> None:
        self._current: dict[str, int] = {}
        self.fenced = 0

    def hold(self, session_id: str, lease_generation: int) -> None:
        self._current[session_id] = max(self._current.get(session_id, 0), lease_generation)

    def drop(self, session_id: str) -> None:
        self._current.pop(session_id, None)

    def generation(self, session_id: str) -> int | None:
        return self._current.get(session_id)

    def admit(self, message: EngineMessage) -> bool:
        """Whether ``message`` may reach its session here (held, and not older)."""
        current = self._current.get(message.session_id)
        if current is None or message.lease_generation < current:
            self.fenced += 1
            return False
        return True
