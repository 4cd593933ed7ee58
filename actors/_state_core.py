"""The fields every part of a session's state machine shares, and its helpers.

`actors._state.SessionState` is one machine over these fields; its handlers
are grouped by what they serve (`actors._resume_rules`: resumes, their
activations and rollbacks, the lease generations they settle;
`actors._event_rules`: journaling events and acks), each a class over this
core, so every handler still reads and writes the same fields under the same
invariants (`StateCore.check_invariants`). Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from actors._commands import (
    Effect,
    LifecycleEvent,
    LifecycleKind,
    RetireAttachment,
    TransportAttachment,
)
from actors._fields import SessionFields
from actors._journal import EventJournal
from actors._transition import NO_FAILPOINTS, Failpoints, SessionConfig, StateSnapshot

__all__ = ["StateCore"]


class StateCore:
    """The session's fields (set by `actors._state.SessionState`), with the
    invariants each keeps, and the helpers every handler uses."""

    _session_id: str
    _config: SessionConfig
    _clock: Callable[[], float]
    _failpoints: Failpoints
    _journal: EventJournal
    # What a session parks, snapshots and stores (its invariants are on
    # SessionFields), replaced whole on a change: a snapshot holds it as is.
    _fields: SessionFields
    # Invariant: None or attachment.generation == attachment_generation.
    _attachment: TransportAttachment | None
    # Invariant: >= 0; begin_resume claims not yet ended.
    _pending_resumes: int
    # Activations on the wire: generation -> digest the resume accepted
    # (what a rollback restores as the recovery token).
    # Invariant: every key <= attachment_generation.
    _activations: dict[int, bytes]
    _closed: bool
    _effects: list[Effect]
    # The snapshot the last handle() took: undo() returns to it.
    _undo_point: StateSnapshot | None

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
        failpoints = self._failpoints
        if failpoints is not NO_FAILPOINTS:  # no call without a fault plan (3 per send)
            failpoints.hit(name, self._session_id)

    def _event(self, kind: LifecycleKind, reason: str | None = None) -> LifecycleEvent:
        return LifecycleEvent(
            kind=kind,
            session_id=self._session_id,
            attachment_generation=self._fields.attachment_generation,
            lease_generation=self._fields.lease_generation,
            reason=reason,
        )

    def _detach(self, reason: str) -> None:
        self._attachment = None
        self._fields = replace(self._fields, detached_at=self._clock())
        self._effects.append(
            RetireAttachment(
                attachment_generation=self._fields.attachment_generation, reason=reason
            )
        )
