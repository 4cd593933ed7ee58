"""The loop-neutral system every front door drives, and its supervisor.

`SessionSystem` is what a front door owns. Its supervisor actor
(`SupervisorActor`, with the handlers of its turns, in
`supervisor._system_turns`) decides (the decisions are `SupervisorMachine`'s, in
`actors._supervisor_machine`: pure, plain calls in, decisions out, which
this module and the turns carry out); session actors carry out:

* **Routing.** The routing table maps each session id to the session's
  `SessionMailbox`. Only the supervisor writes it (on the registry's
  loop, in its turns); front doors read it without a round trip and put
  commands straight into the mailbox, which outlives every actor that runs
  the session.
* **Restarts.** A session that crashes answers its caller, holds its messages
  and reports the crash (`CrashReport`). The supervisor
  applies `RestartPolicy`: restart now, restart when
  a backoff timer of its own fires, or close the session; past the
  registry-wide limit it escalates (the registry is reported unhealthy and
  crashing sessions are closed). Carried out by `supervisor._system_restarts`.
* **The store.** With a store, a resume for a session this process does not
  hold takes it over from there, and each sweep renews this process's
  leases (`supervisor._system_leases`).
* **Passivation.** On each sweep the supervisor proposes parking to detached
  sessions; a parked session's next message wakes the supervisor, which starts
  a new actor from the parked data. A sweep prunes and expires parked
  sessions on their data, without starting them, and only those due
  (`ParkedDeadlines`: a heap by grace or oldest event's TTL). The sweep is
  one of the supervisor's turns (`supervisor._system_turns`).

The supervisor and every session are `LoopActor`s on the registry's event
loop: no thread is started to create, wake or restart a session.

A supervisor that crashes is replaced (the routing table, timers and books
live here, not in the actor), and every message it held is handed to its
successor: none is dropped, however many supervisors die in a row.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pykka

from actors._commands import (
    AuthenticateResume,
    CloseCallable,
    Command,
    LifecycleEvent,
    Resume,
    SendCallable,
)
from actors._errors import RegistryClosedError
from actors._lifecycle import ParkedSession
from actors._loop_actor import enter_loop_thread, leave_loop_thread
from actors._mailbox import InboxClosedError, SessionMailbox
from actors._ports import LoopPort, Outbox, Reply
from actors._session import Call, CrashReport, Opening, SessionActor, SessionContext, answer_unknown
from actors._state import NO_FAILPOINTS, SessionConfig
from actors._store import SessionStore
from actors._supervisor_machine import AnswerClosed, SupervisorMachine
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor._system_books import (
    Adopt,
    Adopted,
    Books,
    Closing,
    Crashed,
    Create,
    Gone,
    LeasesRenewed,
    ParkedDeadlines,
    PollTimers,
    Proceed,
    RegistryStats,
    Reopen,
    Stop,
    Sweep,
    Timers,
    Wake,
)
from supervisor._system_leases import Leases, persistence
from supervisor._system_restarts import Restarts, answer_closed
from supervisor._system_turns import (
    StopReply,
    SupervisorActor,
    forget,
    reopen,
    route_close,
    start_session,
    stop_sessions,
    sweep,
)

__all__ = ["DEFAULT_PASSIVATE_AFTER_S", "RegistryStats", "SessionSystem", "SupervisorActor"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: A detached, idle session is parked after this long (``None``: never).
DEFAULT_PASSIVATE_AFTER_S: float | None = 30.0


class SessionSystem:
    """One registry's actors, whatever the front door. Thread-safe.

    It holds the routing table and carries out what `SupervisorMachine`
    decides (actors, timers, the store, the observer); ``books`` are the
    figures ``stats()`` reads. The routing table's invariant: only the
    supervisor writes it (one writer: a successor starts only after its
    predecessor stopped writing), one whole key at a time; everyone else only
    reads it, with single dict operations (get, in, len, list), each atomic.
    A value is the session's mailbox, which stays the same while the session
    is live, suspended, parked or woken, so parking and restarting never
    write there: only create, close and departure do.

    Its collaborators carry out the rest: ``restarts`` the crash and health
    decisions (`supervisor._system_restarts`), ``leases`` the store's side
    (takeovers, lease renewals: `supervisor._system_leases`, through
    `actors._ownership.StoreOwnership`).
    """

    def __init__(
        self,
        *,
        config: SessionConfig,
        clock: Callable[[], float],
        port: LoopPort,
        restart_policy: RestartPolicy | None = None,
        faults: FaultPlan | None = None,
        observer: Callable[[LifecycleEvent], None] | None = None,
        passivate_after_s: float | None = DEFAULT_PASSIVATE_AFTER_S,
        store: SessionStore | None = None,
    ) -> None:
        if passivate_after_s is not None and not passivate_after_s >= 0:
            raise ValueError("passivate_after_s must be None or >= 0")
        self.registry_id = uuid.uuid4().hex[:12]
        self.faults = faults or FaultPlan()
        #: The plan the outboxes consult per send; None (no cost) unless given.
        self.transport_faults = faults
        self.clock = self.faults.clock(clock) if faults is not None else clock
        self.config = config
        self.policy = restart_policy or RestartPolicy()
        #: The registry's loop: its callbacks, and every actor's turns.
        self.port = port
        self._observer = observer
        #: Where sessions persist beyond this process (None: memory only).
        self.store = store
        #: Writes the sessions' commits off the loop (a store that does I/O only).
        self.committer, ownership = persistence(store, port, self.clock, self.registry_id)
        #: What every session of the registry shares.
        self.context = SessionContext(
            registry_id=self.registry_id,
            config=config,
            clock=self.clock,
            failpoints=faults if faults is not None else NO_FAILPOINTS,
            port=port,
            notify=self.notify,
            owner=self,
            ownership=ownership,
        )
        self._routes: dict[str, SessionMailbox] = {}  # the routing table (see the class)
        #: Takeovers from the store and this process's leases (None: no store).
        self.leases: Leases | None = None if ownership is None else Leases(self, ownership)
        #: What the supervisor decides, and the books it decides by: only its turns call it.
        self.machine = SupervisorMachine[Call](
            limits=self.policy,
            config=config,
            passivate_after_s=passivate_after_s,
            takeovers_off_loop=self.committer is not None,
        )
        self.timers = Timers(self.clock)
        self.books = Books()
        self.restarts: Restarts = Restarts(self)
        #: Parked sessions by when a sweep next has work for them.
        self.parked_due = ParkedDeadlines()
        #: Guards every session mailbox of this registry (SessionMailboxOwner).
        self.mailbox_lock = threading.Lock()
        self._takeover_lock = threading.Lock()
        # Built on the loop it will run on: a blocking future's get() there
        # raises instead of waiting on itself (actors._loop_actor.LoopFuture).
        self._loop_thread: int | None = threading.get_ident()
        enter_loop_thread()
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
        opening = Opening(
            send=send, close=close, lease_generation=lease_generation, outbox=outbox, reply=reply
        )
        self.tell_supervisor(Create(session_id=session_id, opening=opening, reply=reply), reply)

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
        mailbox = self._routes.get(session_id)
        if mailbox is not None:
            try:
                mailbox.tell(Call(command=command, reply=reply, outbox=outbox, internal=internal))
            except InboxClosedError:
                pass
            else:
                return
        if self.store is not None and isinstance(command, Resume | AuthenticateResume):
            # Perhaps another process's session: the supervisor looks in the store.
            call = Call(command=command, reply=reply, outbox=outbox, internal=internal)
            self.tell_supervisor(Adopt(session_id=session_id, call=call), reply)
            return
        answer_unknown(reply, command, session_id)

    def close(self, session_id: str, command: Command, reply: Reply) -> None:
        self.tell_supervisor(Closing(session_id=session_id, command=command, reply=reply), reply)

    def sweep(self, reply: Reply) -> None:
        self.tell_supervisor(Sweep(now=self.clock(), reply=reply), reply)

    def shutdown(self, reply: Reply) -> None:
        """Stop every session; ``reply`` is answered once all have stopped.

        A supervisor that dies on the stop is replaced and told again, so a
        crash there cannot leave sessions running.
        """
        self.tell_supervisor(Stop(reply=StopReply(self, reply)), reply)

    def join(self) -> None:
        """After `shutdown` answered: stop the supervisor (no thread to wait for)."""
        self.machine.stop()
        with contextlib.suppress(pykka.ActorDeadError):
            self._supervisor.stop(block=False)
        if self.committer is not None:
            self.committer.close()
        loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is not None:
            leave_loop_thread(loop_thread)

    def poll_timers(self) -> None:
        """From the door's timer task, on the loop: fire the supervisor's due timers."""
        if self.timers.due():
            self.tell_supervisor(PollTimers())

    @property
    def routes(self) -> dict[str, SessionMailbox]:
        """The routing table (see the class): only the supervisor's turns write it."""
        return self._routes

    def knows(self, session_id: str) -> bool:
        return session_id in self._routes

    def session_ids(self) -> list[str]:
        """Every registered session: live, suspended and parked alike."""
        return list(self._routes)

    def stats(self) -> RegistryStats:
        return self.books.stats(len(self._routes), healthy=self.machine.healthy)

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

        self.port.submit(deliver)

    # -- the session actors' side (SessionOwner, SessionMailboxOwner) ----------------

    def actor_started(self, actor: SessionActor) -> None:
        self.books.actor_started(actor)

    def actor_parked(self, actor: SessionActor, parked: ParkedSession) -> None:
        self.books.actor_parked(actor, parked)
        self.file_parked(actor.mailbox, parked)

    def file_parked(self, mailbox: SessionMailbox, parked: ParkedSession) -> None:
        config = self.config
        due = parked.sweep_due(config.disconnect_grace_s, config.replay_ttl_s)
        self.parked_due.file(due, mailbox, parked)

    def session_crashed(self, report: CrashReport) -> None:
        self.tell_supervisor(Crashed(report=report))

    def session_gone(self, mailbox: SessionMailbox, actor_urn: str, reason: str) -> None:
        self.tell_supervisor(Gone(mailbox=mailbox, actor_urn=actor_urn, reason=reason))

    def wake(self, mailbox: SessionMailbox) -> None:
        self.tell_supervisor(Wake(mailbox=mailbox))

    # -- the supervisor's side (its turns only; the rest: supervisor._system_turns) --

    def dispatch(self, message: Any) -> None:
        handler = _HANDLERS[type(message)]
        handler(self, message)

    def unroute(self, mailbox: SessionMailbox) -> None:
        """A session left: out of the table (unless its id is someone else's now)."""
        if self._routes.get(mailbox.session_id) is mailbox:
            del self._routes[mailbox.session_id]
            self.machine.session_left(mailbox.session_id)

    def activate(self, message: Wake) -> None:
        mailbox = message.mailbox
        parked = mailbox.take_parked()
        if parked is None:
            return
        self.books.parked_woken(parked)
        if isinstance(self.machine.wake(), AnswerClosed):
            answer_closed(mailbox)
            return
        SessionActor.start(mailbox=mailbox, context=self.context, parked=parked)

    # -- supervisors coming and going --------------------------------------------------

    def hand_over(self, dead: pykka.ActorRef[SupervisorActor], queued: list[Any]) -> None:
        """A supervisor gave up: start its successor and pass on what it left queued."""
        self._take_over(dead)
        for message in queued:
            self.tell_supervisor(message, getattr(message, "reply", None))

    def tell_supervisor(self, message: object, reply: Reply | None = None) -> None:
        """Deliver ``message`` to a live supervisor, starting successors as needed.

        Never drops it: it is delivered, or (the registry is shut down) its
        caller is answered `RegistryClosedError`.
        """
        while True:
            supervisor = self._supervisor
            try:
                supervisor.tell(message)
            except pykka.ActorDeadError:
                if not self._take_over(supervisor):
                    self._refuse(message, reply)
                    return
            else:
                return

    def _refuse(self, message: object, reply: Reply | None) -> None:
        if reply is not None:
            reply.fail(RegistryClosedError("the session registry is shut down"))
        elif isinstance(message, Adopted):
            for call in self.machine.takeover_answered(message.session_id):
                call.reply.fail(RegistryClosedError("the session registry is shut down"))
        elif isinstance(message, Wake):
            parked = message.mailbox.take_parked()
            if parked is not None:
                self.books.parked_woken(parked)
            answer_closed(message.mailbox)

    def _start_supervisor(self) -> pykka.ActorRef[SupervisorActor]:
        return SupervisorActor.start(self)

    def _take_over(self, refused: pykka.ActorRef[SupervisorActor] | None = None) -> bool:
        """Start a new supervisor if ours died, or is ``refused`` (one that handed
        over), unless we are shutting down."""
        with self._takeover_lock:
            if self._supervisor is not refused and self._supervisor.is_alive():
                return True
            if self.machine.stopping:
                return False
            logger.warning("supervisor of registry %s died; taking over", self.registry_id)
            self.books.takeovers += 1
            self._supervisor = self._start_supervisor()
            return True


def _leases(system: SessionSystem) -> Leases:
    leases = system.leases
    assert leases is not None  # noqa: S101 - only a registry with a store adopts or renews
    return leases


_HANDLERS: dict[type[Any], Callable[[SessionSystem, Any], None]] = {
    Create: start_session,
    Closing: route_close,
    Reopen: reopen,
    Gone: forget,
    Sweep: sweep,
    LeasesRenewed: lambda system, message: _leases(system).renewed(message),
    Stop: stop_sessions,
    Wake: SessionSystem.activate,
    Crashed: lambda system, message: system.restarts.decide(message),
    Proceed: lambda system, message: system.restarts.proceed(message),
    Adopt: lambda system, message: _leases(system).adopt(message),
    Adopted: lambda system, message: _leases(system).adopted(message),
    PollTimers: lambda system, message: None,  # its turn fired what was due
}
