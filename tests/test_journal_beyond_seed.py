"""EventJournal beyond the seed: count cap, typed gaps, json_bytes, batches, strict mode, undo."""

from __future__ import annotations

import gc
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import _journal as journal_module
from actors._errors import (
    InvalidPayloadError,
    InvalidSequenceError,
    JournalGapError,
    JournalOverflowError,
    SessionError,
)
from actors._journal import EventJournal, JournalEntry
from tests.helpers import FakeClock, make_journal, sequences


def test_max_events_caps_the_count_and_overflows_stickily() -> None:
    journal = make_journal(max_events=2)
    journal.record({})
    journal.record({})
    with pytest.raises(JournalOverflowError, match="event limit exceeded: 3 > 2"):
        journal.record({})
    assert journal.overflowed
    assert journal.last_sequence == 2
    journal.acknowledge(2)
    with pytest.raises(JournalOverflowError):
        journal.record({})


def test_gap_error_reports_ttl_reason_and_boundaries() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0)
    for _ in range(3):
        journal.record({})
    clock.now = 5.0
    journal.record({})
    with pytest.raises(JournalGapError) as info:
        journal.replay_after(1)
    gap = info.value
    assert (gap.requested, gap.first_retained, gap.head, gap.reason) == (1, 4, 4, "ttl")
    assert isinstance(gap, SessionError)


def test_gap_error_reports_acknowledged_reason() -> None:
    journal = make_journal()
    for _ in range(3):
        journal.record({})
    journal.acknowledge(3)
    with pytest.raises(JournalGapError) as info:
        journal.replay_after(0)
    gap = info.value
    assert (gap.requested, gap.first_retained, gap.head, gap.reason) == (0, 4, 3, "acknowledged")


def test_gap_error_reports_overflow_reason() -> None:
    journal = make_journal(max_bytes=30)
    journal.record({})
    with pytest.raises(JournalOverflowError):
        journal.record({"a": "b" * 20})
    with pytest.raises(JournalGapError) as info:
        journal.replay_after(1)
    assert info.value.reason == "overflow"
    assert (info.value.first_retained, info.value.head) == (1, 1)


def test_gap_reason_names_what_dropped_the_first_missing_event() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0)
    journal.record({})  # 1, expires
    clock.now = 3.0
    journal.record({})  # 2, acknowledged
    journal.record({})  # 3
    clock.now = 5.0
    journal.prune()
    journal.acknowledge(2)
    for requested, reason in ((0, "ttl"), (1, "acknowledged")):
        with pytest.raises(JournalGapError) as info:
            journal.replay_after(requested)
        assert info.value.reason == reason


def test_json_bytes_is_the_measured_encoding_without_encoding_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = make_journal().record({"text": "héllo", "n": [1, 2.5, None]})
    expected = '{"text":"héllo","n":[1,2.5,null],"server_event_seq":1}'.encode()

    def no_encoding(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("json_bytes encoded the payload again")

    monkeypatch.setattr(journal_module, "_dumps", no_encoding)
    assert entry.json_bytes() == expected
    assert len(entry.json_bytes()) == entry.encoded_bytes
    assert json.loads(entry.json_bytes()) == dict(entry.payload)


def test_record_many_assigns_consecutive_sequences_at_one_time() -> None:
    clock = FakeClock(7.0)
    journal = make_journal(clock)
    journal.record({})
    entries = journal.record_many([{"a": 1}, {"b": 2}, {"c": 3}])
    assert sequences(entries) == [2, 3, 4]
    assert {entry.created_monotonic for entry in entries} == {7.0}
    assert [entry.payload["server_event_seq"] for entry in entries] == [2, 3, 4]


def test_record_many_with_one_invalid_payload_records_nothing() -> None:
    journal = make_journal(strict=True)
    journal.record({})
    with pytest.raises(InvalidPayloadError):
        journal.record_many([{"ok": 1}, {"bad": math.nan}, {"ok": 2}])
    assert journal.last_sequence == 1
    assert len(journal) == 1
    assert journal.record({}).sequence == 2


@pytest.mark.parametrize(("max_bytes", "max_events"), [(100, None), (10_000, 3)])
def test_record_many_over_a_cap_records_nothing_and_overflows(
    max_bytes: int, max_events: int | None
) -> None:
    journal = make_journal(max_bytes=max_bytes, max_events=max_events)
    journal.record({})
    with pytest.raises(JournalOverflowError):
        journal.record_many([{"a": "x" * 20}, {"a": "y" * 20}, {"a": "z" * 20}])
    assert journal.last_sequence == 1
    assert len(journal) == 1
    assert journal.overflowed


@pytest.mark.parametrize(
    "payload",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": -math.inf},
        {1: "int key"},
        {"nested": {2: "int key"}},
        {"nested": [{"deep": {None: 1}}]},
        [("a", 1)],
        {"x": {1, 2}},
        "not a mapping",
    ],
    ids=["nan", "inf", "-inf", "int-key", "nested-int-key", "deep-none-key", "pairs", "set", "str"],
)
def test_strict_rejects_non_json_payloads_without_consuming_a_sequence(payload: Any) -> None:
    journal = make_journal(strict=True)
    journal.record({})
    before = journal.retained_bytes
    with pytest.raises(InvalidPayloadError) as info:
        journal.record(payload)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert journal.last_sequence == 1
    assert journal.retained_bytes == before
    assert not journal.overflowed
    assert journal.record({}).sequence == 2


@pytest.mark.parametrize("sequence", [True, False, "1", 1.0, None])
def test_strict_rejects_non_int_sequences_for_ack_and_replay(sequence: Any) -> None:
    journal = make_journal(strict=True)
    journal.record({})
    with pytest.raises(InvalidSequenceError):
        journal.acknowledge(sequence)
    with pytest.raises(InvalidSequenceError):
        journal.replay_after(sequence)
    assert len(journal) == 1
    assert journal.record({}).sequence == 2


@pytest.mark.parametrize(
    ("payload", "encoded"),
    [
        ({"x": math.nan}, b'{"x":NaN,"server_event_seq":1}'),
        ({1: "one"}, b'{"1":"one","server_event_seq":1}'),
        ([("a", 1), ("b", 2)], b'{"a":1,"b":2,"server_event_seq":1}'),
    ],
    ids=["nan", "int-key", "pairs"],
)
def test_lenient_records_what_the_seed_recorded(payload: Any, encoded: bytes) -> None:
    journal = make_journal()
    assert journal.record(payload).json_bytes() == encoded
    assert journal.acknowledge(True) == 1  # bool sequences too


def test_first_retained_sequence_is_head_plus_one_when_empty() -> None:
    journal = make_journal()
    assert journal.first_retained_sequence == 1
    journal.record({})
    journal.record({})
    assert journal.first_retained_sequence == 1
    journal.acknowledge(2)
    assert journal.first_retained_sequence == 3


def _observe(journal: EventJournal) -> tuple[object, ...]:
    entries = journal.replay_after(journal.first_retained_sequence - 1)
    return (
        journal.last_sequence,
        journal.retained_bytes,
        journal.overflowed,
        [(e.sequence, dict(e.payload)) for e in entries],
    )


def test_restore_undoes_records_acks_and_prunes() -> None:
    clock = FakeClock(0.0)
    journal = make_journal(clock, ttl_s=5.0)
    for n in range(4):
        journal.record({"n": n})
    clock.now = 2.0
    journal.record({"n": 4})
    before = _observe(journal)
    snap = journal.snapshot()
    journal.acknowledge(2)
    clock.now = 5.0
    journal.record({"n": 5})  # prunes 3 and 4 by TTL first
    journal.restore(snap)
    clock.now = 2.0
    assert _observe(journal) == before
    journal.check_invariants()


def test_restore_undoes_an_entry_recorded_and_then_dropped() -> None:
    journal = make_journal()
    journal.record({"n": 1})
    before = _observe(journal)
    snap = journal.snapshot()
    journal.record({"n": 2})
    journal.acknowledge(2)
    journal.restore(snap)
    journal.check_invariants()
    assert _observe(journal) == before


def test_restore_without_a_snapshot_is_refused() -> None:
    journal = make_journal()
    other = make_journal()
    with pytest.raises(RuntimeError, match="without a snapshot"):
        journal.restore(other.snapshot())


def test_check_invariants_detects_corrupted_byte_count() -> None:
    journal = make_journal()
    journal.record({})
    journal.check_invariants()
    journal._retained_bytes += 1
    with pytest.raises(AssertionError, match="retained_bytes"):
        journal.check_invariants()


# -- what a retained event keeps -------------------------------------------------


def test_a_retained_event_keeps_its_bytes_not_its_dict() -> None:
    journal = make_journal()
    entry = journal.record({"type": "text.delta", "text": "héllo"})
    held = gc.get_referents(entry)
    assert not any(isinstance(x, dict) for x in held)
    assert entry.encoded in held
    assert entry.encoded_bytes == len(entry.encoded)
    # The payload is rebuilt from the bytes, fresh each time, read-only.
    assert dict(entry.payload) == {"type": "text.delta", "text": "héllo", "server_event_seq": 1}
    first, second = entry.fresh_payload(), entry.fresh_payload()
    assert first == second and first is not second
    with pytest.raises(TypeError):
        entry.payload["text"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        entry.sequence = 2


def test_payloads_json_would_change_are_kept_exactly() -> None:
    class Tag(str):
        pass

    strict = make_journal()
    with_tuple = strict.record({"point": (1, 2)})
    assert with_tuple.payload["point"] == (1, 2)
    with_subclass = strict.record({"tag": Tag("x")})
    assert type(with_subclass.payload["tag"]) is Tag
    lenient = make_journal(strict=False)
    odd_keys = lenient.record({1: "one", None: "none"})  # type: ignore[dict-item]
    assert dict(odd_keys.payload) == {1: "one", None: "none", "server_event_seq": 1}
    # The byte count is the seed's either way: the compact JSON's UTF-8 length.
    assert odd_keys.encoded_bytes == len(b'{"1":"one","null":"none","server_event_seq":1}')
    assert [e.sequence for e in lenient.replay_after(0)] == [1]


def test_the_seed_constructor_keeps_what_it_is_given() -> None:
    entry = JournalEntry(1, 0.0, 3, {"a": 1})
    assert entry.payload == {"a": 1}
    assert entry == JournalEntry(1, 0.0, 3, {"a": 1})
    assert entry != JournalEntry(1, 0.0, 3, {"a": 2})
    with pytest.raises(TypeError):
        JournalEntry(1, 0.0, 3)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("strict", [True, False])
def test_a_payload_that_contains_itself_is_refused_not_looped_over(strict: bool) -> None:
    # json.dumps refuses a cycle (the seed's ValueError); the exactness check
    # that runs before it once walked such a payload forever, hanging the
    # session's thread. A container shared twice is not a cycle: it records.
    looped: dict[str, object] = {"type": "x"}
    looped["self"] = [looped]
    journal = make_journal(strict=strict)
    with pytest.raises(InvalidPayloadError):
        journal.record(looped)
    shared = [1, 2]
    entry = journal.record({"a": shared, "b": {"c": shared}})
    assert dict(entry.payload) == {"a": [1, 2], "b": {"c": [1, 2]}, "server_event_seq": 1}


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(payload=st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=6))
def test_the_journal_writes_and_reads_exactly_what_json_would(payload: dict[str, Any]) -> None:
    # The journal encodes with json's C encoder directly and decodes with its
    # scanner: the bytes it counts must be json.dumps's, byte for byte.
    for allow_nan in (True, False):
        try:
            expected = json.dumps(
                payload, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
            ).encode("utf-8")
        except ValueError:
            with pytest.raises(ValueError):
                journal_module._dumps(payload, allow_nan=allow_nan, tree=True)
            continue
        assert journal_module._dumps(payload, allow_nan=allow_nan, tree=True) == expected
        assert json.dumps(journal_module._loads(expected)) == json.dumps(json.loads(expected))


def test_decoding_bytes_the_journal_did_not_write_is_json_loads() -> None:
    assert journal_module._loads(b' {"a": 1} ') == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        journal_module._loads(b'{"a":1}x')
    with pytest.raises(json.JSONDecodeError):
        journal_module._loads(b"")
