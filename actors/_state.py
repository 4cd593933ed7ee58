"""One session's rules as a pure state machine: command in, transition out.

Theory of operation
-------------------
The seed held these rules in a registry guarded by locks and awaited its
transport sends inline. Here they are split from both: `SessionState.handle`
takes one command (`actors._commands`), changes the state, and returns a
`Transition` holding the caller's reply (or a domain error) and the
*effects* the shell must carry out afterwards: frames to deliver to an
attachment generation, an ``on_accepted`` to run, an outbox to retire, an
observer event. Nothing here does I/O, calls user code, or knows of threads
or event loops, so every rule is testable with plain calls and a fake clock.

Where the seed awaited an activation send before releasing its lock, the
state records the activation as *in flight* (`activation_in_flight`)
and learns the result later from an `ActivationOutcome`
command: delivered (nothing to do) or failed (the seed's rollback). The actor
holds later resumes back while an activation is in flight, as the lock did.

Failure atomicity: a domain error (a `SessionError`) is
an answer; what the handler did before raising it stays, and handlers are
written so that is only what the seed also kept (a sticky overflow, a TTL
prune). Any other exception restores the snapshot taken before the command
and propagates: the transition never happened. Named failpoints at each step
let tests and fault plans inject such crashes anywhere.

The machine is one class: every handler touches the same private fields
under the same invariants. Those fields, their invariants and the helpers
are `actors._state_core.StateCore`; the handlers, one per command, are
classes over it that this one joins: resumes (`actors._resume_rules`),
events (`actors._event_rules`), the attachment and the session's end
(`actors._attachment_rules`). This one makes, parks, snapshots and stores
the session, and `handle` dispatches. Its vocabulary
(configuration, failpoints, outcomes) is in `actors._transition`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from actors._attachment_rules import AttachmentRules
from actors._commands import (
    AbortResume,
    Acknowledge,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    CloseCallable,
    Command,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    Notify,
    ReleaseAttachment,
    Resume,
    SendCallable,
    SendEvent,
    SendEvents,
    SessionCreated,
    SettleLeaseGeneration,
    Tick,
    TransportAttachment,
)
from actors._credential import ResumeToken, token_digest
from actors._errors import (
    SessionError,
    UnknownSessionError,
)
from actors._event_rules import EventRules
from actors._fields import SessionFields, field_values
from actors._journal import EventJournal, JournalEntry, new_tuple
from actors._lifecycle import ParkedSession, SessionPhase
from actors._resume_rules import ResumeRules
from actors._store import SessionRecord
from actors._transition import (
    FAILPOINTS,
    LIFECYCLE_FAILPOINTS,
    NO_FAILPOINTS,
    Failpoints,
    SessionConfig,
    StateSnapshot,
    Transition,
    check_generation,
    check_session_id,
)

# The vocabulary lives in actors._transition; it is re-exported here, where
# callers of the machine look for it.
__all__ = [
    "FAILPOINTS",
    "LIFECYCLE_FAILPOINTS",
    "NO_FAILPOINTS",
    "Failpoints",
    "SessionConfig",
    "SessionState",
    "StateSnapshot",
    "Transition",
    "check_session_id",
]


class SessionState(ResumeRules, EventRules, AttachmentRules):
    """The rules of one session, the seed registry's per-session half: its
    fields and their invariants are `StateCore`'s."""

    def __init__(
        self,
        *,
        session_id: str,
        config: SessionConfig,
        send: SendCallable,
        close: CloseCallable,
        lease_generation: int = 0,
        clock: Callable[[], float] | None = None,
        failpoints: Failpoints = NO_FAILPOINTS,
        token: ResumeToken | None = None,
    ) -> None:
        self._session_id = check_session_id(session_id, strict=config.strict)
        if config.strict:
            check_generation(lease_generation, what="lease_generation", optional=False)
        self._config = config
        self._clock = clock or time.monotonic
        self._failpoints = failpoints
        self._journal = EventJournal(
            max_bytes=config.replay_max_bytes,
            ttl_s=config.replay_ttl_s,
            clock=self._clock,
            max_events=config.replay_max_events,
            strict=config.strict,
        )
        # Only the token's digest is kept; open() hands the plaintext out, once.
        self._fields = SessionFields(
            token_digest=token_digest((token or ResumeToken.generate()).plaintext),
            recovery_token_digest=None,
            attachment_generation=1,
            lease_generation=lease_generation,
            orphaned_lease_generation=None,
            last_resume=None,
            detached_at=None,
        )
        self._attachment = TransportAttachment(generation=1, send=send, close=close)
        self._pending_resumes = 0
        self._activations = {}
        self._closed = False
        self._effects = []
        self._undo_point = None

    @classmethod
    def open(
        cls,
        *,
        session_id: str,
        config: SessionConfig,
        send: SendCallable,
        close: CloseCallable,
        lease_generation: int = 0,
        clock: Callable[[], float] | None = None,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> tuple[SessionState, Transition]:
        """A new attached session and its creation transition (token, event)."""
        token = ResumeToken.generate()
        state = cls(
            session_id=session_id,
            config=config,
            send=send,
            close=close,
            lease_generation=lease_generation,
            clock=clock,
            failpoints=failpoints,
            token=token,
        )
        created = SessionCreated(
            session_id=state._session_id,
            attachment_generation=1,
            resume_token=token,
        )
        return state, Transition(reply=created, effects=(Notify(event=state._event("created")),))

    # -- reading -------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def journal(self) -> EventJournal:
        """Read it, never write it: writes go through `handle`."""
        return self._journal

    @property
    def attachment(self) -> TransportAttachment | None:
        return self._attachment

    @property
    def attachment_generation(self) -> int:
        return self._fields.attachment_generation

    @property
    def lease_generation(self) -> int:
        return self._fields.lease_generation

    @property
    def pending_resumes(self) -> int:
        return self._pending_resumes

    @property
    def orphaned_lease_generation(self) -> int | None:
        return self._fields.orphaned_lease_generation

    @property
    def activation_in_flight(self) -> bool:
        """A resume's activation is on the wire: hold later resumes until its outcome."""
        return bool(self._activations)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def phase(self) -> SessionPhase:
        """The named phase (see `actors._lifecycle` for what each accepts)."""
        if self._closed:
            return SessionPhase.CLOSED
        if self._activations:
            return SessionPhase.ACTIVATING
        if self._attachment is not None:
            return SessionPhase.ATTACHED
        if self._fields.recovery_token_digest is not None:
            return SessionPhase.RECOVERING
        return SessionPhase.DETACHED

    # -- passivation -------------------------------------------------------------

    def idle_since(self, last_active: float) -> float | None:
        """Since when this session could be parked (``None``: it cannot be now).

        Parkable: detached (or recovering), no resume claimed, no activation on
        the wire. ``last_active`` is when the shell last handled a command
        other than a tick; idleness counts from the later of the two.
        """
        if self._attachment is not None:
            return None  # attached, activating or closed: `phase` not worked out per send
        if self.phase not in (SessionPhase.DETACHED, SessionPhase.RECOVERING):
            return None
        detached_at = self._fields.detached_at
        if self._pending_resumes or detached_at is None:
            return None
        return max(detached_at, last_active)

    def park(self) -> ParkedSession:
        """This session as plain data. Only for a parkable one (see `idle_since`)."""
        self._failpoint("passivate.enter")
        values = field_values(self._fields)
        if self.idle_since(0.0) is None or values["detached_at"] is None:
            raise ValueError(f"session {self._session_id} is not parkable in {self.phase}")
        parked = ParkedSession(session_id=self._session_id, **self._journal.park(), **values)
        self._failpoint("passivate.parked")
        return parked

    @classmethod
    def unpark(
        cls,
        parked: ParkedSession,
        *,
        config: SessionConfig,
        clock: Callable[[], float] | None = None,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> SessionState:
        """The session ``parked`` was taken from, detached, as it was."""
        failpoints.hit("reactivate.enter", parked.session_id)
        state = cls.__new__(cls)
        state._session_id = parked.session_id
        state._config = config
        state._clock = clock or time.monotonic
        state._failpoints = failpoints
        state._journal = EventJournal.unpark(
            parked.journal,
            max_bytes=config.replay_max_bytes,
            ttl_s=config.replay_ttl_s,
            clock=state._clock,
            max_events=config.replay_max_events,
            strict=config.strict,
        )
        # A copy, not the parked session itself: that would keep its journal alive.
        state._fields = SessionFields(**field_values(parked))
        state._attachment = None
        state._pending_resumes = 0
        state._activations = {}
        state._closed = False
        state._effects = []
        state._undo_point = None
        failpoints.hit("reactivate.restored", parked.session_id)
        return state

    def __repr__(self) -> str:
        return (
            f"SessionState(session_id={self._session_id!r}, "
            f"attachment_generation={self._fields.attachment_generation}, "
            f"attached={self._attachment is not None}, "
            f"lease_generation={self._fields.lease_generation}, journal={self._journal!r})"
        )

    # -- the one entry point -------------------------------------------------

    def handle(self, command: Command) -> Transition:
        """Apply ``command`` whole or not at all; see the module's theory of operation."""
        handler = _HANDLERS.get(type(command))
        if handler is None:
            raise TypeError(f"not a session command: {type(command).__name__}")
        snapshot = self._undo_point = self.snapshot()
        try:
            if self._closed:
                raise UnknownSessionError(self._session_id)
            reply = handler(self, command)
        except SessionError as error:
            self._effects.clear()
            return Transition(error=error)
        except BaseException:
            self.restore(snapshot)
            raise
        # The one list, emptied between commands (a new one per command was
        # one more allocation per send for the garbage collector to count).
        effects = tuple(self._effects)
        self._effects.clear()
        return Transition(reply=reply, effects=effects)

    # -- a store's view ----------------------------------------------------------

    def undo(self) -> None:
        """Undo the last `handle` (its store write failed): as if never sent."""
        if self._undo_point is None:
            raise RuntimeError("undo() before any handle(), or after settle()")
        self.restore(self._undo_point)

    def settle(self) -> None:
        """The last `handle` stands (carried out, durable or needing no write):
        no `undo` follows, so its snapshot is let go now rather than kept
        until the next command (with the fields and attachment it holds, ~4
        objects per live session for the garbage collector to walk)."""
        self._undo_point = None

    def store_record(self, wall_offset: float) -> SessionRecord:
        """What a store keeps of this session, times as wall clock (``clock + offset``).

        While a resume's activation is on the wire, the token the client
        presented stays in the record as the recovery token (see below).
        """
        next_sequence, dropped_through, drop_runs, overflowed = self._journal.counters()
        values = field_values(self._fields)
        detached = values["detached_at"]
        if detached is not None:
            values["detached_at"] = detached + wall_offset
        if self._activations and values["recovery_token_digest"] is None:
            # The client holds only the token it presented until the activation
            # frame reaches it; this process may die first, and the one that
            # takes the session over from the store must accept that token.
            values["recovery_token_digest"] = self._activations[max(self._activations)]
        return SessionRecord(
            next_sequence=next_sequence,
            dropped_through=dropped_through,
            drop_runs=drop_runs,
            overflowed=overflowed,
            **values,
        )

    def entries_after(self, sequence: int) -> tuple[JournalEntry, ...]:
        return self._journal.entries_after(sequence)

    # -- snapshots (invariants: StateCore.check_invariants) ---------------------

    def snapshot(self) -> StateSnapshot:
        # In field order, as `EventJournal.snapshot` builds its own (one per command).
        return new_tuple(
            StateSnapshot,
            (
                self._journal.snapshot(),
                self._fields,
                self._attachment,
                self._pending_resumes,
                tuple(self._activations.items()),
                self._closed,
            ),
        )

    def restore(self, snapshot: StateSnapshot) -> None:
        """Return to ``snapshot``, which must be the latest one taken."""
        self._journal.restore(snapshot.journal)
        self._fields = snapshot.fields
        self._attachment = snapshot.attachment
        self._pending_resumes = snapshot.pending_resumes
        self._activations = dict(snapshot.activations)
        self._closed = snapshot.closed
        self._effects.clear()


_HANDLERS: dict[type[Any], Callable[[SessionState, Any], Any]] = {
    SendEvent: SessionState._on_send_event,
    SendEvents: SessionState._on_send_events,
    Acknowledge: SessionState._on_acknowledge,
    ReleaseAttachment: SessionState._on_release_attachment,
    BeginResume: SessionState._on_begin_resume,
    EndResume: SessionState._on_end_resume,
    SettleLeaseGeneration: SessionState._on_settle_lease_generation,
    HasAttachment: SessionState._on_has_attachment,
    IsCurrentAttachment: SessionState._on_is_current_attachment,
    AuthenticateResume: SessionState._on_authenticate_resume,
    Resume: SessionState._on_resume,
    ActivationOutcome: SessionState._on_activation_outcome,
    AbortResume: SessionState._on_abort_resume,
    Tick: SessionState._on_tick,
    Close: SessionState._on_close,
}
