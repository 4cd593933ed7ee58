"""The supervisor actor and its turns: the routing table's writes, the sweep, the stop.

`SupervisorActor` takes each message in a turn of its own and hands it to
`SessionSystem.dispatch` (`supervisor._system`), which looks up its handler;
the handlers here are plain functions of the system and the message:

* **Routing.** A create routes a new session and starts its actor; a close
  takes the session out of the table at once, then tells it (a close that
  crashed is undone: `CloseReply`, `reopen`); a session gone leaves it.
* **The sweep.** Parked sessions due are pruned or expired on their data;
  live ones get a tick, idle ones a proposal to park with it; then this
  process's leases are renewed and the registry's health judged.
* **The stop.** Every session is told to stop; parked ones are closed
  where they lie.

And the replies they answer through: `CountDown` answers a sweep or a stop
once every session told did; `StopReply` sends a stop again if the
supervisor crashed on it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

import pykka

from actors._commands import LifecycleEvent, Tick
from actors._errors import DuplicateSessionError, RegistryClosedError, SessionCrashedError
from actors._lifecycle import ParkedSession
from actors._loop_actor import LoopActor
from actors._mailbox import InboxClosedError, MailboxPhase, SessionMailbox, SessionMailboxOwner
from actors._ports import LoopPort, Reply
from actors._session import Call, Passivate, SessionActor, SessionContext, Shutdown
from actors._state import SessionConfig
from actors._supervisor_machine import ExpireParked, PruneParked, SupervisorMachine
from supervisor._faults import FaultPlan
from supervisor._system_books import (
    MESSAGES,
    Books,
    Closing,
    Create,
    Gone,
    ParkedDeadlines,
    Reopen,
    Stop,
    SupervisorInbox,
    Sweep,
    Timers,
)
from supervisor._system_leases import Leases
from supervisor._system_restarts import Restarts, answer_closed

__all__ = [
    "CloseReply",
    "CountDown",
    "StopReply",
    "SupervisorActor",
    "TurnsHost",
    "forget",
    "reopen",
    "route_close",
    "start_session",
    "stop_sessions",
    "sweep",
]

logger = logging.getLogger("duplex_supervisor.supervisor")


class TurnsHost(SessionMailboxOwner, Protocol):
    """The supervisor as its turns see it (`supervisor._system.SessionSystem`)."""

    registry_id: str
    faults: FaultPlan
    config: SessionConfig
    #: The registry's loop: its callbacks, and every actor's turns.
    port: LoopPort
    machine: SupervisorMachine[Call]
    timers: Timers
    books: Books
    #: What every session of the registry shares.
    context: SessionContext
    #: Parked sessions by when a sweep next has work for them.
    parked_due: ParkedDeadlines
    leases: Leases | None
    restarts: Restarts

    @property
    def routes(self) -> dict[str, SessionMailbox]:
        """The routing table (written only in the supervisor's turns)."""

    def dispatch(self, message: Any) -> None: ...

    def hand_over(self, dead: pykka.ActorRef[SupervisorActor], queued: list[Any]) -> None: ...

    def unroute(self, mailbox: SessionMailbox) -> None: ...

    def file_parked(self, mailbox: SessionMailbox, parked: ParkedSession) -> None: ...

    def notify(self, event: LifecycleEvent) -> None: ...

    def tell_supervisor(self, message: object, reply: Reply | None = None) -> None: ...


# -- the actor ---------------------------------------------------------------------


class SupervisorActor(LoopActor):
    """Runs the supervisor's decisions for one registry; dies on a crash (see
    `supervisor._system`)."""

    def __init__(self, system: TurnsHost) -> None:
        self._system = system
        self.actor_loop = system.port
        super().__init__()

    def _create_actor_inbox(self) -> Any:  # type: ignore[override]
        # A supervisor that gives up closes it and hands what it held over.
        return SupervisorInbox(self._system.timers, MESSAGES, "this supervisor has handed over")

    def on_receive(self, message: Any) -> Any:
        try:
            self._system.faults.supervisor_hit(type(message).__name__.lower())
            self._system.dispatch(message)
        except BaseException as exc:  # noqa: BLE001 - the supervisor dies; a successor takes over
            logger.error("supervisor of registry %s crashed: %r", self._system.registry_id, exc)
            reply = getattr(message, "reply", None)
            retried: list[Any] = []
            if reply is not None:
                error = SessionCrashedError("the supervisor crashed handling this call")
                error.__cause__ = exc
                reply.fail(error)
            else:
                # Nobody waits on it to learn of the crash: the successor handles it.
                retried.append(message)
            inbox = self.actor_inbox
            assert isinstance(inbox, SupervisorInbox)  # noqa: S101
            self._system.hand_over(self.actor_ref, retried + inbox.close())
            self.stop()
        return None


# -- routing -------------------------------------------------------------------------


def start_session(system: TurnsHost, message: Create) -> None:
    if system.machine.stopping:
        message.reply.fail(RegistryClosedError("the session registry is shut down"))
        return
    if message.session_id in system.routes:
        message.reply.fail(DuplicateSessionError(message.session_id))
        return
    mailbox = SessionMailbox(message.session_id, system)
    system.routes[message.session_id] = mailbox
    SessionActor.start(mailbox=mailbox, context=system.context, opening=message.opening)


def route_close(system: TurnsHost, message: Closing) -> None:
    # Out of the table at once, so a create of the same id right after
    # close() returns succeeds; calls already queued are handled first.
    mailbox = system.routes.pop(message.session_id, None)
    if mailbox is None:
        message.reply.resolve(None)
        return
    reply = CloseReply(system, mailbox, message.reply)
    try:
        mailbox.tell(Call(command=message.command, reply=reply))
    except InboxClosedError:
        message.reply.resolve(None)


def reopen(system: TurnsHost, message: Reopen) -> None:
    """A close that crashed never happened: route the session again, then answer."""
    mailbox = message.mailbox
    if mailbox.session_id not in system.routes and mailbox.phase != MailboxPhase.CLOSED:
        system.routes[mailbox.session_id] = mailbox
    message.answer.fail(message.error)


def forget(system: TurnsHost, message: Gone) -> None:
    system.unroute(message.mailbox)
    system.books.retire(message.actor_urn, message.reason)


# -- the sweep and the stop ----------------------------------------------------------


def sweep(system: TurnsHost, message: Sweep) -> None:
    now = message.now
    for mailbox, parked in system.parked_due.take_due(now):
        _sweep_parked(system, mailbox, parked, now)
    live = [mailbox for mailbox in system.routes.values() if mailbox.parked is None]
    countdown = CountDown(len(live), message.reply)
    tick = Tick(now=now)
    # A session proposed parking gets its tick with the proposal
    # (Passivate.tick); ids, not the mailboxes: nothing more is kept alive.
    ticked: set[int] = set()
    if system.machine.passivate_after_s is not None:
        routed = {id(mailbox) for mailbox in live}
        for actor in system.books.live_actors():
            park = system.machine.park(now, actor.parkable_since)
            if park is None:
                continue
            mailbox, call = actor.mailbox, None
            if id(mailbox) in routed and id(mailbox) not in ticked:
                ticked.add(id(mailbox))
                call = Call(command=tick, reply=countdown, internal=True)
            proposal = Passivate(now=park.now, after_s=park.after_s, tick=call)
            if not mailbox.tell_if_live(proposal) and call is not None:
                countdown.resolve(None)  # parked meanwhile: the next sweep prunes it
    for mailbox in live:
        if id(mailbox) in ticked:
            continue
        if not mailbox.tell_if_live(Call(command=tick, reply=countdown, internal=True)):
            countdown.resolve(None)  # parked meanwhile: the next sweep prunes it
    if system.leases is not None:
        system.leases.renew()
    system.restarts.judge_health(now)


def _sweep_parked(
    system: TurnsHost, mailbox: SessionMailbox, parked: ParkedSession, now: float
) -> None:
    decision = system.machine.parked_due(parked, now)
    if isinstance(decision, ExpireParked):
        if mailbox.close_if_parked():
            # What a live session's expiry tells: "expired", then "closed".
            system.unroute(mailbox)
            system.books.parked_left(parked, reason="expired")
            if system.leases is not None:
                system.leases.forget(mailbox)
            system.notify(LifecycleEvent.about("expired", parked, "disconnect_grace"))
            system.notify(LifecycleEvent.about("closed", parked, None))
        return  # closed, or being woken (its next park files it anew)
    if isinstance(decision, PruneParked) and mailbox.replace_parked(decision.pruned):
        system.books.parked_pruned(parked, decision.pruned)
        parked = decision.pruned
    if mailbox.phase == MailboxPhase.PARKED and mailbox.parked is parked:
        # Due again later (or at the next sweep, where a float's rounding
        # kept a check just short of its due time).
        system.file_parked(mailbox, parked)


def stop_sessions(system: TurnsHost, message: Stop) -> None:
    system.machine.stop()
    mailboxes = {id(m): m for m in system.routes.values()}
    for actor in system.books.live_actors():
        mailboxes.setdefault(id(actor.mailbox), actor.mailbox)
    countdown = CountDown(len(mailboxes), message.reply)
    for mailbox in mailboxes.values():
        parked = mailbox.take_parked()
        if parked is not None:
            system.books.parked_left(parked, reason="shutdown")
            answer_closed(mailbox)
            countdown.resolve(None)
            continue
        try:
            mailbox.tell(Shutdown(reply=countdown))
        except InboxClosedError:
            countdown.resolve(None)


# -- the replies they answer through ---------------------------------------------------


class CountDown:
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


class StopReply:
    """A stop's reply that sends the stop again if the supervisor crashed on it."""

    def __init__(self, system: TurnsHost, reply: Reply) -> None:
        self._system = system
        self._reply = reply

    def resolve(self, value: object) -> None:
        self._reply.resolve(value)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, SessionCrashedError):
            self._system.tell_supervisor(Stop(reply=self), self._reply)
        else:
            self._reply.fail(error)


class CloseReply:
    """A close's reply: on a crash, the supervisor puts the session back first."""

    __slots__ = ("_mailbox", "_reply", "_system")

    def __init__(self, system: TurnsHost, mailbox: SessionMailbox, reply: Reply) -> None:
        self._system = system
        self._mailbox = mailbox
        self._reply = reply

    def resolve(self, value: object) -> None:
        self._reply.resolve(value)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, SessionCrashedError):
            reopen = Reopen(mailbox=self._mailbox, answer=self._reply, error=error)
            self._system.tell_supervisor(reopen)
        else:
            self._reply.fail(error)
