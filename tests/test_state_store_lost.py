"""SessionState: a session taken over from a store that lost its last writes.

A Redis replica promoted before the primary's last commits reached it holds
a journal whose head is behind events the old owner sent. A client that
received them resumes with a last sequence beyond that head: a journal loaded
from the store answers `JournalGapError` with reason ``store_lost`` (never
a silent rewind), and the session never issues those sequences again. A
journal that never left its process keeps the seed's `InvalidSequenceError`.
"""

from __future__ import annotations

from dataclasses import replace

from actors._commands import ReleaseAttachment, SendEvent
from actors._errors import InvalidResumeTokenError, InvalidSequenceError, JournalGapError
from actors._journal import MAX_SKIP_SEQUENCE
from actors._state import SessionState
from actors._store import StoredSession, parked_from_store, stored_event
from tests.helpers import World, auth, config, fails, ok, open_world, resume, resume_command

WALL_OFFSET = 1_000_000.0


def taken_over_behind(world: World, *, sent: int, kept: int) -> World:
    """``world``'s session after ``sent`` events, as another process loads it
    from a store that kept only the first ``kept`` of them."""
    for n in range(sent):
        ok(world.state.handle(SendEvent(payload={"n": n + 1})))
    ok(world.state.handle(ReleaseAttachment()))
    record = world.state.store_record(WALL_OFFSET)
    events = tuple(
        stored_event(entry, WALL_OFFSET)
        for entry in world.state.entries_after(0)
        if entry.sequence <= kept
    )
    stored = StoredSession(
        session_id=world.state.session_id,
        epoch=2,
        record=replace(record, next_sequence=kept + 1),
        events=events,
    )
    state = SessionState.unpark(
        parked_from_store(stored, WALL_OFFSET), config=world.state.config, clock=world.clock
    )
    return World(state=state, clock=world.clock, token=world.token)


def test_a_client_beyond_a_store_loaded_head_gets_a_store_lost_gap() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    gap = fails(
        world.state.handle(resume_command(world, last_received_server_event_seq=5)),
        JournalGapError,
    )
    assert (gap.reason, gap.requested, gap.first_retained, gap.head) == ("store_lost", 5, 1, 3)
    assert "beyond journal head 3" in str(gap)


def test_after_the_gap_the_session_issues_no_sequence_the_client_may_hold() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    fails(
        world.state.handle(resume_command(world, last_received_server_event_seq=5)),
        JournalGapError,
    )
    # The client may resume again from its own last sequence: nothing to replay.
    reply = resume(world, last_received_server_event_seq=5)
    assert reply.replay_entries == ()
    entry = ok(world.state.handle(SendEvent(payload={"n": "new"})))
    assert entry.sequence == 6
    world.state.check_invariants()
    # What the next commit writes: the store skips the lost sequences too.
    record = world.state.store_record(WALL_OFFSET)
    assert (record.next_sequence, record.dropped_through) == (7, 5)
    assert record.drop_runs[-1] == (5, "store_lost")


def test_an_older_sequence_after_the_skip_is_a_store_lost_gap_too() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    fails(auth(world, world.token, 5), JournalGapError)
    gap = fails(auth(world, world.token, 2), JournalGapError)
    assert (gap.reason, gap.requested, gap.first_retained, gap.head) == ("store_lost", 2, 6, 5)


def test_authenticate_resume_answers_the_gap_and_skips_as_resume_does() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    gap = fails(auth(world, world.token, 4), JournalGapError)
    assert (gap.reason, gap.requested, gap.first_retained, gap.head) == ("store_lost", 4, 1, 3)
    assert world.state.journal.last_sequence == 4
    assert ok(auth(world, world.token, 4)) is None


def test_the_token_is_checked_before_the_head_and_a_stranger_skips_nothing() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    fails(auth(world, "not-the-token", 5), InvalidResumeTokenError)
    fails(
        world.state.handle(resume_command(world, token="nope", last_received_server_event_seq=5)),
        InvalidResumeTokenError,
    )
    assert world.state.journal.last_sequence == 3
    assert [e.sequence for e in resume(world, last_received_server_event_seq=1).replay_entries] == [
        2,
        3,
    ]


def test_a_client_within_the_store_loaded_head_resumes_as_always() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    assert [e.sequence for e in resume(world, last_received_server_event_seq=2).replay_entries] == [
        3
    ]
    assert ok(world.state.handle(SendEvent(payload={}))).sequence == 4


def test_the_skip_survives_parking_and_the_store_loaded_answer_too() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    fails(auth(world, world.token, 5), JournalGapError)
    again = SessionState.unpark(world.state.park(), config=config(), clock=world.clock)
    assert again.journal.store_loaded
    assert again.journal.last_sequence == 5
    gap = again.handle(resume_command(world, last_received_server_event_seq=9)).error
    assert isinstance(gap, JournalGapError)
    assert gap.reason == "store_lost"


def test_a_session_that_never_left_its_process_keeps_the_seeds_answer() -> None:
    world = open_world()
    ok(world.state.handle(SendEvent(payload={})))
    assert not world.state.journal.store_loaded
    fails(auth(world, world.token, 2), InvalidSequenceError)
    fails(
        world.state.handle(resume_command(world, last_received_server_event_seq=2)),
        InvalidSequenceError,
    )
    assert ok(world.state.handle(SendEvent(payload={}))).sequence == 2


def test_a_sequence_no_client_can_hold_exactly_is_no_skip() -> None:
    world = taken_over_behind(open_world(), sent=5, kept=3)
    fails(auth(world, world.token, MAX_SKIP_SEQUENCE + 1), InvalidSequenceError)
    lenient = taken_over_behind(open_world(strict=False), sent=5, kept=3)
    fails(auth(lenient, lenient.token, 4.5), InvalidSequenceError)
    fails(auth(lenient, lenient.token, float("inf")), InvalidSequenceError)
    assert (world.state.journal.last_sequence, lenient.state.journal.last_sequence) == (3, 3)
    gap = fails(auth(world, world.token, MAX_SKIP_SEQUENCE), JournalGapError)
    assert gap.reason == "store_lost"
