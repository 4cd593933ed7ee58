"""Shared helpers for the asyncio door's and the seed drop-in's tests (no tests here).

pytest-trio runs plain ``async def`` tests under trio, so every asyncio test
is a sync function that calls `run` on a scenario coroutine. Transports
are coroutine functions that record frames; a send that must be slow or hung
blocks on a `Gate` the test opens. Nothing sleeps for timing: tests
wait on events and on actor round trips (an actor handles its inbox in
order, and its effects ride the registry's one port ahead of its replies).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from actors._commands import LifecycleEvent
from actors._credential import ResumeToken
from supervisor.compat import DuplexSessionAttachmentRegistry
from supervisor.doors._asyncio import AsyncioSessionRegistry, open_session_registry
from supervisor.testing import FakeClock as FakeClock
from supervisor.testing import Gate as Gate
from supervisor.testing import Wire as Wire
from supervisor.testing import registry_options

#: Every scenario runs under ``asyncio.wait_for(..., LIMIT)`` (real time).
LIMIT = 10.0

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run ``scenario()`` on a fresh asyncio loop, bounded by `LIMIT`."""

    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), LIMIT)

    return asyncio.run(bounded())


async def spin(turns: int = 5) -> None:
    """Let every ready task run for a few loop iterations."""
    for _ in range(turns):
        await asyncio.sleep(0)


class Events:
    """An observer (it runs on the registry's loop) that tests can wait on."""

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []
        self._changed: asyncio.Event | None = None

    def __call__(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()

    def kinds(self, session_id: str) -> list[str]:
        return [e.kind for e in self.events if e.session_id == session_id]

    async def wait_for(self, kind: str, session_id: str) -> LifecycleEvent:
        while True:
            for event in self.events:
                if event.kind == kind and event.session_id == session_id:
                    return event
            self._changed = asyncio.Event()
            await self._changed.wait()


def activation(token: ResumeToken, generation: int) -> dict[str, object]:
    return {"type": "session.resumed", "attachment_generation": generation}


class TokenCatcher:
    """An activation factory that keeps the rotated tokens it was handed."""

    def __init__(self) -> None:
        self.tokens: list[ResumeToken] = []

    def __call__(self, token: ResumeToken, generation: int) -> dict[str, object]:
        self.tokens.append(token)
        return activation(token, generation)


@asynccontextmanager
async def door(**overrides: Any) -> AsyncIterator[AsyncioSessionRegistry]:
    """``open_session_registry`` with test defaults: a fake clock, no ticker."""
    async with open_session_registry(**registry_options(**overrides)) as reg:
        yield reg


@asynccontextmanager
async def seed_registry(**overrides: Any) -> AsyncIterator[DuplexSessionAttachmentRegistry]:
    """The drop-in, built exactly as the seed's class; stopped at the end (tidiness only)."""
    options: dict[str, Any] = {
        "replay_ttl_s": 60.0,
        "replay_max_bytes_per_session": 1 << 20,
        "clock": FakeClock(),
    }
    options.update(overrides)
    reg = DuplexSessionAttachmentRegistry(**options)
    try:
        yield reg
    finally:
        await reg.aclose()


def duplex_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("duplex-")]
