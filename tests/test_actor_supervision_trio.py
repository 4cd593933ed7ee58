"""Through the trio door: sessions failing past their budget while supervisors die."""

from __future__ import annotations

import pytest
import trio

from actors._commands import LifecycleEvent
from actors._errors import SessionCrashedError, SessionFailedError
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from tests.trio_support import LIMIT, Events, FakeClock, Wire, gone, registry

SESSIONS = 30


async def test_failures_past_the_budget_are_all_answered_and_counted() -> None:
    plan = FaultPlan()
    events: list[LifecycleEvent] = []
    with trio.fail_after(LIMIT * 3):
        async with registry(
            faults=plan, observer=events.append, restart_policy=RestartPolicy(max_restarts=0)
        ) as reg:
            wires = [Wire() for _ in range(SESSIONS)]
            for i, wire in enumerate(wires):
                await reg.create(f"s{i}", send=wire.send, close=wire.close)
            # Every crash report and departure notice meets dying supervisors.
            plan.crash_supervisor(times=3 * SESSIONS)
            answers: list[str] = []

            async def crash_then_call(i: int) -> None:
                plan.crash("has_attachment.enter", session_id=f"s{i}")
                try:
                    await reg.has_attachment(f"s{i}")
                except SessionCrashedError:
                    answers.append("crashed")
                try:
                    await reg.send_event(f"s{i}", {"n": 1})
                    answers.append("sent")
                except (SessionFailedError, KeyError):
                    answers.append("failed")

            async with trio.open_nursery() as nursery:
                for i in range(SESSIONS):
                    nursery.start_soon(crash_then_call, i)
            assert answers.count("crashed") == SESSIONS
            assert answers.count("failed") == SESSIONS
            plan.clear()
            for i in range(SESSIONS):
                await gone(reg, f"s{i}")
            stats = reg.stats()
            assert stats.sessions_failed == SESSIONS
            assert stats.sessions == 0
            assert stats.supervisor_takeovers >= 2 * SESSIONS
            assert all(wire.closes == ["session_failed"] for wire in wires)


async def test_a_crash_counts_at_its_own_time_not_when_the_supervisor_reads_it() -> None:
    # A fault-injection user's test: crash, jump the registry clock past the
    # window, crash again. Counted when the supervisor read it (which may be
    # after the jump), the first crash would share the window with the second
    # and spend a budget of one: the session closed ``session_failed``. Each
    # session replays the race once; on the old code most runs lost one.
    plan = FaultPlan()
    clock = FakeClock()
    events = Events()
    policy = RestartPolicy(max_restarts=1, within_s=60)
    with trio.fail_after(LIMIT):
        async with registry(
            clock=clock, faults=plan, observer=events, restart_policy=policy
        ) as reg:
            wires = [Wire() for _ in range(8)]
            for i, wire in enumerate(wires):
                session_id = f"s{i}"
                await reg.create(session_id, send=wire.send, close=wire.close)
                for _ in range(2):
                    plan.crash("send_event.recorded", session_id=session_id)
                    with pytest.raises(SessionCrashedError):
                        await reg.send_event(session_id, {"n": "boom"})
                    clock.advance(61)
                assert await reg.send_event(session_id, {"n": "ok"}) is not None
            stats = reg.stats()
            assert stats.restarts == 2 * len(wires)
            assert stats.sessions_failed == 0
            assert all(wire.closes == [] for wire in wires)
            assert not [e for e in events.events if e.kind == "failed"]
