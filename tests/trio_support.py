"""Shared helpers for the trio front door's tests (no tests here).

Transports are trio async functions that record frames; a send that must be
slow or hung blocks on a `Gate` the test releases. Nothing here sleeps
for timing: tests wait on events, on ``wait_all_tasks_blocked`` and on actor
round trips (an actor handles its inbox in order, and its effects ride the
registry's one port ahead of its replies).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from actors._commands import LifecycleEvent
from actors._credential import ResumeToken
from supervisor.doors._trio import TrioSessionRegistry, open_session_registry
from supervisor.testing import FakeClock as FakeClock
from supervisor.testing import Gate as Gate
from supervisor.testing import Wire as Wire
from supervisor.testing import registry_options

#: Every test body runs under ``trio.fail_after(LIMIT)`` (real time).
LIMIT = 10.0


class Events:
    """An observer (it runs on the registry's loop) that tests can wait on."""

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []
        self._changed = trio.Event()

    def __call__(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    def kinds(self, session_id: str) -> list[str]:
        return [e.kind for e in self.events if e.session_id == session_id]

    async def wait_for(self, kind: str, session_id: str) -> LifecycleEvent:
        while True:
            for event in self.events:
                if event.kind == kind and event.session_id == session_id:
                    return event
            await self._changed.wait()


@asynccontextmanager
async def registry(**overrides: Any) -> AsyncIterator[TrioSessionRegistry]:
    """``open_session_registry`` with test defaults: a fake clock, no ticker."""
    async with open_session_registry(**registry_options(**overrides)) as reg:
        yield reg


def activation(token: ResumeToken, generation: int) -> dict[str, object]:
    return {"type": "session.resumed", "attachment_generation": generation}


class TokenCatcher:
    """An activation factory that keeps the rotated tokens it was handed."""

    def __init__(self) -> None:
        self.tokens: list[ResumeToken] = []

    def __call__(self, token: ResumeToken, generation: int) -> dict[str, object]:
        self.tokens.append(token)
        return activation(token, generation)


async def settled(reg: TrioSessionRegistry, session_id: str) -> None:
    """Return once every call a task of this test already made reached the actor.

    First every trio task runs until it blocks (so each started call has been
    handed to its session), then one round trip to the session: its answer
    comes after the session handled everything queued before it, and after
    the effects those calls put on the port.
    """
    await trio.testing.wait_all_tasks_blocked()
    await reg.has_attachment(session_id)
    await trio.testing.wait_all_tasks_blocked()


async def gone(reg: TrioSessionRegistry, session_id: str) -> None:
    """Return once a session that left is out of the supervisor's routing table.

    It tells the supervisor as it leaves; closing an unknown id is a
    supervisor round trip behind that message.
    """
    assert await reg.close("\x00barrier") is None


def duplex_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("duplex-")]


class Outcome:
    """What a call started in a nursery gave: ``value`` or ``error``."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    async def run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = await fn()
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()
