"""The supervisor's vocabulary and books: its messages, timers, inbox and figures.

Kept apart from `supervisor._system` and `supervisor._system_turns` so they
hold the decisions carried out.
Everything here outlives any one supervisor actor: a successor reads the same
timers and books its predecessor left.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from actors._commands import Command
from actors._counters import SUMMED
from actors._errors import StoreError
from actors._lifecycle import ParkedSession
from actors._mailbox import ClosableInbox, Envelope, SessionMailbox
from actors._ports import Reply
from actors._session import Call, CrashReport, Opening, SessionActor

__all__ = [
    "MESSAGES",
    "Adopted",
    "Books",
    "Closing",
    "Crashed",
    "Create",
    "Gone",
    "LeasesRenewed",
    "PollTimers",
    "Proceed",
    "RegistryStats",
    "Reopen",
    "Stop",
    "SupervisorInbox",
    "Sweep",
    "Timers",
    "Wake",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryStats:
    """A registry's figures, read without an actor round trip.

    Gauges (now): ``sessions`` registered (every id ``session_ids()`` lists);
    ``live`` of them with an actor, ``parked`` as plain data;
    ``attached`` (live with a transport) and ``detached`` (the rest);
    ``bytes_retained`` by every journal, live or parked; ``healthy``: the
    registry-wide crash rate is within ``RestartPolicy.registry_max_restarts``.

    Totals since the registry opened, counted by the session that did it (so
    a caller answered by it sees it counted): ``events_journaled``,
    ``resumes`` (``resumes_with_replay`` of them replayed at least one
    event), ``rollbacks`` (failed activations undone), ``crashes`` (handlers,
    passivations and reactivations that raised), ``restarts`` (crashed
    sessions the supervisor let go on), ``gap_errors``, ``overflow_errors``,
    ``invalid_tokens``. Counted by the supervisor: ``sessions_failed`` (closed
    by it after crashes; counted when the session has left), ``sessions_expired``
    (disconnect grace), ``supervisor_takeovers``, ``escalations`` (times the
    registry turned unhealthy), ``passivated`` and ``reactivated`` (parkings
    and wake-ups).
    """

    sessions: int = 0
    attached: int = 0
    detached: int = 0
    live: int = 0
    parked: int = 0
    events_journaled: int = 0
    bytes_retained: int = 0
    resumes: int = 0
    resumes_with_replay: int = 0
    rollbacks: int = 0
    crashes: int = 0
    restarts: int = 0
    sessions_failed: int = 0
    sessions_expired: int = 0
    gap_errors: int = 0
    overflow_errors: int = 0
    invalid_tokens: int = 0
    supervisor_takeovers: int = 0
    passivated: int = 0
    reactivated: int = 0
    escalations: int = 0
    healthy: bool = True


# -- supervisor messages --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Create:
    session_id: str
    opening: Opening = field(repr=False)
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Closing:
    session_id: str
    command: Command
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reopen:
    """A close crashed: route the session again, then fail ``answer`` with ``error``.

    (Not ``reply``: a supervisor that crashes on it retries it, as for every
    message nobody waits on to hear of a supervisor crash.)
    """

    mailbox: SessionMailbox = field(repr=False)
    answer: Reply = field(repr=False)
    error: BaseException = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gone:
    mailbox: SessionMailbox = field(repr=False)
    actor_urn: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    now: float
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasesRenewed:
    """The store's answer to a sweep's lease renewals, one per lease held:
    ``True``, ``False`` (another process owns it) or an error (the store
    could not say: kept, tried again at the next sweep). ``None``: the whole
    call failed."""

    held: tuple[tuple[SessionMailbox, int], ...] = field(repr=False)
    renewed: tuple[bool | StoreError, ...] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Crashed:
    report: CrashReport


@dataclass(frozen=True, slots=True, kw_only=True)
class Proceed:
    """A restart decided (now, or when its backoff timer fired)."""

    report: CrashReport


@dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    mailbox: SessionMailbox = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Adopt:
    """A resume for a session this process does not hold: look in the store."""

    session_id: str
    call: Call = field(repr=False)

    @property
    def reply(self) -> Reply:
        return self.call.reply


@dataclass(frozen=True, slots=True, kw_only=True)
class Adopted:
    """The store's answer to a takeover: ``(stored, taken)``, or its error."""

    session_id: str
    outcome: object = field(default=None, repr=False)
    error: BaseException | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class PollTimers:
    """A nudge from the door's timer task: the supervisor's turn fires what is due."""


MESSAGES = (
    Create,
    Closing,
    Reopen,
    Gone,
    Sweep,
    LeasesRenewed,
    Stop,
    Crashed,
    Proceed,
    Wake,
    Adopt,
    Adopted,
    PollTimers,
)


# -- timers and the inbox that runs them -----------------------------------------


class Timers:
    """Messages the supervisor sends itself later, on the registry's clock.

    Touched only on the registry's loop (scheduled by the supervisor's
    handlers, fired by its inbox's ``take``, polled by the door's timer
    task), so no lock.
    """

    #: A timer due on a clock that jumps (a fake or shifted clock) is seen
    #: within this many real seconds even if no message arrives: the door's
    #: timer task looks that often while a timer is pending.
    POLL_S = 0.25

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, object]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, deadline: float, message: object) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), message))

    def pop_due(self) -> object | None:
        if self._heap and self._heap[0][0] <= self._clock():
            return heapq.heappop(self._heap)[2]
        return None

    def due(self) -> bool:
        return bool(self._heap) and self._heap[0][0] <= self._clock()

    def wait_s(self) -> float | None:
        """How long until the next look (``None``: no timer pending)."""
        if not self._heap:
            return None
        return min(max(0.0, self._heap[0][0] - self._clock()), self.POLL_S)


class ParkedDeadlines:
    """Parked sessions by when a sweep next has work for them.

    A sweep visits only the parked sessions whose expiry or oldest event's
    TTL is due, not every parked session each time (100,000 parked sessions
    made every sweep a walk over all of them). An entry is the parked data
    it was computed from: one whose mailbox holds other data now (woken,
    closed, pruned, parked again) is stale and dropped when it comes up,
    since whoever changed the data filed it anew. Any thread may ``file``
    (a session parks in its own turn); the sweep takes what is due.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, SessionMailbox, ParkedSession]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def file(self, due: float, mailbox: SessionMailbox, parked: ParkedSession) -> None:
        if due == math.inf:
            return  # nothing will ever be due: no grace, no event to expire
        with self._lock:
            heapq.heappush(self._heap, (due, next(self._order), mailbox, parked))

    def take_due(self, now: float) -> list[tuple[SessionMailbox, ParkedSession]]:
        """The entries due at ``now`` whose mailbox still holds that data."""
        taken = []
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                _, _, mailbox, parked = heapq.heappop(heap)
                if mailbox.parked is parked:
                    taken.append((mailbox, parked))
        return taken


class SupervisorInbox(ClosableInbox):
    """A closable inbox whose ``take`` also fires the supervisor's due timers."""

    def __init__(self, timers: Timers, guarded: tuple[type, ...], refusal: str) -> None:
        super().__init__(guarded, refusal)
        self._timers = timers

    def take(self) -> Any:
        due = self._timers.pop_due()
        if due is not None:
            return Envelope(due)
        return super().take()


# -- the books ----------------------------------------------------------------------

_LeftReason = Literal["expired", "failed", "shutdown", "replaced"]


class Books:
    """Who is live and what was counted: the figures ``stats()`` reads.

    Guarded by a lock, as readers of ``stats()`` may call from any thread.
    What the supervisor decides by (crash windows, health) is not here but
    in `actors._supervisor_machine.SupervisorMachine`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Every live session actor, by actor urn: the counters stats() reads.
        self._actors: dict[str, SessionActor] = {}
        self._retired = dict.fromkeys(SUMMED, 0)
        self._failed = 0
        self._expired = 0
        self._parked = 0
        self._parked_bytes = 0
        self._passivated = 0
        self._reactivated = 0
        self._escalations = 0
        self.takeovers = 0

    def actor_started(self, actor: SessionActor) -> None:
        with self._lock:
            self._actors[actor.actor_urn] = actor

    def actor_parked(self, actor: SessionActor, parked: ParkedSession) -> None:
        with self._lock:
            self._retire_locked(actor.actor_urn)
            self._parked += 1
            self._parked_bytes += parked.retained_bytes
            self._passivated += 1

    def adopted(self, parked: ParkedSession) -> None:
        """A session taken over from the store arrives parked (its wake-up
        then counts as a reactivation)."""
        with self._lock:
            self._parked += 1
            self._parked_bytes += parked.retained_bytes

    def parked_woken(self, parked: ParkedSession) -> None:
        with self._lock:
            self._parked -= 1
            self._parked_bytes -= parked.retained_bytes
            self._reactivated += 1

    def reactivation_crashed(self, mailbox: SessionMailbox) -> None:
        parked = mailbox.parked
        with self._lock:
            self._reactivated -= 1
            if parked is not None:
                self._parked += 1
                self._parked_bytes += parked.retained_bytes

    def parked_pruned(self, before: ParkedSession, after: ParkedSession) -> None:
        with self._lock:
            self._parked_bytes += after.retained_bytes - before.retained_bytes

    def parked_left(self, parked: ParkedSession, *, reason: _LeftReason) -> None:
        with self._lock:
            self._parked -= 1
            self._parked_bytes -= parked.retained_bytes
            self._failed += reason == "failed"
            self._expired += reason == "expired"

    def retire(self, actor_urn: str, reason: str) -> None:
        """A session actor left: keep its totals, count why it left."""
        with self._lock:
            self._retire_locked(actor_urn)
            self._failed += reason == "failed"
            self._expired += reason == "expired"

    def _retire_locked(self, actor_urn: str) -> None:
        actor = self._actors.pop(actor_urn, None)
        if actor is not None:
            for name in SUMMED:
                self._retired[name] += getattr(actor.counters, name)

    def escalated(self) -> None:
        """The registry turned unhealthy (counted in ``escalations``)."""
        with self._lock:
            self._escalations += 1

    def live_actors(self) -> list[SessionActor]:
        with self._lock:
            return list(self._actors.values())

    def stats(self, sessions: int, *, healthy: bool) -> RegistryStats:
        # Counters move from a live actor to the retired totals under this
        # lock, so a read never misses or double counts a session that left.
        with self._lock:
            totals = dict(self._retired)
            actors = list(self._actors.values())
            parked, parked_bytes = self._parked, self._parked_bytes
            failed, expired = self._failed, self._expired
            passivated, reactivated = self._passivated, self._reactivated
            escalations = self._escalations
        attached = 0
        bytes_retained = parked_bytes
        for actor in actors:
            counters = actor.counters
            attached += counters.attached
            bytes_retained += counters.bytes_retained
            for name in SUMMED:
                totals[name] += getattr(counters, name)
        return RegistryStats(
            sessions=sessions,
            attached=attached,
            detached=max(0, sessions - attached),
            live=max(0, sessions - parked),
            parked=parked,
            bytes_retained=bytes_retained,
            sessions_failed=failed,
            sessions_expired=expired,
            supervisor_takeovers=self.takeovers,
            passivated=passivated,
            reactivated=reactivated,
            escalations=escalations,
            healthy=healthy,
            **totals,
        )
