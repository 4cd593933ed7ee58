"""EventJournal: every behaviour of the seed's DuplexEventJournal.

What the journal adds beyond the seed is in ``test_journal_beyond_seed.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from actors._errors import (
    InvalidSequenceError,
    JournalGapError,
    JournalOverflowError,
    SessionError,
)
from actors._journal import EventJournal
from tests.helpers import FakeClock, make_journal, sequences

# -- the seed's behaviour ---------------------------------------------------------


def test_sequences_start_at_one_and_increase_by_one() -> None:
    journal = make_journal()
    assert journal.last_sequence == 0
    assert [journal.record({"n": n}).sequence for n in range(3)] == [1, 2, 3]
    assert journal.last_sequence == 3


def test_record_stamps_server_event_seq_without_touching_the_callers_payload() -> None:
    journal = make_journal()
    payload = {"type": "delta", "server_event_seq": 99}
    journal.record({"a": 1})
    entry = journal.record(payload)
    assert dict(entry.payload) == {"type": "delta", "server_event_seq": 2}
    assert payload == {"type": "delta", "server_event_seq": 99}


def test_entry_payload_is_a_read_only_copy_hidden_from_repr() -> None:
    payload: dict[str, object] = {"text": "do-not-print"}
    entry = make_journal().record(payload)
    payload["text"] = "changed"
    assert entry.payload["text"] == "do-not-print"
    with pytest.raises(TypeError):
        entry.payload["text"] = "x"  # type: ignore[index]
    assert "do-not-print" not in repr(entry)


def test_byte_cost_is_compact_utf8_json_length_including_non_ascii() -> None:
    entry = make_journal().record({"t": "é"})
    expected = '{"t":"é","server_event_seq":1}'.encode()
    assert entry.encoded_bytes == len(expected) == 31
    assert entry.json_bytes() == expected


def test_retained_bytes_sums_entries_and_shrinks_on_ack() -> None:
    journal = make_journal()
    first = journal.record({"k": "日本"})
    second = journal.record({"k": "x"})
    assert first.encoded_bytes == 35
    assert journal.retained_bytes == first.encoded_bytes + second.encoded_bytes
    journal.acknowledge(1)
    assert journal.retained_bytes == second.encoded_bytes


def test_acknowledge_returns_how_many_entries_it_dropped() -> None:
    journal = make_journal()
    for n in range(4):
        journal.record({"n": n})
    assert journal.acknowledge(0) == 0
    assert journal.acknowledge(2) == 2
    assert journal.acknowledge(2) == 0
    assert journal.acknowledge(4) == 2
    assert journal.replay_after(4) == ()


def overflow(journal: EventJournal) -> EventJournal:
    """Three 22-byte events then one that cannot fit the 100-byte cap."""
    with pytest.raises(JournalOverflowError):
        journal.record({"a": "y" * 20})
    return journal


# Every error the seed's journal raised, with its exact message, after three
# events ({} costs 22 bytes) in a journal capped at 100 bytes.
SEED_ERRORS: dict[str, tuple[Callable[[EventJournal], object], type[Exception], str]] = {
    "ack-negative": (
        lambda j: j.acknowledge(-1),
        InvalidSequenceError,
        "acknowledged sequence must not be negative",
    ),
    "ack-newer-than-head": (
        lambda j: j.acknowledge(4),
        InvalidSequenceError,
        "acknowledged sequence 4 is newer than journal head 3",
    ),
    "replay-negative": (
        lambda j: j.replay_after(-1),
        InvalidSequenceError,
        "replay sequence must not be negative",
    ),
    "replay-newer-than-head": (
        lambda j: j.replay_after(4),
        InvalidSequenceError,
        "requested sequence 4 is newer than journal head 3",
    ),
    "replay-older-than-boundary": (
        lambda j: (j.acknowledge(2), j.replay_after(1)),
        JournalGapError,
        "requested sequence 1 is older than retained journal boundary 2",
    ),
    "overflow": (
        lambda j: j.record({"a": "y" * 20}),
        JournalOverflowError,
        "duplex event journal byte limit exceeded: 115 > 100",
    ),
    "record-after-overflow": (
        lambda j: overflow(j).record({}),
        JournalOverflowError,
        "duplex event journal already exceeded its byte limit",
    ),
    "replay-after-overflow": (
        lambda j: overflow(j).replay_after(3),
        JournalGapError,
        "duplex event journal overflowed; replay is incomplete",
    ),
}


@pytest.mark.parametrize("case", SEED_ERRORS)
def test_errors_keep_the_seeds_type_and_exact_message(case: str) -> None:
    action, error_type, message = SEED_ERRORS[case]
    journal = make_journal(max_bytes=100)
    for _ in range(3):
        journal.record({})
    with pytest.raises(error_type) as info:
        action(journal)
    assert str(info.value) == message
    seed_base = RuntimeError if error_type is not InvalidSequenceError else ValueError
    assert isinstance(info.value, seed_base)
    assert isinstance(info.value, SessionError)
    assert journal.last_sequence == 3


def test_replay_after_returns_entries_strictly_after_the_sequence() -> None:
    journal = make_journal()
    for n in range(5):
        journal.record({"n": n})
    assert sequences(journal.replay_after(2)) == [3, 4, 5]
    assert sequences(journal.replay_after(0)) == [1, 2, 3, 4, 5]
    assert journal.replay_after(5) == ()
    assert make_journal().replay_after(0) == ()


def test_replay_at_exactly_the_acknowledged_boundary_is_complete() -> None:
    journal = make_journal()
    for n in range(3):
        journal.record({"n": n})
    journal.acknowledge(2)
    assert sequences(journal.replay_after(2)) == [3]


def test_overflow_does_not_consume_a_sequence_and_never_evicts() -> None:
    journal = make_journal(max_bytes=60)
    first = journal.record({"a": "x"})
    assert first.encoded_bytes == 30
    with pytest.raises(JournalOverflowError, match="79 > 60"):
        journal.record({"a": "y" * 20})  # 49 bytes as event 2
    assert journal.overflowed
    assert journal.last_sequence == 1
    assert len(journal) == 1
    assert journal.retained_bytes == first.encoded_bytes


def test_overflow_is_sticky_even_after_acknowledging_everything() -> None:
    journal = make_journal(max_bytes=60)
    journal.record({"a": "x"})
    with pytest.raises(JournalOverflowError):
        journal.record({"a": "y" * 40})
    journal.acknowledge(1)
    assert journal.retained_bytes == 0
    with pytest.raises(JournalOverflowError, match="already exceeded"):
        journal.record({})
    assert journal.overflowed
    assert journal.last_sequence == 1


def test_record_exactly_at_the_byte_limit_is_accepted() -> None:
    journal = make_journal(max_bytes=22)  # '{"server_event_seq":1}' is 22 bytes
    assert journal.record({}).encoded_bytes == 22
    assert not journal.overflowed


def test_prune_drops_entries_at_exactly_the_ttl_cutoff() -> None:
    clock = FakeClock(100.0)
    journal = make_journal(clock, ttl_s=10.0)
    journal.record({"n": 1})
    clock.now = 105.0
    journal.record({"n": 2})
    assert journal.prune(now=109.999) == 0
    assert journal.prune(now=110.0) == 1  # created 100 <= cutoff 100
    assert sequences(journal.replay_after(1)) == [2]


def test_prune_without_now_uses_the_injected_clock() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0)
    journal.record({})
    clock.now = 4.0
    assert journal.prune() == 0
    clock.now = 5.0
    assert journal.prune() == 1
    assert journal.retained_bytes == 0


def test_record_prunes_expired_entries_before_measuring_the_cap() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0, max_bytes=50)
    journal.record({"a": "x" * 10})  # 37 bytes
    clock.now = 5.0
    entry = journal.record({"a": "x" * 10})  # fits only because the first expired
    assert entry.sequence == 2
    assert entry.created_monotonic == 5.0
    assert not journal.overflowed


def test_replay_prunes_first_so_an_expired_entry_is_a_gap() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0)
    journal.record({})
    journal.record({})
    clock.now = 5.0
    with pytest.raises(JournalGapError, match="older than retained journal boundary 2"):
        journal.replay_after(0)
    assert journal.replay_after(2) == ()


def test_default_clock_is_monotonic() -> None:
    journal = EventJournal(max_bytes=1000, ttl_s=10.0)
    before = time.monotonic()
    entry = journal.record({})
    assert before <= entry.created_monotonic <= time.monotonic()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_bytes": 0, "ttl_s": 1.0}, "journal max_bytes must be positive"),
        ({"max_bytes": -5, "ttl_s": 1.0}, "journal max_bytes must be positive"),
        ({"max_bytes": 1, "ttl_s": 0.0}, "journal ttl_s must be positive"),
        ({"max_bytes": 1, "ttl_s": -1.0}, "journal ttl_s must be positive"),
        ({"max_bytes": 1, "ttl_s": 1.0, "max_events": 0}, "journal max_events must be positive"),
    ],
)
def test_constructor_rejects_non_positive_limits(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        EventJournal(**kwargs)
    assert str(info.value) == message
