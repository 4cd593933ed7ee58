"""One task per trio registry that cuts transport sends running past ``send_timeout_s``.

A cancel scope with a deadline per send (registered in trio's deadline heap,
and again per frame of a replay) was a measured cost of every awaited
``send_event`` and of every replayed frame. Here a send only stamps when it
began and joins a set; one watchdog task sleeps until the oldest send in the
set would run out, and cuts it then (`TimedSend.cut`) if it is still
running. A send that began while the watchdog slept never ends later than
its wake-up: the watchdog sleeps at most ``send_timeout_s`` from when it last
looked, and that was before the send began. So every send is cut when it has
run exactly ``send_timeout_s`` (on trio's clock), as a deadline would cut it.
After a whole ``send_timeout_s`` without a send, the watchdog waits
without a deadline until the next send begins.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

import outcome
import trio

__all__ = ["ParkedTask", "SendWatchdog", "TimedSend"]


class ParkedTask:
    """One trio task waiting, without a deadline, until another wakes it.

    A ``ParkingLot`` does the same for many tasks; one slot costs a pump or
    the watchdog less per wake-up. Waking a slot nobody waits in does nothing.
    """

    __slots__ = ("_abort_fn", "_task")

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None
        # Bound once: a pump parks once per delivery, and what a park makes
        # lives as long as the wait; under overload every such object
        # outlives the young GC generations and makes full collections
        # (most of the server's CPU at 1,000 clients) come sooner.
        self._abort_fn = self._abort

    def park(self) -> Awaitable[object]:
        """What to await (at once) to wait until `wake`: trio's wait itself,
        not a coroutine of ours around it (one object less per park)."""
        self._task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort_fn)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def wake(self) -> bool:
        """Wake the waiting task; ``False`` if none waits."""
        task, self._task = self._task, None
        if task is None:
            return False
        trio.lowlevel.reschedule(task, outcome.Value(None))
        return True


class TimedSend(Protocol):
    """What the watchdog watches: one outbox's send in progress."""

    @property
    def send_began(self) -> float:
        """When the send in progress began (``trio.current_time()``)."""

    def cut(self) -> None:
        """The send ran out of time: cancel it."""


class SendWatchdog:
    """Cuts sends older than ``timeout`` seconds; run `run` in the registry's nursery."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # dict, not set: ordered, so sends are cut in a reproducible order.
        self._sending: dict[TimedSend, None] = {}
        # Whether a send began since the watchdog last looked.
        self._recent = False
        # Where the watchdog waits for a first send (no deadline).
        self._idle = ParkedTask()

    def watch(self, send: TimedSend) -> None:
        """``send`` began (its ``send_began`` is stamped)."""
        self._sending[send] = None
        self._recent = True
        idle = self._idle
        if idle._task is not None:  # a wake-up only when it waits (a call per send less)
            idle.wake()

    def unwatch(self, send: TimedSend) -> None:
        """``send`` ended, however."""
        self._sending.pop(send, None)

    async def run(self) -> None:
        clock = trio.lowlevel.current_clock()
        timeout = self.timeout
        while True:
            now = clock.current_time()
            wake = now + timeout
            for send in list(self._sending):
                ends = send.send_began + timeout
                if ends <= now:
                    del self._sending[send]
                    send.cut()
                elif ends < wake:
                    wake = ends
            if not self._sending and not self._recent:
                # A whole period without a send: wait without a deadline
                # (waking per send would cost every awaited send a task step).
                await self._idle.park()
                continue
            self._recent = False
            await trio.sleep_until(wake)
