"""What a session persists, and the store interface it persists through.

A registry without a store keeps every session in its own memory (the
embedded default: nothing to run, no write per event). A registry given a
`SessionStore` writes each committed transition through it before the
transition's effects are released, so another process sharing the store can
take the session over when a client resumes there.

What crosses processes is plain data, never a pickle:

* `SessionRecord`: the session's fields (token digest, recovery
  digest, generations, orphaned lease, journal counters, when it was
  detached), written whole when any of them changed;
* `StoredEvent`: one journal entry, its encoded JSON and its age;
* `Commit`: one transition's writes, fenced by the owner's epoch.

Client events across processes: the store keeps which sequenced client
events were handled (`actors._client_seqs.ClientWatermark`: a watermark,
``last_client_seq``, and the events handled above it), each one marked by
itself: an event the engine took once it returned, an input once its answer
ended. An engine event carrying ``client_seq`` answers that client event; the
commit that journals it marks it handled in the same atomic write
(`Commit.client_seqs`), so a resume on another process neither redelivers an
answered client event nor skips one whose answer never got journaled. The
watermark stops below an input whose answer is still in flight, so the
process that resumes after its process died gets it again.

Inputs across processes: a client that resumes on another process resends
the inputs it saw no answer to. `SessionStore.claim_input` says whether
this process should answer one: not when its answer was already journaled
(the replay carries it), yes when nobody claimed it or when another process
claimed it and never journaled its answer's end (that process was killed or
taken over; its later writes are refused, so only one answer is journaled).
An answer ends with the event ``{"type": "response.done", "client_event_id":
...}`` (the gateway's protocol); the commit that journals it marks the input
answered in the same atomic write (`Commit.settles`), so no crash can fall
between the two.

One owner at a time: `SessionStore.create` and `SessionStore.acquire`
hand out an *epoch* (a per-session counter that only grows) with a lease; every
write carries the epoch, and a write whose epoch is not the newest, or whose
lease ran out, is refused (`SessionReplacedError`). A token rotation is a
compare-and-set on the stored digest (`TokenConflictError`).

Times: journal entries carry the session clock's (monotonic) times in memory;
the store keeps wall-clock times, converted with the offset between the two
at write and at load, so ages survive a move to another process. Two machines'
wall clocks differ by their skew; TTLs are approximate by that much.

This module does no I/O and imports no threading; the stores are
`supervisor.stores._memory.MemoryStore` and
`supervisor.redis_store.RedisStore`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from actors._client_seqs import ClientWatermark
from actors._credential import token_digest
from actors._errors import (
    GapReason,
    StoreUnavailableError,
)
from actors._fields import SessionFields, field_values
from actors._journal import JournalEntry, ParkedJournal
from actors._lifecycle import ParkedSession

__all__ = [
    "BatchingStore",
    "Commit",
    "CommitAnswer",
    "Committer",
    "SessionRecord",
    "SessionStore",
    "StoredEvent",
    "StoredSession",
    "handled_client_seq",
    "identity_fingerprint",
    "input_key",
    "proves_token",
    "settled_input",
]

#: How long an owner's lease lasts unless renewed (a write renews it too).
DEFAULT_LEASE_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord(SessionFields):
    """A session's persisted fields (its events are `StoredEvent` s): its
    `SessionFields`, ``detached_at`` as wall-clock time (``None``: attached
    when written), and its journal's counters."""

    next_sequence: int
    dropped_through: int
    drop_runs: tuple[tuple[int, GapReason], ...]
    overflowed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """One journal entry as stored: its sequence, age and encoded JSON."""

    sequence: int
    #: Wall-clock time the event was journaled.
    created_at: float
    encoded_bytes: int
    encoded: bytes = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredSession:
    """A session as loaded from the store: its epoch, fields and retained events."""

    session_id: str
    epoch: int
    record: SessionRecord
    events: tuple[StoredEvent, ...] = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """One transition's writes; refused whole unless ``epoch`` owns the session."""

    session_id: str
    epoch: int
    #: ``None``: no field changed but ``next_sequence``, which follows ``appends``.
    record: SessionRecord | None
    #: Compare-and-set: the stored token digest must still be this one.
    expect_token_digest: bytes | None = field(default=None, repr=False)
    appends: tuple[StoredEvent, ...] = field(default=(), repr=False)
    #: Drop every stored event at or below this sequence (acks, TTL).
    trim_through: int | None = None
    #: `input_key` s whose answers end in ``appends``: marked answered.
    settles: tuple[str, ...] = ()
    #: The ``client_seq`` s the events of ``appends`` carry: those client events
    #: are handled (`SessionStore.record_client_seq` for each).
    client_seqs: tuple[int, ...] = ()


class SessionStore(Protocol):
    """Where sessions persist. Every method may raise `StoreUnavailableError`."""

    def create(self, session_id: str, record: SessionRecord) -> int:
        """Store a new session; its first epoch, or `DuplicateSessionError`."""

    def commit(self, commit: Commit) -> None:
        """Apply ``commit`` whole, or raise `SessionReplacedError` /
        `TokenConflictError` and change nothing. Renews the lease."""

    def load(self, session_id: str, *, events: bool = True) -> StoredSession | None:
        """Read a session without taking it (``None``: not stored).

        ``events=False``: its fields only (``events`` empty), e.g. to check a
        token before a takeover, which reads the events itself.
        """

    def acquire(self, session_id: str, expect_token_digest: bytes) -> StoredSession | None:
        """Take the session over: a new epoch and lease, the old owner's ended.

        Only while the stored digest is still ``expect_token_digest`` (the
        one the caller's token was proven against); ``None`` otherwise.
        """

    def renew(self, session_id: str, epoch: int) -> bool:
        """Extend ``epoch``'s lease; ``False`` if it is no longer the owner's."""

    def renew_many(
        self, leases: Sequence[tuple[str, int]]
    ) -> Sequence[bool | StoreUnavailableError]:
        """`renew` for each ``(session_id, epoch)``, in order (a sweep's renewals:
        a store may send them together). Each answered alone: ``True``,
        ``False``, or `StoreUnavailableError` for a lease the store could not
        reach (tried again at the next sweep), so one part of the store that is
        down costs no other session its renewal."""

    def delete(self, session_id: str, epoch: int) -> None:
        """Remove the session if ``epoch`` still owns it."""

    def bind_identity(self, session_id: str, fingerprint: str) -> None:
        """Keep who opened the session (`identity_fingerprint`), for a resume
        on another process to check; nothing if the session is not stored."""

    def bound_identity(self, session_id: str) -> str | None:
        """What `bind_identity` kept (``None``: nothing, or no such session)."""

    def claim_input(self, session_id: str, claimant: str, key: str) -> bool | None:
        """Should ``claimant`` (one process's engine work for the session) answer
        input ``key`` (`input_key`)?

        ``False``: its answer was journaled; ``True``: ``claimant``'s (claimed
        now: nobody had, or another claimant never journaled its answer; or
        claimed by ``claimant`` before: a claim tried again because its reply
        was lost answers as the first try did); ``None``: the session is not
        stored.

        A claimant is one run of a session's engine work, which answers each
        input once itself: the same claimant claims an input twice only when
        it tries one claim again.
        """

    def record_client_seq(self, session_id: str, client_seq: int) -> None:
        """The gateway handled the session's client event ``client_seq`` (this one,
        not those below it): `ClientWatermark.with_handled` (nothing if the
        session is not stored)."""

    def client_watermark(self, session_id: str) -> ClientWatermark:
        """What `record_client_seq` kept, read at once (empty: nothing yet, or no
        such session)."""


@runtime_checkable
class BatchingStore(SessionStore, Protocol):
    """A store whose writes are I/O: it takes many sessions' commits at once.

    A registry given one writes its sessions' commits through a committer off
    its loop (`Committer`), never a round trip per commit on the loop.
    """

    def commit_many(self, commits: Sequence[Commit]) -> list[BaseException | None]:
        """Apply each commit as `SessionStore.commit` would, each whole or not at
        all, together (one round trip); for each, ``None`` (applied) or its
        refusal. Raises `StoreUnavailableError` if none could be answered.

        A commit whose request was sent but whose answer was lost is answered
        `StoreOutcomeUnknownError` (applied or not, nobody knows yet): see
        `fence`."""

    def fence(self, session_id: str, epoch: int, nonce: str) -> StoredSession:
        """End every write of ``epoch`` still on its way to the store, and read
        the session as it is now (fields only: ``events`` empty).

        ``nonce`` names this fence: sent again with it (its own answer lost),
        a fence that was applied answers the same, not "replaced".

        The owner's next epoch (the lease renewed), so a commit of ``epoch``
        that reaches the store later is refused; `SessionReplacedError` if
        ``epoch`` is not the owner's any more (as its commit would be).
        """


#: How a committer answers one commit: ``None`` (durable) or why not.
CommitAnswer = Callable[[BaseException | None], None]


class Committer(Protocol):
    """Writes commits off the caller's loop; answers each on that loop, later."""

    def submit(self, commit: Commit, answer: CommitAnswer) -> None:
        """Queue ``commit``; ``answer`` runs on the registry's loop once the store
        answered (never inside this call)."""

    def call(
        self,
        fn: Callable[[], object],
        answer: Callable[[object, BaseException | None], None] | None,
        *,
        what: str,
        retry_for_s: float = 0.0,
    ) -> None:
        """Run ``fn``, another store call, after the commits queued before it;
        ``answer(result, error)`` on the loop after (none: an error is logged).

        ``retry_for_s`` > 0: while ``fn`` raises `StoreUnavailableError` it is
        run again after a backoff (a timer: the other calls go on meanwhile),
        until it answers or that long has passed."""


def identity_fingerprint(identity: object) -> str | None:
    """A digest of a client's identity that another process computes alike.

    ``None`` for no identity, or one that is not plain JSON data (str,
    number, bool, list, dict): such an identity is compared in the opening
    process only.
    """
    if identity is None:
        return None
    try:
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return _short_digest(text)


def input_key(client_event_id: str) -> str:
    """The stored key of an input id (a digest: ids are the client's text)."""
    return _short_digest(client_event_id)


def _short_digest(text: str) -> str:
    """32 hex characters that every process computes alike for ``text``."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


#: Only an event holding this is decoded to see whether it ends an answer.
_ANSWER_END = b'"response.done"'


def settled_input(encoded: bytes) -> str | None:
    """The `input_key` whose answer this encoded event ends, if it ends one."""
    if _ANSWER_END not in encoded:
        return None
    payload = json.loads(encoded)
    if not isinstance(payload, dict) or payload.get("type") != "response.done":
        return None
    client_event_id = payload.get("client_event_id")
    return input_key(client_event_id) if isinstance(client_event_id, str) else None


#: Only an event holding this is decoded to see which client event it answers.
_CLIENT_SEQ = b'"client_seq"'


def handled_client_seq(encoded: bytes) -> int | None:
    """The ``client_seq`` an engine's encoded event answers, if it carries one."""
    if _CLIENT_SEQ not in encoded:
        return None
    payload = json.loads(encoded)
    seq = payload.get("client_seq") if isinstance(payload, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def proves_token(stored: StoredSession, plaintext: str) -> bytes | None:
    """The stored digest ``plaintext`` matches (current or recovery), or ``None``.

    Constant-time comparisons; a process checks this before it takes a
    session over, so a wrong token never ends the rightful owner's lease.
    """
    digest = token_digest(plaintext)
    record = stored.record
    current = hmac.compare_digest(record.token_digest, digest)
    recovery = record.recovery_token_digest
    if recovery is not None and hmac.compare_digest(recovery, digest):
        return record.token_digest
    return record.token_digest if current else None


def stored_event(entry: JournalEntry, wall_offset: float) -> StoredEvent:
    return StoredEvent(
        sequence=entry.sequence,
        created_at=entry.created_monotonic + wall_offset,
        encoded_bytes=entry.encoded_bytes,
        encoded=entry.json_bytes(),
    )


def parked_from_store(stored: StoredSession, wall_offset: float) -> ParkedSession:
    """The stored session as a parked one, detached, in this process's clock.

    ``wall_offset`` is ``time.time() - clock()`` now. A session stored while
    attached counts as detached from the moment it is loaded.
    """
    record = stored.record
    entries = tuple(
        JournalEntry(
            event.sequence,
            event.created_at - wall_offset,
            event.encoded_bytes,
            encoded=event.encoded,
        )
        for event in stored.events
        if event.sequence > record.dropped_through
    )
    journal = ParkedJournal(
        entries=entries,
        next_sequence=record.next_sequence,
        dropped_through=record.dropped_through,
        drop_runs=record.drop_runs,
        retained_bytes=sum(entry.encoded_bytes for entry in entries),
        overflowed=record.overflowed,
        # Its head is the store's: a client beyond it is a store_lost gap.
        store_loaded=True,
    )
    values = field_values(record)
    detached_at = values["detached_at"]
    values["detached_at"] = (time.time() if detached_at is None else detached_at) - wall_offset
    return ParkedSession(session_id=stored.session_id, **journal, **values)
