"""The supervisor actor and the loop-neutral system every front door drives.

:class:`SessionSystem` is what a front door owns: it starts the supervisor,
routes commands straight to session actors through a routing table that only
the supervisor writes (so the hot path pays no supervisor round trip), and
answers unknown sessions the way the seed did. Creates and closes go through
the :class:`SupervisorActor`, which keeps the table, starts session actors,
collects the counters of sessions that left, and is replaced by a new one
(taking the routing over from the live session actors) if it dies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka

from actors.errors import (
    DuplicateSessionError,
    RegistryClosedError,
    SessionCrashedError,
)
from actors.messages import (
    CloseCallable,
    Command,
    LifecycleEvent,
    SendCallable,
    Tick,
)
from actors.ports import LoopPort, Outbox, Reply
from actors.session import (
    Call,
    ClosableInbox,
    SessionActor,
    SessionContext,
    Shutdown,
    answer_unknown,
)
from actors.state import NO_FAILPOINTS, SessionConfig
from supervisor.faults import FaultPlan
from supervisor.policy import RestartPolicy

__all__ = ["RegistryStats", "SessionSystem", "SupervisorActor"]

logger = logging.getLogger("duplex_supervisor.supervisor")


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryStats:
    """A registry's figures, read without an actor round trip."""

    sessions: int = 0
    attached: int = 0
    detached: int = 0
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


_SUMMED: tuple[str, ...] = (
    "events_journaled",
    "resumes",
    "resumes_with_replay",
    "rollbacks",
    "crashes",
    "restarts",
    "gap_errors",
    "overflow_errors",
    "invalid_tokens",
)


# -- supervisor messages --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Create:
    session_id: str
    send: SendCallable = field(repr=False)
    close: CloseCallable = field(repr=False)
    lease_generation: int
    outbox: Outbox = field(repr=False)
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Close:
    session_id: str
    command: Command
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Gone:
    session_id: str
    actor_urn: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Sweep:
    now: float
    reply: Reply = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stop:
    reply: Reply = field(repr=False)


_MESSAGES = (_Create, _Close, _Gone, _Sweep, _Stop)


class SupervisorActor(pykka.ThreadingActor):
    """Owns the routing table of one registry. Dies on a crash; see SessionSystem."""

    def __init__(self, system: SessionSystem) -> None:
        super().__init__()
        self._system = system

    @staticmethod
    def _create_actor_inbox() -> Any:
        # A supervisor that gives up closes it and hands what it held over.
        return ClosableInbox(_MESSAGES, "this supervisor has handed over")

    def on_start(self) -> None:
        threading.current_thread().name = f"duplex-supervisor:{self._system.registry_id}"
        self._system.adopt_live_sessions()

    def on_receive(self, message: Any) -> Any:
        try:
            self._system.faults.supervisor_hit(type(message).__name__.strip("_").lower())
            self._dispatch(message)
        except BaseException as exc:  # noqa: BLE001 - the supervisor dies; the door takes over
            logger.error("supervisor of registry %s crashed: %r", self._system.registry_id, exc)
            reply = getattr(message, "reply", None)
            if reply is not None:
                error = SessionCrashedError("the supervisor crashed handling this call")
                error.__cause__ = exc
                reply.fail(error)
            inbox = self.actor_inbox
            assert isinstance(inbox, ClosableInbox)  # noqa: S101
            self._system.hand_over(self.actor_ref, inbox.close())
            self.stop()
        return None

    def _dispatch(self, message: Any) -> None:
        system = self._system
        if isinstance(message, _Create):
            system.start_session(message)
        elif isinstance(message, _Close):
            system.route_close(message)
        elif isinstance(message, _Gone):
            system.forget(message)
        elif isinstance(message, _Sweep):
            system.tick_all(message)
        elif isinstance(message, _Stop):
            system.stop_sessions(message)


class _DaemonSupervisorActor(SupervisorActor):
    use_daemon_thread = True


class _CountDown:
    """Resolves ``reply`` after ``n`` answers (of any kind)."""

    def __init__(self, n: int, reply: Reply) -> None:
        self._left = n
        self._lock = threading.Lock()
        self._reply = reply
        if n == 0:
            reply.resolve(None)

    def _one(self) -> None:
        with self._lock:
            self._left -= 1
            done = self._left == 0
        if done:
            self._reply.resolve(None)

    def resolve(self, value: object) -> None:
        self._one()

    def fail(self, error: BaseException) -> None:
        self._one()


class _CloseReply:
    """A close's reply: on a crash, put the session back in the table first."""

    __slots__ = ("_ref", "_reply", "_session_id", "_system")

    def __init__(
        self,
        system: SessionSystem,
        session_id: str,
        ref: pykka.ActorRef[SessionActor],
        reply: Reply,
    ) -> None:
        self._system = system
        self._session_id = session_id
        self._ref = ref
        self._reply = reply

    def resolve(self, value: object) -> None:
        self._reply.resolve(value)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, SessionCrashedError):
            self._system.reopen(self._session_id, self._ref)
        self._reply.fail(error)


class _StopReply:
    """A stop's reply that sends the stop again if the supervisor crashed on it."""

    def __init__(self, system: SessionSystem, reply: Reply, *, retries: int) -> None:
        self._system = system
        self._reply = reply
        self._retries = retries

    def resolve(self, value: object) -> None:
        self._reply.resolve(value)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, SessionCrashedError) and self._retries > 0:
            again = _StopReply(self._system, self._reply, retries=self._retries - 1)
            self._system._tell_supervisor(_Stop(reply=again), self._reply)
        else:
            self._reply.fail(error)


class SessionSystem:
    """One registry's actors, whatever the front door. Thread-safe."""

    def __init__(
        self,
        *,
        config: SessionConfig,
        clock: Callable[[], float],
        port: LoopPort,
        restart_policy: RestartPolicy | None = None,
        faults: FaultPlan | None = None,
        observer: Callable[[LifecycleEvent], None] | None = None,
        daemon_threads: bool = False,
    ) -> None:
        self.registry_id = uuid.uuid4().hex[:12]
        self.faults = faults or FaultPlan()
        #: The plan the outboxes consult per send; None (no cost) unless given.
        self.transport_faults = faults
        self.clock = self.faults.clock(clock) if faults is not None else clock
        self._port = port
        self._observer = observer
        self._context = SessionContext(
            registry_id=self.registry_id,
            config=config,
            clock=self.clock,
            failpoints=faults if faults is not None else NO_FAILPOINTS,
            restart_budget=restart_policy or RestartPolicy(),
            port=port,
            notify=self.notify,
            owner=self,
            daemon_threads=daemon_threads,
        )
        # Written by the supervisor's thread (and by a session it started, on
        # its first step); read by anyone without a lock (GIL-atomic).
        self._table: dict[str, pykka.ActorRef[SessionActor]] = {}
        # Closed through the supervisor, their counters not yet retired.
        self._closing: dict[str, pykka.ActorRef[SessionActor]] = {}
        # Every live session actor of this registry, by actor urn, as each
        # registered itself on start: what a new supervisor takes over from.
        self._actors: dict[str, SessionActor] = {}
        self._stats_lock = threading.Lock()
        # Every session thread that may still run, for join(); threads that
        # ended are dropped whenever the list doubles (amortized O(1) a create:
        # pruning on every create made 10,000 creates take 50 s).
        self._threads: list[threading.Thread] = []
        self._prune_threads_at = 64
        self._retired = dict.fromkeys(_SUMMED, 0)
        self._failed = 0
        self._expired = 0
        self._takeovers = 0
        self._closed = False
        self._takeover_lock = threading.Lock()
        self._supervisor: pykka.ActorRef[SupervisorActor] = self._start_supervisor()

    # -- the front doors' side -------------------------------------------------

    def create(
        self,
        session_id: str,
        *,
        send: SendCallable,
        close: CloseCallable,
        lease_generation: int,
        outbox: Outbox,
        reply: Reply,
    ) -> None:
        message = _Create(
            session_id=session_id,
            send=send,
            close=close,
            lease_generation=lease_generation,
            outbox=outbox,
            reply=reply,
        )
        self._tell_supervisor(message, reply)

    def call(
        self,
        session_id: str,
        command: Command,
        reply: Reply,
        outbox: Outbox | None = None,
        *,
        internal: bool = False,
    ) -> None:
        """Route ``command`` to its session; answer unknown sessions as the seed did.

        ``internal``: a command of the library's own (an abort after a
        cancelled resume) that a crash retries once instead of dropping.
        """
        ref = self._table.get(session_id)
        if ref is not None:
            try:
                ref.tell(Call(command=command, reply=reply, outbox=outbox, internal=internal))
            except pykka.ActorDeadError:
                pass
            else:
                return
        answer_unknown(reply, command, session_id)

    def close(self, session_id: str, command: Command, reply: Reply) -> None:
        self._tell_supervisor(_Close(session_id=session_id, command=command, reply=reply), reply)

    def sweep(self, reply: Reply) -> None:
        self._tell_supervisor(_Sweep(now=self.clock(), reply=reply), reply)

    def shutdown(self, reply: Reply) -> None:
        """Stop every session; ``reply`` is answered once all have stopped.

        A supervisor that dies on the stop is replaced and told again (twice
        at most), so a crash there cannot leave sessions running.
        """
        self._tell_supervisor(_Stop(reply=_StopReply(self, reply, retries=2)), reply)

    def join(self, timeout: float | None = None) -> None:
        """After :meth:`shutdown` answered: stop the supervisor, join every thread of ours."""
        self._closed = True
        with contextlib.suppress(pykka.ActorDeadError):
            self._supervisor.stop(block=True, timeout=timeout)
        for thread in list(self._threads):
            thread.join(timeout)

    def knows(self, session_id: str) -> bool:
        return session_id in self._table

    def session_ids(self) -> list[str]:
        return list(self._table)

    def session_actors(self) -> list[pykka.ActorRef[SessionActor]]:
        return list(self._table.values())

    def stats(self) -> RegistryStats:
        attached = 0
        bytes_retained = 0
        sessions = len(self._table)
        # Counters move from a live actor to the retired totals under this
        # lock, so a read never misses or double counts a session that left.
        with self._stats_lock:
            totals = dict(self._retired)
            actors = list(self._actors.values())
        for actor in actors:
            counters = actor.counters
            attached += counters.attached
            bytes_retained += counters.bytes_retained
            for name in _SUMMED:
                totals[name] += getattr(counters, name)
        return RegistryStats(
            sessions=sessions,
            attached=attached,
            detached=max(0, sessions - attached),
            bytes_retained=bytes_retained,
            sessions_failed=self._failed,
            sessions_expired=self._expired,
            supervisor_takeovers=self._takeovers,
            **totals,
        )

    def notify(self, event: LifecycleEvent) -> None:
        """Hand ``event`` to the observer on the registry's loop; never raises."""
        observer = self._observer
        if observer is None:
            return

        def deliver() -> None:
            try:
                observer(event)
            except Exception:
                logger.exception("observer raised on a %s event", event.kind)

        self._port.submit(deliver)

    # -- the session actors' side (SessionOwner) ------------------------------------

    def session_started(self, actor: SessionActor) -> None:
        # Runs on the new session's thread before it answers its creator, so the
        # creator can route to it at once. start_session writes the same entry
        # on the supervisor's thread before its next message, so a second create
        # of this id is refused even if this has not run yet.
        with self._stats_lock:
            self._actors[actor.actor_urn] = actor
        self._table[actor.session_id] = actor.actor_ref
        self._threads.append(actor.thread)
        if len(self._threads) >= self._prune_threads_at:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._prune_threads_at = 2 * len(self._threads) + 64

    def session_gone(self, session_id: str, actor_urn: str, reason: str) -> None:
        with contextlib.suppress(RegistryClosedError):
            self._tell_supervisor(_Gone(session_id=session_id, actor_urn=actor_urn, reason=reason))

    # -- the supervisor's side (called on its thread only) ------------------------

    def start_session(self, message: _Create) -> None:
        if self._closed:
            message.reply.fail(RegistryClosedError("the session registry is shut down"))
            return
        if message.session_id in self._table:
            message.reply.fail(DuplicateSessionError(message.session_id))
            return
        ref = SessionActor.start(
            session_id=message.session_id,
            context=self._context,
            send=message.send,
            close=message.close,
            lease_generation=message.lease_generation,
            outbox=message.outbox,
            reply=message.reply,
        )
        self._table[message.session_id] = ref

    def route_close(self, message: _Close) -> None:
        # Out of the table at once, so a create of the same id right after
        # close() returns succeeds; calls already routed are handled first.
        ref = self._table.pop(message.session_id, None)
        if ref is None:
            message.reply.resolve(None)
            return
        self._closing[ref.actor_urn] = ref
        reply = _CloseReply(self, message.session_id, ref, message.reply)
        try:
            ref.tell(Call(command=message.command, reply=reply))
        except pykka.ActorDeadError:
            message.reply.resolve(None)

    def forget(self, message: _Gone) -> None:
        ref = self._closing.pop(message.actor_urn, None)
        current = self._table.get(message.session_id)
        if current is not None and current.actor_urn == message.actor_urn:
            ref = self._table.pop(message.session_id)
        if ref is not None:
            self._retire(ref)
        if message.reason == "failed":
            self._failed += 1
        elif message.reason == "expired":
            self._expired += 1

    def tick_all(self, message: _Sweep) -> None:
        tick = Tick(now=message.now)
        self._broadcast(lambda done: Call(command=tick, reply=done, internal=True), message.reply)

    def stop_sessions(self, message: _Stop) -> None:
        self._closed = True
        self._broadcast(lambda done: Shutdown(reply=done), message.reply)

    def reopen(self, session_id: str, ref: pykka.ActorRef[SessionActor]) -> None:
        """A close that crashed never happened: route the session again.

        Called on the session's thread before the close's caller is answered,
        so the caller finds the session where it left it. If a new session
        took the id meanwhile, the old one stays in ``_closing``.
        """
        if self._table.setdefault(session_id, ref) is ref:
            self._closing.pop(ref.actor_urn, None)

    def adopt_live_sessions(self) -> None:
        """Take the routing over from the live session actors of this registry.

        A session whose create the last supervisor started but never entered
        in the table is entered now; one that died meanwhile is dropped.
        """
        for actor in list(self._actors.values()):
            ref = actor.actor_ref
            if ref.is_alive() and actor.session_id not in self._table:
                self._table[actor.session_id] = ref
        for session_id, ref in list(self._table.items()):
            if not ref.is_alive():
                del self._table[session_id]

    # -- internals -----------------------------------------------------------------

    def _broadcast(self, mail_for: Callable[[Reply], object], reply: Reply) -> None:
        """Send every routed session ``mail_for(done)``; answer ``reply`` once all did."""
        refs = list(self._table.values())
        countdown = _CountDown(len(refs), reply)
        for ref in refs:
            try:
                ref.tell(mail_for(countdown))
            except pykka.ActorDeadError:
                countdown.resolve(None)

    def _retire(self, ref: pykka.ActorRef[SessionActor]) -> None:
        with self._stats_lock:
            actor = self._actors.pop(ref.actor_urn, None)
            if actor is not None:
                for name in _SUMMED:
                    self._retired[name] += getattr(actor.counters, name)

    def hand_over(self, dead: pykka.ActorRef[SupervisorActor], queued: list[Any]) -> None:
        """A supervisor gave up: start its successor and pass on what it left queued."""
        self._take_over(dead)
        for message in queued:
            self._tell_supervisor(message, getattr(message, "reply", None))

    def _tell_supervisor(self, message: object, reply: Reply | None = None) -> None:
        for _ in range(2):
            supervisor = self._supervisor
            try:
                supervisor.tell(message)
            except pykka.ActorDeadError:
                if not self._take_over(supervisor) and reply is not None:
                    reply.fail(RegistryClosedError("the session registry is shut down"))
                    return
            else:
                return

    def _start_supervisor(self) -> pykka.ActorRef[SupervisorActor]:
        actor_class = _DaemonSupervisorActor if self._context.daemon_threads else SupervisorActor
        return actor_class.start(self)

    def _take_over(self, refused: pykka.ActorRef[SupervisorActor] | None = None) -> bool:
        """Start a new supervisor if ours died, or is ``refused`` (one that handed
        over), unless we are shutting down."""
        with self._takeover_lock:
            if self._supervisor is not refused and self._supervisor.is_alive():
                return True
            if self._closed:
                return False
            logger.warning("supervisor of registry %s died; taking over", self.registry_id)
            self._takeovers += 1
            self._supervisor = self._start_supervisor()
            return True
