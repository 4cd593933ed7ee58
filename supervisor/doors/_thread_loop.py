"""The thread door's loop side: the trio door hosted on a loop thread of its own.

`HostedTrioRegistry` is the trio door whose outboxes send through blocking
transports on worker threads, and which takes a blocking caller's calls as
plain callbacks on the loop; `ThreadReply` is the answer such a caller
waits for on its own thread (see `supervisor.doors._threads`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from actors._commands import Command
from actors._errors import RegistryClosedError, SessionError
from supervisor._options import RegistryOptions
from supervisor.doors._door_calls import LoopReply
from supervisor.doors._loop_port import CoalescingPort
from supervisor.doors._outbox_trio import BlockingTrioOutbox, TrioOutbox
from supervisor.doors._trio import TrioSessionRegistry

__all__ = ["HostedTrioRegistry", "ThreadReply"]


class ThreadReply(LoopReply):
    """The answer a plain thread waits for: landed on the loop, it wakes the
    thread itself (a task per call to await the answer and then wake the
    thread was a measured cost of every blocking ``send_event``)."""

    __slots__ = ("_lock", "_sent", "gave_up", "landed", "scope")

    def __init__(self, port: CoalescingPort) -> None:
        super().__init__(port)
        self.landed = threading.Event()
        # Between the loop's answer and a worker's `answer_sent`.
        self._lock = threading.Lock()
        self._sent = False
        #: The caller's ``TimeoutError`` once it gave up before an answer.
        self.gave_up: TimeoutError | None = None
        #: The scope of the task that waits for room for the call, if one does.
        self.scope: trio.CancelScope | None = None

    @property
    def answered(self) -> bool:
        return self._done or self._sent

    def answer_sent(self, value: object) -> None:
        """From the worker thread whose send of the event finished: answer
        now, unless the loop answered first (the loop's later answer only
        releases the call's slot)."""
        with self._lock:
            if self._done or self._sent:
                return
            self._sent = True
            self._value = value
        self.landed.set()

    def _land(self, value: object, error: BaseException | None) -> None:
        with self._lock:
            if self._sent:
                value, error = self._value, None
            super()._land(value, error)

    def _wake(self) -> None:
        self.landed.set()

    def answer(self) -> Any:
        if self.gave_up is not None:
            raise self.gave_up
        return self._outcome()


class HostedTrioRegistry(TrioSessionRegistry):
    """The trio door on the thread door's loop: blocking transports run on threads."""

    _async_transports = False

    def __init__(self, *, options: RegistryOptions, nursery: trio.Nursery) -> None:
        super().__init__(options=options, nursery=nursery)
        # Unbounded: a hung send holds its thread, and must not hold up the
        # sends of other attachments nor its own transport's close.
        self._limiter = trio.CapacityLimiter(math.inf)

    def pending_calls(self, session_id: str) -> int:
        return self._calls.pending.get(session_id, 0)

    def send_event_nowait_or_report(
        self, session_id: str, payload: Mapping[str, object], journal: bool
    ) -> None:
        """A thread's ``send_event_nowait``, landed on the loop: refusals are reported."""
        try:
            self.send_event_nowait(session_id, payload, journal=journal)
        except (SessionError, trio.WouldBlock) as exc:
            self.report_refused(session_id, exc)

    @property
    def port(self) -> CoalescingPort:
        return self._port

    def ask_for_thread(self, session_id: str, command: Command, reply: ThreadReply) -> None:
        """A blocking caller's `_ask`, landed on the loop.

        While the session has room the call goes to it at once, no task;
        otherwise a task waits for room, cancelled if the caller gives up.
        """
        try:
            self._check_open()
            self._calls.flush(session_id)
            if not self._calls.has_room(session_id):
                reply.scope = trio.CancelScope()
                self._nursery.start_soon(
                    self._ask_when_room, session_id, command, reply, reply.scope
                )
                return
            self._calls.call_in_room(session_id, command, reply)
        except Exception as exc:  # noqa: BLE001 - refused: the blocked caller must hear it
            reply.fail(exc)

    async def _ask_when_room(
        self, session_id: str, command: Command, reply: ThreadReply, scope: trio.CancelScope
    ) -> None:
        try:
            with scope:
                reply.resolve(await self._ask(session_id, command))
        except trio.Cancelled:
            reply.fail(RegistryClosedError("the registry was shut down"))
            raise
        except BaseException as exc:  # noqa: BLE001 - it is the caller's answer
            reply.fail(exc)

    def give_up(self, reply: ThreadReply, limit: float) -> None:
        """The caller's ``timeout`` ran out: it gets ``TimeoutError`` unless
        the answer landed first, and a call still waiting for room is
        cancelled (one sent to its session stays sent, as on the async door)."""
        if reply.answered:
            return
        if reply.scope is not None:
            reply.scope.cancel()
        reply.gave_up = TimeoutError(f"no answer within {limit} s")
        reply.landed.set()

    def spawn(self, async_fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``async_fn`` as a task of the registry (on the loop)."""
        self._nursery.start_soon(async_fn)

    def _new_outbox(self, **kwargs: Any) -> TrioOutbox:
        return BlockingTrioOutbox(limiter=self._limiter, **kwargs)
