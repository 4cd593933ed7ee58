"""Phases, the commands each accepts, the resume stash, unknown-session answers and
parking: the rules of actors/_lifecycle.py, with plain calls and a fake clock."""

from __future__ import annotations

import pytest

from actors._commands import (
    AbortResume,
    Acknowledge,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    Close,
    Command,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    ReleaseAttachment,
    SendEvent,
    SettleLeaseGeneration,
    Tick,
)
from actors._errors import InvalidResumeTokenError, JournalGapError, UnknownSessionError
from actors._lifecycle import (
    ACCEPTS,
    ALL_COMMANDS,
    UNKNOWN_SESSION_ANSWERS,
    ResumeStash,
    SessionPhase,
    unknown_session_answer,
)
from actors._state import SessionState
from supervisor._faults import FaultPlan, InjectedFaultError
from tests.helpers import (
    activation_payload,
    auth,
    config,
    fails,
    ok,
    open_world,
    resume,
    resume_command,
)


def test_phases_follow_the_session() -> None:
    world = open_world()
    state = world.state
    phases = [state.phase]
    ok(state.handle(ReleaseAttachment()))
    phases.append(state.phase)
    reply = resume(world, activation_payload_factory=activation_payload)
    phases.append(state.phase)
    generation = reply.attachment_generation
    ok(state.handle(ActivationOutcome(attachment_generation=generation, delivered=False)))
    phases.append(state.phase)
    resume(world, token=world.tokens["created"])
    phases.append(state.phase)
    ok(state.handle(Close()))
    phases.append(state.phase)
    assert [p.value for p in phases] == [
        "attached",
        "detached",
        "activating",
        "recovering",
        "attached",
        "closed",
    ]


def test_the_accepts_table() -> None:
    for phase in (SessionPhase.ATTACHED, SessionPhase.DETACHED, SessionPhase.RECOVERING):
        assert ACCEPTS[phase] == ALL_COMMANDS
    activating = ACCEPTS[SessionPhase.ACTIVATING]
    assert AuthenticateResume not in activating
    assert {SendEvent, Acknowledge, ReleaseAttachment, ActivationOutcome, AbortResume} <= activating
    assert ACCEPTS[SessionPhase.CLOSED] == frozenset()


def _resume_cmd(world: object) -> Command:
    return AuthenticateResume(resume_token="t", last_received_server_event_seq=0)


def test_the_stash_holds_resumes_behind_an_activation_in_arrival_order() -> None:
    world = open_world()
    state = world.state
    ok(state.handle(ReleaseAttachment()))
    reply = resume(world, activation_payload_factory=activation_payload)
    stash: ResumeStash[str] = ResumeStash()
    first = resume_command(world)
    second = AuthenticateResume(resume_token=world.token, last_received_server_event_seq=0)
    assert stash.admit(state.phase, first, "first") is False
    assert stash.admit(state.phase, SendEvent(payload={"n": 1}), "event") is True
    assert stash.admit(state.phase, second, "second") is False
    assert len(stash) == 2
    assert stash.next_ready(state.phase) is None  # still activating
    generation = reply.attachment_generation
    ok(state.handle(ActivationOutcome(attachment_generation=generation, delivered=True)))
    assert stash.next_ready(state.phase) == "first"
    assert stash.next_ready(state.phase) == "second"
    assert stash.next_ready(state.phase) is None


def test_a_resume_never_overtakes_one_held_before_it() -> None:
    world = open_world()
    state = world.state
    ok(state.handle(ReleaseAttachment()))
    reply = resume(world, activation_payload_factory=activation_payload)
    stash: ResumeStash[str] = ResumeStash()
    assert stash.admit(state.phase, resume_command(world), "held") is False
    ok(
        state.handle(
            ActivationOutcome(attachment_generation=reply.attachment_generation, delivered=True)
        )
    )
    # Settled, but the first resume has not run yet: the next one queues behind it.
    assert stash.admit(state.phase, resume_command(world), "later") is False
    assert stash.drain() == ["held", "later"]
    assert len(stash) == 0


def test_a_closed_session_admits_everything_to_answer_it_as_unknown() -> None:
    stash: ResumeStash[str] = ResumeStash()
    assert stash.admit(SessionPhase.CLOSED, _resume_cmd(None), "x") is True


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        (ReleaseAttachment(), None),
        (EndResume(), None),
        (SettleLeaseGeneration(lease_generation=1), None),
        (HasAttachment(), False),
        (IsCurrentAttachment(attachment_generation=1), False),
        (Close(), None),
    ],
)
def test_unknown_session_plain_answers(command: Command, answer: object) -> None:
    transition = unknown_session_answer(command, "nobody")
    assert transition.error is None
    assert transition.reply is answer
    assert type(command) in UNKNOWN_SESSION_ANSWERS


@pytest.mark.parametrize(
    "command",
    [
        SendEvent(payload={}),
        Acknowledge(sequence=0),
        BeginResume(),
        AuthenticateResume(resume_token="t", last_received_server_event_seq=0),
    ],
)
def test_unknown_session_key_errors(command: Command) -> None:
    error = fails(unknown_session_answer(command, "nobody"), UnknownSessionError)
    assert isinstance(error, KeyError)


# -- parking -------------------------------------------------------------------


def test_only_a_detached_idle_session_is_parkable() -> None:
    world = open_world()
    state = world.state
    assert state.idle_since(0.0) is None  # attached
    with pytest.raises(ValueError, match="not parkable"):
        state.park()
    ok(state.handle(ReleaseAttachment()))
    assert state.idle_since(0.0) == world.clock.now
    assert state.idle_since(world.clock.now + 5) == world.clock.now + 5
    ok(state.handle(BeginResume()))
    assert state.idle_since(0.0) is None  # a resume is claimed
    ok(state.handle(EndResume()))
    resume(world, activation_payload_factory=activation_payload)
    ok(state.handle(ReleaseAttachment()))
    assert state.idle_since(0.0) is None  # the activation is still on the wire


def test_park_and_unpark_keep_everything_a_client_can_observe() -> None:
    world = open_world(replay_max_events=50)
    state = world.state
    for i in range(5):
        ok(state.handle(SendEvent(payload={"i": i})))
    ok(state.handle(Acknowledge(sequence=2)))
    ok(state.handle(SettleLeaseGeneration(lease_generation=4)))
    ok(state.handle(ReleaseAttachment()))
    before = state.snapshot()
    parked = world.state.park()
    assert "token" not in repr(parked) and world.token not in repr(parked)
    back = SessionState.unpark(parked, config=state.config, clock=world.clock)
    after = back.snapshot()
    assert after == before
    back.check_invariants()
    # The token still works, the journal replays the same events, a gap is still a gap.
    world.state = back
    ok(auth(world, world.token, 2))
    gap = fails(auth(world, world.token, 0), JournalGapError)
    assert gap.reason == "acknowledged"
    fails(auth(world, "wrong", 2), InvalidResumeTokenError)
    reply = resume(world)
    assert [e.sequence for e in reply.replay_entries] == []
    entry = ok(back.handle(SendEvent(payload={"i": 5})))
    assert entry.sequence == 6


def test_parked_data_prunes_and_expires_without_a_live_state() -> None:
    world = open_world(replay_ttl_s=10.0, disconnect_grace_s=30.0)
    state = world.state
    ok(state.handle(SendEvent(payload={"i": 0})))
    world.clock.advance(5)
    ok(state.handle(SendEvent(payload={"i": 1})))
    ok(state.handle(ReleaseAttachment()))
    parked = state.park()
    assert parked.pruned(world.clock.now, 10.0) is parked  # nothing old enough
    later = parked.pruned(world.clock.now + 6, 10.0)
    assert [e.sequence for e in later.entries] == [2]
    assert later.retained_bytes < parked.retained_bytes
    assert later.dropped_through == 1
    assert not later.expired(world.clock.now + 29, 30.0)
    assert later.expired(world.clock.now + 30, 30.0)
    assert not later.expired(world.clock.now + 10_000, None)


@pytest.mark.parametrize("failpoint", FaultPlan.lifecycle_failpoint_names())
def test_a_crash_while_parking_or_unparking_changes_nothing(failpoint: str) -> None:
    plan = FaultPlan()
    world = open_world(failpoints=plan)
    state = world.state
    ok(state.handle(SendEvent(payload={"i": 0})))
    ok(state.handle(ReleaseAttachment()))
    before = state.snapshot()
    plan.crash(failpoint)
    if failpoint.startswith("passivate."):
        with pytest.raises(InjectedFaultError):
            state.park()
        assert state.snapshot() == before
        parked = state.park()  # and it parks once the fault has passed
    else:
        parked = state.park()
        with pytest.raises(InjectedFaultError):
            SessionState.unpark(parked, config=config(), clock=world.clock, failpoints=plan)
    back = SessionState.unpark(parked, config=state.config, clock=world.clock)
    assert back.snapshot() == before
    assert plan.fired[failpoint] == 1


def test_tick_is_handled_in_every_live_phase() -> None:
    world = open_world()
    for phase, accepted in ACCEPTS.items():
        assert (Tick in accepted) is (phase is not SessionPhase.CLOSED)
    ok(world.state.handle(Tick(now=world.clock.now)))
