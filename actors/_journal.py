"""The event journal: sequence numbers, byte and count caps, TTL, ack, replay.

Every behaviour of the seed's ``DuplexEventJournal`` holds: sequences start at
1 and are stamped into the payload as ``server_event_seq``; an event costs the
UTF-8 length of its compact JSON; overflow is sticky and never evicts; TTL and
acknowledgement drop events from the head; a replay older than what is kept
is a gap. Beyond the seed: an optional count cap, gap errors that say what is
missing and why, entries that keep their encoded bytes, and a snapshot /
restore pair so a transition that fails half-way can be undone cheaply.
An event's JSON (payload checks, encoders, decoder) is `actors._event_json`'s.

Pure: no I/O, no threads, no event loop. The clock is injected.

One module over 400 lines: `EventJournal` alone is over 400, the seed's
journal rules (append, ack, replay, caps, TTL) with each invariant next to the
field it constrains; the records it makes and takes back (`JournalEntry`,
`JournalSnapshot`, `ParkedJournal`) stay beside it.
"""

from __future__ import annotations

import itertools
import math
import numbers
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, TypedDict

from actors._errors import (
    GapReason,
    InvalidSequenceError,
    JournalGapError,
    JournalOverflowError,
)
from actors._event_json import _dumps as _dumps  # noqa: PLC0414 - tests patch it here
from actors._event_json import _encode_checked, encode_event, normalize_payload
from actors._event_json import _loads as _loads  # noqa: PLC0414 - tests read it here

__all__ = [
    "EventJournal",
    "JournalEntry",
    "JournalSnapshot",
    "ParkedJournal",
    "check_sequence",
    "encode_event",
    "normalize_payload",
]

#: How many (through, reason) runs a journal remembers to explain its gaps.
#: Runs only multiply when TTL and acks alternate; past this the oldest merge.
_MAX_DROP_RUNS = 32

#: A journal's undo list while nothing was dropped since its snapshot.
_NOTHING_DROPPED: tuple[()] = ()


def check_sequence(sequence: object, *, strict: bool, what: str) -> int:
    """Validate a sequence argument's type; range checks stay with their callers.

    Strict: a non-negative ``int`` that is not a ``bool``. Lenient: any real
    number, as the seed's comparisons allowed.
    """
    if strict:
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise InvalidSequenceError(
                f"{what} sequence must be an int, got {type(sequence).__name__}"
            )
    elif not isinstance(sequence, numbers.Real) or math.isnan(sequence):
        raise InvalidSequenceError(
            f"{what} sequence must be a number, got {type(sequence).__name__}"
        )
    return sequence  # type: ignore[return-value]


class JournalEntry:
    """One recorded event. ``payload`` is read-only and includes ``server_event_seq``.

    Immutable. A journal's entry keeps the compact JSON it was measured by
    (``encoded``, ``encoded_bytes`` long) and rebuilds ``payload`` from it on
    each read, which costs a decode but halves what a retained event holds.
    A payload JSON would not give back exactly (a tuple, a non-str key a
    lenient journal took, a subclass of a JSON type) is kept as well, and
    an entry built from a payload alone (the seed's constructor) keeps it.
    """

    __slots__ = ("_kept", "created_monotonic", "encoded", "encoded_bytes", "sequence")

    sequence: int
    created_monotonic: float
    encoded_bytes: int
    encoded: bytes
    _kept: Mapping[str, object] | None

    def __init__(
        self,
        sequence: int,
        created_monotonic: float,
        encoded_bytes: int,
        payload: Mapping[str, object] | None = None,
        encoded: bytes = b"",
    ) -> None:
        if payload is None and not encoded:
            raise TypeError("a JournalEntry needs its payload or its encoded bytes")
        kept: Mapping[str, object] | None = None
        if payload is not None:
            kept = payload if type(payload) is MappingProxyType else MappingProxyType(dict(payload))
        setter = object.__setattr__
        setter(self, "sequence", sequence)
        setter(self, "created_monotonic", created_monotonic)
        setter(self, "encoded_bytes", encoded_bytes)
        setter(self, "encoded", encoded)
        setter(self, "_kept", kept)

    @property
    def payload(self) -> Mapping[str, object]:
        """The event as sent, ``server_event_seq`` included: a read-only mapping.

        Rebuilt from ``encoded`` on each read (unless the entry kept it).
        """
        kept = self._kept
        if kept is not None:
            return kept
        return MappingProxyType(_loads(self.encoded))

    def fresh_payload(self) -> dict[str, object]:
        """A new plain dict of the payload (what a replay puts on the wire)."""
        kept = self._kept
        if kept is not None:
            return dict(kept)
        rebuilt: dict[str, object] = _loads(self.encoded)
        return rebuilt

    def json_bytes(self) -> bytes:
        """The compact JSON the journal measured, without encoding again."""
        return self.encoded or _dumps(self.payload, allow_nan=True)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"JournalEntry is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"JournalEntry is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not JournalEntry:
            return NotImplemented
        return (
            self.sequence == other.sequence
            and self.created_monotonic == other.created_monotonic
            and self.encoded_bytes == other.encoded_bytes
            and dict(self.payload) == dict(other.payload)
        )

    def __hash__(self) -> int:
        return hash((self.sequence, self.created_monotonic, self.encoded_bytes))

    def __repr__(self) -> str:
        return (
            f"JournalEntry(sequence={self.sequence!r}, "
            f"created_monotonic={self.created_monotonic!r}, encoded_bytes={self.encoded_bytes!r})"
        )


#: ``tuple.__new__``: builds a named tuple from its fields in order, with no Python frame.
new_tuple = tuple.__new__


class JournalSnapshot(NamedTuple):
    """Everything `EventJournal.restore` needs; O(1) to take (a named tuple,
    as `StateSnapshot`: one is taken per command)."""

    length: int
    next_sequence: int
    dropped_through: int
    drop_runs: tuple[tuple[int, GapReason], ...]
    retained_bytes: int
    overflowed: bool


class ParkedJournal(TypedDict):
    """A journal as plain data, for a parked session: no clock, no callables.

    `EventJournal.park` makes one and `EventJournal.unpark` brings it back
    whole. A dict of keyword arguments, not an object of its own: a
    `actors._lifecycle.ParkedSession` keeps these as its own fields (one
    object less per parked session for each full garbage collection to walk).
    """

    entries: tuple[JournalEntry, ...]
    next_sequence: int
    dropped_through: int
    drop_runs: tuple[tuple[int, GapReason], ...]
    retained_bytes: int
    overflowed: bool
    #: Loaded from a store (taken over): see `EventJournal.store_loaded`.
    store_loaded: bool


_EMPTY_ENTRIES: tuple[JournalEntry, ...] = ()

#: The highest sequence a store_lost skip moves a journal to: the largest
#: integer a JSON client (JavaScript's numbers) and Redis's Lua (doubles) hold
#: exactly. Past it (or not an int: a lenient registry's float) a sequence
#: beyond the head stays `InvalidSequenceError`.
MAX_SKIP_SEQUENCE = 2**53 - 1


def _skippable(sequence: object) -> bool:
    return (
        isinstance(sequence, int)
        and not isinstance(sequence, bool)
        and sequence <= MAX_SKIP_SEQUENCE
    )


class EventJournal:
    """Sequenced, capped, expiring event log of one session."""

    def __init__(
        self,
        *,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] | None = None,
        max_events: int | None = None,
        strict: bool = False,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("journal max_bytes must be positive")
        if ttl_s <= 0:
            raise ValueError("journal ttl_s must be positive")
        if max_events is not None and max_events <= 0:
            raise ValueError("journal max_events must be positive")
        self._max_bytes = max_bytes
        self._max_events = max_events
        self._ttl_s = ttl_s
        self._clock = clock or time.monotonic
        self._strict = strict
        # Invariant: sequences in _entries are dense and ascending, all
        # > _dropped_through, and the last one is _next_sequence - 1.
        self._entries: deque[JournalEntry] = deque()
        # Invariant: >= 1; every sequence below it was issued exactly once.
        self._next_sequence = 1
        # Invariant: every sequence <= this is gone (acked, expired or never kept).
        self._dropped_through = 0
        # Invariant: (through, reason) runs, ascending; the last through is
        # _dropped_through when anything was dropped. Explains gap errors.
        # A tuple, replaced on change (rare): nothing to copy per snapshot, and
        # no list per session for the garbage collector to walk.
        self._drop_runs: tuple[tuple[int, GapReason], ...] = ()
        # Invariant: == sum(entry.encoded_bytes for entry in _entries) <= _max_bytes.
        self._retained_bytes = 0
        # Invariant: once True, stays True: an overflowed journal records nothing.
        self._overflowed = False
        # Entries dropped from the head since the last snapshot(), oldest
        # last, so restore() can put them back. None: no snapshot taken;
        # _NOTHING_DROPPED: none dropped since it (a list is made only then:
        # a snapshot is taken per command).
        self._undo: list[JournalEntry] | tuple[()] | None = None
        # Constant: see store_loaded.
        self._store_loaded = False

    # -- reading -----------------------------------------------------------

    @property
    def retained_bytes(self) -> int:
        """The ``encoded_bytes`` of every retained entry, summed (what the byte cap counts)."""
        return self._retained_bytes

    @property
    def overflowed(self) -> bool:
        """Whether the journal passed its cap: sticky, it records nothing more."""
        return self._overflowed

    @property
    def store_loaded(self) -> bool:
        """Whether this journal was loaded from a store (a session taken over).

        Its head is then only what the store kept: a store that lost its last
        writes (a replica promoted before they reached it) is behind sequences
        the previous owner issued, so a replay asked beyond the head is a
        `JournalGapError` with reason ``store_lost``, not the
        `InvalidSequenceError` a journal that never left this process answers.
        """
        return self._store_loaded

    @property
    def last_sequence(self) -> int:
        """The last sequence issued (0 before the first event)."""
        return self._next_sequence - 1

    @property
    def first_retained_sequence(self) -> int:
        """The oldest sequence still held, or ``last_sequence + 1`` when empty."""
        return self._entries[0].sequence if self._entries else self._next_sequence

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(last_sequence={self.last_sequence}, "
            f"retained={len(self._entries)}, retained_bytes={self._retained_bytes}, "
            f"overflowed={self._overflowed})"
        )

    # -- writing -----------------------------------------------------------

    def record(self, payload: Mapping[str, object]) -> JournalEntry:
        """Sequence, measure and keep one event; raise if a cap is hit."""
        return self.record_framed(payload)[0]

    def record_framed(
        self, payload: Mapping[str, object]
    ) -> tuple[JournalEntry, Mapping[str, object]]:
        """`record`, also handing back the sequenced payload (the live frame),
        so sending it live costs no decode."""
        # record_many((payload,)) without the batch's bookkeeping: the hot path.
        if self._overflowed:
            raise JournalOverflowError("duplex event journal already exceeded its byte limit")
        sequence = self._next_sequence
        sequenced, encoded, exact = self._stage(payload, sequence)
        now = self._clock()
        self.prune(now)
        size = len(encoded)
        self._admit(size, 1)
        entry = JournalEntry(sequence, now, size, None if exact else sequenced, encoded)  # type: ignore[arg-type]
        self._entries.append(entry)
        self._retained_bytes += size
        self._next_sequence = sequence + 1
        return entry, sequenced  # type: ignore[return-value]

    def record_many(self, payloads: Sequence[Mapping[str, object]]) -> tuple[JournalEntry, ...]:
        """Record a batch all or nothing: one bad payload or a cap records none.

        Hitting a cap still makes the journal overflowed, as a single
        `record` would: overflow is sticky and nothing is evicted.
        """
        return self.record_many_framed(payloads)[0]

    def record_many_framed(
        self, payloads: Sequence[Mapping[str, object]]
    ) -> tuple[tuple[JournalEntry, ...], tuple[Mapping[str, object], ...]]:
        """`record_many`, also handing back the sequenced payloads."""
        if self._overflowed:
            raise JournalOverflowError("duplex event journal already exceeded its byte limit")
        staged = [
            self._stage(payload, self._next_sequence + offset)
            for offset, payload in enumerate(payloads)
        ]
        now = self._clock()
        self.prune(now)
        size = sum(len(encoded) for _, encoded, _ in staged)
        self._admit(size, len(staged))
        entries = tuple(
            JournalEntry(
                self._next_sequence + offset,
                now,
                len(encoded),
                None if exact else sequenced,  # type: ignore[arg-type]
                encoded,
            )
            for offset, (sequenced, encoded, exact) in enumerate(staged)
        )
        self._entries.extend(entries)
        self._retained_bytes += size
        self._next_sequence += len(entries)
        return entries, tuple(sequenced for sequenced, _, _ in staged)  # type: ignore[misc]

    def _stage(
        self, payload: Mapping[str, object], sequence: int
    ) -> tuple[dict[object, object], bytes, bool]:
        """The sequenced copy of ``payload``, its bytes and whether they give it back
        exactly; or InvalidPayloadError."""
        sequenced = normalize_payload(payload, strict=self._strict)
        sequenced["server_event_seq"] = sequence
        return (sequenced, *_encode_checked(sequenced, strict=self._strict))

    def _admit(self, size: int, count: int) -> None:
        """Room for ``count`` more events of ``size`` bytes, or a sticky overflow."""
        if self._retained_bytes + size > self._max_bytes:
            self._overflowed = True
            raise JournalOverflowError(
                "duplex event journal byte limit exceeded: "
                f"{self._retained_bytes + size} > {self._max_bytes}"
            )
        held = len(self._entries) + count
        if self._max_events is not None and held > self._max_events:
            self._overflowed = True
            raise JournalOverflowError(
                f"duplex event journal event limit exceeded: {held} > {self._max_events}"
            )

    def acknowledge(self, sequence: int) -> int:
        """Drop every event up to ``sequence``; return how many were held."""
        sequence = check_sequence(sequence, strict=self._strict, what="acknowledged")
        if sequence < 0:
            raise InvalidSequenceError("acknowledged sequence must not be negative")
        if sequence > self.last_sequence:
            raise InvalidSequenceError(
                f"acknowledged sequence {sequence} is newer than journal head {self.last_sequence}"
            )
        removed = 0
        while self._entries and self._entries[0].sequence <= sequence:
            self._drop_head()
            removed += 1
        self._note_dropped(sequence, "acknowledged")
        return removed

    def prune(self, now: float | None = None) -> int:
        """Drop events older than the TTL; return how many."""
        effective_now = self._clock() if now is None else now
        cutoff = effective_now - self._ttl_s
        removed = 0
        while self._entries and self._entries[0].created_monotonic <= cutoff:
            entry = self._drop_head()
            self._note_dropped(entry.sequence, "ttl")
            removed += 1
        return removed

    def replay_after(self, sequence: int) -> tuple[JournalEntry, ...]:
        """Every retained event after ``sequence``, or a gap / range error."""
        sequence = check_sequence(sequence, strict=self._strict, what="replay")
        if sequence < 0:
            raise InvalidSequenceError("replay sequence must not be negative")
        self.prune()
        if self._overflowed:
            raise self._gap(
                "duplex event journal overflowed; replay is incomplete", sequence, "overflow"
            )
        if sequence < self._dropped_through:
            raise self._gap(
                f"requested sequence {sequence} is older than retained journal boundary "
                f"{self._dropped_through}",
                sequence,
                self._reason_for(sequence + 1),
            )
        if sequence > self.last_sequence:
            if self._store_loaded and _skippable(sequence):
                raise self._skip_lost(sequence)
            raise InvalidSequenceError(
                f"requested sequence {sequence} is newer than journal head {self.last_sequence}"
            )
        # Sequences are dense, so the first wanted entry's index is arithmetic.
        skip = max(0, int(sequence) + 1 - self.first_retained_sequence)
        return tuple(itertools.islice(self._entries, skip, None))

    def entries_after(self, sequence: int) -> tuple[JournalEntry, ...]:
        """The retained entries above ``sequence`` (no pruning, no checks): a
        store's appends since its last write."""
        if not self._entries or self._entries[-1].sequence <= sequence:
            return _EMPTY_ENTRIES
        # From the newest end: a commit's appends are few, the retained many.
        newer: list[JournalEntry] = []
        for entry in reversed(self._entries):
            if entry.sequence <= sequence:
                break
            newer.append(entry)
        newer.reverse()
        return tuple(newer)

    def counters(self) -> tuple[int, int, tuple[tuple[int, GapReason], ...], bool]:
        """``(next_sequence, dropped_through, drop_runs, overflowed)``."""
        return (
            self._next_sequence,
            self._dropped_through,
            self._drop_runs,
            self._overflowed,
        )

    # -- parking -------------------------------------------------------------

    def park(self) -> ParkedJournal:
        """Everything this journal holds, as plain data (see `ParkedJournal`)."""
        return {
            "entries": tuple(self._entries) if self._entries else _EMPTY_ENTRIES,
            "next_sequence": self._next_sequence,
            "dropped_through": self._dropped_through,
            "drop_runs": self._drop_runs,
            "retained_bytes": self._retained_bytes,
            "overflowed": self._overflowed,
            "store_loaded": self._store_loaded,
        }

    @classmethod
    def unpark(
        cls,
        parked: ParkedJournal,
        *,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] | None = None,
        max_events: int | None = None,
        strict: bool = False,
    ) -> EventJournal:
        """The journal ``parked`` was taken from, with these limits and clock."""
        journal = cls(
            max_bytes=max_bytes, ttl_s=ttl_s, clock=clock, max_events=max_events, strict=strict
        )
        journal._entries.extend(parked["entries"])
        journal._next_sequence = parked["next_sequence"]
        journal._dropped_through = parked["dropped_through"]
        journal._drop_runs = tuple(parked["drop_runs"])
        journal._retained_bytes = parked["retained_bytes"]
        journal._overflowed = parked["overflowed"]
        journal._store_loaded = parked["store_loaded"]
        return journal

    # -- transactions --------------------------------------------------------

    def snapshot(self) -> JournalSnapshot:
        """Mark a point `restore` can return to. Only the latest one counts."""
        self._undo = _NOTHING_DROPPED
        # Positional, through tuple's own constructor: a named tuple's
        # generated ``__new__`` with keywords cost ~3x as much (one per command).
        return new_tuple(
            JournalSnapshot,
            (
                len(self._entries),
                self._next_sequence,
                self._dropped_through,
                self._drop_runs,
                self._retained_bytes,
                self._overflowed,
            ),
        )

    def restore(self, snapshot: JournalSnapshot) -> None:
        """Undo everything since ``snapshot`` (which must be the latest taken)."""
        if self._undo is None:
            raise RuntimeError("restore() without a snapshot()")
        # Entries recorded since the snapshot may have been dropped again
        # since (recorded, then acknowledged): remove only those still held,
        # and put back only the dropped entries the snapshot held.
        while self._entries and self._entries[-1].sequence >= snapshot.next_sequence:
            self._entries.pop()
        undo = self._undo
        while isinstance(undo, list) and undo:
            entry = undo.pop()
            if entry.sequence < snapshot.next_sequence:
                self._entries.appendleft(entry)
        self._next_sequence = snapshot.next_sequence
        self._dropped_through = snapshot.dropped_through
        self._drop_runs = snapshot.drop_runs
        self._retained_bytes = snapshot.retained_bytes
        self._overflowed = snapshot.overflowed

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the fields disagree (O(n): for restarts and tests)."""
        expected = self._dropped_through + 1
        if self._entries:
            expected = self._entries[0].sequence
            if expected <= self._dropped_through:
                raise AssertionError("a retained entry is at or below the dropped boundary")
        for offset, entry in enumerate(self._entries):
            if entry.sequence != expected + offset:
                raise AssertionError("journal sequences are not dense")
        if self._entries and self._entries[-1].sequence != self.last_sequence:
            raise AssertionError("journal head does not match the last entry")
        if sum(e.encoded_bytes for e in self._entries) != self._retained_bytes:
            raise AssertionError("retained_bytes disagrees with the entries")
        if self._retained_bytes > self._max_bytes:
            raise AssertionError("retained_bytes exceeds max_bytes")
        if self._dropped_through > self.last_sequence:
            raise AssertionError("dropped boundary is past the head")

    # -- internals -----------------------------------------------------------

    def _drop_head(self) -> JournalEntry:
        entry = self._entries.popleft()
        self._retained_bytes -= entry.encoded_bytes
        undo = self._undo
        if isinstance(undo, list):
            undo.append(entry)
        elif undo is not None:  # _NOTHING_DROPPED: the first since the snapshot
            self._undo = [entry]
        return entry

    def _note_dropped(self, through: int, reason: GapReason) -> None:
        if through <= self._dropped_through:
            return
        self._dropped_through = through
        runs = self._drop_runs
        if runs and runs[-1][1] == reason:
            self._drop_runs = (*runs[:-1], (through, reason))
        else:
            self._drop_runs = (*runs, (through, reason))[-_MAX_DROP_RUNS:]

    def _skip_lost(self, sequence: int) -> JournalGapError:
        """The gap of a client beyond a store-loaded head; the journal moves past it.

        The client holds events up to ``sequence`` that the store lost, under
        sequences this session would issue again to other events: the client
        would drop those as duplicates, or keep two contents under one
        sequence. So the lost sequences are skipped for good: everything
        retained is dropped too (the journal holds one dense run above its
        dropped boundary, and this client has all of it), the boundary moves
        to ``sequence`` (reason ``store_lost``) and the next event issued is
        ``sequence + 1``. The gap reports the journal as it was found. A
        domain error keeps its changes (`SessionState.handle`): the skip
        reaches the store with the session's next commit, before any event
        past it is released; a process that dies first leaves the store as
        it was, and the next owner skips again.
        """
        gap = self._gap(
            f"requested sequence {sequence} is beyond journal head {self.last_sequence}: "
            "the session store lost the events after it",
            sequence,
            "store_lost",
        )
        while self._entries:
            self._drop_head()
        self._next_sequence = sequence + 1
        self._note_dropped(sequence, "store_lost")
        return gap

    def _reason_for(self, sequence: float) -> GapReason:
        for through, reason in self._drop_runs:
            if sequence <= through:
                return reason
        return self._drop_runs[-1][1] if self._drop_runs else "acknowledged"

    def _gap(self, message: str, sequence: int, reason: GapReason) -> JournalGapError:
        return JournalGapError(
            message,
            requested=sequence,
            first_retained=self.first_retained_sequence,
            head=self.last_sequence,
            reason=reason,
        )
