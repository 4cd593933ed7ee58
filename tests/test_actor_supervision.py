"""The supervisor decides: restart, close, escalate; and no message to it is dropped."""

from __future__ import annotations

import sys
import threading
from types import FrameType

import pytest

from actors._errors import SessionCrashedError, SessionFailedError
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor._system import SupervisorActor
from tests.actor_support import WAIT, Background, Events, FakeClock, Wire, registry, settle

THREADS, PER_THREAD = 8, 40


def test_every_create_is_answered_while_supervisors_keep_dying() -> None:
    plan = FaultPlan()
    with registry(faults=plan) as reg:
        # Successors die on their first message again and again, while eight
        # threads keep creating.
        deaths = THREADS * PER_THREAD // 2
        plan.crash_supervisor(times=deaths)
        outcomes: list[str] = []
        lock = threading.Lock()

        def creator(n: int) -> None:
            for i in range(PER_THREAD):
                try:
                    reg.create(f"t{n}-{i}", send=Wire().send_blocking, close=lambda r: None)
                    outcome = "created"
                except SessionCrashedError:
                    outcome = "crashed"
                with lock:
                    outcomes.append(outcome)

        workers = [Background(lambda n=n: creator(n)) for n in range(THREADS)]  # type: ignore[misc]
        for worker in workers:
            worker.result(timeout=60)  # a create never answered would hang here
        assert len(outcomes) == THREADS * PER_THREAD
        assert outcomes.count("crashed") == plan.fired["supervisor"] == deaths
        assert len(reg.session_ids()) == outcomes.count("created")
        assert reg.close("\x00barrier") is None  # a round trip to the last successor
        assert reg.stats().supervisor_takeovers == deaths


def test_departure_notices_survive_dying_supervisors() -> None:
    plan = FaultPlan()
    events = Events()
    policy = RestartPolicy(max_restarts=0)
    n = 20
    with registry(faults=plan, observer=events, restart_policy=policy) as reg:
        for i in range(n):
            reg.create(f"s{i}", send=Wire().send_blocking, close=lambda r: None)
        # Every crash report and every departure notice meets a dying supervisor.
        plan.crash_supervisor(times=4 * n)
        for i in range(n):
            plan.crash("has_attachment.enter", session_id=f"s{i}")
            with pytest.raises(SessionCrashedError):
                reg.has_attachment(f"s{i}")
        for i in range(n):
            events.wait_for("failed", f"s{i}")
            settle(reg, f"s{i}")
        plan.clear()
        stats = reg.stats()
        assert stats.sessions_failed == n
        assert stats.sessions == 0
        assert reg.session_ids() == []


def test_backoff_is_a_supervisor_timer_and_the_session_thread_never_sleeps() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(backoff_s=3600.0, max_backoff_s=3600.0, jitter=0.0)
    with registry(clock=clock, faults=plan, observer=events, restart_policy=policy) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        plan.crash("send_event.recorded", session_id="s")
        with pytest.raises(SessionCrashedError):
            reg.send_event("s", {"n": "boom"})
        held = Background(lambda: reg.send_event("s", {"n": 1}))
        # The session holds it for the supervisor's decision: an hour away.
        assert not held.finished_within(0.2)
        assert "restarted" not in events.kinds("s")
        # Its thread is not asleep: it answers a shutdown's stop at once
        # (below), and the supervisor's timer fires when the clock says so.
        clock.now += 3600
        reg.sweep()
        entry = held.result()
        assert entry.sequence == 1
        events.wait_for("restarted", "s")
        assert reg.stats().restarts == 1


def test_a_held_session_answers_the_registry_shutdown_at_once() -> None:
    plan = FaultPlan()
    policy = RestartPolicy(backoff_s=3600.0, max_backoff_s=3600.0, jitter=0.0)
    reg_cm = registry(faults=plan, restart_policy=policy)
    reg = reg_cm.__enter__()
    try:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        plan.crash("send_event.recorded", session_id="s")
        with pytest.raises(SessionCrashedError):
            reg.send_event("s", {"n": "boom"})
        held = Background(lambda: reg.send_event("s", {"n": 1}))
        assert not held.finished_within(0.2)
    finally:
        closing = Background(lambda: reg_cm.__exit__(None, None, None))
        # A session sleeping its backoff would keep shutdown waiting an hour.
        closing.result(timeout=WAIT)
    error = held.error()
    assert error is not None
    assert type(error).__name__ == "RegistryClosedError"


def test_the_supervisor_closes_a_session_past_its_budget() -> None:
    plan = FaultPlan()
    events = Events()
    policy = RestartPolicy(max_restarts=1)
    with registry(faults=plan, observer=events, restart_policy=policy) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        for _ in range(2):
            plan.crash("send_event.recorded", session_id="s")
            with pytest.raises(SessionCrashedError):
                reg.send_event("s", {"n": "boom"})
        events.wait_for("failed", "s")
        assert wire.closed.wait_blocking(WAIT)
        assert wire.closes == ["session_failed"]
        settle(reg, "s")
        with pytest.raises(KeyError):
            reg.send_event("s", {"n": "late"})
        assert reg.has_attachment("s") is False
        stats = reg.stats()
        assert (stats.crashes, stats.restarts, stats.sessions_failed) == (2, 1, 1)


def test_messages_held_behind_a_crash_the_supervisor_gives_up_on_are_failed() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=0, backoff_s=0.0)
    with registry(clock=clock, faults=plan, restart_policy=policy) as reg:
        reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        plan.crash("send_event.recorded", session_id="s")
        with pytest.raises(SessionCrashedError):
            reg.send_event("s", {"n": "boom"})
        late = Background(lambda: reg.send_event("s", {"n": 1}))
        error = late.error()
        # Held for the decision, then failed with it (or, if it came after
        # the session left, the unknown-session answer): never a hang.
        assert isinstance(error, SessionFailedError | KeyError), repr(error)


def test_escalation_past_the_registry_wide_limit() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(max_restarts=5, within_s=60, registry_max_restarts=2)
    with registry(clock=clock, faults=plan, observer=events, restart_policy=policy) as reg:
        for sid in ("a", "b", "c"):
            reg.create(sid, send=Wire().send_blocking, close=lambda r: None)
        for sid in ("a", "b"):
            plan.crash("has_attachment.enter", session_id=sid)
            with pytest.raises(SessionCrashedError):
                reg.has_attachment(sid)
            assert reg.has_attachment(sid) is True  # restarted: within the limit
        assert reg.stats().healthy is True
        plan.crash("has_attachment.enter", session_id="c")
        with pytest.raises(SessionCrashedError):
            reg.has_attachment("c")
        # The third crash in the window: the supervisor escalates instead of
        # restarting "c" again and again.
        unhealthy = events.wait_for("registry_unhealthy", "")
        assert unhealthy.reason is not None
        events.wait_for("failed", "c")
        settle(reg, "c")
        stats = reg.stats()
        assert stats.healthy is False
        assert stats.escalations == 1
        assert stats.sessions_failed == 1
        assert sorted(reg.session_ids()) == ["a", "b"]
        # Once the window has passed, the registry is healthy again.
        clock.now += 61
        reg.sweep()
        events.wait_for("registry_healthy", "")
        assert reg.stats().healthy is True


def _writer() -> str:
    """Who writes: the supervisor (its handler is on the stack) or someone else."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is SupervisorActor.on_receive.__code__:
            return "supervisor"
        frame = frame.f_back
    return threading.current_thread().name


class _WatchedRoutes(dict[str, object]):
    """A routing table that remembers who wrote it."""

    writers: set[str]

    def __setitem__(self, key: str, value: object) -> None:
        self.writers.add(_writer())
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.writers.add(_writer())
        super().__delitem__(key)

    def pop(self, key: str, *default: object) -> object:
        self.writers.add(_writer())
        return super().pop(key, *default)


def test_only_the_supervisor_writes_the_routing_table() -> None:
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(max_restarts=1)
    with registry(clock=clock, faults=plan, observer=events, restart_policy=policy) as reg:
        routes = _WatchedRoutes()
        routes.writers = set()
        reg.system._routes = routes  # type: ignore[assignment]
        reg.create("a", send=Wire().send_blocking, close=lambda r: None)
        reg.create("b", send=Wire().send_blocking, close=lambda r: None)
        plan.crash("close.enter", session_id="a")
        with pytest.raises(SessionCrashedError):
            reg.close("a")  # a crashed close puts the session back in the table
        events.wait_for("restarted", "a")  # the crash report reached the supervisor
        plan.crash_supervisor()
        with pytest.raises(SessionCrashedError):
            reg.create("c", send=Wire().send_blocking, close=lambda r: None)
        reg.create("c", send=Wire().send_blocking, close=lambda r: None)
        reg.detach("b")
        clock.now += 30
        reg.sweep()
        events.wait_for("passivated", "b")
        assert reg.has_attachment("b") is False  # woken
        for _ in range(2):  # past its budget: the supervisor closes it
            plan.crash("send_event.recorded", session_id="c")
            with pytest.raises(SessionCrashedError):
                reg.send_event("c", {"n": 1})
        events.wait_for("failed", "c")
        settle(reg, "c")
        assert reg.close("a") is not None
        assert sorted(reg.session_ids()) == ["b"]
        assert routes.writers
        assert routes.writers == {"supervisor"}, routes.writers
