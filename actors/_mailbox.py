"""Inboxes that outlive their consumer: a session's mailbox and a closable inbox.

A `SessionMailbox` is what the routing table maps a session id to. It
is created with the session and lives until the session closes, across every
actor that runs the session: a crashed incarnation's successor, and the
actor that reactivates a parked session, take their messages from the same
mailbox, so a message is never re-routed, reordered or dropped on the way.

Its consumer phase says who reads it:

* ``LIVE``: one actor takes its messages, in turns on the registry's loop
  (a `LoopActor` bound to it: the ``put`` that finds it idle schedules it);
* ``PARKED``: nobody; it holds the parked session's plain data and is empty;
* ``WAKING``: nobody; messages arrived while parked and the owner was asked,
  once, to start an actor (`SessionMailboxOwner.wake`);
* ``CLOSED``: guarded messages are refused at ``put`` (``InboxClosedError``).

Each phase change happens under the mailbox's lock, so "the inbox is empty"
and "park" are one step: a message either got in before the actor parked (and
the park is aborted) or finds the mailbox parked and wakes it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import pykka

from actors._lifecycle import ParkedSession
from actors._loop_actor import _turns

if TYPE_CHECKING:
    from actors._loop_actor import LoopActor

__all__ = [
    "ClosableInbox",
    "Envelope",
    "InboxClosedError",
    "MailboxPhase",
    "SessionMailbox",
    "SessionMailboxOwner",
]


class InboxClosedError(pykka.ActorDeadError):
    """The session is gone; its inbox takes no more calls."""


class Envelope:
    """What pykka's actor loop reads from an inbox: a message, no reply slot."""

    __slots__ = ("message",)

    reply_to = None

    def __init__(self, message: Any) -> None:
        self.message = message


class _LoopQueue:
    """A FIFO of envelopes and the `LoopActor` it schedules (see
    `actors._loop_actor.LoopInbox`): the put that finds the actor idle sets
    the scheduled flag and asks for a turn; ``take`` clears it when empty."""

    __slots__ = ("_actor", "_lock", "_queue", "_scheduled")

    def __init__(self, lock: threading.Lock | None = None) -> None:
        # Made by the first put, dropped again when a session parks: a parked
        # mailbox is what 100,000 parked sessions are made of, and every object
        # in it is one more for each full garbage collection to walk.
        self._queue: deque[Any] | None = None
        # Held only for a few field reads and writes, never while calling out
        # to another queue: so one lock may serve many queues (a registry's).
        self._lock = lock if lock is not None else threading.Lock()
        # The actor that runs this queue now, and whether it has a turn coming.
        self._actor: LoopActor | None = None
        self._scheduled = False

    def _enqueue_locked(self, envelope: Any) -> LoopActor | None:
        """Queue ``envelope`` (the lock held); the actor to dispatch, if any."""
        self._append_locked(envelope)
        actor = self._actor
        if actor is None or self._scheduled:
            return None
        self._scheduled = True
        return actor

    def _append_locked(self, envelope: Any) -> None:
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        queue.append(envelope)

    def get(self) -> Any:
        if self._queue is None:
            raise IndexError("get() from an empty inbox")
        return self._queue.popleft()

    def empty(self) -> bool:
        return not self._queue

    def bind(self, actor: LoopActor) -> None:
        """``actor`` runs this queue from now on; its first turn is coming."""
        with self._lock:
            self._actor = actor
            self._scheduled = True

    def take(self) -> Any:
        """The next envelope, or ``None`` (and no turn is scheduled any more)."""
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            self._scheduled = False
            return None

    def unbind(self, actor: LoopActor) -> None:
        """``actor`` stopped: it runs this queue no more (unless a successor does)."""
        with self._lock:
            if self._actor is actor:
                self._actor = None
                self._scheduled = False


class ClosableInbox(_LoopQueue):
    """pykka's inbox contract (put/get/empty), run by a LoopActor, closable.

    Once `close` ran, a message of one of ``guarded`` types is refused
    at ``put`` (``refusal`` is raised: an ``ActorDeadError``), so its sender
    learns at once instead of queueing behind a stop, where pykka would drop
    it unanswered. pykka's own messages (a stop) are always let through.
    """

    __slots__ = ("_closed", "_guarded", "_refusal")

    def __init__(self, guarded: type | tuple[type, ...], refusal: str) -> None:
        super().__init__()
        self._closed = False
        self._guarded = guarded
        self._refusal = refusal

    def put(self, envelope: Any) -> None:
        with self._lock:
            if self._closed and isinstance(envelope.message, self._guarded):
                raise InboxClosedError(self._refusal)
            actor = self._enqueue_locked(envelope)
        if actor is not None:
            actor.dispatch()

    def close(self) -> list[Any]:
        """Refuse guarded messages from now on; take out those queued, in order."""
        with self._lock:
            self._closed = True
            envelopes = list(self._queue or ())
            # pykka's own (a stop) stay queued
            kept = [e for e in envelopes if not isinstance(e.message, self._guarded)]
            self._queue = deque(kept) if kept else None
        return [e.message for e in envelopes if isinstance(e.message, self._guarded)]


class MailboxPhase:
    """A mailbox's consumer phase (plain ints: 100,000 parked mailboxes add up)."""

    LIVE = 0
    PARKED = 1
    WAKING = 2
    CLOSED = 3


class SessionMailboxOwner(Protocol):
    """Who starts an actor for a parked mailbox that got a message.

    Its ``mailbox_lock`` guards every mailbox it owns: a lock per mailbox was
    one more object per parked session for each full garbage collection to
    walk, and a mailbox never holds it while it calls out (a parked
    session's ``commit`` touches the owner's books, never another mailbox).
    """

    mailbox_lock: threading.Lock

    def wake(self, mailbox: SessionMailbox) -> None: ...


class SessionMailbox(_LoopQueue):
    """One session's inbox and routing entry; see the module docstring."""

    __slots__ = ("_owner", "_phase", "parked", "session_id", "store_epoch")

    def __init__(self, session_id: str, owner: SessionMailboxOwner) -> None:
        super().__init__(owner.mailbox_lock)
        self.session_id = session_id
        self._owner = owner
        self._phase = MailboxPhase.LIVE
        #: The parked session while PARKED or WAKING; None otherwise.
        self.parked: ParkedSession | None = None
        #: With a session store: the epoch this process owns the session at
        #: (set by the creating actor or the supervisor's takeover; read by
        #: the actor that runs the session and by the lease renewal).
        self.store_epoch: int | None = None

    def __repr__(self) -> str:
        return f"SessionMailbox({self.session_id!r}, phase={self._phase})"

    @property
    def phase(self) -> int:
        return self._phase

    # -- pykka's inbox contract (and the doors' tell) ---------------------------

    def tell(self, message: Any) -> None:
        """Queue ``message``; wake a parked session. ``InboxClosedError`` once closed.

        A message told on the loop's thread, outside any turn, to a started
        actor that is idle with nothing queued is handled at once, without
        being queued (`LoopActor.handle_told_now`): the same order and the
        same serial handling, less work for the commonest call.
        """
        actor = self._actor
        if (
            actor is not None
            and actor._started_turns
            and not actor.actor_stopped._flag  # type: ignore[attr-defined]
            and not _turns.running
            and actor.actor_loop.on_loop()
        ):
            with self._lock:
                now = (
                    self._actor is actor
                    and not self._scheduled
                    and not self._queue
                    and self._phase == MailboxPhase.LIVE
                )
                if now:
                    self._scheduled = True
            if now:
                actor.handle_told_now(message)
                return
        self.put(Envelope(message))

    def put(self, envelope: Any) -> None:
        run: LoopActor | None = None
        with self._lock:
            phase = self._phase
            if phase == MailboxPhase.CLOSED and not isinstance(
                envelope.message, pykka.messages._ActorStop
            ):
                raise InboxClosedError("session is gone")
            if phase == MailboxPhase.PARKED:
                self._append_locked(envelope)
                self._phase = MailboxPhase.WAKING
            else:
                run = self._enqueue_locked(envelope)
        if run is not None:
            run.dispatch()
        elif phase == MailboxPhase.PARKED:
            self._owner.wake(self)

    def tell_if_live(self, message: Any) -> bool:
        """Queue ``message`` only if an actor runs this mailbox (never wakes it)."""
        run: LoopActor | None = None
        with self._lock:
            if self._phase != MailboxPhase.LIVE:
                return False
            run = self._enqueue_locked(Envelope(message))
        if run is not None:
            run.dispatch()
        return True

    # -- phase changes ------------------------------------------------------------

    def park(self, parked: ParkedSession, commit: Any) -> bool:
        """LIVE -> PARKED iff nothing is queued; ``commit()`` runs inside that step."""
        with self._lock:
            if self._phase != MailboxPhase.LIVE or self._queue:
                return False
            self._queue = None  # empty: a parked mailbox keeps no deque
            self._phase = MailboxPhase.PARKED
            self.parked = parked
            commit()
        return True

    def adopt(self, parked: ParkedSession, epoch: int) -> None:
        """A new mailbox for a session taken over from the store: PARKED, so
        its first message starts an actor from ``parked``."""
        with self._lock:
            if self._phase != MailboxPhase.LIVE or self.parked is not None:
                raise RuntimeError("adopt() on a mailbox already in use")
            self.store_epoch = epoch
            self.parked = parked
            self._phase = MailboxPhase.PARKED

    def take_parked(self) -> ParkedSession | None:
        """PARKED/WAKING -> LIVE: the parked data, for the actor that will run it."""
        with self._lock:
            if self._phase not in (MailboxPhase.PARKED, MailboxPhase.WAKING):
                return None
            parked, self.parked = self.parked, None
            self._phase = MailboxPhase.LIVE
        return parked

    def give_back(self, parked: ParkedSession) -> None:
        """An actor that could not reactivate returns the data (LIVE -> WAKING)."""
        with self._lock:
            if self._phase == MailboxPhase.LIVE:
                self.parked = parked
                self._phase = MailboxPhase.WAKING

    def replace_parked(self, parked: ParkedSession) -> bool:
        """Swap the data of a PARKED mailbox (a sweep pruned it)."""
        with self._lock:
            if self._phase != MailboxPhase.PARKED:
                return False
            self.parked = parked
        return True

    def close_if_parked(self) -> bool:
        """PARKED -> CLOSED (an expiry that needs no actor); ``False`` if not parked."""
        with self._lock:
            if self._phase != MailboxPhase.PARKED:
                return False
            self._phase = MailboxPhase.CLOSED
            self.parked = None
        return True

    def close(self) -> list[Any]:
        """-> CLOSED: refuse messages from now on; take out those queued, in order."""
        with self._lock:
            self._phase = MailboxPhase.CLOSED
            self.parked = None
            messages = []
            stops = []
            for envelope in self._queue or ():
                if isinstance(envelope.message, pykka.messages._ActorStop):
                    stops.append(envelope)
                else:
                    messages.append(envelope.message)
            self._queue = deque(stops) if stops else None
        return messages
