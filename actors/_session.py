"""SessionActor: the pykka shell that runs one SessionState serially.

The actor is the imperative shell around `SessionState`:
it takes one message at a time from the session's mailbox, asks the state for
a transition, and only then releases the transition's effects (frames to the
attachment's outbox, callbacks to the caller's loop, the reply:
`actors._effects.SessionEffects`).

It carries out; its supervisor decides. A handler that crashes leaves the
state at its snapshot (the machine restores it), the caller gets
`SessionCrashedError`, and the actor *suspends*: it holds every later
message, in arrival order, and reports the crash to its owner. The owner
answers with `Restart` (run the held messages as a new incarnation)
or `FailSession` (close the transport, answer every held message
`SessionFailedError`, leave). What it holds meanwhile is
`actors._held.HeldMail`. Nothing here ever waits: a backoff is the
supervisor's timer, not a wait here.

Nor for a store that does I/O: a transition is released only once durable.
The session's `actors._store_link.StoreLink` writes it (through the
registry's `actors._ownership.StoreOwnership`, which makes every store call)
and the actor holds, as a suspended one does, every later message until the
store answered; then it carries the transition out, or undoes it on a
refusal (`SessionActor.refused`: another process may have taken the session
over, and this one lets go).

The actor has no thread: it is a `LoopActor`, run in turns on its registry's
event loop, so a create is a mailbox and a small object, and a message from
a task of that loop is handled in the caller's own stack when the session is
idle.

Passivation is the same split: the supervisor proposes `Passivate`;
the actor re-checks idleness when its turn comes, and parks (state as plain
data in the mailbox, actor stopped) only if nothing arrived.

The vocabulary it speaks is in `actors._supervisor_mail`.

One module over 400 lines: `SessionActor` alone is over 400 (parking,
`_park`, reads the actor's state, mailbox, stash and effects in one turn; its
store side, effects and held mail are collaborators of their own already),
and `SessionOwner` and `SessionContext` name it in their types, so elsewhere
they would make an import cycle (tests/test_import_graph.py counts type-only
imports too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import pykka

from actors._commands import (
    AbortResume,
    ActivationOutcome,
    Close,
    Command,
    LifecycleEvent,
    LifecycleKind,
    Resume,
    Tick,
    TickResult,
)
from actors._counters import SessionCounters
from actors._effects import SessionEffects
from actors._errors import (
    InvalidResumeTokenError,
    RegistryClosedError,
    SessionFailedError,
    SessionReplacedError,
    StoreError,
    StoreUnavailableError,
)
from actors._held import HeldMail, answer_held
from actors._lifecycle import ParkedSession, ResumeStash
from actors._loop_actor import LoopActor
from actors._mailbox import ClosableInbox, InboxClosedError, SessionMailbox
from actors._ownership import StoreOwnership
from actors._ports import LoopPort, Outbox, Reply
from actors._state import NO_FAILPOINTS, Failpoints, SessionConfig, SessionState, Transition
from actors._store_link import StoreLink
from actors._supervisor_mail import (
    NO_REPLY,
    Call,
    Committed,
    CrashReport,
    FailSession,
    Fenced,
    Opening,
    Passivate,
    Replaced,
    Restart,
    Shutdown,
    answer_unknown,
)

__all__ = [
    "Call",
    "ClosableInbox",
    "CrashReport",
    "FailSession",
    "InboxClosedError",
    "Opening",
    "Passivate",
    "Replaced",
    "Restart",
    "SessionActor",
    "SessionContext",
    "SessionCounters",
    "SessionOwner",
    "Shutdown",
    "answer_unknown",
]

logger = logging.getLogger("duplex_supervisor.actors")

# Tuples, not ``A | B``: a union is a new object per isinstance call, and
# these run per command.
_NOT_ACTIVITY = (Tick, ActivationOutcome)
# A resume's end, which nobody sends again (see `SessionActor.refused`).
_OUTCOMES = (ActivationOutcome, AbortResume)


class SessionOwner(Protocol):
    """The supervisor's side, as a session actor sees it."""

    def actor_started(self, actor: SessionActor) -> None: ...

    def actor_parked(self, actor: SessionActor, parked: ParkedSession) -> None: ...

    def session_crashed(self, report: CrashReport) -> None: ...

    def session_gone(self, mailbox: SessionMailbox, actor_urn: str, reason: str) -> None: ...

    def call(
        self,
        session_id: str,
        command: Command,
        reply: Reply,
        outbox: Outbox | None = None,
        *,
        internal: bool = False,
    ) -> None:
        """Route ``command`` as a front door would (a session that left: the store)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionContext:
    """What every session of one registry shares."""

    registry_id: str
    config: SessionConfig
    clock: Callable[[], float]
    failpoints: Failpoints
    #: The registry's loop: callbacks go there, and every actor runs on it.
    port: LoopPort
    notify: Callable[[LifecycleEvent], None]
    owner: SessionOwner
    #: Where committed transitions are written, and how (None: this process's
    #: memory only).
    ownership: StoreOwnership | None = None


class SessionActor(LoopActor):
    """One session incarnation run; its mailbox is the session's, shared by all of them."""

    def __init__(
        self,
        *,
        mailbox: SessionMailbox,
        context: SessionContext,
        opening: Opening | None = None,
        parked: ParkedSession | None = None,
    ) -> None:
        self._mailbox = mailbox
        self.actor_loop = context.port
        super().__init__()
        self.session_id = mailbox.session_id
        self.mailbox = mailbox
        self.counters = SessionCounters(attached=opening is not None)
        self._context = context
        self._opening = opening
        self._parked = parked
        self._state: SessionState | None = None
        self._link = StoreLink(context.ownership, mailbox, self)
        self._effects = SessionEffects(
            mailbox=mailbox,
            port=context.port,
            notify=context.notify,
            first=opening.outbox if opening else None,
        )
        self._stash: ResumeStash[Call] = ResumeStash()
        self._holding = HeldMail()
        # When the last command other than a tick was handled (passivation's idleness).
        self._last_active = context.clock()
        #: Since when this session could be parked (None: not now). Written by
        #: the actor after each command; the supervisor reads it as a hint for
        #: whom to propose parking to (the actor checks again itself).
        self.parkable_since: float | None = None
        self._gone = False
        self._closing_reason = "closed"

    def _create_actor_inbox(self) -> Any:  # type: ignore[override]
        # pykka's __init__ asks for the inbox: it is the session's mailbox.
        return self._mailbox

    def _actor_loop_teardown(self) -> None:
        # LoopActor drains the inbox here; the mailbox outlives this actor (a
        # parked session's next actor, or _leave's answers, take what is left).
        return None

    # -- life cycle ------------------------------------------------------------

    def on_start(self) -> None:
        self._context.owner.actor_started(self)
        if self._parked is not None:
            self._reactivate(self._parked)
            return
        opening = self._opening
        assert opening is not None  # noqa: S101 - one of the two is always given
        try:
            state, created = SessionState.open(
                session_id=self.session_id,
                config=self._context.config,
                send=opening.send,
                close=opening.close,
                lease_generation=opening.lease_generation,
                clock=self._context.clock,
                failpoints=self._context.failpoints,
            )
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, the actor ends
            self.create_failed(exc)
            return
        self._link.open(state, created)

    def opened(self, state: SessionState, created: Transition) -> None:
        """The new session is stored (or needs no store): it goes live."""
        opening = self._opening
        assert opening is not None  # noqa: S101
        self._state = state
        self._opening = None
        self._effects.release(created, opening.reply)

    def create_failed(self, failure: BaseException) -> None:
        """The store refused the new session: the caller hears why; it leaves."""
        opening = self._opening
        assert opening is not None  # noqa: S101
        opening.reply.fail(failure)
        self._leave("create_failed", failure)

    def _reactivate(self, parked: ParkedSession) -> None:
        context = self._context
        self._parked = None
        try:
            state = SessionState.unpark(
                parked, config=context.config, clock=context.clock, failpoints=context.failpoints
            )
        except BaseException as exc:  # noqa: BLE001 - still parked; the supervisor decides
            logger.warning(
                "session %s crashed reactivating (%s)", self.session_id, type(exc).__name__
            )
            self.counters.crashes += 1
            self._gone = True
            self._stop_quietly()  # before the data is back: never two readers
            self._mailbox.give_back(parked)
            context.owner.session_crashed(
                CrashReport(
                    session_id=self.session_id,
                    mailbox=self._mailbox,
                    actor_urn=self.actor_urn,
                    during="reactivate",
                    crashed_at=context.clock(),
                )
            )
            return
        self._state = state
        self._link.rebind(state)
        self.counters.bytes_retained = state.journal.retained_bytes
        self.parkable_since = state.idle_since(self._last_active)
        self._announce(state, "reactivated", "message")

    def on_receive(self, message: Any) -> Any:
        if self._gone:
            return None
        if type(message) is Call and self._link.in_flight is None and not self._holding.suspended:
            # Most messages: a call to a session free to run it (what the
            # chain below would decide after seven checks).
            self._on_call(message)
            return None
        if isinstance(message, Committed):
            self._link.committed(message)
        elif isinstance(message, Fenced):
            self._link.fenced(message)
        elif isinstance(message, Shutdown) and self._link.waiting_out_an_outage():
            self._abandon_unknown_write(message)
        elif self._link.in_flight is not None:
            self._holding.hold(message)
        elif isinstance(message, Shutdown):
            self._on_shutdown(message)
        elif isinstance(message, Restart):
            self._on_restart()
        elif isinstance(message, FailSession):
            self._fail(message.reason)
        elif self._holding.suspended:
            self._holding.hold(message)
        elif isinstance(message, Call):
            self._on_call(message)
        elif isinstance(message, Passivate):
            self._on_passivate(message)
        elif isinstance(message, Replaced) and self._link.holds(message.epoch):
            self._replaced()
        return None

    # -- calls -----------------------------------------------------------------

    def _on_call(self, call: Call) -> None:
        state = self._state
        assert state is not None  # noqa: S101 - on_start sets it before any message
        if not self._stash.admit(state.phase, call.command, call):
            return
        self._run(call)
        self._run_stashed()

    def _run_stashed(self) -> None:
        """Run the stashed calls the state's phase lets through now."""
        state = self._state
        assert state is not None  # noqa: S101
        if not self._stash:
            return  # nothing stashed (the usual case): no phase to work out
        while self._ready():
            held = self._stash.next_ready(state.phase)
            if held is None:
                break
            self._run(held)

    def _ready(self) -> bool:
        """Whether the next message may run now (not gone, suspended or committing)."""
        return not self._gone and not self._holding.suspended and self._link.in_flight is None

    def _run(self, call: Call, *, retry: bool = True) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        command = call.command
        try:
            transition = state.handle(command)
        except BaseException as exc:  # noqa: BLE001 - a crash, never the actor's end
            self._crashed(call, exc, retry=retry)
            return
        if self._link.binding is not None and transition.error is None:
            self._link.write(call, transition, state)
            return
        self.carry_out(call, transition)

    def carry_out(self, call: Call, transition: Transition) -> None:
        """The rest of `_run`, once the transition is durable (or needs no write)."""
        state = self._state
        assert state is not None  # noqa: S101
        state.settle()
        command = call.command
        if isinstance(transition.error, InvalidResumeTokenError) and self._link.taken_over():
            # The token may be one another process issued when it took this
            # session over, which this process, not having written since,
            # never heard of: let go, and route the resume again, to be taken
            # over from the store here if the store accepts the token.
            self._route_again(call)
            return
        if not isinstance(command, _NOT_ACTIVITY):
            self._last_active = self._context.clock()
        self.counters.count(command, transition)
        if isinstance(transition.error, InvalidResumeTokenError):
            self._context.notify(LifecycleEvent(kind="invalid_token", session_id=self.session_id))
        self.counters.attached = state.attachment is not None
        self.counters.bytes_retained = state.journal.retained_bytes
        self.parkable_since = state.idle_since(self._last_active)
        self._effects.release(transition, call.reply, call.outbox)
        if isinstance(command, Close):
            self._link.forget()
            self._leave(self._closing_reason)
        elif isinstance(transition.reply, TickResult) and transition.reply.expired:
            self._expire()

    def refused(self, call: Call, transition: Transition, exc: BaseException) -> None:
        """The store refused the transition's commit: undo it and answer why
        (an activation's outcome the store was away for stands instead)."""
        state = self._state
        assert state is not None  # noqa: S101
        if isinstance(exc, StoreUnavailableError) and isinstance(call.command, _OUTCOMES):
            # Nobody sends an activation's outcome again: undone, it would
            # leave the session activating for good, holding every later
            # resume. It stands in memory; the store kept the resume's write,
            # with the presented token as its recovery token (which either
            # outcome allows), and the session's next write brings it level.
            self.carry_out(call, transition)
            return
        state.undo()
        if isinstance(exc, SessionReplacedError) and isinstance(call.command, Resume):
            # The client proved a token this process knows, and another took
            # the lease by proving the same token without writing since (its
            # connection ended before its resume): a takeover to make here,
            # as for a token this process never heard of (`carry_out`).
            self._route_again(call)
        elif isinstance(exc, SessionReplacedError):
            call.reply.fail(exc)
            self._replaced()
        elif isinstance(exc, StoreError):
            call.reply.fail(exc)
        else:  # a bug in a store: a crash of this call
            self._crashed(call, exc, retry=False)

    def go_on(self) -> None:
        """A write in flight was answered: run what waited for it."""
        if self._gone:
            return
        self._run_stashed()
        self._holding.release(self._ready, self.on_receive)

    def _abandon_unknown_write(self, message: Shutdown) -> None:
        """A shutdown does not wait out an outage: the write stays as the store
        has it, and its answer (later) finds this actor gone."""
        closed = RegistryClosedError("the session registry was shut down")
        call = self._link.abandon()
        if call is not None:
            call.reply.fail(closed)
        elif self._opening is not None:
            self._opening.reply.fail(closed)
        self._on_shutdown(message)

    def _route_again(self, call: Call) -> None:
        """Another process holds the session: let go of it here and hand ``call``
        back to the supervisor, which takes the session over from the store."""
        self._replaced()
        self._context.owner.call(
            self.session_id, call.command, call.reply, call.outbox, internal=call.internal
        )

    def _replaced(self) -> None:
        """Another process took this session over: let go of it here."""
        state = self._close_attached("replaced")
        self._announce(state, "replaced", "store")
        self._link.let_go()
        self._leave("replaced", SessionReplacedError(self.session_id))

    # -- crashes -------------------------------------------------------------------

    def _crashed(self, call: Call, exc: BaseException, *, retry: bool) -> None:
        """Answer the caller, suspend, and let the supervisor decide."""
        # Counted before the caller hears of it, so its next stats() shows it.
        self.counters.crashes += 1
        logger.warning(
            "session %s crashed handling %s (%s)",
            self.session_id,
            type(call.command).__name__,
            type(exc).__name__,
        )
        self._holding.suspend(self.session_id, call, exc, retry=retry)
        state = self._state
        assert state is not None  # noqa: S101
        try:
            state.check_invariants()
        except AssertionError:
            logger.error("session %s: restored state failed its invariants", self.session_id)
            sound = False
        else:
            sound = True
        self._context.owner.session_crashed(
            CrashReport(
                session_id=self.session_id,
                mailbox=self._mailbox,
                actor_urn=self.actor_urn,
                during="handle",
                crashed_at=self._context.clock(),
                state_sound=sound,
                retry_crashed=call.internal and not retry,
            )
        )

    def _on_restart(self) -> None:
        holding = self._holding
        if not holding.suspended:
            return
        state = self._state
        assert state is not None  # noqa: S101
        holding.suspended = False
        self.counters.restarts += 1
        self._announce(state, "restarted", "crash")
        retry, holding.retry = holding.retry, None
        if retry is not None:
            self._run(retry, retry=False)
        holding.release(self._ready, self.on_receive)

    # -- passivation -----------------------------------------------------------------

    def _on_passivate(self, message: Passivate) -> None:
        tick = message.tick
        if tick is None:
            self._park(message, tick_due=False)
            return
        # The sweep's tick rode along (see Passivate.tick).
        parked = self._park(message, tick_due=True)
        if parked == "parked":
            tick.reply.resolve(None)
            return
        self._on_call(tick)
        if parked == "not_quiet":
            self.on_receive(Passivate(now=message.now, after_s=message.after_s))

    def _park(
        self, message: Passivate, *, tick_due: bool
    ) -> Literal["parked", "stays", "not_quiet"]:
        """Park if still idle (and, with a tick due, if that tick would change
        nothing at ``message.now``); "not_quiet": the tick must run first."""
        state = self._state
        assert state is not None  # noqa: S101
        idle_since = state.idle_since(self._last_active)
        if idle_since is None or message.now - idle_since < message.after_s or len(self._stash):
            return "stays"
        if not self._mailbox.empty():
            return "stays"  # something arrived: stay live
        context = self._context
        if tick_due and context.failpoints is not NO_FAILPOINTS:
            return "not_quiet"  # under a fault plan every tick runs, its failpoints with it
        try:
            parked = state.park()
        except BaseException as exc:  # noqa: BLE001 - parking changed nothing: stay live
            self.counters.crashes += 1
            logger.warning(
                "session %s crashed passivating (%s); it stays live",
                self.session_id,
                type(exc).__name__,
            )
            return "stays"
        config = context.config
        if tick_due and not parked.quiet(
            message.now, config.disconnect_grace_s, config.replay_ttl_s
        ):
            return "not_quiet"
        owner = context.owner

        def commit() -> None:
            # Inside the mailbox's lock: from here this actor never reads it
            # again, and an observer hears "passivated" before any wake-up's
            # "reactivated".
            self.actor_stopped.set()
            owner.actor_parked(self, parked)
            self._announce(state, "passivated", "idle")

        if not self._mailbox.park(parked, commit):
            return "stays"
        self._gone = True
        pykka.ActorRegistry.unregister(self.actor_ref)
        self._effects.retire_all("parked")
        return "parked"

    # -- endings ------------------------------------------------------------------

    def _announce(self, state: SessionState, kind: LifecycleKind, reason: str) -> None:
        self._context.notify(LifecycleEvent.about(kind, state, reason))

    def _close_attached(self, reason: str) -> SessionState:
        """Close the attached transport (if any) with ``reason``; the state."""
        state = self._state
        assert state is not None  # noqa: S101
        attachment = state.attachment
        if attachment is not None:
            self._effects.close_transport(attachment.generation, reason)
        return state

    def _fail(self, reason: str) -> None:
        state = self._close_attached(reason)
        self._announce(state, "failed", reason)
        failure = SessionFailedError(f"session {self.session_id} failed and was closed")
        self._leave("failed", failure)

    def _expire(self) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        self._announce(state, "expired", "disconnect_grace")
        self._closing_reason = "expired"
        self._run(Call(command=Close(), reply=NO_REPLY, internal=True))

    def _on_shutdown(self, message: Shutdown) -> None:
        closed = RegistryClosedError("the session registry was shut down")
        self._leave("shutdown", closed)
        if message.reply is not None:
            message.reply.resolve(None)

    def _leave(self, reason: str, failure: BaseException | None = None) -> None:
        """Stop taking calls; answer every one still held; tell the owner; stop."""
        self._gone = True
        self._effects.retire_all(reason)
        holding = self._holding
        retry, holding.retry = holding.retry, None
        held: list[Any] = [] if retry is None else [retry]
        held += self._stash.drain()
        held += holding.drain()
        held += self._mailbox.close()
        answer_held(held, self.session_id, failure)
        self.counters.attached = False
        self._context.owner.session_gone(self._mailbox, self.actor_urn, reason)
        self._stop_quietly()

    def _stop_quietly(self) -> None:
        """Stop this actor now, without touching the mailbox (pykka's stop would queue)."""
        self.actor_stopped.set()
        pykka.ActorRegistry.unregister(self.actor_ref)
