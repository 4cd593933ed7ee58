"""A live session's binding to its store: its epoch and what it last wrote.

`StoreBinding` turns a session state into the `actors._store.Commit` that
writes what a transition changed (nothing, when it changed nothing
persisted), and decides, after a fence, whether a commit whose answer was
lost was applied. It does no I/O but the store call of `StoreBinding.commit`
(the in-memory store's, in the session's turn); a store that does I/O gets
`prepare`'s commit through a `actors._store.Committer`.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Protocol

from actors._fields import FIELD_NAMES
from actors._journal import JournalEntry
from actors._store import (
    Commit,
    SessionRecord,
    SessionStore,
    StoredSession,
    handled_client_seq,
    settled_input,
    stored_event,
)

__all__ = ["Checkpointable", "StoreBinding", "same_fields"]


class Checkpointable(Protocol):
    """What `StoreBinding` reads of a session state."""

    def store_record(self, wall_offset: float) -> SessionRecord: ...

    def entries_after(self, sequence: int) -> tuple[JournalEntry, ...]: ...


class StoreBinding:
    """One live session's link to the store: its epoch and what was last written.

    Used by a session's `actors._store_link.StoreLink` only. `commit` writes
    what a transition changed (nothing, when it changed nothing persisted);
    `prepare` and `confirm` are the same write in two steps, for a commit
    answered later (`Committer`).
    """

    __slots__ = (
        "_clock",
        "_last_sequence",
        "_prepared",
        "_record",
        "epoch",
        "session_id",
        "store",
    )

    def __init__(
        self,
        *,
        store: SessionStore,
        session_id: str,
        epoch: int,
        record: SessionRecord,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.epoch = epoch
        self._record = record
        self._last_sequence = record.next_sequence - 1
        self._prepared: SessionRecord | None = None
        self._clock = clock

    def wall_offset(self) -> float:
        return time.time() - self._clock()

    def commit(self, state: Checkpointable) -> None:
        """Write what changed since the last commit; raises the store's refusal."""
        commit = self.prepare(state)
        if commit is not None:
            self.store.commit(commit)
            self.confirm()

    def prepare(self, state: Checkpointable) -> Commit | None:
        """What changed since the last confirmed commit (``None``: nothing to write).

        `confirm` once the store applied it; on a refusal the state is undone
        and the next `prepare` compares against the last confirmed write again.
        """
        offset = self.wall_offset()
        record = state.store_record(offset)
        last = self._record
        appended = state.entries_after(self._last_sequence)
        unchanged = same_fields(record, last)
        if not appended and unchanged and record.next_sequence == last.next_sequence:
            return None
        events = tuple(stored_event(entry, offset) for entry in appended)
        # The common commit, one event journaled: only next_sequence moved, and
        # the store derives it from the appends (fewer bytes per event).
        sequence_only = bool(events) and unchanged
        settles: tuple[str, ...] = ()
        client_seqs: tuple[int, ...] = ()
        for event in events:
            key = settled_input(event.encoded)
            if key:
                settles += (key,)
            seq = handled_client_seq(event.encoded)
            if seq:
                client_seqs += (seq,)
        self._prepared = record
        return Commit(
            session_id=self.session_id,
            epoch=self.epoch,
            record=None if sequence_only else record,
            expect_token_digest=(
                last.token_digest if record.token_digest != last.token_digest else None
            ),
            appends=events,
            trim_through=(
                record.dropped_through if record.dropped_through != last.dropped_through else None
            ),
            settles=settles,
            client_seqs=client_seqs,
        )

    def settle(self, fenced: StoredSession) -> bool:
        """Whether the commit `prepare` returned last, answered
        `StoreOutcomeUnknownError`, was applied: ``fenced`` is the session as
        `BatchingStore.fence` read it (at the owner's next epoch, taken here).

        Why this decides it under every interleaving: the fence ran after
        that commit or fenced it out for good (its epoch is refused from now
        on), and this owner writes one commit at a time, so the stored fields
        are either the prepared record (applied: confirmed, its effects may go
        out) or the last confirmed one (never applied: the caller undoes it).
        The two differ (else `prepare` had nothing to write): in the fields,
        or in ``next_sequence``, which a commit with events moves.
        """
        prepared = self._prepared
        assert prepared is not None  # noqa: S101 - only after a prepare that wrote
        self.epoch = fenced.epoch
        stored = fenced.record
        if stored.next_sequence == prepared.next_sequence and same_fields(stored, prepared):
            self.confirm()
            return True
        self._prepared = None
        return False

    def confirm(self) -> None:
        """The store applied what `prepare` returned last: it is the base now."""
        record, self._prepared = self._prepared, None
        assert record is not None  # noqa: S101 - only after a prepare that wrote
        self._record = record
        self._last_sequence = record.next_sequence - 1


#: What `same_fields` compares as is: every field but ``detached_at``.
_compared = operator.attrgetter(*(name for name in FIELD_NAMES if name != "detached_at"))


def same_fields(record: SessionRecord, last: SessionRecord) -> bool:
    """Equal but for ``next_sequence`` (and ``detached_at``'s value, which moves
    with the wall clock offset: only whether it is set counts)."""
    return (
        _compared(record) == _compared(last)
        and (record.detached_at is None) == (last.detached_at is None)
        and record.dropped_through == last.dropped_through
        and record.overflowed == last.overflowed
        and record.drop_runs == last.drop_runs
    )
