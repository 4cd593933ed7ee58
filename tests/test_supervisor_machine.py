"""The supervisor's decisions as plain calls: no actor, no loop, no thread.

Crashes are stamped from a fake clock, as a session stamps its report from
the registry's clock; the machine is told only what a report says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import pytest

import actors._supervisor_machine as machine_module
from actors._commands import ReleaseAttachment, SendEvent
from actors._lifecycle import ParkedSession
from actors._supervisor_machine import (
    AnswerClosed,
    CloseParked,
    Escalate,
    ExpireParked,
    FailSuspended,
    Park,
    PruneParked,
    Recover,
    RestartAfter,
    RestartNow,
    RouteAdopted,
    SupervisorMachine,
    TakeOver,
    WaitForTakeover,
    WakeSession,
)
from supervisor._policy import RestartPolicy
from tests.helpers import FakeClock, config, ok, open_world


@dataclass(frozen=True, slots=True, kw_only=True)
class Crash:
    """What a `CrashReport` tells the machine (the mailbox and urn are the shell's)."""

    session_id: str
    during: Literal["handle", "reactivate"]
    crashed_at: float
    state_sound: bool = True
    retry_crashed: bool = False


def machine(
    *,
    policy: RestartPolicy | None = None,
    passivate_after_s: float | None = 30.0,
    takeovers_off_loop: bool = False,
    **config_overrides: Any,
) -> SupervisorMachine[str]:
    return SupervisorMachine[str](
        limits=policy or RestartPolicy(jitter=0),
        config=config(**config_overrides),
        passivate_after_s=passivate_after_s,
        takeovers_off_loop=takeovers_off_loop,
    )


def crash(
    clock: FakeClock,
    session_id: str = "s",
    *,
    during: Literal["handle", "reactivate"] = "handle",
) -> Crash:
    """A crash stamped now on ``clock``, as a session stamps its report."""
    return Crash(session_id=session_id, during=during, crashed_at=clock.now)


# -- restarts ---------------------------------------------------------------------------


def test_a_crash_within_the_budget_restarts_now() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=2, within_s=60))
    assert supervisor.crashed(crash(clock)) == (RestartNow(),)
    clock.advance(1)
    assert supervisor.crashed(crash(clock)) == (RestartNow(),)


def test_past_the_budget_a_handler_crash_fails_the_suspended_session() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=2, within_s=60))
    decisions = []
    for _ in range(3):
        decisions.append(supervisor.crashed(crash(clock)))
        clock.advance(1)
    assert decisions == [(RestartNow(),), (RestartNow(),), (FailSuspended(),)]


def test_past_the_budget_a_wake_up_crash_closes_the_parked_session() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=0, within_s=60))
    assert supervisor.crashed(crash(clock, during="reactivate")) == (CloseParked(),)


def test_a_backoff_restarts_after_a_delay_that_doubles_per_crash_in_the_window() -> None:
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=5, within_s=60, backoff_s=0.5, jitter=0)
    supervisor = machine(policy=policy)
    delays = []
    for _ in range(3):
        delays.append(supervisor.crashed(crash(clock)))
        clock.advance(1)
    assert delays == [
        (RestartAfter(delay_s=0.5),),
        (RestartAfter(delay_s=1.0),),
        (RestartAfter(delay_s=2.0),),
    ]


@pytest.mark.parametrize(
    "facts",
    [
        Crash(session_id="s", during="handle", crashed_at=0.0, state_sound=False),
        Crash(session_id="s", during="handle", crashed_at=0.0, retry_crashed=True),
    ],
    ids=["unsound", "retry"],
)
def test_an_unsound_state_or_a_crashed_retry_is_never_restarted(facts: Crash) -> None:
    supervisor = machine(policy=RestartPolicy(max_restarts=10, within_s=60))
    assert supervisor.crashed(facts) == (FailSuspended(),)


def test_each_session_has_its_own_budget_and_a_new_session_starts_afresh() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=1, within_s=60))
    assert supervisor.crashed(crash(clock, "a")) == (RestartNow(),)
    assert supervisor.crashed(crash(clock, "b")) == (RestartNow(),)
    assert supervisor.crashed(crash(clock, "a")) == (FailSuspended(),)
    supervisor.session_left("a")
    assert "a" not in supervisor.crash_times
    assert supervisor.crashed(crash(clock, "a")) == (RestartNow(),)  # the same id, anew


# -- the budget counts each crash at its own time ------------------------------------------


def test_a_crash_read_after_a_clock_jump_counts_at_its_stamp_not_at_the_jump() -> None:
    # The fault-injection user's test: crash, jump past the window, crash
    # again; the first report is read only after the jump. At its stamp, it
    # has left the window by the second crash: both restart.
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=1, within_s=60))
    first = crash(clock)
    clock.advance(61)
    second = crash(clock)
    assert supervisor.crashed(first) == (RestartNow(),)
    assert supervisor.crashed(second) == (RestartNow(),)
    assert supervisor.crash_times["s"] == [second.crashed_at]  # the first left the window


def test_crashes_a_window_apart_read_together_share_nothing() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=1, within_s=60))
    stamped = []
    for _ in range(3):
        stamped.append(crash(clock))
        clock.advance(60)  # the window is half-open: a crash 60 s back has left it
    clock.advance(1_000)  # all read long after
    assert [supervisor.crashed(c) for c in stamped] == [(RestartNow(),)] * 3


def test_crashes_within_the_window_share_it_however_late_they_are_read() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=1, within_s=60))
    first = crash(clock)
    clock.advance(30)
    second = crash(clock)
    clock.advance(1_000)
    assert supervisor.crashed(first) == (RestartNow(),)
    assert supervisor.crashed(second) == (FailSuspended(),)


# -- escalation --------------------------------------------------------------------------


def test_past_the_registry_limit_it_escalates_and_closes_crashing_sessions() -> None:
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=5, within_s=60, registry_max_restarts=2)
    supervisor = machine(policy=policy)
    assert supervisor.crashed(crash(clock, "a")) == (RestartNow(),)
    assert supervisor.crashed(crash(clock, "b")) == (RestartNow(),)
    # The health change comes first, then what becomes of the session.
    assert supervisor.crashed(crash(clock, "c")) == (
        Escalate(crashes=3, within_s=60),
        FailSuspended(),
    )
    assert not supervisor.healthy
    assert supervisor.crashed(crash(clock, "d", during="reactivate")) == (CloseParked(),)


def test_a_sweep_past_the_window_recovers_once() -> None:
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=5, within_s=10, registry_max_restarts=0)
    supervisor = machine(policy=policy)
    assert supervisor.crashed(crash(clock)) == (Escalate(crashes=1, within_s=10), FailSuspended())
    clock.advance(5)
    assert supervisor.swept(clock.now) == ()
    clock.advance(5)
    assert supervisor.swept(clock.now) == (Recover(crashes=0, within_s=10),)
    assert supervisor.healthy
    assert supervisor.swept(clock.now) == ()


def test_a_crash_that_finds_the_window_cleared_recovers_and_restarts() -> None:
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=5, within_s=10, registry_max_restarts=1)
    supervisor = machine(policy=policy)
    supervisor.crashed(crash(clock, "a"))
    assert supervisor.crashed(crash(clock, "b")) == (
        Escalate(crashes=2, within_s=10),
        FailSuspended(),
    )
    clock.advance(10)
    assert supervisor.crashed(crash(clock, "c")) == (
        Recover(crashes=1, within_s=10),
        RestartNow(),
    )


def test_without_a_registry_limit_it_never_escalates() -> None:
    clock = FakeClock()
    supervisor = machine(policy=RestartPolicy(max_restarts=1_000, within_s=60))
    for i in range(500):
        assert supervisor.crashed(crash(clock, f"s{i}")) == (RestartNow(),)
    assert supervisor.healthy and supervisor.swept(clock.now) == ()


# -- parking, sweeping parked sessions, waking -------------------------------------------


def test_a_sweep_proposes_parking_only_to_a_session_idle_long_enough() -> None:
    supervisor = machine(passivate_after_s=30.0)
    assert supervisor.park(100.0, None) is None  # attached or busy
    assert supervisor.park(100.0, 71.0) is None
    assert supervisor.park(100.0, 70.0) == Park(now=100.0, after_s=30.0)
    assert machine(passivate_after_s=None).park(1e9, 0.0) is None


def parked_session(**config_overrides: Any) -> tuple[ParkedSession, FakeClock]:
    world = open_world(**config_overrides)
    ok(world.state.handle(SendEvent(payload={"i": 0})))
    world.clock.advance(5)
    ok(world.state.handle(SendEvent(payload={"i": 1})))
    ok(world.state.handle(ReleaseAttachment()))
    return world.state.park(), world.clock


def test_a_parked_session_past_its_grace_expires_without_waking() -> None:
    parked, clock = parked_session(disconnect_grace_s=30.0)
    supervisor = machine(disconnect_grace_s=30.0)
    assert supervisor.parked_due(parked, clock.now + 29) is None
    assert supervisor.parked_due(parked, clock.now + 30) == ExpireParked()


def test_a_parked_session_with_events_past_their_ttl_is_pruned() -> None:
    parked, clock = parked_session(replay_ttl_s=10.0)
    supervisor = machine(replay_ttl_s=10.0)
    assert supervisor.parked_due(parked, clock.now) is None  # nothing old enough
    decision = supervisor.parked_due(parked, clock.now + 6)
    assert isinstance(decision, PruneParked)
    assert [e.sequence for e in decision.pruned.entries] == [2]


def test_a_parked_session_wakes_unless_the_registry_is_stopping() -> None:
    supervisor = machine()
    assert supervisor.wake() == WakeSession()
    supervisor.stop()
    supervisor.stop()  # idempotent: the shutdown and the join both say so
    assert supervisor.stopping
    assert supervisor.wake() == AnswerClosed()


# -- takeovers ---------------------------------------------------------------------------


def test_a_resume_of_a_routed_session_goes_to_it() -> None:
    supervisor = machine(takeovers_off_loop=True)
    assert supervisor.adopt("s", "call", routed=True) == RouteAdopted()
    assert supervisor.takeover_answered("s") == []


def test_a_takeover_in_the_turn_keeps_no_book() -> None:
    supervisor = machine(takeovers_off_loop=False)
    assert supervisor.adopt("s", "first", routed=False) == TakeOver(off_loop=False)
    assert supervisor.adopt("s", "second", routed=False) == TakeOver(off_loop=False)
    assert supervisor.takeover_answered("s") == []


def test_resumes_behind_a_takeover_off_the_loop_wait_for_its_answer_in_order() -> None:
    supervisor = machine(takeovers_off_loop=True)
    assert supervisor.adopt("s", "first", routed=False) == TakeOver(off_loop=True)
    assert supervisor.adopt("s", "second", routed=False) == WaitForTakeover()
    assert supervisor.adopt("s", "third", routed=False) == WaitForTakeover()
    assert supervisor.adopt("t", "other", routed=False) == TakeOver(off_loop=True)
    assert supervisor.takeover_answered("s") == ["first", "second", "third"]
    assert supervisor.takeover_answered("s") == []  # answered once
    # The next resume of it starts a takeover of its own.
    assert supervisor.adopt("s", "fourth", routed=False) == TakeOver(off_loop=True)


def test_a_stopping_registry_takes_nothing_over() -> None:
    supervisor = machine(takeovers_off_loop=True)
    supervisor.stop()
    assert supervisor.adopt("s", "call", routed=False) == RouteAdopted()
    assert supervisor.takeover_answered("s") == []


# -- the vocabulary ------------------------------------------------------------------------

DECISIONS = [
    getattr(machine_module, name)
    for name in machine_module.__all__
    if dataclasses.is_dataclass(getattr(machine_module, name))
]


@pytest.mark.parametrize("decision", DECISIONS, ids=lambda d: d.__name__)
def test_every_decision_is_a_frozen_slotted_keyword_only_dataclass(decision: type) -> None:
    params = decision.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    assert "__slots__" in decision.__dict__
    assert all(f.kw_only for f in dataclasses.fields(decision))
