"""How a door's calls reach their sessions, and how their callers wait.

`LoopReply` is an answer settled on the caller's loop. `SessionCalls` keeps
at most ``max_pending_per_session`` calls in flight per session (a caller
past it waits for room) and coalesces the ``send_event_nowait`` events of
one loop tick into one message per session, flushed before any other call
to that session so per-session order holds. Every door
(`supervisor.doors._door.AsyncSessionRegistry`, and through it the thread
door) sends its calls through one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors._commands import Command, LifecycleEvent, SendEvent, SendEvents
from actors._ports import NoWaiter
from supervisor._system import SessionSystem
from supervisor.doors._loop_port import CoalescingPort

__all__ = ["LoopReply", "SessionCalls", "report_refused"]

logger = logging.getLogger("duplex_supervisor.supervisor")


class LoopReply:
    """A reply settled on its loop; the first answer wins.

    ``resolve``/``fail`` may come from any thread: off the loop they ride the
    port, on it they land at once (unless callbacks submitted before them
    still wait: then they queue behind). A subclass wakes its loop's waiter.
    """

    __slots__ = ("_done", "_error", "_on_settled", "_port", "_queued", "_settled_key", "_value")

    def __init__(self, port: CoalescingPort) -> None:
        self._port = port
        self._on_settled: Callable[[str], None] | None = None
        self._settled_key = ""
        self._done = False
        # An answer given on the loop behind queued callbacks, kept in
        # _value/_error until its turn (`_land_queued`).
        self._queued = False
        self._value: object = None
        self._error: BaseException | None = None

    def resolve(self, value: object) -> None:
        self._settle(value, None)

    def fail(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, value: object, error: BaseException | None) -> None:
        port = self._port
        if port.may_run_now():
            self._land(value, error)
        elif not port.on_loop():
            port.submit(lambda: self._land(value, error))
        elif not self._queued and not self._done:
            # On the loop, behind callbacks submitted before it: the answer
            # waits on the reply itself and a bound method rides the port
            # (a closure and its cells were four more objects per call).
            # A later answer given on the loop meanwhile would land after
            # this one, so it is dropped: the first answer wins either way.
            self._queued = True
            self._value = value
            self._error = error
            port.submit(self._land_queued)

    def _land_queued(self) -> None:
        self._land(self._value, self._error)

    def settle_later(self, on_settled: Callable[[str], None], key: str) -> None:
        """Call ``on_settled(key)`` once this reply is settled (set before it
        is sent); a function and its argument, not a closure: one is set per
        awaited call."""
        self._on_settled = on_settled
        self._settled_key = key

    def _land(self, value: object, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self._value = value
        self._error = error
        # Dropped once run: an actor may hold this reply until its next
        # message, and the callback holds the registry (the drop-in's
        # finalizer needs the registry to become garbage).
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled(self._settled_key)
        self._wake()

    def _outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def _wake(self) -> None:
        raise NotImplementedError

    def wait(self) -> Awaitable[Any]:
        """What the caller awaits for the answer; awaited at once, by the
        task that asked."""
        raise NotImplementedError


def report_refused(
    notify: Callable[[LifecycleEvent], None], session_id: str, error: BaseException
) -> None:
    """Log a refused ``send_event_nowait`` event and tell the observer."""
    reason = type(error).__name__
    logger.warning("a send_event_nowait to session %s was refused: %s", session_id, reason)
    notify(LifecycleEvent(kind="event_refused", session_id=session_id, reason=reason))


def _released(count: int) -> None:
    """What a settled _CountedNoWaiter releases again: nothing."""


class _CountedNoWaiter(NoWaiter):
    """The reply of ``count`` coalesced ``send_event_nowait`` calls.

    Nobody waits, but their slots are freed, and every refusal is logged and
    reaches the observer as an ``event_refused`` event.
    """

    __slots__ = ("_count", "_notify", "_port", "_release", "_session_id")

    def __init__(
        self,
        port: CoalescingPort,
        release: Callable[[int], None],
        count: int,
        *,
        session_id: str,
        notify: Callable[[LifecycleEvent], None],
    ) -> None:
        self._port = port
        self._release = release
        self._count = count
        self._session_id = session_id
        self._notify = notify

    def resolve(self, value: object) -> None:
        if isinstance(value, tuple):
            # Each refused event with its own error, in the burst's order.
            for item in value:
                if isinstance(item, BaseException):
                    report_refused(self._notify, self._session_id, item)
        self._settle()

    def fail(self, error: BaseException) -> None:
        for _ in range(self._count):
            report_refused(self._notify, self._session_id, error)
        self._settle()

    def _settle(self) -> None:
        # Dropped once used, for the reason LoopReply drops its callback.
        release, self._release = self._release, _released
        count = self._count
        if self._port.on_loop():
            release(count)
        else:
            self._port.submit(lambda: release(count))


class SessionCalls:
    """The calls in flight per session, and ``send_event_nowait``'s bursts.

    Touched on the registry's loop only. ``new_reply`` and ``new_event`` are
    the loop's (a door's `_new_reply`, `_new_event`); ``notify`` hears the
    refused ``send_event_nowait`` events.
    """

    __slots__ = (
        "_bursts",
        "_flush_scheduled",
        "_max_pending",
        "_new_event",
        "_new_reply",
        "_notify",
        "_port",
        "_release_one",
        "_system",
        "pending",
        "room",
    )

    def __init__(
        self,
        system: SessionSystem,
        port: CoalescingPort,
        *,
        max_pending: int,
        new_reply: Callable[[], LoopReply],
        new_event: Callable[[], Any],
        notify: Callable[[LifecycleEvent], None],
    ) -> None:
        self._system = system
        self._notify = notify
        self._port = port
        self._max_pending = max_pending
        self._new_reply = new_reply
        self._new_event = new_event
        #: Calls in flight per session.
        self.pending: dict[str, int] = {}
        #: Per session, an event set when one of its calls settles.
        self.room: dict[str, Any] = {}
        # send_event_nowait calls of this loop tick, per session, not yet sent:
        # (journal flag, payloads). Flushed at the end of the tick, or before
        # any other call to that session, so per-session order holds.
        self._bursts: dict[str, tuple[bool, list[Mapping[str, object]]]] = {}
        self._flush_scheduled = False
        # Bound once: every awaited call's reply holds it until settled.
        self._release_one = self.release

    def in_flight(self) -> int:
        """Calls sent and not yet settled, over every session."""
        return sum(self.pending.values())

    def has_room(self, session_id: str) -> bool:
        """Whether the session has fewer than ``max_pending_per_session`` calls in flight."""
        return self.pending.get(session_id, 0) < self._max_pending

    def call_in_room(self, session_id: str, command: Command, reply: LoopReply) -> None:
        """Send ``command`` to its session in one of its places (`has_room`);
        ``reply``, once settled, gives the place back."""
        self.pending[session_id] = self.pending.get(session_id, 0) + 1
        reply.settle_later(self._release_one, session_id)
        self._system.call(session_id, command, reply)

    def ask(self, session_id: str, command: Command) -> Awaitable[Any]:
        """Send ``command`` (after the session's queued bursts) and return what
        to await for its answer.

        Not a coroutine itself: with room in the session, the caller awaits
        the reply's own ``wait`` (a coroutine less per awaited call).
        """
        if self._bursts:
            self.flush(session_id)
        if self.pending.get(session_id, 0) >= self._max_pending:  # not has_room()
            return self._ask_once_room(session_id, command)
        reply = self._new_reply()
        self.call_in_room(session_id, command, reply)
        return reply.wait()

    async def _ask_once_room(self, session_id: str, command: Command) -> Any:
        while not self.has_room(session_id):
            await self._wait_for_room(session_id)
        reply = self._new_reply()
        self.call_in_room(session_id, command, reply)
        return await reply.wait()

    async def _wait_for_room(self, session_id: str) -> None:
        """Return once a call of the session settled (it may have room then)."""
        event = self.room.get(session_id)
        if event is None:
            event = self.room[session_id] = self._new_event()
        await event.wait()

    def release(self, session_id: str, count: int = 1) -> None:
        """``count`` calls of the session settled: their places are free."""
        left = self.pending.get(session_id, count) - count
        if left <= 0:
            self.pending.pop(session_id, None)
        else:
            self.pending[session_id] = left
        event = self.room.pop(session_id, None)
        if event is not None:
            event.set()

    def queue(self, session_id: str, payload: Mapping[str, object], *, journal: bool) -> None:
        """Take one ``send_event_nowait`` event (the session has room): it
        joins the session's burst of this loop tick, sent as one message."""
        self.pending[session_id] = self.pending.get(session_id, 0) + 1
        burst = self._bursts.get(session_id)
        if burst is not None and burst[0] != journal:
            self.flush(session_id)
            burst = None
        if burst is None:
            burst = self._bursts[session_id] = (journal, [])
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._port.submit(self.flush_all)
        burst[1].append(payload)

    def flush(self, session_id: str) -> None:
        """Send the session's queued burst now, if it has one."""
        burst = self._bursts.pop(session_id, None)
        if burst is None:
            return
        journal, payloads = burst
        reply = _CountedNoWaiter(
            self._port,
            lambda count: self.release(session_id, count),
            len(payloads),
            session_id=session_id,
            notify=self._notify,
        )
        command: Command
        if len(payloads) == 1:
            command = SendEvent(payload=payloads[0], journal=journal)
        else:
            command = SendEvents(payloads=tuple(payloads), journal=journal, atomic=False)
        self._system.call(session_id, command, reply)

    def flush_all(self) -> None:
        """Send every queued burst (the end of the loop tick, or shutdown)."""
        self._flush_scheduled = False
        for session_id in list(self._bursts):
            self.flush(session_id)
