"""RestartPolicy: the numbers the supervisor decides by (plain calls, no actors)."""

from __future__ import annotations

import pytest

from supervisor._policy import RestartPolicy
from supervisor._system_books import Timers


def test_intensity_counts_crashes_within_the_window_only() -> None:
    policy = RestartPolicy(max_restarts=2, within_s=60)
    times: list[float] = []
    for now in (0.0, 10.0):
        times.append(now)
        assert policy.allows_restart(times, now)
    times.append(20.0)
    assert not policy.allows_restart(times, 20.0)  # three within 60 s
    times.append(75.0)
    assert policy.allows_restart(times, 75.0)  # 0 and 10 have left the window
    assert times == [20.0, 75.0]


def test_escalation_is_off_by_default_and_counts_the_whole_registry() -> None:
    assert RestartPolicy().registry_healthy([0.0] * 1000, 0.0)
    policy = RestartPolicy(within_s=10, registry_max_restarts=2)
    crashes = [0.0, 1.0]
    assert policy.registry_healthy(crashes, 1.0)
    crashes.append(2.0)
    assert not policy.registry_healthy(crashes, 2.0)
    assert policy.registry_healthy(crashes, 10.5)  # 0.0 left the window
    assert crashes == [1.0, 2.0]


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0, jitter=0.0)
    assert [policy.backoff_s_for(n) for n in (0, 1, 2, 3, 4, 5)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert RestartPolicy().backoff_s_for(3) == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_restarts": -1},
        {"within_s": 0},
        {"backoff_s": -1},
        {"jitter": 2},
        {"registry_max_restarts": -1},
    ],
)
def test_nonsense_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**fields)  # type: ignore[arg-type]


def test_timers_fire_in_deadline_order_on_the_given_clock() -> None:
    now = [100.0]
    timers = Timers(lambda: now[0])
    assert timers.wait_s() is None  # nothing scheduled: block until a message
    timers.schedule(105.0, "b")
    timers.schedule(101.0, "a")
    timers.schedule(105.0, "c")
    assert timers.pop_due() is None
    assert timers.wait_s() == pytest.approx(min(1.0, Timers.POLL_S))
    now[0] = 105.0
    assert [timers.pop_due(), timers.pop_due(), timers.pop_due()] == ["a", "b", "c"]
    assert timers.pop_due() is None
    assert len(timers) == 0
