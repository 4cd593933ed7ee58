"""A session's phases, the commands each accepts, and what a gone session answers.

Whether a command is handled now, held back, or answered as for an unknown
session is data here (`ACCEPTS`, `UNKNOWN_SESSION_ANSWERS`), not branches in
the actor. It is an admission table, not a transition table: the phase is
derived from the state (`SessionState.phase`), and only two phases differ
from the rest. ``ACTIVATING`` holds resumes back while an activation is on
the wire (`HELD_WHILE_ACTIVATING`), and ``CLOSED`` accepts nothing; every
other phase accepts every command. `ResumeStash` applies the table to
commands that arrive during an activation, and `unknown_session_answer` is
the seed's answer for a session it did not know. Pure: no I/O, no threads,
no event loop.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from actors._commands import (
    AbortResume,
    Acknowledge,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    Command,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    ReleaseAttachment,
    Resume,
    SendEvent,
    SendEvents,
    SettleLeaseGeneration,
    Tick,
)
from actors._errors import GapReason, UnknownSessionError
from actors._fields import SessionFields
from actors._journal import EventJournal, JournalEntry, ParkedJournal
from actors._transition import Transition

__all__ = [
    "ACCEPTS",
    "ALL_COMMANDS",
    "HELD_WHILE_ACTIVATING",
    "UNKNOWN_SESSION_ANSWERS",
    "ParkedSession",
    "ResumeStash",
    "SessionPhase",
    "unknown_session_answer",
]


class SessionPhase(enum.Enum):
    """Where a session is in its life; `SessionState.phase` names it."""

    #: A transport is attached and no activation is on the wire.
    ATTACHED = "attached"
    #: No transport; the client may come back with its token.
    DETACHED = "detached"
    #: A resume's activation is on the wire; its outcome is not known yet.
    ACTIVATING = "activating"
    #: Detached after a failed activation: the presented token works once more.
    RECOVERING = "recovering"
    #: Closed (or expired, or failed): every command gets the unknown-session answer.
    CLOSED = "closed"


ALL_COMMANDS: frozenset[type[Any]] = frozenset(
    {
        SendEvent,
        SendEvents,
        Acknowledge,
        ReleaseAttachment,
        BeginResume,
        EndResume,
        SettleLeaseGeneration,
        HasAttachment,
        IsCurrentAttachment,
        AuthenticateResume,
        Resume,
        ActivationOutcome,
        AbortResume,
        Tick,
        Close,
    }
)

#: Resumes wait while an activation is on the wire, as the seed's lock made
#: them wait, so a failed activation's token recovery is seen by the next one.
HELD_WHILE_ACTIVATING: frozenset[type[Any]] = frozenset({Resume, AuthenticateResume})

#: The commands each phase handles now. A command a live phase does not accept
#: is held (see `ResumeStash`); a closed session accepts none.
ACCEPTS: Mapping[SessionPhase, frozenset[type[Any]]] = {
    SessionPhase.ATTACHED: ALL_COMMANDS,
    SessionPhase.DETACHED: ALL_COMMANDS,
    SessionPhase.RECOVERING: ALL_COMMANDS,
    SessionPhase.ACTIVATING: ALL_COMMANDS - HELD_WHILE_ACTIVATING,
    SessionPhase.CLOSED: frozenset(),
}

#: The seed answered these commands for an unknown session with a plain value;
#: every other command raised ``KeyError`` (our `UnknownSessionError`).
UNKNOWN_SESSION_ANSWERS: Mapping[type[Any], object] = {
    ReleaseAttachment: None,
    EndResume: None,
    SettleLeaseGeneration: None,
    HasAttachment: False,
    IsCurrentAttachment: False,
    Close: None,
}


def unknown_session_answer(command: Command, session_id: str) -> Transition:
    """The seed's answer to ``command`` for a session it does not know."""
    kind = type(command)
    if kind in UNKNOWN_SESSION_ANSWERS:
        return Transition(reply=UNKNOWN_SESSION_ANSWERS[kind])
    return Transition(error=UnknownSessionError(session_id))


T = TypeVar("T")


class ResumeStash(Generic[T]):
    """Commands held back because their session's phase does not accept them yet.

    ``item`` is whatever the shell keeps with a command (its caller, its
    outbox); the stash only looks at the command. Items come out in arrival
    order, one at a time, and only while the phase accepts the first one, so
    a resume released after a rollback is followed by the next only once that
    one's own activation has settled.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # Made on first use: an empty deque is ~600 bytes, and most sessions
        # never hold a resume (10,000 live sessions would carry 6 MB of them).
        self._held: deque[tuple[Command, T]] | None = None

    def __len__(self) -> int:
        return len(self._held) if self._held else 0

    def admit(self, phase: SessionPhase, command: Command, item: T) -> bool:
        """``True``: handle ``command`` now. ``False``: it was held.

        A closed session is admitted (and answers as unknown). Nothing is
        admitted past a command already held, which keeps arrival order.
        """
        if phase is SessionPhase.CLOSED:
            return True
        kind = type(command)
        # A resume never overtakes one held before it.
        if kind in ACCEPTS[phase] and not (self._held and kind in HELD_WHILE_ACTIVATING):
            return True
        if self._held is None:
            self._held = deque()
        self._held.append((command, item))
        return False

    def next_ready(self, phase: SessionPhase) -> T | None:
        """The oldest held item, if ``phase`` accepts its command now."""
        if not self._held:
            return None
        command, item = self._held[0]
        if phase is not SessionPhase.CLOSED and type(command) not in ACCEPTS[phase]:
            return None
        self._held.popleft()
        return item

    def drain(self) -> list[T]:
        """Every held item, in arrival order; the stash is empty afterwards."""
        items = [item for _, item in self._held or ()]
        self._held = None
        return items


@dataclass(frozen=True, slots=True, kw_only=True)
class ParkedSession(SessionFields):
    """A passivated session as plain data: no transport, no callables, no thread.

    Only a detached session with no resume claimed and no activation on the
    wire is parked (`SessionState.park`), so none of those is kept;
    `SessionState.unpark` brings the rest back as it was. Its journal's data
    (a `ParkedJournal`) are fields of its own: with 100,000 parked sessions,
    each object one keeps is one more for every full garbage collection to walk.
    """

    session_id: str
    detached_at: float
    entries: tuple[JournalEntry, ...] = field(repr=False)
    next_sequence: int
    dropped_through: int
    drop_runs: tuple[tuple[int, GapReason], ...] = field(repr=False)
    retained_bytes: int
    overflowed: bool
    store_loaded: bool = False

    @property
    def journal(self) -> ParkedJournal:
        """The journal's part, as `EventJournal.unpark` takes it."""
        return {
            "entries": self.entries,
            "next_sequence": self.next_sequence,
            "dropped_through": self.dropped_through,
            "drop_runs": self.drop_runs,
            "retained_bytes": self.retained_bytes,
            "overflowed": self.overflowed,
            "store_loaded": self.store_loaded,
        }

    def pruned(self, now: float, ttl_s: float) -> ParkedSession:
        """This session with its journal pruned by TTL at ``now``, as a sweep would."""
        if not self._prune_due(now, ttl_s):
            return self  # the common case costs no copy
        journal = EventJournal.unpark(
            self.journal, max_bytes=max(1, self.retained_bytes), ttl_s=ttl_s
        )
        journal.prune(now)
        return replace(self, **journal.park())

    def _prune_due(self, now: float, ttl_s: float) -> bool:
        entries = self.entries
        return bool(entries) and entries[0].created_monotonic <= now - ttl_s

    def quiet(self, now: float, disconnect_grace_s: float | None, ttl_s: float) -> bool:
        """Whether a tick at ``now`` would change nothing: no event past its
        TTL, not expired (a live session's Tick rules)."""
        return not self._prune_due(now, ttl_s) and not _past_grace(
            self.detached_at, now, disconnect_grace_s
        )

    def sweep_due(self, disconnect_grace_s: float | None, ttl_s: float) -> float:
        """When a sweep next has work here: the expiry, or the oldest
        event's TTL, whichever comes first (``inf``: never)."""
        due = math.inf if disconnect_grace_s is None else self.detached_at + disconnect_grace_s
        entries = self.entries
        return min(due, entries[0].created_monotonic + ttl_s) if entries else due

    def expired(self, now: float, disconnect_grace_s: float | None) -> bool:
        """Left detached past the disconnect grace (a live session's Tick rule)."""
        return _past_grace(self.detached_at, now, disconnect_grace_s)


def _past_grace(detached_at: float, now: float, disconnect_grace_s: float | None) -> bool:
    return disconnect_grace_s is not None and now - detached_at >= disconnect_grace_s
