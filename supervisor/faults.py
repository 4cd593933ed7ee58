"""FaultPlan: the one way to inject faults, for our tests and yours.

Pass a plan to a registry (``faults=plan``) and arm it while the system runs:

* ``plan.crash("send_event.recorded", session_id="s1", times=2)``: the next two
  times session ``s1`` passes that failpoint, the handler raises
  :class:`InjectedFaultError` (a crash, not a domain error). ``session_id=None``
  means any session. :data:`FAILPOINTS` lists the names.
* ``plan.crash_supervisor(times=1)``: the supervisor actor dies on its next
  message; the registry starts a new one that takes the routing over.
* ``plan.jump_clock(seconds)``: the registry's clock leaps forward (TTL and
  disconnect grace see it at the next sweep).

Thread-safe: arm it from any thread while sessions hit it from theirs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from actors.state import FAILPOINTS

__all__ = ["FAILPOINTS", "FaultPlan", "InjectedFaultError"]


class InjectedFaultError(RuntimeError):
    """Raised at an armed failpoint. A crash by design: not a SessionError."""


@dataclass(slots=True)
class _Rule:
    failpoint: str
    session_id: str | None
    remaining: int


class FaultPlan:
    """Armed faults; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._supervisor_crashes = 0
        self._clock_offset = 0.0
        self.hits: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()

    @staticmethod
    def failpoint_names() -> tuple[str, ...]:
        return FAILPOINTS

    # -- arming ---------------------------------------------------------------

    def crash(self, failpoint: str, *, session_id: str | None = None, times: int = 1) -> None:
        if failpoint not in FAILPOINTS:
            raise ValueError(f"unknown failpoint {failpoint!r}; see FaultPlan.failpoint_names()")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._rules.append(_Rule(failpoint, session_id, times))

    def crash_supervisor(self, *, times: int = 1) -> None:
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._supervisor_crashes += times

    def jump_clock(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only jumps forward")
        with self._lock:
            self._clock_offset += seconds

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._supervisor_crashes = 0

    # -- what the system calls ------------------------------------------------------

    def hit(self, name: str, session_id: str) -> None:
        """The :class:`~actors.state.Failpoints` hook: raise if armed here."""
        with self._lock:
            self.hits[name] += 1
            for rule in self._rules:
                if rule.failpoint == name and rule.session_id in (None, session_id):
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
                    self.fired[name] += 1
                    break
            else:
                return
        raise InjectedFaultError(f"injected fault at {name} in session {session_id}")

    def supervisor_hit(self, step: str) -> None:
        with self._lock:
            if self._supervisor_crashes == 0:
                return
            self._supervisor_crashes -= 1
            self.fired["supervisor"] += 1
        raise InjectedFaultError(f"injected supervisor crash at {step}")

    def clock(self, base: Callable[[], float]) -> Callable[[], float]:
        """``base`` shifted by every jump so far (and every later one)."""

        def shifted() -> float:
            return base() + self._clock_offset

        return shifted
