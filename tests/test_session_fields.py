"""A session's fields are one record: every path that copies them copies all.

Each test enumerates `SessionFields` with `dataclasses.fields`, so a field
added to the record that one path (park, unpark, snapshot, restore, the
store record, the Redis hash, the commit's change check) forgets fails here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from actors._commands import ReleaseAttachment, Resume
from actors._credential import token_digest
from actors._fields import FIELD_NAMES, SessionFields, field_values
from actors._journal import ParkedJournal
from actors._lifecycle import ParkedSession
from actors._state import SessionState
from actors._store import SessionRecord, StoredSession, parked_from_store
from actors._store_binding import same_fields
from supervisor.stores._redis_codec import record_fields as redis_hash
from supervisor.stores._redis_codec import session_record as from_redis_hash
from tests.helpers import FakeClock, config, wire_close, wire_send

#: A value for every field, none of them what a new session starts with (so a
#: path that drops a field shows it). A new field needs one here first.
SAMPLES: dict[str, Any] = {
    "token_digest": token_digest("current"),
    "recovery_token_digest": token_digest("recovery"),
    "attachment_generation": 7,
    "lease_generation": 5,
    "orphaned_lease_generation": 6,
    "last_resume": (7, token_digest("accepted")),
    "detached_at": 100.0,
}

#: Another value for every field, different from its sample.
OTHERS: dict[str, Any] = {
    "token_digest": token_digest("rotated"),
    "recovery_token_digest": None,
    "attachment_generation": 8,
    "lease_generation": 9,
    "orphaned_lease_generation": None,
    "last_resume": None,
    "detached_at": None,
}

#: Exactly representable, so wall-clock conversions round-trip exactly.
WALL_OFFSET = 1_000_000.0


def test_the_samples_name_every_field() -> None:
    names = [f.name for f in dataclasses.fields(SessionFields)]
    assert names == list(FIELD_NAMES)
    assert set(SAMPLES) == set(names) == set(OTHERS)
    assert all(SAMPLES[name] != OTHERS[name] for name in names)


def _parked() -> ParkedSession:
    journal = ParkedJournal(
        entries=(),
        next_sequence=4,
        dropped_through=3,
        drop_runs=((3, "acknowledged"),),
        retained_bytes=0,
        overflowed=False,
        store_loaded=False,
    )
    return ParkedSession(session_id="s1", **journal, **SAMPLES)


def _unparked(clock: FakeClock) -> SessionState:
    state = SessionState.unpark(_parked(), config=config(), clock=clock)
    state.check_invariants()
    return state


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_park_and_unpark_keep_every_field(name: str) -> None:
    state = _unparked(FakeClock())
    assert getattr(state.park(), name) == SAMPLES[name]
    assert field_values(state.park()) == SAMPLES


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_a_snapshot_and_its_restore_keep_every_field(name: str) -> None:
    state = _unparked(FakeClock())
    resume = Resume(
        resume_token="recovery",
        last_received_server_event_seq=3,
        send=wire_send,
        close=wire_close,
        lease_generation=8,
    )
    assert state.handle(resume).error is None
    # The resume moved every sample field (undo restores the snapshot it took) ...
    assert getattr(state.store_record(0.0), name) != SAMPLES[name]
    state.undo()
    state.check_invariants()
    # ... and the restore brought each back.
    state.handle(ReleaseAttachment())  # detached already: changes nothing
    assert getattr(state.park(), name) == SAMPLES[name]
    assert field_values(state.park()) == SAMPLES


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_the_store_record_and_the_redis_hash_keep_every_field(name: str) -> None:
    state = _unparked(FakeClock())
    record = state.store_record(WALL_OFFSET)
    expected = SAMPLES[name]
    if name == "detached_at":
        expected += WALL_OFFSET  # a record's times are wall clock
    assert getattr(record, name) == expected
    flat = redis_hash(record)
    stored_hash = {
        str(key).encode(): value if isinstance(value, bytes) else value.encode()
        for key, value in zip(flat[::2], flat[1::2], strict=True)
    }
    loaded = from_redis_hash(stored_hash)
    assert loaded == record
    stored = StoredSession(session_id="s1", epoch=1, record=loaded, events=())
    back = parked_from_store(stored, WALL_OFFSET)
    assert getattr(back, name) == SAMPLES[name]
    assert field_values(back) == SAMPLES


@pytest.mark.parametrize("name", FIELD_NAMES)
def test_a_change_to_any_field_is_written(name: str) -> None:
    record = _unparked(FakeClock()).store_record(WALL_OFFSET)
    changed: SessionRecord = dataclasses.replace(record, **{name: OTHERS[name]})
    assert not same_fields(changed, record)
    # detached_at moves with the wall offset: only whether it is set counts.
    moved = dataclasses.replace(record, detached_at=record.detached_at + 1.0)  # type: ignore[operator]
    assert same_fields(moved, record)
