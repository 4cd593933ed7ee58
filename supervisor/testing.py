"""A pytest plugin for testing an engine against a registry, with faults and a fake clock.

Installed with the package (entry point ``pytest11``, name
``duplex_supervisor``), so its fixtures are there in every test session;
``-p no:duplex_supervisor`` turns it off. Fixtures:

``duplex_clock``
    A `FakeClock` (the registry's clock): ``duplex_clock.advance(60)``
    moves TTLs and the disconnect grace a minute on, nothing sleeps.
``duplex_faults``
    A `FaultPlan` wired into every registry fixture: arm
    crashes, failed, hung or delayed sends, supervisor crashes, clock jumps.
``duplex_options``
    The options every registry fixture is built with (a ``dict``): the
    clock and plan above, a 60 s TTL, 1 MiB per journal, no background
    sweeps (``await registry.sweep()`` instead), a 1 s send timeout.
    Override this fixture to change them.
``duplex_wire``
    A `Wire`: a transport that records frames and closes, for every
    door, and holds or fails its n-th send on demand.
``duplex_trio_registry``
    A trio registry (``open_session_registry``) for a trio test (needs
    pytest-trio); shut down after the test.
``duplex_asyncio_registry``
    A function returning the asyncio registry's async context manager:
    ``async with duplex_asyncio_registry() as registry:`` inside your
    asyncio test (any runner).
``duplex_thread_registry``
    A `ThreadSessionRegistry`, shut down after the test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio

from supervisor._faults import FaultPlan
from supervisor.doors._asyncio import AsyncioSessionRegistry
from supervisor.doors._asyncio import open_session_registry as open_asyncio_registry
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.doors._trio import TrioSessionRegistry, open_session_registry

__all__ = ["FakeClock", "Gate", "Signal", "Wire", "registry_options"]


class FakeClock:
    """A clock that moves only when told: pass it as a registry's ``clock``.

    Args:
        now: The starting time, in seconds.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        """The current time."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds


class Signal:
    """A one-shot event any waiter can wait on: a trio task, an asyncio task or a thread.

    ``set()`` must run on the waiter's loop (or, for thread waiters, anywhere).
    """

    def __init__(self) -> None:
        self._set = threading.Event()
        self._loop_events: list[trio.Event | asyncio.Event] = []

    def set(self) -> None:
        """Wake every waiter, now and later."""
        self._set.set()
        events, self._loop_events = self._loop_events, []
        for event in events:
            event.set()

    def is_set(self) -> bool:
        """Whether ``set()`` was called."""
        return self._set.is_set()

    async def wait(self) -> None:
        """Wait on the running loop (trio or asyncio) until set."""
        event: trio.Event | asyncio.Event = (
            trio.Event() if trio.lowlevel.in_trio_run() else asyncio.Event()
        )
        if self._set.is_set():
            event.set()
        else:
            self._loop_events.append(event)
        await event.wait()

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """Block this thread until set (or ``timeout``); whether it was set."""
        return self._set.wait(timeout)


class Gate:
    """Holds one send of a `Wire`: ``entered`` once it began, it ends at ``release``."""

    def __init__(self) -> None:
        self.entered = Signal()
        self._release = Signal()
        #: Whether the held send was cancelled (the library gave up on it).
        self.cancelled = False

    def release(self) -> None:
        """Let the held send finish."""
        self._release.set()

    async def _hold(self) -> None:
        self.entered.set()
        try:
            await self._release.wait()
        except BaseException:
            self.cancelled = True
            raise

    def _hold_blocking(self) -> None:
        self.entered.set()
        self._release.wait_blocking()


class Wire:
    """A transport that records what reached it, for every door.

    Pass ``send=wire.send, close=wire.close`` to the trio or asyncio door,
    ``send=wire.send_blocking, close=wire.close_blocking`` to the thread door.
    ``hold(n)`` makes the n-th send (counted from 1) wait until released;
    ``fail(n, error)`` makes it raise ``error`` (after any hold).

    Args:
        log: A list to append ``"send"`` to at each send past its hold.
    """

    def __init__(self, log: list[str] | None = None) -> None:
        self._lock = threading.Lock()
        #: The frames that reached ``send``, in order (failed ones not).
        self.frames: list[dict[str, object]] = []
        #: The reasons ``close`` was called with, in order.
        self.closes: list[str] = []
        #: Set at the first ``close``.
        self.closed = Signal()
        #: Sends begun, failed ones included.
        self.sends = 0
        #: If set, gets ``"send"`` for every send past its hold (failed ones too).
        self.log = log
        self._gates: dict[int, Gate] = {}
        self._failures: dict[int, BaseException] = {}

    def hold(self, nth: int) -> Gate:
        """Hold the ``nth`` send until the returned gate is released."""
        gate = self._gates[nth] = Gate()
        return gate

    def fail(self, nth: int, error: BaseException) -> None:
        """Make the ``nth`` send raise ``error``."""
        self._failures[nth] = error

    def disarm(self) -> None:
        """Forget every hold and failure not reached yet."""
        with self._lock:
            self._gates.clear()
            self._failures.clear()

    def _begin(self) -> tuple[int, Gate | None]:
        with self._lock:
            self.sends += 1
            return self.sends, self._gates.pop(self.sends, None)

    def _finish(self, nth: int, frame: dict[str, object]) -> None:
        with self._lock:
            if self.log is not None:
                self.log.append("send")
            error = self._failures.pop(nth, None)
            if error is None:
                self.frames.append(frame)
        if error is not None:
            raise error

    async def send(self, frame: dict[str, object]) -> None:
        """The async ``send`` (trio or asyncio)."""
        nth, gate = self._begin()
        if gate is not None:
            await gate._hold()
        self._finish(nth, frame)

    async def close(self, reason: str) -> None:
        """The async ``close`` (trio or asyncio)."""
        self.close_blocking(reason)

    def send_blocking(self, frame: dict[str, object]) -> None:
        """The blocking ``send``, for the thread door."""
        nth, gate = self._begin()
        if gate is not None:
            gate._hold_blocking()
        self._finish(nth, frame)

    def close_blocking(self, reason: str) -> None:
        """The blocking ``close``, for the thread door."""
        with self._lock:
            self.closes.append(reason)
        self.closed.set()

    def seqs(self) -> list[object]:
        """The ``server_event_seq`` of each frame (``None`` for unjournaled ones)."""
        with self._lock:
            return [frame.get("server_event_seq") for frame in self.frames]

    def sequences(self) -> list[int]:
        """The sequences of the journaled frames only, in wire order."""
        return [seq for seq in self.seqs() if isinstance(seq, int)]


def registry_options(**overrides: Any) -> dict[str, Any]:
    """Options for a registry under test, with ``overrides`` applied.

    A fresh `FakeClock`, a 60 s TTL, 1 MiB per journal and no
    background sweep (call ``sweep()``): pass them to any door as
    ``open_session_registry(**registry_options())``.
    """
    options: dict[str, Any] = {
        "replay_ttl_s": 60.0,
        "replay_max_bytes_per_session": 1 << 20,
        "clock": FakeClock(),
        "sweep_interval_s": None,
    }
    options.update(overrides)
    return options


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture
def duplex_clock() -> FakeClock:
    """A fake clock, the registry fixtures' clock."""
    return FakeClock()


@pytest.fixture
def duplex_faults() -> FaultPlan:
    """A fault plan, armed by the test, wired into the registry fixtures."""
    return FaultPlan()


@pytest.fixture
def duplex_options(duplex_clock: FakeClock, duplex_faults: FaultPlan) -> dict[str, Any]:
    """The registry fixtures' options; override this fixture to change them."""
    return registry_options(clock=duplex_clock, faults=duplex_faults, send_timeout_s=1.0)


@pytest.fixture
def duplex_wire() -> Wire:
    """A recording transport for any door."""
    return Wire()


@pytest.fixture
async def duplex_trio_registry(
    duplex_options: dict[str, Any],
) -> AsyncIterator[TrioSessionRegistry]:
    """A trio registry for the test (a trio test: pytest-trio runs this fixture)."""
    async with open_session_registry(**duplex_options) as registry:
        yield registry


@pytest.fixture
def duplex_asyncio_registry(
    duplex_options: dict[str, Any],
) -> Callable[[], AbstractAsyncContextManager[AsyncioSessionRegistry]]:
    """``async with duplex_asyncio_registry() as registry`` in an asyncio test."""
    return lambda: open_asyncio_registry(**duplex_options)


@pytest.fixture
def duplex_thread_registry(duplex_options: dict[str, Any]) -> Iterator[ThreadSessionRegistry]:
    """A thread door registry, shut down after the test."""
    with ThreadSessionRegistry(timeout=30.0, **duplex_options) as registry:
        yield registry
