"""SessionState: authenticate_resume, resume, activation outcomes and token recovery.

Where the seed awaited its activation send, the state emits ``Activate`` and
learns the outcome from ``ActivationOutcome``; a failed one is the seed's
``_rollback_resume``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from actors._commands import (
    AbortResume,
    Acknowledge,
    Activate,
    ActivationOutcome,
    BeginResume,
    EndResume,
    Notify,
    ReleaseAttachment,
    ResumeResult,
    RetireAttachment,
    SendEvent,
    SendEvents,
    SettleLeaseGeneration,
    TransportAttachment,
)
from actors._credential import token_digest
from actors._errors import InvalidResumeTokenError, InvalidSequenceError, JournalGapError
from actors._state import Transition
from tests.helpers import (
    World,
    activation_payload,
    auth,
    current,
    fails,
    has,
    leases,
    ok,
    open_world,
    resume,
    resume_command,
    sequences,
    wire_close,
    wire_send,
)

# -- authenticate_resume -------------------------------------------------------------------


def test_authenticate_resume_with_the_current_token_changes_nothing() -> None:
    world = open_world()
    world.state.handle(SendEvent(payload={}))
    before = world.state.snapshot()
    assert ok(auth(world, world.token, 0)) is None
    assert world.state.snapshot() == before
    assert ok(auth(world, world.token, 1)) is None


def test_authenticate_resume_rejects_a_wrong_token_with_the_seed_message() -> None:
    world = open_world()
    error = fails(auth(world, "not-the-token", 0), InvalidResumeTokenError)
    assert isinstance(error, RuntimeError)
    assert str(error) == "invalid resume token for duplex session s1"


@pytest.mark.parametrize("seq", [0, 99, -1, True, "7"], ids=["gap", "newer", "neg", "bool", "str"])
def test_token_is_checked_before_the_sequence(seq: Any) -> None:
    world = open_world()
    world.state.handle(SendEvent(payload={}))
    world.state.handle(Acknowledge(sequence=1))
    resumed = world.state.handle(resume_command(world, "wrong", last_received_server_event_seq=seq))
    for transition in (auth(world, "wrong", seq), resumed):
        fails(transition, InvalidResumeTokenError)
    # The same sequence with the right token is refused for what it is.
    assert auth(world, world.token, seq).error is not None


def test_authenticate_resume_reports_gap_and_newer_sequence_after_the_token() -> None:
    world = open_world()
    for _ in range(2):
        world.state.handle(SendEvent(payload={}))
    world.state.handle(Acknowledge(sequence=1))
    assert fails(auth(world, world.token, 0), JournalGapError).reason == "acknowledged"
    fails(auth(world, world.token, 3), InvalidSequenceError)


# -- resume ------------------------------------------------------------------------------


def test_resume_rotates_the_token_and_the_presented_one_stops_working() -> None:
    world = open_world()
    presented = world.token
    reply = resume(world)
    assert isinstance(reply, ResumeResult)
    assert reply.resume_token.plaintext != presented
    assert len(reply.resume_token.plaintext) == 43
    fails(auth(world, presented, 0), InvalidResumeTokenError)
    assert ok(auth(world, reply.resume_token.plaintext, 0)) is None


def test_resume_replays_every_entry_after_the_given_sequence() -> None:
    world = open_world()
    for n in range(3):
        ok(world.state.handle(SendEvent(payload={"n": n})))
    reply = resume(world, last_received_server_event_seq=1)
    assert reply.session_id == "s1"
    assert sequences(reply.replay_entries) == [2, 3]
    assert [dict(e.payload) for e in reply.replay_entries] == [
        {"n": 1, "server_event_seq": 2},
        {"n": 2, "server_event_seq": 3},
    ]
    assert resume(world).replay_entries == ()


def test_each_resume_moves_the_attachment_generation_up_by_one() -> None:
    world = open_world()
    assert [resume(world).attachment_generation for _ in range(3)] == [2, 3, 4]
    assert current(world, 4) and not current(world, 3)


def test_resume_while_attached_returns_and_retires_the_replaced_attachment() -> None:
    world = open_world()
    transition = world.state.handle(resume_command(world))
    reply = ok(transition)
    assert reply.replaced_attachment is not None
    assert reply.replaced_attachment.generation == 1
    retire, notify = transition.effects
    assert retire == RetireAttachment(attachment_generation=1, reason="replaced")
    assert isinstance(notify, Notify) and notify.event.kind == "resumed"
    assert current(world, 2) and not current(world, 1)


def test_resume_while_detached_replaces_nothing() -> None:
    world = open_world()
    ok(world.state.handle(ReleaseAttachment()))
    transition = world.state.handle(resume_command(world))
    assert ok(transition).replaced_attachment is None
    assert not any(isinstance(effect, RetireAttachment) for effect in transition.effects)
    assert has(world)


@pytest.mark.parametrize(
    ("held", "given", "orphan", "expected"),
    [(5, None, None, 5), (2, 7, None, 7), (9, 7, None, 9), (2, 3, 6, 6), (2, 8, 6, 8)],
)
def test_resume_serves_the_newest_of_held_given_and_orphaned_lease(
    held: int, given: int | None, orphan: int | None, expected: int
) -> None:
    world = open_world(lease_generation=held)
    if orphan is not None:
        ok(world.state.handle(BeginResume()))
        ok(world.state.handle(SettleLeaseGeneration(lease_generation=orphan)))
    resume(world, lease_generation=given)
    assert world.state.lease_generation == expected
    assert world.state.orphaned_lease_generation is None


@pytest.mark.parametrize("case", ["bad-token", "gap", "newer"])
def test_failed_resume_changes_nothing(case: str) -> None:
    world = open_world()
    ok(world.state.handle(SendEvents(payloads=({}, {}))))
    ok(world.state.handle(Acknowledge(sequence=1)))
    token = "nope" if case == "bad-token" else world.token
    seq = {"bad-token": 2, "gap": 0, "newer": 3}[case]
    before = world.state.snapshot()
    transition = world.state.handle(
        resume_command(world, token, last_received_server_event_seq=seq)
    )
    assert transition.error is not None and transition.effects == ()
    assert world.state.snapshot() == before
    assert ok(auth(world, world.token, 2)) is None


def test_resume_without_a_factory_leaves_activation_to_the_caller() -> None:
    world = open_world()
    transition = world.state.handle(resume_command(world))
    assert not any(isinstance(effect, Activate) for effect in transition.effects)
    assert not world.state.activation_in_flight


# -- activation and its rollback -------------------------------------------------------------


def activating(world: World, token: str | None = None, **overrides: Any) -> Transition:
    """A resume with an activation factory; the world learns the rotated token."""
    transition = world.state.handle(
        resume_command(world, token, activation_payload_factory=activation_payload, **overrides)
    )
    world.token = ok(transition).resume_token.plaintext
    return transition


def outcome(world: World, generation: int, *, delivered: bool) -> Transition:
    command = ActivationOutcome(attachment_generation=generation, delivered=delivered)
    transition = world.state.handle(command)
    assert transition.error is None
    return transition


def test_resume_with_a_factory_emits_activate_with_the_rotated_token_and_replay() -> None:
    world = open_world()
    ok(world.state.handle(SendEvents(payloads=({"n": 1}, {"n": 2}))))
    transition = activating(world, last_received_server_event_seq=0)
    reply = ok(transition)
    [activate] = [e for e in transition.effects if isinstance(e, Activate)]
    assert activate.attachment_generation == 2
    assert activate.resume_token == reply.resume_token
    assert activate.payload_factory is activation_payload
    assert sequences(activate.replay) == [1, 2]
    assert world.state.activation_in_flight


def test_delivered_activation_keeps_the_attachment_and_the_old_token_dead() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    transition = outcome(world, 2, delivered=True)
    assert transition.effects == ()
    assert transition.reply is False  # nothing rolled back
    assert current(world, 2) and not world.state.activation_in_flight
    ok(world.state.handle(ReleaseAttachment()))
    fails(auth(world, presented, 0), InvalidResumeTokenError)


def test_the_store_keeps_the_presented_token_as_recovery_until_the_activation_is_delivered() -> (
    None
):
    """A process can die between a resume's commit and its activation frame:
    the client never saw the rotated token, and the process that takes the
    session over from the store must still accept the one it presented."""
    world = open_world()
    presented = world.token
    activating(world)
    record = world.state.store_record(0.0)
    assert record.token_digest == token_digest(world.token)
    assert record.recovery_token_digest == token_digest(presented)
    outcome(world, 2, delivered=True)
    assert world.state.store_record(0.0).recovery_token_digest is None


def test_the_store_keeps_the_presented_token_after_a_failed_activation_too() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    outcome(world, 2, delivered=False)
    assert world.state.store_record(0.0).recovery_token_digest == token_digest(presented)


def test_a_resume_without_activation_hands_its_token_out_at_once_and_keeps_no_recovery() -> None:
    world = open_world()
    resume(world)
    assert world.state.store_record(0.0).recovery_token_digest is None


def test_failed_activation_detaches_and_end_resume_hands_back_its_lease() -> None:
    world = open_world(lease_generation=1)
    ok(world.state.handle(BeginResume()))
    activating(world, lease_generation=5)
    transition = outcome(world, 2, delivered=False)
    assert transition.reply is True  # rolled back
    assert RetireAttachment(attachment_generation=2, reason="activation_failed") in (
        transition.effects
    )
    assert not has(world)
    assert world.state.orphaned_lease_generation == 5
    assert ok(world.state.handle(EndResume())) == 5


def test_failed_activation_lease_is_settled_as_the_newest_never_a_stale_one() -> None:
    world = open_world(lease_generation=1)
    activating(world, lease_generation=5)
    outcome(world, 2, delivered=False)
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=4))) == 5


def test_lease_abandoned_during_activation_is_returned_after_its_rollback() -> None:
    world = open_world(lease_generation=1)
    ok(world.state.handle(BeginResume()))  # resume A
    ok(world.state.handle(BeginResume()))  # resume B
    activating(world, lease_generation=3)  # A activates
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=4))) is None  # B gives up
    assert ok(world.state.handle(EndResume())) is None
    outcome(world, 2, delivered=False)
    assert ok(world.state.handle(EndResume())) == 4


def test_failed_activation_lets_the_presented_token_resume_exactly_once() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    outcome(world, 2, delivered=False)
    assert ok(auth(world, presented, 0)) is None  # authenticate does not consume it
    resume(world, presented)
    ok(world.state.handle(ReleaseAttachment()))
    fails(world.state.handle(resume_command(world, presented)), InvalidResumeTokenError)


def test_resuming_with_the_rotated_token_also_ends_the_recovery() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    outcome(world, 2, delivered=False)
    resume(world)  # the token the failed activation rotated to
    ok(world.state.handle(ReleaseAttachment()))
    fails(auth(world, presented, 0), InvalidResumeTokenError)


def test_recovery_token_is_refused_while_a_connection_is_attached() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    outcome(world, 2, delivered=False)
    snapshot = world.state.snapshot()
    attached = TransportAttachment(generation=2, send=wire_send, close=wire_close)
    fields = replace(snapshot.fields, detached_at=None)
    world.state.restore(snapshot._replace(attachment=attached, fields=fields))
    world.state.check_invariants()
    fails(auth(world, presented, 0), InvalidResumeTokenError)


def test_rollback_is_generation_checked_so_a_later_resume_keeps_its_attachment() -> None:
    world = open_world()
    first = world.token
    activating(world)
    second = world.token
    activating(world)
    stale = outcome(world, 2, delivered=False)
    assert (stale.reply, stale.effects) == (False, ())
    assert current(world, 3)
    outcome(world, 3, delivered=True)
    ok(world.state.handle(ReleaseAttachment()))
    for dead in (first, second):
        fails(auth(world, dead, 0), InvalidResumeTokenError)


def test_outcome_for_an_unknown_or_settled_generation_changes_nothing() -> None:
    world = open_world()
    activating(world)
    outcome(world, 2, delivered=True)
    before = world.state.snapshot()
    for generation in (2, 9):
        late = outcome(world, generation, delivered=False)
        assert (late.reply, late.effects) == (False, ())
    assert world.state.snapshot() == before
    assert current(world, 2)


def test_failed_activation_after_its_release_still_restores_the_presented_token() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    ok(world.state.handle(ReleaseAttachment(attachment_generation=2)))
    transition = outcome(world, 2, delivered=False)
    assert not any(isinstance(effect, RetireAttachment) for effect in transition.effects)
    resume(world, presented)


def test_recovery_survives_a_second_failed_activation_with_the_same_token() -> None:
    world = open_world()
    presented = world.token
    activating(world)
    outcome(world, 2, delivered=False)
    activating(world, presented)
    outcome(world, 3, delivered=False)
    assert resume(world, presented).attachment_generation == 4


# -- abort_resume: the caller was cancelled before it saw the result --------------------


def test_abort_after_a_resume_without_activation_restores_the_presented_token_once() -> None:
    world = open_world()
    presented = world.token
    ok(world.state.handle(ReleaseAttachment()))
    resume(world, lease_generation=4)
    assert ok(world.state.handle(AbortResume(attachment_generation=2))) is True
    assert has(world) is False
    # The rotated token stays current; the presented one recovers, once.
    assert ok(auth(world, presented, 0)) is None
    assert leases(world) == (4, 4)
    resume(world, presented)
    fails(auth(world, presented, 0), InvalidResumeTokenError)


def test_abort_of_an_activating_resume_is_a_failed_activation() -> None:
    world = open_world()
    presented = world.token
    resume(world, activation_payload_factory=activation_payload)
    assert world.state.activation_in_flight
    transition = world.state.handle(AbortResume(attachment_generation=2))
    assert ok(transition) is True
    assert RetireAttachment(attachment_generation=2, reason="activation_failed") in (
        transition.effects
    )
    assert world.state.snapshot().activations == ()
    # A late outcome for the aborted activation changes nothing more.
    assert (
        ok(world.state.handle(ActivationOutcome(attachment_generation=2, delivered=True))) is False
    )
    assert ok(auth(world, presented, 0)) is None


def test_abort_of_a_superseded_resume_changes_nothing() -> None:
    world = open_world()
    resume(world)
    resume(world)
    before = world.state.snapshot()
    assert ok(world.state.handle(AbortResume(attachment_generation=2))) is False
    assert world.state.snapshot() == before
    assert current(world, 3) is True


def test_abort_twice_rolls_back_once() -> None:
    world = open_world()
    resume(world)
    assert ok(world.state.handle(AbortResume(attachment_generation=2))) is True
    before = world.state.snapshot()
    assert ok(world.state.handle(AbortResume(attachment_generation=2))) is False
    assert world.state.snapshot() == before
