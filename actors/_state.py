"""One session's rules as a pure state machine: command in, transition out.

Theory of operation
-------------------
The seed held these rules in a registry guarded by locks and awaited its
transport sends inline. Here they are split from both: `SessionState.handle`
takes one command (`actors._messages`), changes the state, and returns a
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

The machine is one class on purpose, longer than our other modules: every
handler touches the same private fields under the same invariants, and
splitting the handlers apart would hide what a transition may change. Its
vocabulary (configuration, failpoints, outcomes) is in `actors._transition`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from actors._credential import ResumeToken, token_digest
from actors._errors import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidResumeTokenError,
    JournalOverflowError,
    SessionError,
    UnknownSessionError,
)
from actors._fields import SessionFields, field_values
from actors._journal import EventJournal, JournalEntry, normalize_payload
from actors._lifecycle import ParkedSession, SessionPhase
from actors._messages import (
    AbortResume,
    Acknowledge,
    Activate,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    CloseCallable,
    Command,
    Deliver,
    DetachedAttachment,
    Effect,
    EndResume,
    EventAccepted,
    HasAttachment,
    IsCurrentAttachment,
    LifecycleEvent,
    LifecycleKind,
    Notify,
    ReleaseAttachment,
    Resume,
    ResumeResult,
    RetireAttachment,
    SendCallable,
    SendEvent,
    SendEvents,
    SessionCreated,
    SettleLeaseGeneration,
    Tick,
    TickResult,
    TransportAttachment,
)
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


class SessionState:
    """The rules of one session, the seed registry's per-session half."""

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
        # What a session parks, snapshots and stores (its invariants are on
        # SessionFields), replaced whole on a change: a snapshot holds it as is.
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
        # Invariant: None or attachment.generation == attachment_generation.
        self._attachment: TransportAttachment | None = TransportAttachment(
            generation=1, send=send, close=close
        )
        # Invariant: >= 0; begin_resume claims not yet ended.
        self._pending_resumes = 0
        # Activations on the wire: generation -> digest the resume accepted
        # (what a rollback restores as the recovery token).
        # Invariant: every key <= attachment_generation.
        self._activations: dict[int, bytes] = {}
        self._closed = False
        self._effects: list[Effect] = []
        # The snapshot the last handle() took: undo() returns to it.
        self._undo_point: StateSnapshot | None = None

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
        self._effects = []
        try:
            if self._closed:
                raise UnknownSessionError(self._session_id)
            reply = handler(self, command)
        except SessionError as error:
            self._effects = []
            return Transition(error=error)
        except BaseException:
            self.restore(snapshot)
            raise
        effects, self._effects = tuple(self._effects), []
        return Transition(reply=reply, effects=effects)

    # -- a store's view ----------------------------------------------------------

    def undo(self) -> None:
        """Undo the last `handle` (its store write failed): as if never sent."""
        if self._undo_point is None:
            raise RuntimeError("undo() before any handle()")
        self.restore(self._undo_point)

    def store_record(self, wall_offset: float) -> SessionRecord:
        """What a store keeps of this session, times as wall clock (``clock + offset``)."""
        next_sequence, dropped_through, drop_runs, overflowed = self._journal.counters()
        values = field_values(self._fields)
        detached = values["detached_at"]
        if detached is not None:
            values["detached_at"] = detached + wall_offset
        return SessionRecord(
            next_sequence=next_sequence,
            dropped_through=dropped_through,
            drop_runs=drop_runs,
            overflowed=overflowed,
            **values,
        )

    def entries_after(self, sequence: int) -> tuple[JournalEntry, ...]:
        return self._journal.entries_after(sequence)

    # -- snapshots and invariants ---------------------------------------------

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            journal=self._journal.snapshot(),
            fields=self._fields,
            attachment=self._attachment,
            pending_resumes=self._pending_resumes,
            activations=tuple(self._activations.items()),
            closed=self._closed,
        )

    def restore(self, snapshot: StateSnapshot) -> None:
        """Return to ``snapshot``, which must be the latest one taken."""
        self._journal.restore(snapshot.journal)
        self._fields = snapshot.fields
        self._attachment = snapshot.attachment
        self._pending_resumes = snapshot.pending_resumes
        self._activations = dict(snapshot.activations)
        self._closed = snapshot.closed
        self._effects = []

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first invariant that does not hold."""
        fields = self._fields
        generation = fields.attachment_generation
        orphan = fields.orphaned_lease_generation
        recovery = fields.recovery_token_digest
        checks: tuple[tuple[bool, str], ...] = (
            (generation >= 1, "attachment generation below 1"),
            (
                self._attachment is None or self._attachment.generation == generation,
                "attachment is not the current generation",
            ),
            (fields.lease_generation >= 0, "negative lease generation"),
            (self._pending_resumes >= 0, "negative pending resumes"),
            (orphan is None or orphan >= 0, "negative orphaned lease generation"),
            (
                all(g <= generation for g in self._activations),
                "an activation is newer than the current generation",
            ),
            (
                fields.last_resume is None or fields.last_resume[0] <= generation,
                "the last resume is newer than the current generation",
            ),
            (len(fields.token_digest) == 32, "credential digest is not SHA-256"),
            (recovery is None or len(recovery) == 32, "recovery digest is not SHA-256"),
            (
                self._closed or (self._attachment is None) == (fields.detached_at is not None),
                "detached_at disagrees with the attachment",
            ),
        )
        for holds, what in checks:
            if not holds:
                raise AssertionError(f"session {self._session_id}: {what}")
        self._journal.check_invariants()

    # -- helpers ---------------------------------------------------------------

    def _failpoint(self, name: str) -> None:
        self._failpoints.hit(name, self._session_id)

    def _event(self, kind: LifecycleKind, reason: str | None = None) -> LifecycleEvent:
        return LifecycleEvent(
            kind=kind,
            session_id=self._session_id,
            attachment_generation=self._fields.attachment_generation,
            lease_generation=self._fields.lease_generation,
            reason=reason,
        )

    def _check_token(self, token: object) -> str:
        if not isinstance(token, str):
            raise InvalidInputError(f"resume token must be a str, got {type(token).__name__}")
        return token

    def _validate_resume_identity(self, token: str) -> bool:
        """``False``: the current token. ``True``: the one-shot recovery token."""
        digest = token_digest(token)
        if hmac.compare_digest(self._fields.token_digest, digest):
            return False
        recovery = self._fields.recovery_token_digest
        if (
            self._attachment is None
            and recovery is not None
            and hmac.compare_digest(recovery, digest)
        ):
            return True
        raise InvalidResumeTokenError(f"invalid resume token for duplex session {self._session_id}")

    def _settle_orphan(self) -> int | None:
        fields = self._fields
        orphan = fields.orphaned_lease_generation
        if orphan is None or self._pending_resumes > 0:
            # Nothing parked, or the next activation absorbs it (see resume).
            return None
        if self._attachment is not None:
            lease = max(fields.lease_generation, orphan)
            self._fields = replace(fields, orphaned_lease_generation=None, lease_generation=lease)
            return None
        self._fields = replace(fields, orphaned_lease_generation=None)
        return orphan

    def _detach(self, reason: str) -> None:
        self._attachment = None
        self._fields = replace(self._fields, detached_at=self._clock())
        self._effects.append(
            RetireAttachment(
                attachment_generation=self._fields.attachment_generation, reason=reason
            )
        )

    # -- handlers, one per command ----------------------------------------------

    def _on_send_event(self, command: SendEvent) -> Any:
        self._failpoint("send_event.enter")
        attachment = self._attachment
        if command.journal:
            entry, frame = self._journal.record_framed(command.payload)
            self._failpoint("send_event.recorded")
            if command.on_accepted is not None:
                self._effects.append(EventAccepted(callback=command.on_accepted))
            if attachment is not None:
                self._effects.append(
                    Deliver(attachment_generation=attachment.generation, frames=(frame,))
                )
            self._failpoint("send_event.effects")
            return entry
        plain = normalize_payload(command.payload, strict=self._config.strict)
        self._failpoint("send_event.recorded")
        if attachment is not None:
            self._effects.append(
                Deliver(
                    attachment_generation=attachment.generation,
                    frames=(plain,),  # type: ignore[arg-type]
                    on_delivered=command.on_accepted,
                )
            )
        self._failpoint("send_event.effects")
        return None

    def _on_send_events(self, command: SendEvents) -> Any:
        self._failpoint("send_event.enter")
        attachment = self._attachment
        if not command.atomic:
            reply, frames = self._record_each(command)
        elif command.journal:
            entries, frames = self._journal.record_many_framed(command.payloads)
            reply = entries
        else:
            frames = tuple(
                normalize_payload(p, strict=self._config.strict) for p in command.payloads
            )
            reply = (None,) * len(frames)
        self._failpoint("send_event.recorded")
        if attachment is not None and frames:
            self._effects.append(
                Deliver(attachment_generation=attachment.generation, frames=frames)
            )
        self._failpoint("send_event.effects")
        return reply

    def _record_each(self, command: SendEvents) -> tuple[Any, tuple[Any, ...]]:
        """Each payload on its own: its entry (or None) or the error refusing it."""
        results: list[object] = []
        frames: list[object] = []
        for payload in command.payloads:
            try:
                if command.journal:
                    entry, frame = self._journal.record_framed(payload)
                    results.append(entry)
                    frames.append(frame)
                else:
                    frames.append(normalize_payload(payload, strict=self._config.strict))
                    results.append(None)
            except (InvalidPayloadError, JournalOverflowError) as refused:
                results.append(refused)
        return tuple(results), tuple(frames)

    def _on_acknowledge(self, command: Acknowledge) -> int:
        self._failpoint("acknowledge.enter")
        removed = self._journal.acknowledge(command.sequence)
        self._failpoint("acknowledge.removed")
        return removed

    def _on_release_attachment(self, command: ReleaseAttachment) -> DetachedAttachment | None:
        self._failpoint("release_attachment.enter")
        wanted = command.attachment_generation
        if self._config.strict:
            check_generation(wanted, what="attachment_generation", optional=True)
        if self._attachment is None:
            return None
        if wanted is not None and wanted != self._fields.attachment_generation:
            return None
        self._detach("detached")
        self._failpoint("release_attachment.detached")
        self._effects.append(Notify(event=self._event("detached")))
        return DetachedAttachment(
            session_id=self._session_id,
            attachment_generation=self._fields.attachment_generation,
            lease_generation=self._fields.lease_generation,
        )

    def _on_begin_resume(self, command: BeginResume) -> None:
        self._failpoint("begin_resume.enter")
        self._pending_resumes += 1
        self._failpoint("begin_resume.claimed")

    def _on_end_resume(self, command: EndResume) -> int | None:
        self._failpoint("end_resume.enter")
        self._pending_resumes = max(0, self._pending_resumes - 1)
        owed = self._settle_orphan()
        self._failpoint("end_resume.released")
        return owed

    def _on_settle_lease_generation(self, command: SettleLeaseGeneration) -> int | None:
        self._failpoint("settle_lease_generation.enter")
        if self._config.strict:
            check_generation(command.lease_generation, what="lease_generation", optional=False)
        orphan = max(self._fields.orphaned_lease_generation or 0, command.lease_generation)
        self._fields = replace(self._fields, orphaned_lease_generation=orphan)
        self._failpoint("settle_lease_generation.parked")
        return self._settle_orphan()

    def _on_has_attachment(self, command: HasAttachment) -> bool:
        self._failpoint("has_attachment.enter")
        return self._attachment is not None

    def _on_is_current_attachment(self, command: IsCurrentAttachment) -> bool:
        self._failpoint("is_current_attachment.enter")
        return (
            self._attachment is not None
            and self._fields.attachment_generation == command.attachment_generation
        )

    def _on_authenticate_resume(self, command: AuthenticateResume) -> None:
        self._failpoint("authenticate_resume.enter")
        token = self._check_token(command.resume_token)
        self._validate_resume_identity(token)
        self._failpoint("authenticate_resume.verified")
        self._journal.replay_after(command.last_received_server_event_seq)

    def _on_resume(self, command: Resume) -> ResumeResult:
        self._failpoint("resume.enter")
        token = self._check_token(command.resume_token)
        if self._config.strict:
            check_generation(command.lease_generation, what="lease_generation", optional=True)
        # Token before sequence: a stranger learns nothing about the journal.
        used_recovery = self._validate_resume_identity(token)
        replay = self._journal.replay_after(command.last_received_server_event_seq)
        self._failpoint("resume.verified")
        fields = self._fields
        accepted_digest = fields.token_digest
        if used_recovery and fields.recovery_token_digest is not None:
            accepted_digest = fields.recovery_token_digest
        rotated = ResumeToken.generate()
        self._fields = fields = replace(
            fields, recovery_token_digest=None, token_digest=token_digest(rotated.plaintext)
        )
        self._failpoint("resume.rotated")
        replaced = self._attachment
        if replaced is not None:
            self._effects.append(
                RetireAttachment(attachment_generation=replaced.generation, reason="replaced")
            )
        generation = fields.attachment_generation + 1
        self._attachment = TransportAttachment(
            generation=generation, send=command.send, close=command.close
        )
        self._fields = replace(
            fields,
            attachment_generation=generation,
            detached_at=None,
            # The activating connection serves the newest lease the engine holds:
            # its own resume's, or a newer one abandoned while this one was pending.
            lease_generation=max(
                fields.lease_generation,
                command.lease_generation if command.lease_generation is not None else 0,
                fields.orphaned_lease_generation or 0,
            ),
            orphaned_lease_generation=None,
            last_resume=(generation, accepted_digest),
        )
        self._failpoint("resume.attached")
        if command.activation_payload_factory is not None:
            self._activations[generation] = accepted_digest
            self._effects.append(
                Activate(
                    attachment_generation=generation,
                    resume_token=rotated,
                    payload_factory=command.activation_payload_factory,
                    replay=replay,
                )
            )
        self._effects.append(Notify(event=self._event("resumed")))
        return ResumeResult(
            session_id=self._session_id,
            attachment_generation=generation,
            resume_token=rotated,
            replay_entries=replay,
            replaced_attachment=replaced,
        )

    def _on_activation_outcome(self, command: ActivationOutcome) -> bool:
        """``True`` when this outcome rolled the resume back."""
        self._failpoint("activation_outcome.enter")
        generation = command.attachment_generation
        accepted_digest = self._activations.pop(generation, None)
        if accepted_digest is None or command.delivered:
            return False
        return self._roll_back(generation, accepted_digest, "activation_outcome.rolled_back")

    def _on_abort_resume(self, command: AbortResume) -> bool:
        """``True`` when the resume was rolled back; ``False``: nothing to undo."""
        self._failpoint("abort_resume.enter")
        generation = command.attachment_generation
        accepted_digest = self._activations.pop(generation, None)
        if accepted_digest is None:
            last = self._fields.last_resume
            if last is None or last[0] != generation:
                return False
            accepted_digest = last[1]
        return self._roll_back(generation, accepted_digest, "abort_resume.rolled_back")

    def _roll_back(self, generation: int, accepted_digest: bytes, failpoint: str) -> bool:
        # The seed's rollback, generation-checked: a later resume that took
        # over keeps its attachment. The presented token works again, once;
        # the lease the provisional attachment served is parked as the orphan.
        if self._fields.attachment_generation != generation:
            return False
        if self._attachment is not None:
            self._detach("activation_failed")
        fields = self._fields
        self._fields = replace(
            fields,
            recovery_token_digest=accepted_digest,
            orphaned_lease_generation=max(
                fields.orphaned_lease_generation or 0, fields.lease_generation
            ),
            last_resume=None,
        )
        self._failpoint(failpoint)
        return True

    def _on_tick(self, command: Tick) -> TickResult:
        self._failpoint("tick.enter")
        pruned = self._journal.prune(command.now)
        self._failpoint("tick.pruned")
        grace = self._config.disconnect_grace_s
        detached_at = self._fields.detached_at
        expired = (
            grace is not None
            and detached_at is not None
            and self._pending_resumes == 0
            and not self._activations
            and command.now - detached_at >= grace
        )
        return TickResult(pruned=pruned, expired=expired)

    def _on_close(self, command: Close) -> TransportAttachment | None:
        self._failpoint("close.enter")
        attachment = self._attachment
        if attachment is not None:
            self._effects.append(
                RetireAttachment(attachment_generation=attachment.generation, reason="closed")
            )
        self._closed = True
        self._failpoint("close.closed")
        self._effects.append(Notify(event=self._event("closed")))
        return attachment


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
