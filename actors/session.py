"""SessionActor: one pykka thread per session, running its SessionState serially.

The actor is the imperative shell around :class:`~actors.state.SessionState`:
it takes one message at a time from its inbox, asks the state for a
transition, and only then releases the transition's effects (frames to the
attachment's outbox, callbacks to the caller's loop, the reply). A crash in a
handler never stops the pykka actor: it is caught here, the state is already
back at its snapshot, the caller gets :class:`SessionCrashedError`, and the
same thread goes on with the next message as a new incarnation, unless the
restart budget is spent, in which case the session fails and closes.

Messages queued for a session that has closed are answered, never dropped:
the inbox is closed under a lock, so a sender either gets its message in
before the final drain or learns at ``put`` time (``InboxClosedError``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pykka

from actors.errors import (
    InvalidResumeTokenError,
    JournalGapError,
    JournalOverflowError,
    RegistryClosedError,
    SessionCrashedError,
    SessionFailedError,
    UnknownSessionError,
)
from actors.journal import JournalEntry
from actors.messages import (
    Activate,
    ActivationOutcome,
    AuthenticateResume,
    Close,
    CloseCallable,
    Command,
    Deliver,
    EndResume,
    EventAccepted,
    HasAttachment,
    IsCurrentAttachment,
    LifecycleEvent,
    LifecycleKind,
    Notify,
    ReleaseAttachment,
    Resume,
    ResumeResult,
    RetireAttachment,
    SendCallable,
    SettleLeaseGeneration,
    TickResult,
)
from actors.ports import Delivery, LoopPort, Outbox, Reply, RestartBudget
from actors.state import Failpoints, SessionConfig, SessionState, Transition

__all__ = [
    "THREAD_NAME_PREFIX",
    "Call",
    "ClosableInbox",
    "InboxClosedError",
    "SessionActor",
    "SessionContext",
    "SessionCounters",
    "SessionOwner",
    "Shutdown",
    "answer_unknown",
]

logger = logging.getLogger("duplex_supervisor.actors")

#: Every session thread is named ``THREAD_NAME_PREFIX + session_id``.
THREAD_NAME_PREFIX = "duplex-session:"


#: The seed answered these commands for an unknown session with a plain value;
#: every other command raised ``KeyError``.
_UNKNOWN_ANSWERS: dict[type[Any], object] = {
    ReleaseAttachment: None,
    EndResume: None,
    SettleLeaseGeneration: None,
    HasAttachment: False,
    IsCurrentAttachment: False,
    Close: None,
}


def answer_unknown(reply: Reply, command: Command, session_id: str) -> None:
    """Answer ``command`` as the seed answered it for a session it did not know."""
    if type(command) in _UNKNOWN_ANSWERS:
        reply.resolve(_UNKNOWN_ANSWERS[type(command)])
    else:
        reply.fail(UnknownSessionError(session_id))


class InboxClosedError(pykka.ActorDeadError):
    """The session is gone; its inbox takes no more calls."""


class SessionOwner(Protocol):
    """Who is told when a session starts and leaves (the supervisor's side)."""

    def session_started(self, actor: SessionActor) -> None: ...

    def session_gone(self, session_id: str, actor_urn: str, reason: str) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionContext:
    """What every session of one registry shares."""

    registry_id: str
    config: SessionConfig
    clock: Callable[[], float]
    failpoints: Failpoints
    restart_budget: RestartBudget
    port: LoopPort
    notify: Callable[[LifecycleEvent], None]
    owner: SessionOwner
    #: Daemon threads let a program that never shuts the registry down exit.
    daemon_threads: bool = False


class SessionCounters:
    """Written only by the session's own thread; read by anyone for stats."""

    __slots__ = (
        "attached",
        "bytes_retained",
        "crashes",
        "events_journaled",
        "gap_errors",
        "invalid_tokens",
        "overflow_errors",
        "restarts",
        "resumes",
        "resumes_with_replay",
        "rollbacks",
    )

    def __init__(self) -> None:
        self.attached = True
        self.bytes_retained = 0
        self.crashes = 0
        self.events_journaled = 0
        self.gap_errors = 0
        self.invalid_tokens = 0
        self.overflow_errors = 0
        self.restarts = 0
        self.resumes = 0
        self.resumes_with_replay = 0
        self.rollbacks = 0


class _Mail:
    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(_Mail):
    """A command from a front door, its reply, and for a resume the new outbox."""

    command: Command
    reply: Reply = field(repr=False)
    outbox: Outbox | None = field(default=None, repr=False)
    #: An internal command (an outcome, a tick) is retried once after a crash.
    internal: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(_Mail):
    """The registry stops: answer everything with RegistryClosedError and stop."""

    reply: Reply | None = field(default=None, repr=False)


class ClosableInbox:
    """pykka's inbox contract (put/get/empty) on a SimpleQueue, closable.

    Once :meth:`close` ran, a message of one of ``guarded`` types is refused
    at ``put`` (``refusal`` is raised: an ``ActorDeadError``), so its sender
    learns at once instead of queueing behind a stop, where pykka would drop
    it unanswered. pykka's own messages (a stop) are always let through.
    """

    def __init__(self, guarded: type | tuple[type, ...], refusal: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._guarded = guarded
        self._refusal = refusal

    def put(self, envelope: Any) -> None:
        with self._lock:
            if self._closed and isinstance(envelope.message, self._guarded):
                raise InboxClosedError(self._refusal)
            self._queue.put(envelope)

    def get(self) -> Any:
        return self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()

    def close(self) -> list[Any]:
        """Refuse guarded messages from now on; take out those queued, in order."""
        with self._lock:
            self._closed = True
            envelopes = []
            while not self._queue.empty():
                envelopes.append(self._queue.get_nowait())
            for envelope in envelopes:  # pykka's own (a stop) stay queued
                if not isinstance(envelope.message, self._guarded):
                    self._queue.put(envelope)
        return [e.message for e in envelopes if isinstance(e.message, self._guarded)]


class SessionActor(pykka.ThreadingActor):
    """One session. Start it with :meth:`start`; talk to it with ``tell(Call(...))``."""

    def __init__(
        self,
        *,
        session_id: str,
        context: SessionContext,
        send: SendCallable,
        close: CloseCallable,
        lease_generation: int,
        outbox: Outbox,
        reply: Reply,
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self.registry_id = context.registry_id
        self.counters = SessionCounters()
        self._context = context
        self._open_args = (send, close, lease_generation)
        self._reply_created = reply
        self._state: SessionState | None = None
        # Invariant: keys are attachment generations the state may still
        # deliver to; the current attachment's outbox is always here.
        self._outboxes: dict[int, Outbox] = {1: outbox}
        # Resumes held back while an activation is on the wire, in arrival order.
        self._stash: list[Call] = []
        self._crash_times: list[float] = []
        self.incarnation = 0
        #: The actor's own thread (set by ``start`` before any message).
        self.thread = threading.current_thread()
        self._gone = False
        self._closing_reason = "closed"

    @staticmethod
    def _create_actor_inbox() -> Any:
        return ClosableInbox(_Mail, "session is gone")

    def _start_actor_loop(self) -> None:
        # pykka's own, but keeping the thread so shutdown can join it.
        self.thread = threading.Thread(
            target=self._actor_loop, name=f"{THREAD_NAME_PREFIX}{self.session_id}"
        )
        self.thread.daemon = self._context.daemon_threads
        self.thread.start()

    # -- life cycle ------------------------------------------------------------

    def on_start(self) -> None:
        self._context.owner.session_started(self)
        send, close, lease = self._open_args
        try:
            state, created = SessionState.open(
                session_id=self.session_id,
                config=self._context.config,
                send=send,
                close=close,
                lease_generation=lease,
                clock=self._context.clock,
                failpoints=self._context.failpoints,
            )
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, the actor ends
            failure = exc
            self._reply_created.fail(failure)
            self._leave("create_failed", answer=lambda call: call.reply.fail(failure))
            return
        self._state = state
        self._release(created, self._reply_created)

    def on_receive(self, message: Any) -> Any:
        if self._gone:
            return None
        if isinstance(message, Call):
            self._on_call(message)
        elif isinstance(message, Shutdown):
            self._on_shutdown(message)
        return None

    # -- calls -----------------------------------------------------------------

    def _on_call(self, call: Call) -> None:
        state = self._state
        assert state is not None  # noqa: S101 - on_start sets it before any message
        if isinstance(call.command, Resume | AuthenticateResume) and state.activation_in_flight:
            self._stash.append(call)
            return
        self._run(call)
        while self._stash and not self._gone and not state.activation_in_flight:
            self._run(self._stash.pop(0))

    def _run(self, call: Call, *, retry: bool = True) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        try:
            transition = state.handle(call.command)
        except BaseException as exc:  # noqa: BLE001 - a crash, never the actor's end
            # A command retried after this crash answers its waiter with the
            # retry's outcome, not with this crash.
            retried = call.internal and retry
            if self._restart_after_crash(call, exc, answer=not retried) and retried:
                self._run(call, retry=False)
            elif retried:
                call.reply.fail(self._crash_error(call, exc))
            elif call.internal and not self._gone and not retry:
                self._fail("session_failed")
            return
        self._count(call.command, transition)
        self._release(transition, call.reply, call.outbox)
        if isinstance(call.command, Close):
            self._leave(self._closing_reason)
        elif isinstance(transition.reply, TickResult) and transition.reply.expired:
            self._expire()

    def _release(
        self, transition: Transition, reply: Reply, new_outbox: Outbox | None = None
    ) -> None:
        """Carry out a committed transition's effects, then answer the caller."""
        if transition.error is not None:
            reply.fail(transition.error)
            return
        if isinstance(transition.reply, ResumeResult) and new_outbox is not None:
            self._outboxes[transition.reply.attachment_generation] = new_outbox
        answered = False
        for effect in transition.effects:
            if isinstance(effect, EventAccepted):
                self._context.port.submit(effect.callback)
            elif isinstance(effect, Deliver | Activate):
                answered |= self._post(effect, reply, transition.reply)
            elif isinstance(effect, RetireAttachment):
                outbox = self._outboxes.pop(effect.attachment_generation, None)
                if outbox is not None:
                    outbox.retire(effect.reason)
            elif isinstance(effect, Notify):
                self._context.notify(effect.event)
        if not answered:
            reply.resolve(transition.reply)

    def _post(self, effect: Deliver | Activate, reply: Reply, value: object) -> bool:
        outbox = self._outboxes.get(effect.attachment_generation)
        if outbox is None:
            return False
        if isinstance(effect, Activate):
            outbox.post(Delivery(effect=effect, reply=reply, value=value, report=self._report))
            return True
        if effect.awaited:
            outbox.post(Delivery(effect=effect, reply=reply, value=value))
            return True
        outbox.post(Delivery(effect=effect))
        return False

    def _report(self, outcome: ActivationOutcome) -> None:
        """Called on the outbox's loop: hand the outcome back as a message."""
        # A session already gone has nothing left to roll back.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(Call(command=outcome, reply=_NO_REPLY, internal=True))

    def _count(self, command: Command, transition: Transition) -> None:
        counters = self.counters
        error = transition.error
        if error is not None:
            if isinstance(error, InvalidResumeTokenError):
                counters.invalid_tokens += 1
                self._context.notify(
                    LifecycleEvent(kind="invalid_token", session_id=self.session_id)
                )
            elif isinstance(error, JournalGapError):
                counters.gap_errors += 1
            elif isinstance(error, JournalOverflowError):
                counters.overflow_errors += 1
        else:
            reply = transition.reply
            if isinstance(reply, ResumeResult):
                counters.resumes += 1
                counters.resumes_with_replay += bool(reply.replay_entries)
            elif isinstance(command, ActivationOutcome):
                counters.rollbacks += reply is True
            elif isinstance(reply, tuple):
                # A batch; a coalesced one may hold the errors refusing some.
                for item in reply:
                    counters.events_journaled += isinstance(item, JournalEntry)
                    counters.overflow_errors += isinstance(item, JournalOverflowError)
            elif isinstance(reply, JournalEntry):
                counters.events_journaled += 1
        state = self._state
        assert state is not None  # noqa: S101
        counters.attached = state.attachment is not None
        counters.bytes_retained = state.journal.retained_bytes

    # -- crashes and endings ------------------------------------------------------

    def _crash_error(self, call: Call, exc: BaseException) -> SessionCrashedError:
        name = type(call.command).__name__
        error = SessionCrashedError(f"session {self.session_id} crashed handling {name}")
        error.__cause__ = exc
        return error

    def _restart_after_crash(self, call: Call, exc: BaseException, *, answer: bool) -> bool:
        """Restart in place (answering the caller if ``answer``). ``False``: it failed."""
        name = type(call.command).__name__
        error = self._crash_error(call, exc)
        # Counted before the caller hears of it, so its next stats() shows it.
        self.counters.crashes += 1
        logger.warning(
            "session %s crashed handling %s (%s)", self.session_id, name, type(exc).__name__
        )
        now = self._context.clock()
        self._crash_times.append(now)
        if answer:
            call.reply.fail(error)
        state = self._state
        assert state is not None  # noqa: S101
        try:
            state.check_invariants()
        except AssertionError:
            logger.error("session %s: restored state failed its invariants", self.session_id)
            self._fail("session_failed")
            return False
        if not self._context.restart_budget.allows_restart(self._crash_times, now):
            self._fail("session_failed")
            return False
        self.incarnation += 1
        self.counters.restarts += 1
        self._announce(state, "restarted", name)
        delay = self._context.restart_budget.backoff_s_for(len(self._crash_times))
        if delay > 0:
            self.actor_stopped.wait(delay)
        return True

    def _announce(self, state: SessionState, kind: LifecycleKind, reason: str) -> None:
        self._context.notify(
            LifecycleEvent(
                kind=kind,
                session_id=self.session_id,
                attachment_generation=state.attachment_generation,
                lease_generation=state.lease_generation,
                reason=reason,
            )
        )

    def _fail(self, reason: str) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        attachment = state.attachment
        if attachment is not None:
            outbox = self._outboxes.pop(attachment.generation, None)
            if outbox is not None:
                outbox.close_transport(reason)
        self._announce(state, "failed", reason)
        failure = SessionFailedError(f"session {self.session_id} failed and was closed")
        self._leave("failed", answer=lambda call: call.reply.fail(failure))

    def _expire(self) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        self._announce(state, "expired", "disconnect_grace")
        self._closing_reason = "expired"
        self._run(Call(command=Close(), reply=_NO_REPLY, internal=True))

    def _on_shutdown(self, message: Shutdown) -> None:
        closed = RegistryClosedError("the session registry was shut down")
        self._leave("shutdown", answer=lambda call: call.reply.fail(closed))
        if message.reply is not None:
            message.reply.resolve(None)

    def _leave(self, reason: str, answer: Callable[[Call], None] | None = None) -> None:
        """Stop taking calls; answer every one still held; tell the owner; stop."""
        self._gone = True
        for outbox in self._outboxes.values():
            outbox.retire(reason)
        self._outboxes.clear()
        held = list(self._stash)
        self._stash.clear()
        inbox = self.actor_inbox
        assert isinstance(inbox, ClosableInbox)  # noqa: S101
        held += [message for message in inbox.close() if isinstance(message, Call)]
        for call in held:
            if answer is not None:
                answer(call)
            else:
                answer_unknown(call.reply, call.command, self.session_id)
        self.counters.attached = False
        self._context.owner.session_gone(self.session_id, self.actor_urn, reason)
        self.stop()


class _NoReply:
    def resolve(self, value: object) -> None:
        return None

    def fail(self, error: BaseException) -> None:
        return None


_NO_REPLY: Reply = _NoReply()
