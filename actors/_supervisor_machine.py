"""The supervisor's decisions, pure: supervisor messages in, decisions out.

`SupervisorMachine` is to the supervisor what `SessionState` is to a session:
plain calls in (a crash, a sweep, a wake-up, a resume for a session held
elsewhere), frozen decisions out (restart now, restart after a backoff,
close, escalate or recover, park, wake, take over). It keeps the books that
decide (each session's crash window, the registry's, its health, whether it
is stopping, the takeovers the store has not answered yet) and carries out
nothing: `supervisor._system.SessionSystem` starts and tells actors, runs
timers, calls the store and tells the observer. OTP's split: a supervisor's
decisions are a callback module; the routing table (the shell's) is a
separate thing with its own writer.

Every call comes from the supervisor's turns (one at a time, on the
registry's loop; once the registry is shut down and no supervisor is left,
from whoever is refused), so there is no lock; no clock either: each call
that needs the time says when.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from actors._lifecycle import ParkedSession
from actors._transition import SessionConfig

__all__ = [
    "AnswerClosed",
    "CloseParked",
    "CrashFacts",
    "Escalate",
    "ExpireParked",
    "FailSuspended",
    "Park",
    "PruneParked",
    "Recover",
    "RestartAfter",
    "RestartLimits",
    "RestartNow",
    "RouteAdopted",
    "SupervisorMachine",
    "TakeOver",
    "WaitForTakeover",
    "WakeSession",
]

CallT = TypeVar("CallT")


class RestartLimits(Protocol):
    """The numbers a restart is decided by (`supervisor.RestartPolicy`)."""

    @property
    def within_s(self) -> float: ...

    def allows_restart(self, crash_times: list[float], now: float) -> bool: ...

    def registry_healthy(self, crash_times: list[float], now: float) -> bool: ...

    def backoff_s_for(self, restarts: int) -> float: ...


class CrashFacts(Protocol):
    """What a crash report says that a decision needs (`actors._supervisor_mail.CrashReport`)."""

    @property
    def session_id(self) -> str: ...

    @property
    def during(self) -> Literal["handle", "reactivate"]: ...

    @property
    def crashed_at(self) -> float: ...

    @property
    def state_sound(self) -> bool: ...

    @property
    def retry_crashed(self) -> bool: ...


# -- decisions ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartNow:
    """Let the crashed session go on (restart it, or wake it again) at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartAfter:
    """As `RestartNow`, when a timer of ``delay_s`` (registry clock) fires."""

    delay_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FailSuspended:
    """Give up on a session whose handler crashed: its suspended actor closes it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseParked:
    """Give up on a session that crashed waking: close it from its parked data."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalate:
    """The registry turned unhealthy: ``crashes`` within ``within_s`` passed its limit."""

    crashes: int
    within_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Recover:
    """The registry is healthy again: ``crashes`` within ``within_s`` are within its limit."""

    crashes: int
    within_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Park:
    """Propose parking to an idle, detached session (it re-checks in its turn)."""

    now: float
    after_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireParked:
    """A parked session outlived its disconnect grace: close it without waking it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneParked:
    """A parked session's oldest events outlived their TTL: keep ``pruned`` instead."""

    pruned: ParkedSession


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeSession:
    """Start an actor from a parked session's data."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerClosed:
    """The registry is stopping: answer what the session holds, start nothing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteAdopted:
    """The session is routed here now (or the registry stops): hand it the call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitForTakeover:
    """A takeover of this session is with the store: the call waits for its answer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TakeOver:
    """Take the session over from the store: off the loop (``off_loop``, the
    answer comes back as a message) or in this turn."""

    off_loop: bool


CrashDecision = RestartNow | RestartAfter | FailSuspended | CloseParked | Escalate | Recover
HealthDecision = Escalate | Recover
AdoptDecision = RouteAdopted | WaitForTakeover | TakeOver


class SupervisorMachine(Generic[CallT]):
    """One registry's supervisor decisions and the books they are made from.

    ``CallT`` is whatever the shell queues behind a takeover (its calls);
    the machine only holds them in order.
    """

    def __init__(
        self,
        *,
        limits: RestartLimits,
        config: SessionConfig,
        passivate_after_s: float | None,
        takeovers_off_loop: bool = False,
    ) -> None:
        self.limits = limits
        self.config = config
        self.passivate_after_s = passivate_after_s
        self._takeovers_off_loop = takeovers_off_loop
        #: Per session id: its crashes within the window, in order, each at
        #: the time it happened (its report's stamp), not when it was read.
        self.crash_times: dict[str, list[float]] = {}
        #: The whole registry's crashes within the window (escalation), likewise.
        self.registry_crashes: list[float] = []
        self.healthy = True
        #: Shutdown began: nothing starts, wakes or is taken over any more.
        self.stopping = False
        # Takeovers with the store: the calls waiting for each, in order.
        self._adopting: dict[str, list[CallT]] = {}

    # -- crashes and health ------------------------------------------------------------

    def crashed(self, crash: CrashFacts) -> tuple[CrashDecision, ...]:
        """Decide on one crash (OTP's intensity, then escalation).

        Counted at ``crash.crashed_at``: a report that waited in the inbox
        while the clock moved spends the budget of the window it crashed in.
        A health change, if any, comes first, then what becomes of the session.
        """
        at = crash.crashed_at
        bisect.insort(self.registry_crashes, at)
        health = self._judge_health(at)
        times = self.crash_times.setdefault(crash.session_id, [])
        bisect.insort(times, at)
        restart = (
            self.healthy
            and crash.state_sound
            and not crash.retry_crashed
            and self.limits.allows_restart(times, at)
        )
        outcome: CrashDecision
        if not restart:
            outcome = FailSuspended() if crash.during == "handle" else CloseParked()
        else:
            delay = self.limits.backoff_s_for(len(times))
            outcome = RestartAfter(delay_s=delay) if delay > 0 else RestartNow()
        return (*health, outcome)

    def swept(self, now: float) -> tuple[HealthDecision, ...]:
        """A sweep at ``now``: crashes that left the window may make the registry healthy."""
        return self._judge_health(now)

    def _judge_health(self, now: float) -> tuple[HealthDecision, ...]:
        healthy = self.limits.registry_healthy(self.registry_crashes, now)
        if healthy == self.healthy:
            return ()
        self.healthy = healthy
        crashes, within_s = len(self.registry_crashes), self.limits.within_s
        if healthy:
            return (Recover(crashes=crashes, within_s=within_s),)
        return (Escalate(crashes=crashes, within_s=within_s),)

    def session_left(self, session_id: str) -> None:
        """The session left the routing table: a new one of that id starts afresh."""
        self.crash_times.pop(session_id, None)

    # -- parking and waking --------------------------------------------------------------

    def park(self, now: float, idle_since: float | None) -> Park | None:
        """A sweep's proposal to a live session idle (detached) since ``idle_since``."""
        after_s = self.passivate_after_s
        if after_s is None or idle_since is None or now - idle_since < after_s:
            return None
        return Park(now=now, after_s=after_s)

    def parked_due(self, parked: ParkedSession, now: float) -> ExpireParked | PruneParked | None:
        """A sweep's decision on a parked session that came due (``None``: keep it)."""
        if parked.expired(now, self.config.disconnect_grace_s):
            return ExpireParked()
        pruned = parked.pruned(now, self.config.replay_ttl_s)
        return None if pruned is parked else PruneParked(pruned=pruned)

    def wake(self) -> WakeSession | AnswerClosed:
        """A parked session received a message."""
        return AnswerClosed() if self.stopping else WakeSession()

    def stop(self) -> None:
        """Shutdown began. Idempotent: the shutdown's turn says so, and the join after it."""
        self.stopping = True

    # -- takeovers -----------------------------------------------------------------------

    def adopt(self, session_id: str, call: CallT, *, routed: bool) -> AdoptDecision:
        """A resume of ``session_id``, which is not (or no longer) routed here.

        One takeover per session at a time: later resumes wait for its
        answer, then each proves its own token.
        """
        if routed or self.stopping:
            return RouteAdopted()
        waiting = self._adopting.get(session_id)
        if waiting is not None:
            waiting.append(call)
            return WaitForTakeover()
        if self._takeovers_off_loop:
            self._adopting[session_id] = [call]
        return TakeOver(off_loop=self._takeovers_off_loop)

    def takeover_answered(self, session_id: str) -> list[CallT]:
        """The store answered a takeover: the calls that waited for it, in order."""
        return self._adopting.pop(session_id, [])
