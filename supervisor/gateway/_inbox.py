"""`_Inbox`: one session's accepted client events on their way to the engine.

`supervisor.gateway._sessions.EngineWork` keeps one per session and hands
its events to ``engine.on_client_event`` in order, from one task.
"""

from __future__ import annotations

from collections import deque

import anyio

from supervisor.gateway._protocol import ClientEvent

__all__ = ["_Inbox"]


class _Inbox:
    """A session's accepted client events on their way to the engine: bounded
    (a full inbox makes the connection's reading wait), closed at the session's end."""

    def __init__(self, capacity: int) -> None:
        self._items: deque[ClientEvent] = deque()
        self._capacity = capacity
        self._changed: anyio.Event | None = None
        self.closed = False

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def put(self, event: ClientEvent) -> None:
        while len(self._items) >= self._capacity and not self.closed:
            await self._wait()
        if not self.closed:
            self._items.append(event)
            self._notify()

    async def get(self) -> ClientEvent | None:
        """The next event; ``None`` once closed."""
        while not self._items:
            if self.closed:
                return None
            await self._wait()
        event = self._items.popleft()
        self._notify()
        return event

    def close(self) -> None:
        self.closed = True
        self._items.clear()
        self._notify()
