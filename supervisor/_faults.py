"""FaultPlan: the one way to inject faults, for our tests and yours.

Pass a plan to a registry (``faults=plan``) and arm it while the system runs:

* ``plan.crash("send_event.recorded", session_id="s1", times=2)``: the next two
  times session ``s1`` passes that failpoint, the handler raises
  `InjectedFaultError` (a crash, not a domain error). ``session_id=None``
  means any session. `FAILPOINTS` lists the names of the commands'
  steps; `LIFECYCLE_FAILPOINTS` those of passivation (``passivate.*``:
  the session stays live) and reactivation (``reactivate.*``: the session
  stays parked, and the supervisor decides as for any crash).
* ``plan.crash_supervisor(times=1)``: the supervisor actor dies on its next
  message; the registry starts a new one that takes the routing over.
* ``plan.jump_clock(seconds)``: the registry's clock leaps forward (TTL and
  disconnect grace see it at the next sweep).
* ``plan.fail_send("s1", nth=3)``, ``plan.hang_send(...)``,
  ``plan.delay_send(..., seconds=0.5)``: the 3rd send (counted per attachment
  from 1) of session ``s1``'s attachment ``generation`` (any, if ``None``)
  raises, never returns, or starts late. ``plan.fail_close("s1")``: that
  session's next transport close raises. Transport faults act in every
  door's outbox (the thread door's too), in front of the transport's own
  ``send``.

Thread-safe: arm it from any thread while sessions hit it from theirs.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from actors._state import FAILPOINTS, LIFECYCLE_FAILPOINTS

__all__ = [
    "FAILPOINTS",
    "LIFECYCLE_FAILPOINTS",
    "FaultPlan",
    "InjectedFaultError",
    "TransportAction",
]


class InjectedFaultError(RuntimeError):
    """Raised at an armed failpoint. A crash by design: not a SessionError."""


@dataclass(frozen=True, slots=True)
class TransportAction:
    """What a transport fault does to one send."""

    kind: str  # "fail" | "hang" | "delay"
    seconds: float = 0.0
    error: BaseException | None = None

    async def apply(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        if self.kind == "fail":
            raise self.error or ConnectionResetError("injected send failure")
        await sleep(math.inf if self.kind == "hang" else self.seconds)


@dataclass(slots=True)
class _SendRule:
    session_id: str
    generation: int | None
    nth: int
    action: TransportAction


@dataclass(slots=True)
class _Rule:
    failpoint: str
    session_id: str | None
    remaining: int


class FaultPlan:
    """Faults to inject into a registry, for tests: pass ``faults=plan`` to any door.

    Arm faults before or while the registry runs; each fires as many times
    as armed, then disarms. ``hits`` counts every failpoint reached and
    ``fired`` every fault that fired, by name. Thread-safe.

    Example::

        plan = FaultPlan()
        plan.crash("send_event.recorded", session_id="s1")
        plan.fail_send("s1", nth=3)
        plan.jump_clock(60)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._supervisor_crashes = 0
        self._clock_offset = 0.0
        self._send_rules: list[_SendRule] = []
        self._close_failures: Counter[str] = Counter()
        self.hits: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()

    @staticmethod
    def failpoint_names() -> tuple[str, ...]:
        """The commands' failpoints, ``"<command>.<step>"`` (see also
        `lifecycle_failpoint_names`)."""
        return FAILPOINTS

    @staticmethod
    def lifecycle_failpoint_names() -> tuple[str, ...]:
        """Passivation's and reactivation's failpoints."""
        return LIFECYCLE_FAILPOINTS

    # -- arming ---------------------------------------------------------------

    def crash(self, failpoint: str, *, session_id: str | None = None, times: int = 1) -> None:
        """Crash the next ``times`` passes of ``failpoint`` (of ``session_id``, or any).

        At a command's failpoint the command's caller gets
        ``SessionCrashedError`` and the supervisor decides (see
        ``RestartPolicy``); at a lifecycle one (``passivate.*``,
        ``reactivate.*``) no caller sees it: the session stays live, or
        parked until the supervisor restarts or closes it.

        Raises:
            ValueError: an unknown failpoint, or ``times < 1``.
        """
        if failpoint not in FAILPOINTS and failpoint not in LIFECYCLE_FAILPOINTS:
            raise ValueError(f"unknown failpoint {failpoint!r}; see FaultPlan.failpoint_names()")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._rules.append(_Rule(failpoint, session_id, times))

    def crash_supervisor(self, *, times: int = 1) -> None:
        """Crash the supervisor on its next ``times`` messages; a new one takes over."""
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._supervisor_crashes += times

    def jump_clock(self, seconds: float) -> None:
        """Move the registry's clock forward by ``seconds`` (TTLs and grace see it).

        Raises:
            ValueError: a negative jump.
        """
        if seconds < 0:
            raise ValueError("the clock only jumps forward")
        with self._lock:
            self._clock_offset += seconds

    def fail_send(
        self,
        session_id: str,
        *,
        nth: int = 1,
        generation: int | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Make the ``nth`` send of the session's attachment raise ``error``.

        ``ConnectionResetError`` by default; ``generation`` limits it to one
        attachment generation. Sends are counted per attachment, from 1.
        """
        self._add_send(session_id, generation, nth, TransportAction("fail", error=error))

    def hang_send(self, session_id: str, *, nth: int = 1, generation: int | None = None) -> None:
        """Make the ``nth`` send of the session's attachment hang (until ``send_timeout_s``)."""
        self._add_send(session_id, generation, nth, TransportAction("hang"))

    def delay_send(
        self, session_id: str, *, seconds: float, nth: int = 1, generation: int | None = None
    ) -> None:
        """Delay the ``nth`` send of the session's attachment by ``seconds`` (real time)."""
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self._add_send(session_id, generation, nth, TransportAction("delay", seconds=seconds))

    def fail_close(self, session_id: str, *, times: int = 1) -> None:
        """Make the next ``times`` transport closes of the session fail (logged, ignored)."""
        with self._lock:
            self._close_failures[session_id] += times

    def clear(self) -> None:
        """Disarm every fault (clock jumps stay)."""
        with self._lock:
            self._rules.clear()
            self._send_rules.clear()
            self._close_failures.clear()
            self._supervisor_crashes = 0

    # -- what the system calls ------------------------------------------------------

    def hit(self, name: str, session_id: str) -> None:
        """The `Failpoints` hook: raise if armed here."""
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
        """The supervisor's hook: raise if a supervisor crash is armed."""
        with self._lock:
            if self._supervisor_crashes == 0:
                return
            self._supervisor_crashes -= 1
            self.fired["supervisor"] += 1
        raise InjectedFaultError(f"injected supervisor crash at {step}")

    def transport_action(
        self, session_id: str, generation: int, nth: int
    ) -> TransportAction | None:
        """The fault armed for this send, if any (each rule fires once)."""
        with self._lock:
            for rule in self._send_rules:
                if (
                    rule.session_id == session_id
                    and rule.nth == nth
                    and rule.generation in (None, generation)
                ):
                    self._send_rules.remove(rule)
                    self.fired[f"send.{rule.action.kind}"] += 1
                    return rule.action
        return None

    def check_close(self, session_id: str) -> None:
        """The outbox's hook before a transport close: raise if a close failure is armed."""
        with self._lock:
            if self._close_failures[session_id] <= 0:
                return
            self._close_failures[session_id] -= 1
            self.fired["close.fail"] += 1
        raise InjectedFaultError(f"injected close failure in session {session_id}")

    def _add_send(
        self, session_id: str, generation: int | None, nth: int, action: TransportAction
    ) -> None:
        if nth < 1:
            raise ValueError("nth counts sends from 1")
        with self._lock:
            self._send_rules.append(_SendRule(session_id, generation, nth, action))

    def clock(self, base: Callable[[], float]) -> Callable[[], float]:
        """``base`` shifted by every jump so far (and every later one)."""

        def shifted() -> float:
            return base() + self._clock_offset

        return shifted
