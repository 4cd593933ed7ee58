"""Shared helpers for the asyncio door's and the seed drop-in's tests (no tests here).

pytest-trio runs plain ``async def`` tests under trio, so every asyncio test
is a sync function that calls :func:`run` on a scenario coroutine. Transports
are coroutine functions that record frames; a send that must be slow or hung
blocks on a :class:`Gate` the test opens. Nothing sleeps for timing: tests
wait on events and on actor round trips (an actor handles its inbox in
order, and its effects ride the registry's one port ahead of its replies).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from actors.credential import ResumeToken
from actors.messages import LifecycleEvent
from supervisor.asyncio_registry import AsyncioSessionRegistry, open_session_registry
from supervisor.compat import DuplexSessionAttachmentRegistry

#: Every scenario runs under ``asyncio.wait_for(..., LIMIT)`` (real time).
LIMIT = 10.0

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run ``scenario()`` on a fresh asyncio loop, bounded by :data:`LIMIT`."""

    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), LIMIT)

    return asyncio.run(bounded())


async def spin(turns: int = 5) -> None:
    """Let every ready task run for a few loop iterations."""
    for _ in range(turns):
        await asyncio.sleep(0)


class FakeClock:
    """The registry's logical clock: ``clock.now += 10``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gate:
    """Holds one send: ``entered`` once it started; it returns after ``release``."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._release = asyncio.Event()
        self.cancelled = False

    def release(self) -> None:
        self._release.set()

    async def wait(self) -> None:
        self.entered.set()
        try:
            await self._release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Wire:
    """An asyncio transport: records the frames that reached ``send`` and every close.

    ``hold(n)`` makes its n-th send (counted from 1) block until released;
    ``fail(n, error)`` makes it raise ``error`` (after any hold) instead.
    ``log``, if set, gets ``"send"`` for every send that returned.
    """

    def __init__(self, log: list[str] | None = None) -> None:
        self.frames: list[dict[str, object]] = []
        self.closes: list[str] = []
        self.closed = asyncio.Event()
        self.sends = 0
        self.log = log
        self._gates: dict[int, Gate] = {}
        self._failures: dict[int, BaseException] = {}

    def hold(self, nth: int) -> Gate:
        gate = self._gates[nth] = Gate()
        return gate

    def fail(self, nth: int, error: BaseException) -> None:
        self._failures[nth] = error

    async def send(self, frame: dict[str, object]) -> None:
        assert type(frame) is dict, "send must get a fresh plain dict"
        self.sends += 1
        nth = self.sends
        gate = self._gates.pop(nth, None)
        if gate is not None:
            await gate.wait()
        error = self._failures.pop(nth, None)
        if error is not None:
            raise error
        self.frames.append(frame)
        if self.log is not None:
            self.log.append("send")

    async def close(self, reason: str) -> None:
        self.closes.append(reason)
        self.closed.set()

    def seqs(self) -> list[object]:
        return [f.get("server_event_seq") for f in self.frames]


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
    options: dict[str, Any] = {
        "replay_ttl_s": 60.0,
        "replay_max_bytes_per_session": 1 << 20,
        "clock": FakeClock(),
        "sweep_interval_s": None,
    }
    options.update(overrides)
    async with open_session_registry(**options) as reg:
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
