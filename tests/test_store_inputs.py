"""Inputs across processes: the store says whether a process answers an input.

On MemoryStore and on RedisStore against a real redis-server (the ``store``
fixture of test_redis_store). A commit that journals an answer's end
(``response.done`` with the input's id) marks the input answered in the same
write, so the process a client resumes on never answers it twice; an input a
killed or replaced process claimed but never finished is answered again.
"""

from __future__ import annotations

import json

import pytest

from actors._store import (
    Commit,
    SessionStore,
    StoredEvent,
    identity_fingerprint,
    input_key,
    settled_input,
)
from actors._store_binding import StoreBinding
from tests.test_redis_store import record, store

__all__ = ["store"]  # the fixture, from test_redis_store


def done(sequence: int, client_event_id: str) -> StoredEvent:
    encoded = json.dumps(
        {"type": "response.done", "client_event_id": client_event_id, "server_event_seq": sequence}
    ).encode()
    return StoredEvent(
        sequence=sequence, created_at=1000.0, encoded_bytes=len(encoded), encoded=encoded
    )


def answer_end(*, epoch: int, client_event_id: str) -> Commit:
    """The commit journaling an answer's end (sequence 1): it settles the input."""
    return Commit(
        session_id="s",
        epoch=epoch,
        record=record(next_sequence=2),
        appends=(done(1, client_event_id),),
        settles=(input_key(client_event_id),),
    )


def test_an_input_claimed_again_by_its_claimant_is_still_its(store: SessionStore) -> None:
    store.create("s", record())
    key = input_key("c1-1")
    assert store.claim_input("s", "process-a", key) is True
    # A claim tried again (its reply lost) answers as the first try did.
    assert store.claim_input("s", "process-a", key) is True
    assert store.claim_input("s", "process-a", input_key("c1-2")) is True


def test_an_input_another_process_never_finished_is_answered_again(
    store: SessionStore,
) -> None:
    store.create("s", record())
    key = input_key("c1-1")
    assert store.claim_input("s", "process-a", key) is True
    # process-a died (or was taken over) before journaling the answer's end.
    assert store.claim_input("s", "process-b", key) is True
    assert store.claim_input("s", "process-a", key) is True  # and back


def test_an_input_whose_answer_was_journaled_is_answered_nowhere_else(
    store: SessionStore,
) -> None:
    store.create("s", record())
    key = input_key("c1-1")
    assert store.claim_input("s", "process-a", key) is True
    store.commit(answer_end(epoch=1, client_event_id="c1-1"))
    assert store.claim_input("s", "process-b", key) is False
    assert store.claim_input("s", "process-a", key) is False


def test_a_refused_commit_marks_no_input_answered(store: SessionStore) -> None:
    store.create("s", record())
    key = input_key("c1-1")
    store.claim_input("s", "process-a", key)
    taken = store.acquire("s", record().token_digest)
    assert taken is not None and taken.epoch == 2
    with pytest.raises(KeyError):  # SessionReplacedError: the stale owner's write
        store.commit(answer_end(epoch=1, client_event_id="c1-1"))
    assert store.claim_input("s", "process-b", key) is True


def test_inputs_of_an_unknown_or_deleted_session(store: SessionStore) -> None:
    assert store.claim_input("nope", "process-a", input_key("x")) is None
    store.create("s", record())
    store.claim_input("s", "process-a", input_key("x"))
    store.delete("s", 1)
    assert store.claim_input("s", "process-a", input_key("x")) is None
    store.create("s", record())  # a new session of the same id starts with no inputs
    assert store.claim_input("s", "process-a", input_key("x")) is True


def test_only_a_response_done_with_an_id_settles_an_input() -> None:
    assert settled_input(b'{"type":"response.done","client_event_id":"c1-1"}') == input_key("c1-1")
    assert settled_input(b'{"type":"response.output_text.delta","delta":"x"}') is None
    assert settled_input(b'{"type":"response.done"}') is None
    assert settled_input(b'{"type":"x","note":"response.done"}') is None
    assert settled_input(b'["response.done"]') is None
    assert input_key("a") != input_key("b")
    assert len(input_key("a" * 10_000)) == 32


class _State:
    def __init__(self, entries: tuple[object, ...], next_sequence: int) -> None:
        self.entries = entries
        self.next_sequence = next_sequence

    def store_record(self, wall_offset: float) -> object:
        return record(next_sequence=self.next_sequence)

    def entries_after(self, sequence: int) -> tuple[object, ...]:
        return self.entries


def test_the_binding_marks_the_inputs_its_commit_answers(store: SessionStore) -> None:
    from actors._journal import JournalEntry

    store.create("s", record())
    key = input_key("c1-7")
    store.claim_input("s", "process-a", key)
    delta = b'{"type":"response.output_text.delta","delta":"hi"}'
    end = b'{"type":"response.done","client_event_id":"c1-7"}'
    entries = (
        JournalEntry(1, 1.0, len(delta), encoded=delta),
        JournalEntry(2, 1.0, len(end), encoded=end),
    )
    binding = StoreBinding(store=store, session_id="s", epoch=1, record=record(), clock=lambda: 1.0)
    binding.commit(_State(entries, 3))  # type: ignore[arg-type]
    assert store.claim_input("s", "process-b", key) is False
    loaded = store.load("s")
    assert loaded is not None and [e.sequence for e in loaded.events] == [1, 2]


def test_the_identity_that_opened_a_session_is_kept_for_other_processes(
    store: SessionStore,
) -> None:
    assert store.bound_identity("s") is None
    store.bind_identity("s", "ignored: no such session")
    assert store.bound_identity("s") is None
    store.create("s", record())
    assert store.bound_identity("s") is None
    fingerprint = identity_fingerprint({"user": "alice", "org": 7})
    assert fingerprint is not None
    store.bind_identity("s", fingerprint)
    assert store.bound_identity("s") == fingerprint
    taken = store.acquire("s", record().token_digest)  # kept through a takeover
    assert taken is not None and taken.record == record()
    assert store.bound_identity("s") == fingerprint
    store.delete("s", taken.epoch)
    assert store.bound_identity("s") is None


def test_an_identity_fingerprint_is_the_same_in_every_process() -> None:
    assert identity_fingerprint({"org": 7, "user": "alice"}) == identity_fingerprint(
        {"user": "alice", "org": 7}
    )
    assert identity_fingerprint("alice") != identity_fingerprint("bob")
    assert identity_fingerprint("bearer") is not None
    assert identity_fingerprint(None) is None
    assert identity_fingerprint(object()) is None  # not plain data: this process only
    assert identity_fingerprint(float("nan")) is None
