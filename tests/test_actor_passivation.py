"""Passivation: idle detached sessions are parked as data and woken by their next message."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from actors._commands import SendEvent
from actors._errors import JournalGapError, SessionCrashedError, SessionFailedError
from actors._lifecycle import ParkedSession
from actors._session import SessionActor
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor.doors._threads import ThreadSessionRegistry
from tests.actor_support import (
    WAIT,
    Background,
    Events,
    FakeClock,
    GatedPlan,
    Wire,
    registry,
    settle,
)
from tests.helpers import ThreadReply

AFTER = 30.0


def _live(reg: ThreadSessionRegistry, session_id: str) -> list[SessionActor]:
    """The live actors that run ``session_id`` (none once it parked)."""
    return [a for a in reg.system.books.live_actors() if a.session_id == session_id]


def _park(reg: ThreadSessionRegistry, clock: FakeClock, events: Events, sid: str) -> None:
    """Let ``sid`` (detached) idle past the limit and wait until a sweep parked it."""
    parked_before = events.kinds(sid).count("passivated")
    clock.now += AFTER
    reg.sweep()

    def parked() -> bool:
        return events.kinds(sid).count("passivated") > parked_before

    deadline = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if parked():
            break
        deadline.wait(0.01)
    assert parked(), f"{sid} was not parked: {events.kinds(sid)}"
    assert _live(reg, sid) == []


def test_a_detached_idle_session_is_parked_and_its_next_message_brings_it_back() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        wire = Wire()
        created = reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        reg.send_events("s", [{"n": 1}, {"n": 2}])
        reg.create("attached", send=Wire().send_blocking, close=lambda r: None)
        assert reg.detach("s") is True
        _park(reg, clock, events, "s")
        assert _live(reg, "s") == []
        stats = reg.stats()
        assert (stats.sessions, stats.live, stats.parked, stats.passivated) == (2, 1, 1, 1)
        assert stats.events_journaled == 2  # the parked session's totals still count
        assert stats.bytes_retained > 0
        assert sorted(reg.session_ids()) == ["attached", "s"]
        assert "passivated" not in events.kinds("attached")
        # Parking is invisible: the next call wakes it and gets the same answer.
        assert reg.has_attachment("s") is False
        events.wait_for("reactivated", "s")
        second = Wire()
        result = reg.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=second.send_blocking,
            close=second.close_blocking,
        )
        assert [e.sequence for e in result.replay_entries] == [1, 2]
        assert result.attachment_generation == 2
        stats = reg.stats()
        assert (stats.live, stats.parked, stats.reactivated) == (2, 0, 1)


def test_a_parked_sessions_actor_is_freed_without_the_cycle_collector() -> None:
    """Parking 100,000 sessions must not leave 100,000 actor graphs (state,
    journal, outboxes) for the cycle collector to find: nothing of a session
    actor refers back to it, so it goes when its last reference does."""
    clock, events = FakeClock(), Events()
    gc.collect()
    gc.disable()
    try:
        with registry(clock=clock, observer=events) as reg:
            reg.create("s", send=Wire().send_blocking, close=lambda r: None)
            reg.send_event("s", {"n": 1})
            reg.detach("s")
            [actor] = _live(reg, "s")
            gone = weakref.ref(actor)
            del actor
            _park(reg, clock, events, "s")
            assert gone() is None
            assert reg.send_event("s", {"n": 2}).sequence == 2  # type: ignore[union-attr]
    finally:
        gc.enable()


def test_what_an_ended_actor_leaves_behind_is_safe_to_inspect() -> None:
    """A memory profiler (or a test) walks ``gc.get_objects()`` with
    ``isinstance``: a part of an ended actor still held by something (a
    traceback's frame, a debugger) must answer it, not raise ``ReferenceError``
    as a dead ``weakref.proxy`` does."""
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        [actor] = _live(reg, "s")
        link = actor._link  # held past its actor
        gone = weakref.ref(actor)
        del actor
        _park(reg, clock, events, "s")
        gc.collect()
        assert gone() is None
        for referent in gc.get_referents(link):
            assert not isinstance(referent, SessionActor)


def test_nothing_is_parked_too_early_attached_or_with_a_resume_claimed() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        for sid in ("early", "attached", "claimed"):
            reg.create(sid, send=Wire().send_blocking, close=lambda r: None)
        reg.detach("claimed")
        reg.begin_resume("claimed")
        clock.now += AFTER - 1
        reg.detach("early")  # detached only one second before the sweep below
        clock.now += 1
        reg.sweep()
        reg.sweep()  # a round trip behind the proposals of the first sweep
        for sid in ("early", "attached", "claimed"):
            assert reg.has_attachment(sid) is (sid == "attached")
        assert (reg.stats().passivated, reg.stats().parked) == (0, 0)


def test_passivation_off() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events, passivate_after_s=None) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        clock.now += 10 * AFTER
        reg.sweep()
        reg.sweep()
        assert reg.has_attachment("s") is False
        assert (reg.stats().passivated, reg.stats().parked) == (0, 0)


def test_messages_to_a_parked_session_are_handled_in_order_once() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        _park(reg, clock, events, "s")
        accepted: list[int] = []
        lock = threading.Lock()
        flushed = threading.Event()

        def accept(i: int) -> None:
            with lock:
                accepted.append(i)

        for i in range(200):
            reg.send_event_nowait("s", {"i": i})
        entry = reg.send_event("s", {"i": 200}, on_accepted=lambda: accept(200))
        assert entry is not None
        assert entry.sequence == 201
        result = reg.resume(
            "s",
            resume_token=created.resume_token.plaintext,
            last_received_server_event_seq=0,
            send=Wire().send_blocking,
            close=lambda r: None,
        )
        assert [e.payload["i"] for e in result.replay_entries] == list(range(201))
        assert [e.sequence for e in result.replay_entries] == list(range(1, 202))
        # on_accepted runs on the registry's dispatcher, in order: once this
        # later one ran, the one above ran (exactly once) before it.
        reg.send_event("s", {"i": 201}, on_accepted=flushed.set)
        assert flushed.wait(WAIT)
        assert accepted == [200]
        assert reg.stats().reactivated == 1


def test_at_most_one_live_actor_per_session_through_many_cycles() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        seen: list[int] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                # Live: registered with the books and not stopped (a parking
                # actor stops inside the mailbox's lock, before any wake-up).
                mine = [a for a in reg.system.books.live_actors() if a.session_id == "s"]
                seen.append(sum(not a.actor_stopped.is_set() for a in mine))

        watcher = Background(watch)
        for i in range(10):
            _park(reg, clock, events, "s")
            writers = [
                Background(lambda j=j: reg.send_event("s", {"j": j}))  # type: ignore[misc]
                for j in range(4)
            ]
            for writer in writers:
                writer.result()
            assert reg.stats().reactivated == i + 1
        stop.set()
        watcher.result()
        assert seen
        assert max(seen) == 1
        # The observer hears each parking before the wake-up that ends it.
        for _ in range(int(WAIT / 0.01)):
            if events.kinds("s").count("reactivated") == 10:
                break
            stop.wait(0.01)
        cycle = [k for k in events.kinds("s") if k in ("passivated", "reactivated")]
        assert cycle == ["passivated", "reactivated"] * 10


def test_a_passivation_aborts_if_a_message_arrived_meanwhile() -> None:
    clock, events, plan = FakeClock(), Events(), GatedPlan()
    with registry(clock=clock, observer=events, faults=plan) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        plan.gate("passivate.enter", "s")
        clock.now += AFTER
        # Not a blocking sweep(): the gate holds the registry's loop, where
        # the session runs (and the door's own ticker may sweep first).
        reg.system.sweep(ThreadReply())
        assert plan.reached.wait(WAIT)
        # The session is inside its passivation; this reaches its mailbox
        # before it parks (straight to the system: the door may defer calls).
        first = ThreadReply()
        reg.system.call("s", SendEvent(payload={"n": 1}), first)
        plan.release.set()
        assert first.wait(WAIT).sequence == 1
        entry = reg.send_event("s", {"n": 2})
        assert entry is not None
        assert entry.sequence == 2
        assert (reg.stats().passivated, reg.stats().parked) == (0, 0)


def test_ttl_and_grace_expire_a_parked_session_without_waking_it() -> None:
    clock, events = FakeClock(), Events()
    with registry(
        clock=clock, observer=events, replay_ttl_s=100.0, disconnect_grace_s=1000.0
    ) as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.send_events("s", [{"n": 1}, {"n": 2}])
        reg.create("gone", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        reg.detach("gone")
        _park(reg, clock, events, "s")
        events.wait_for("passivated", "gone")
        assert reg.stats().bytes_retained > 0
        clock.now += 100
        reg.sweep()  # past the TTL: the parked journal is pruned as data
        assert reg.stats().bytes_retained == 0
        clock.now += 1000
        reg.sweep()  # past the grace: both expire, parked
        events.wait_for("expired", "gone")
        events.wait_for("closed", "s")
        assert "reactivated" not in events.kinds()
        stats = reg.stats()
        assert (stats.sessions, stats.parked, stats.sessions_expired) == (0, 0, 2)
        with pytest.raises(KeyError):
            reg.authenticate_resume(
                "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=0
            )


def test_a_sweep_visits_a_parked_session_only_once_its_ttl_or_grace_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    visits: list[str] = []
    expired = ParkedSession.expired

    def counted(self: ParkedSession, now: float, disconnect_grace_s: float | None) -> bool:
        visits.append(self.session_id)
        return expired(self, now, disconnect_grace_s)

    monkeypatch.setattr(ParkedSession, "expired", counted)
    clock, events = FakeClock(), Events()
    with registry(
        clock=clock, observer=events, replay_ttl_s=100.0, disconnect_grace_s=1000.0
    ) as reg:
        reg.create("events", send=Wire().send_blocking, close=lambda r: None)
        reg.send_events("events", [{"n": 1}])
        reg.create("quiet", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("events")
        reg.detach("quiet")
        _park(reg, clock, events, "events")
        events.wait_for("passivated", "quiet")
        for _ in range(3):
            clock.now += 20
            reg.sweep()  # nothing due: neither parked session is looked at
        assert visits == []
        clock.now += 50  # past the event's TTL (parked at 30, sent at 0)
        reg.sweep()
        assert visits == ["events"]
        assert reg.stats().bytes_retained == 0
        clock.now += 20
        reg.sweep()  # pruned: nothing due until the grace runs out
        assert visits == ["events"]
        clock.now += 1000
        reg.sweep()
        events.wait_for("expired", "quiet")
        events.wait_for("expired", "events")
        assert sorted(visits) == ["events", "events", "quiet"]
        assert reg.stats().parked == 0


def test_ttl_pruned_while_parked_is_a_ttl_gap_after_waking() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events, replay_ttl_s=100.0) as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.send_events("s", [{"n": 1}, {"n": 2}])
        reg.detach("s")
        _park(reg, clock, events, "s")
        clock.now += 100
        reg.sweep()
        with pytest.raises(JournalGapError) as info:
            reg.authenticate_resume(
                "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=0
            )
        assert info.value.reason == "ttl"
        reg.authenticate_resume(
            "s", resume_token=created.resume_token.plaintext, last_received_server_event_seq=2
        )


@pytest.mark.parametrize("failpoint", ["passivate.enter", "passivate.parked"])
def test_a_crash_while_passivating_leaves_the_session_live(failpoint: str) -> None:
    clock, events, plan = FakeClock(), Events(), FaultPlan()
    with registry(clock=clock, observer=events, faults=plan) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.send_event("s", {"n": 1})
        reg.detach("s")
        plan.crash(failpoint, session_id="s")
        clock.now += AFTER
        reg.sweep()
        assert reg.has_attachment("s") is False  # a round trip behind the proposal
        assert plan.fired[failpoint] == 1
        assert reg.stats().parked == 0
        assert reg.stats().crashes == 1
        assert reg.send_event("s", {"n": 2}).sequence == 2  # type: ignore[union-attr]
        reg.detach("s")
        _park(reg, clock, events, "s")  # and a later sweep parks it
        assert reg.stats().parked == 1


@pytest.mark.parametrize("failpoint", ["reactivate.enter", "reactivate.restored"])
def test_a_crash_while_reactivating_is_retried_and_loses_nothing(failpoint: str) -> None:
    clock, events, plan = FakeClock(), Events(), FaultPlan()
    with registry(clock=clock, observer=events, faults=plan) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.send_event("s", {"n": 1})
        reg.detach("s")
        _park(reg, clock, events, "s")
        plan.crash(failpoint, session_id="s")
        entry = reg.send_event("s", {"n": 2})
        assert entry is not None
        assert entry.sequence == 2
        assert plan.fired[failpoint] == 1
        stats = reg.stats()
        assert (stats.crashes, stats.reactivated, stats.parked) == (1, 1, 0)
        # The incarnation that failed to start is not counted as live.
        assert [a.session_id for a in reg.system.books.live_actors()] == ["s"]


def test_a_session_that_cannot_reactivate_is_failed_never_lost() -> None:
    clock, events, plan = FakeClock(), Events(), FaultPlan()
    policy = RestartPolicy(max_restarts=0)
    with registry(clock=clock, observer=events, faults=plan, restart_policy=policy) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        _park(reg, clock, events, "s")
        plan.crash("reactivate.enter", session_id="s")
        late = Background(lambda: reg.send_event("s", {"n": 1}))
        assert isinstance(late.error(), SessionFailedError)
        failed = events.wait_for("failed", "s")
        # Told as a live session's failure is: with its generations.
        assert (failed.attachment_generation, failed.lease_generation) == (1, 0)
        assert failed.reason == "session_failed"
        settle(reg, "s")
        with pytest.raises(KeyError):
            reg.send_event("s", {"n": 2})
        stats = reg.stats()
        assert (stats.sessions, stats.parked, stats.sessions_failed) == (0, 0, 1)


def test_shutdown_answers_messages_queued_for_a_parked_session() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        _park(reg, clock, events, "s")
    # The registry shut down with the session parked: nothing hangs.
    assert reg.stats().parked == 0


def test_a_session_proposed_parking_with_an_event_past_its_ttl_is_pruned_by_that_sweep() -> None:
    # The sweep's tick rides with the proposal; the session parks without it
    # only if it would change nothing. Here it prunes first, then parks.
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events, replay_ttl_s=10.0) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.send_events("s", [{"n": 1}])
        reg.detach("s")
        _park(reg, clock, events, "s")  # past the TTL and the passivation limit
        stats = reg.stats()
        assert (stats.parked, stats.bytes_retained) == (1, 0)


def test_a_session_past_its_grace_when_proposed_parking_expires_instead() -> None:
    clock, events = FakeClock(), Events()
    with registry(clock=clock, observer=events, disconnect_grace_s=AFTER / 2) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        clock.now += AFTER
        reg.sweep()
        events.wait_for("closed", "s")
        assert "passivated" not in events.kinds("s")
        assert "expired" in events.kinds("s")


def test_a_sweep_is_answered_when_a_session_leaves_holding_its_proposal() -> None:
    # A suspended session holds the proposal (and the tick riding with it);
    # shut down before its restart, it answers that tick: the sweep returns.
    clock, events, plan = FakeClock(), Events(), FaultPlan()
    policy = RestartPolicy(backoff_s=1000.0, max_backoff_s=1000.0, jitter=0.0)
    with registry(clock=clock, observer=events, faults=plan, restart_policy=policy) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("s")
        plan.crash("acknowledge.enter", session_id="s")
        with pytest.raises(SessionCrashedError):
            reg.acknowledge("s", 0)
        clock.now += AFTER
        (suspended,) = _live(reg, "s")
        sweep = Background(reg.sweep)
        waited = threading.Event()
        while not len(suspended._holding) and not sweep.finished_within(0):
            waited.wait(0.01)  # until the session holds the proposal
        reg.shutdown()
        assert sweep.result() is None
