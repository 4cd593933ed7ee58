"""MemoryStore: a `SessionStore` in this process's memory.

For tests and for several registries in one process sharing sessions (a
resume on one registry takes a session over from another, as across
processes with `RedisStore`). It does not
outlive the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from actors._client_seqs import ClientWatermark
from actors._errors import (
    DuplicateSessionError,
    SessionReplacedError,
    StoreUnavailableError,
    TokenConflictError,
)
from actors._store import (
    DEFAULT_LEASE_S,
    Commit,
    SessionRecord,
    StoredEvent,
    StoredSession,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Entry:
    epoch: int
    lease_until: float
    record: SessionRecord
    events: dict[int, StoredEvent]
    #: input key -> its claimant, or ``_ANSWERED``.
    inputs: dict[str, str] = field(default_factory=dict)
    identity: str | None = None
    client_seqs: ClientWatermark = field(default_factory=ClientWatermark)


#: An input whose answer was journaled (claimants are never this).
_ANSWERED = ""


class MemoryStore:
    """A `SessionStore` in this process's memory, shared under a lock.

    For tests and for several registries in one process; it does not outlive
    the process. Its leases use ``clock`` (monotonic by default).
    """

    def __init__(
        self, *, lease_s: float = DEFAULT_LEASE_S, clock: Callable[[], float] | None = None
    ) -> None:
        self.lease_s = lease_s
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._sessions: dict[str, _Entry] = {}

    def create(self, session_id: str, record: SessionRecord) -> int:
        """Store a new session at epoch 1 (`DuplicateSessionError` if held)."""
        with self._lock:
            if session_id in self._sessions:
                raise DuplicateSessionError(session_id)
            self._sessions[session_id] = _Entry(
                epoch=1, lease_until=self._clock() + self.lease_s, record=record, events={}
            )
            return 1

    def _owned(self, session_id: str, epoch: int) -> _Entry:
        entry = self._sessions.get(session_id)
        if entry is None or entry.epoch != epoch or entry.lease_until < self._clock():
            raise SessionReplacedError(session_id)
        return entry

    def commit(self, commit: Commit) -> None:
        """Apply ``commit`` whole or refuse it (see `SessionStore`)."""
        with self._lock:
            entry = self._owned(commit.session_id, commit.epoch)
            expect = commit.expect_token_digest
            if expect is not None and entry.record.token_digest != expect:
                raise TokenConflictError("the resume token was rotated by another resume")
            # Appends follow the head (or the new trim boundary): no hole (RedisStore's rule).
            top = max(entry.record.next_sequence - 1, commit.trim_through or 0)
            for event in commit.appends:
                if event.sequence != top + 1:
                    raise SessionReplacedError(commit.session_id)
                top = event.sequence
            for event in commit.appends:
                entry.events[event.sequence] = event
            if commit.trim_through is not None:
                for sequence in [s for s in entry.events if s <= commit.trim_through]:
                    del entry.events[sequence]
            if commit.record is not None:
                entry.record = commit.record
            elif commit.appends:
                entry.record = replace(entry.record, next_sequence=top + 1)
            for key in commit.settles:
                entry.inputs[key] = _ANSWERED
            if commit.client_seqs:
                entry.client_seqs = entry.client_seqs.with_handled(commit.client_seqs)
            entry.lease_until = self._clock() + self.lease_s

    def load(self, session_id: str, *, events: bool = True) -> StoredSession | None:
        """The session as stored, without taking it (without its events if asked)."""
        with self._lock:
            return self._read(session_id, events=events)

    def _read(self, session_id: str, *, events: bool = True) -> StoredSession | None:
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        return StoredSession(
            session_id=session_id,
            epoch=entry.epoch,
            record=entry.record,
            events=tuple(entry.events[s] for s in sorted(entry.events)) if events else (),
        )

    def acquire(self, session_id: str, expect_token_digest: bytes) -> StoredSession | None:
        """Take the session over at the next epoch if its digest is still this one."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None or entry.record.token_digest != expect_token_digest:
                return None
            entry.epoch += 1
            entry.lease_until = self._clock() + self.lease_s
            return self._read(session_id)

    def renew(self, session_id: str, epoch: int) -> bool:
        """Extend ``epoch``'s lease; ``False`` once another epoch owns it or it ran out."""
        with self._lock:
            try:
                entry = self._owned(session_id, epoch)
            except SessionReplacedError:
                return False
            entry.lease_until = self._clock() + self.lease_s
            return True

    def renew_many(
        self, leases: Sequence[tuple[str, int]]
    ) -> Sequence[bool | StoreUnavailableError]:
        """`renew` for each ``(session_id, epoch)``, in order (never unavailable)."""
        return [self.renew(session_id, epoch) for session_id, epoch in leases]

    def delete(self, session_id: str, epoch: int) -> None:
        """Remove the session if ``epoch`` still owns it."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None and entry.epoch == epoch:
                del self._sessions[session_id]

    def claim_input(self, session_id: str, claimant: str, key: str) -> bool | None:
        """See `SessionStore.claim_input`."""
        if not claimant:
            raise ValueError("a claimant is a non-empty name")
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                return None
            held = entry.inputs.get(key)
            if held == _ANSWERED:
                return False
            entry.inputs[key] = claimant
            return True

    def record_client_seq(self, session_id: str, client_seq: int) -> None:
        """See `SessionStore.record_client_seq`."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None:
                entry.client_seqs = entry.client_seqs.with_handled((client_seq,))

    def client_watermark(self, session_id: str) -> ClientWatermark:
        """See `SessionStore.client_watermark`."""
        with self._lock:
            entry = self._sessions.get(session_id)
            return ClientWatermark() if entry is None else entry.client_seqs

    def last_client_seq(self, session_id: str) -> int:
        """The stored watermark alone: every client event through it was handled
        (`client_watermark` also gives the handled runs above it)."""
        return self.client_watermark(session_id).last_client_seq

    def bind_identity(self, session_id: str, fingerprint: str) -> None:
        """See `SessionStore.bind_identity`."""
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None:
                entry.identity = fingerprint

    def bound_identity(self, session_id: str) -> str | None:
        """See `SessionStore.bound_identity`."""
        with self._lock:
            entry = self._sessions.get(session_id)
            return None if entry is None else entry.identity
