"""SessionState: detach, attachment queries, and the seed's lease settlement rules.

Detach is fenced by attachment generation. A lease generation whose resume was
abandoned needs an owner: the pending resume (absorbs it on activation), else
the attached connection, else nobody (it is handed back). Generations only
move forward.
"""

from __future__ import annotations

from actors._commands import (
    BeginResume,
    DetachedAttachment,
    EndResume,
    Notify,
    ReleaseAttachment,
    RetireAttachment,
    SettleLeaseGeneration,
)
from tests.helpers import current, has, leases, ok, open_world, resume

# -- release_attachment / detach ------------------------------------------------------


def test_release_current_generation_detaches_and_returns_its_lease() -> None:
    world = open_world(lease_generation=3)
    transition = world.state.handle(ReleaseAttachment(attachment_generation=1))
    assert ok(transition) == DetachedAttachment(
        session_id="s1", attachment_generation=1, lease_generation=3
    )
    retire, notify = transition.effects
    assert retire == RetireAttachment(attachment_generation=1, reason="detached")
    assert isinstance(notify, Notify) and notify.event.kind == "detached"
    assert not has(world)


def test_release_with_a_stale_generation_cannot_detach_the_winner() -> None:
    world = open_world()
    resume(world)
    transition = world.state.handle(ReleaseAttachment(attachment_generation=1))
    assert ok(transition) is None and transition.effects == ()
    assert current(world, 2)


def test_release_with_none_detaches_whichever_connection_is_attached() -> None:
    world = open_world()
    resume(world)
    assert ok(world.state.handle(ReleaseAttachment())).attachment_generation == 2
    assert not has(world)


def test_second_release_answers_none_so_grace_cannot_restart() -> None:
    world = open_world()
    assert ok(world.state.handle(ReleaseAttachment())) is not None
    transition = world.state.handle(ReleaseAttachment())
    assert ok(transition) is None and transition.effects == ()


def test_release_reports_the_dropped_connections_lease_not_a_parked_newer_one() -> None:
    world = open_world(lease_generation=2)
    ok(world.state.handle(BeginResume()))
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=5))) is None
    assert ok(world.state.handle(ReleaseAttachment())).lease_generation == 2


# -- has / is_current -------------------------------------------------------------------


def test_has_attachment_follows_detach_and_resume() -> None:
    world = open_world()
    assert has(world)
    ok(world.state.handle(ReleaseAttachment()))
    assert not has(world)
    resume(world)
    assert has(world)


def test_is_current_attachment_needs_an_attached_matching_generation() -> None:
    world = open_world()
    assert current(world, 1) and not current(world, 2) and not current(world, 0)
    ok(world.state.handle(ReleaseAttachment()))
    assert not current(world, 1)


# -- begin/end_resume and settle_lease_generation ---------------------------------------


def test_end_resume_without_a_claim_never_goes_negative() -> None:
    world = open_world()
    assert ok(world.state.handle(EndResume())) is None
    assert ok(world.state.handle(EndResume())) is None
    assert world.state.pending_resumes == 0
    ok(world.state.handle(BeginResume()))
    assert world.state.pending_resumes == 1


def test_orphan_waits_for_the_pending_resume_which_absorbs_it() -> None:
    world = open_world(lease_generation=1)
    ok(world.state.handle(BeginResume()))
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=5))) is None
    assert leases(world) == (1, 5)  # not handed to the socket about to be replaced
    resume(world, lease_generation=3)
    assert leases(world) == (5, None)
    assert ok(world.state.handle(EndResume())) is None


def test_orphan_goes_to_the_attached_connection_when_no_resume_is_pending() -> None:
    world = open_world(lease_generation=1)
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=4))) is None
    assert leases(world) == (4, None)
    assert ok(world.state.handle(ReleaseAttachment())).lease_generation == 4


def test_orphan_with_nobody_attached_and_no_resume_pending_is_returned() -> None:
    world = open_world(lease_generation=1)
    ok(world.state.handle(ReleaseAttachment()))
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=4))) == 4
    assert world.state.orphaned_lease_generation is None
    assert world.state.lease_generation == 1


def test_end_resume_returns_a_parked_orphan_nobody_took() -> None:
    world = open_world()
    ok(world.state.handle(BeginResume()))
    ok(world.state.handle(ReleaseAttachment()))
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=6))) is None
    assert ok(world.state.handle(EndResume())) == 6
    assert ok(world.state.handle(EndResume())) is None


def test_end_resume_hands_a_parked_orphan_to_the_attached_connection() -> None:
    world = open_world()
    ok(world.state.handle(BeginResume()))
    ok(world.state.handle(SettleLeaseGeneration(lease_generation=6)))
    assert ok(world.state.handle(EndResume())) is None
    assert world.state.lease_generation == 6


def test_orphan_stays_parked_until_the_last_claim_ends() -> None:
    world = open_world()
    ok(world.state.handle(ReleaseAttachment()))
    ok(world.state.handle(BeginResume()))
    ok(world.state.handle(BeginResume()))
    ok(world.state.handle(SettleLeaseGeneration(lease_generation=2)))
    assert ok(world.state.handle(EndResume())) is None
    assert ok(world.state.handle(EndResume())) == 2


def test_lease_generations_only_move_forward() -> None:
    world = open_world(lease_generation=8)
    assert ok(world.state.handle(SettleLeaseGeneration(lease_generation=3))) is None
    assert world.state.lease_generation == 8
    ok(world.state.handle(BeginResume()))
    ok(world.state.handle(SettleLeaseGeneration(lease_generation=9)))
    ok(world.state.handle(SettleLeaseGeneration(lease_generation=4)))
    assert world.state.orphaned_lease_generation == 9
    ok(world.state.handle(ReleaseAttachment()))
    assert ok(world.state.handle(EndResume())) == 9
