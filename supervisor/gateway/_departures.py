"""A connection's or a session's end, as the gateway tells the registry.

A connection that ends detaches (an unconfirmed resume rolled back first);
a session that ends is closed; an open whose token never reached its client
is closed again (`supervisor.gateway._admission`). With a session store
each is a store write, and an unreachable store must not lose it:
`Departures.until_stored` tries once now and, while the store stays
unreachable, again on a timer in the background, until the store answers or
the session is gone (taken over, closed, the registry shut).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import anyio

from actors._errors import (
    RegistryClosedError,
    SessionCrashedError,
    SessionError,
    SessionReplacedError,
    StoreUnavailableError,
)
from supervisor._log_limit import LogLimiter
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._config import GatewayCounters
from supervisor.gateway._sessions import TaskSpawner

__all__ = ["LEAVE_RETRY_MAX_S", "LEAVE_RETRY_S", "Departures"]

#: A leave's store call (detach, close) that met an unreachable store is
#: tried again after this, doubling up to `LEAVE_RETRY_MAX_S`: a timer, not
#: a busy loop, until the store answers or another process took the session.
LEAVE_RETRY_S = 0.2
LEAVE_RETRY_MAX_S = 2.0

StoreCall = Callable[[], Awaitable[object]]


class Departures:
    """Detaches and closes that reach the registry, whatever the store does."""

    def __init__(
        self,
        registry: AsyncSessionRegistry,
        counters: GatewayCounters,
        task_group: TaskSpawner,
        log: LogLimiter,
    ) -> None:
        self._registry = registry
        self._counters = counters
        self._task_group = task_group
        self._log = log

    async def detach(self, session_id: str, generation: int, *, unconfirmed: bool) -> None:
        """The connection of ``generation`` ended: roll its resume back if the
        client never confirmed it, then detach it."""
        registry = self._registry
        with contextlib.suppress(KeyError, SessionError):
            if unconfirmed and await registry.abandon_resume(
                session_id, attachment_generation=generation
            ):
                self._counters.unconfirmed_resumes += 1
        await self.until_stored(
            "detach", lambda: registry.detach(session_id, attachment_generation=generation)
        )

    async def close(self, session_id: str) -> None:
        """The session ended: close it in the registry."""
        await self.until_stored("close", lambda: self._registry.close(session_id))

    async def until_stored(self, what: str, call: StoreCall) -> None:
        """A leave's store call (``detach``, ``close``; an open's rollback close):
        once now, and while the store is unreachable again on a timer in the
        background, until the store answers or the session is gone (taken
        over, closed, the registry shut)."""
        if not await self._try_once(what, call):
            self._task_group.start_soon(self._retry, what, call)

    async def _retry(self, what: str, call: StoreCall) -> None:
        delay = LEAVE_RETRY_S
        while True:
            await anyio.sleep(delay)
            if await self._try_once(what, call):
                return
            delay = min(delay * 2, LEAVE_RETRY_MAX_S)

    async def _try_once(self, what: str, call: StoreCall) -> bool:
        """One try; ``False``: the store was unreachable, try again later."""
        for _ in range(2):  # a crash is retryable and traceless: once more at once
            try:
                await call()
            except SessionCrashedError:
                continue
            except StoreUnavailableError:
                self._log.log(
                    logging.WARNING,
                    "leave_retry",
                    "a session's %s met an unreachable store; retrying until it answers",
                    what,
                    now=anyio.current_time(),
                )
                return False
            except SessionReplacedError:
                # A normal path: a resume elsewhere won the race with this leave.
                self._log.log(
                    logging.INFO,
                    "replaced",
                    "a session was taken over while its connection left",
                    now=anyio.current_time(),
                )
            except (KeyError, RegistryClosedError):
                pass  # the session is gone already: nothing is left to release
            return True
        return False
