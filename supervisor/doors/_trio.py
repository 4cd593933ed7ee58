"""The trio front door: ``open_session_registry()``.

    async with open_session_registry(
        replay_ttl_s=30, replay_max_bytes_per_session=1 << 20
    ) as registry:
        created = await registry.create("s1", send=ws.send_json, close=ws.aclose)
        await registry.send_event("s1", {"type": "delta", "text": "hi"})

``send`` and ``close`` are trio async functions. Each attachment's outbox
pump runs in the registry's nursery, from its first delivery on;
``on_accepted``, observer callbacks and replies reach the loop through
``TrioToken.run_sync_soon``, coalesced, so a waiting task never parks a
thread (from the loop's own thread, through a drain task: `LocalDrain`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Unpack

import outcome
import trio

from actors._commands import CloseCallable, SendCallable
from actors._ports import NO_WAITER
from supervisor._options import RegistryOptions, RegistryOptionsDict
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.doors._door_calls import LoopReply
from supervisor.doors._loop_port import CoalescingPort
from supervisor.doors._outbox import OutboxCore
from supervisor.doors._outbox_trio import TrioOutbox
from supervisor.doors._send_watchdog import ParkedTask, SendWatchdog

__all__ = ["TrioSessionRegistry", "open_session_registry", "serve_registry"]


class TrioReply(LoopReply):
    """Wakes one waiting trio task with ``reschedule``; a cancelled waiter may wait again."""

    __slots__ = ("_task",)

    def __init__(self, port: CoalescingPort) -> None:
        super().__init__(port)
        self._task: trio.lowlevel.Task | None = None

    def _wake(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # The answer itself is the waiter's outcome: its wait returns
            # or raises it with no coroutine of ours around trio's.
            error = self._error
            answer = outcome.Value(self._value) if error is None else outcome.Error(error)
            trio.lowlevel.reschedule(task, answer)

    def wait(self) -> Awaitable[Any]:
        # Not a coroutine: one object fewer per awaited call. ``wait`` is
        # awaited at once by the task that calls it (every caller does).
        if self._done:
            return self._answered()
        self._task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort)

    async def _answered(self) -> Any:
        await trio.lowlevel.checkpoint()
        return self._outcome()

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        # A method, not a closure made per wait (one wait per awaited call).
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED


class LocalDrain:
    """A task that runs a port's drain when the loop's own thread asks.

    ``run_sync_soon`` writes to trio's wake-up socket on every call, also
    from the loop's thread, where waking a parked task is enough. Outside
    ``run`` (before it starts, after it ended) ``schedule`` declines, so the
    port falls back to ``run_sync_soon``.
    """

    __slots__ = ("_drain", "_parked")

    def __init__(self) -> None:
        self._parked = ParkedTask()
        self._drain: Callable[[], None] | None = None

    def schedule(self, drain: Callable[[], None]) -> bool:
        if not self._parked.wake():
            return False
        self._drain = drain
        return True

    async def run(self) -> None:
        while True:
            await self._parked.park()
            drain, self._drain = self._drain, None
            if drain is not None:
                drain()


class TrioSessionRegistry(AsyncSessionRegistry):
    """The registry `open_session_registry` yields, bound to one trio run.

    ``send_event_nowait`` raises ``trio.WouldBlock`` when the session has
    ``max_pending_per_session`` calls in flight.
    """

    def __init__(self, *, options: RegistryOptions, nursery: trio.Nursery) -> None:
        self._drainer = LocalDrain()
        port = CoalescingPort(
            trio.lowlevel.current_trio_token().run_sync_soon, self._drainer.schedule
        )
        super().__init__(options=options, port=port)
        self._nursery = nursery
        nursery.start_soon(self._drainer.run, name="duplex-port-drain")
        timeout = options.send_timeout_s
        # One task bounds every send of the registry (no deadline per send).
        self._watchdog = SendWatchdog(timeout) if timeout is not None else None
        if self._watchdog is not None:
            nursery.start_soon(self._watchdog.run, name="duplex-send-watchdog")

    def _new_reply(self) -> LoopReply:
        return TrioReply(self._port)

    def _new_outbox(self, **kwargs: Any) -> TrioOutbox:
        return TrioOutbox(**kwargs)

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        outbox = self._new_outbox(
            session_id=session_id,
            send=send,
            close=close,
            port=self._port,
            notify=self._notify,
            send_timeout_s=self._send_timeout_s,
            faults=self._system.transport_faults,
            watchdog=self._watchdog,
            nursery=self._nursery,
        )
        self._keep(outbox)
        return outbox

    def _would_block(self, session_id: str) -> BaseException:
        return trio.WouldBlock(f"session {session_id} has too many calls in flight")

    def _new_event(self) -> trio.Event:
        return trio.Event()

    def _is_cancellation(self, exc: BaseException) -> bool:
        return isinstance(exc, trio.Cancelled)

    async def _shielded(self, reply: LoopReply, timeout: float) -> Any:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout):
            return await reply.wait()
        raise TimeoutError("no answer within the shielded wait")

    async def _sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    def _now(self) -> float:
        return trio.current_time()

    async def _ticker(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            if not self._closed:
                self._system.sweep(NO_WAITER)


@asynccontextmanager
async def serve_registry(
    options: RegistryOptions, registry_class: type[TrioSessionRegistry]
) -> AsyncIterator[TrioSessionRegistry]:
    """Run ``registry_class`` in a nursery of the current trio run; shut it down at exit."""
    async with trio.open_nursery() as nursery:
        registry = registry_class(options=options, nursery=nursery)
        nursery.start_soon(registry._run_timers, name="duplex-timers")
        if options.sweep_interval_s is not None:
            nursery.start_soon(registry._ticker, options.sweep_interval_s)
        try:
            yield registry
        finally:
            with trio.CancelScope(shield=True):
                await registry._shut_down()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_session_registry(
    **options: Unpack[RegistryOptionsDict],
) -> AsyncIterator[TrioSessionRegistry]:
    """Run a session registry for the current trio run, for the block's duration.

    Keyword arguments are the fields of `RegistryOptions` (typed by
    `RegistryOptionsDict`; ``replay_ttl_s`` and
    ``replay_max_bytes_per_session`` are required); a misspelled one raises
    ``TypeError`` and a bad value ``ValueError``, before any thread starts.

    Leaving the block shuts the registry down, shielded from cancellation:
    queued ``send_event_nowait`` calls and outboxes drain for up to
    ``drain_timeout_s``, then every session stops (waiting calls get
    `RegistryClosedError`; no transport's ``close`` is
    called) and the supervisor stops.

    Yields:
        TrioSessionRegistry: the registry; ``send`` and ``close`` of its
        transports are trio async functions.
    """
    async with serve_registry(RegistryOptions(**options), TrioSessionRegistry) as registry:
        yield registry
