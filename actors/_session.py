"""SessionActor: the pykka shell that runs one SessionState serially.

The actor is the imperative shell around `SessionState`:
it takes one message at a time from the session's mailbox, asks the state for
a transition, and only then releases the transition's effects (frames to the
attachment's outbox, callbacks to the caller's loop, the reply).

It carries out; its supervisor decides. A handler that crashes leaves the
state at its snapshot (the machine restores it), the caller gets
`SessionCrashedError`, and the actor *suspends*: it holds every later
message, in arrival order, and reports the crash to its owner. The owner
answers with `Restart` (run the held messages as a new incarnation)
or `FailSession` (close the transport, answer every held message
`SessionFailedError`, leave). Nothing here ever waits: a backoff is the
supervisor's timer, not a wait here.

Nor for a store that does I/O: a transition's commit (and a new session's
create) goes to the registry's `Committer`, and the actor holds, as a
suspended one does, every later message until the answer comes back as a
`Committed` message; then it releases the effects, or undoes the transition
on a refusal. One commit in flight per session keeps its order. A commit
whose answer was lost (`StoreOutcomeUnknownError`) is neither: the actor
goes on holding and has the store fence it (`Fenced`), then keeps or undoes
it as the store says (`StoreBinding.settle`).

The actor has no thread: it is a `LoopActor`, run in turns on its registry's
event loop, so a create is a mailbox and a small object, and a message from
a task of that loop is handled in the caller's own stack when the session is
idle.

Passivation is the same split: the supervisor proposes `Passivate`;
the actor re-checks idleness when its turn comes, and parks (state as plain
data in the mailbox, actor stopped) only if nothing arrived.

One class, longer than our other modules, on purpose: the crash, restart and
passivation paths all read and change the same few fields (the state, the
stash, the held messages, the outboxes) under the actor's one-message-at-a-
time rule; the vocabulary it speaks is in `actors._mail`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pykka

from actors._counters import SessionCounters
from actors._errors import (
    InvalidResumeTokenError,
    RegistryClosedError,
    SessionCrashedError,
    SessionFailedError,
    SessionReplacedError,
    StoreError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
)
from actors._lifecycle import ParkedSession, ResumeStash
from actors._loop_actor import LoopActor
from actors._mail import (
    NO_REPLY,
    Call,
    Committed,
    CrashReport,
    FailSession,
    Fenced,
    Mail,
    Opening,
    Passivate,
    Replaced,
    Restart,
    SessionContext,
    SessionOwner,
    Shutdown,
    answer_unknown,
    carried_call,
)
from actors._mailbox import ClosableInbox, InboxClosedError, SessionMailbox
from actors._messages import (
    Activate,
    ActivationOutcome,
    Close,
    Deliver,
    EventAccepted,
    LifecycleEvent,
    LifecycleKind,
    Notify,
    Resume,
    ResumeResult,
    RetireAttachment,
    Tick,
    TickResult,
)
from actors._ports import Delivery, Outbox, Reply
from actors._state import NO_FAILPOINTS, SessionState, Transition
from actors._store import (
    DEFAULT_LEASE_S,
    BatchingStore,
    Committer,
    SessionRecord,
    StoreBinding,
    StoredSession,
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
_DELIVERIES = (Deliver, Activate)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Creating:
    """A new session whose create the store has not answered yet."""

    state: SessionState = field(repr=False)
    created: Transition = field(repr=False)
    record: SessionRecord = field(repr=False)
    #: Its first answer was lost: sent again until the store answers.
    again: bool = False


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
        self.registry_id = context.registry_id
        self.counters = SessionCounters(attached=opening is not None)
        self._context = context
        self._opening = opening
        self._parked = parked
        self._state: SessionState | None = None
        # With a store: this session's epoch and last write (None: memory only).
        self._binding: StoreBinding | None = None
        # Invariant: keys are attachment generations the state may still
        # deliver to; the current attachment's outbox is always here.
        self._outboxes: dict[int, Outbox] = {1: opening.outbox} if opening else {}
        self._stash: ResumeStash[Call] = ResumeStash()
        # Messages held for the supervisor's decision while suspended (made on
        # the first crash: most sessions never need its ~600 bytes).
        self._held: deque[Mail] | None = None
        self._suspended = False
        # A transition whose commit the committer has not answered yet (or the
        # session's create in the store): its effects and reply wait, and so
        # does every later message (held).
        self._in_flight: tuple[Call, Transition] | _Creating | None = None
        # The commit in flight whose answer was lost, while the store fences it.
        self._fencing: tuple[Call, Transition] | None = None
        # An internal command that crashed once: run again first on Restart.
        self._retry: Call | None = None
        # When the last command other than a tick was handled (passivation's idleness).
        self._last_active = context.clock()
        #: Since when this session could be parked (None: not now). Written by
        #: the actor after each command; the supervisor reads it as a hint for
        #: whom to propose parking to (the actor checks again itself).
        self.parkable_since: float | None = None
        self.incarnation = 0
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
            failure = exc
            opening.reply.fail(failure)
            self._leave("create_failed", answer=lambda call: call.reply.fail(failure))
            return
        store, committer = self._context.store, self._context.committer
        if store is not None and committer is not None:
            # Created in the store off the loop; everything waits for the answer.
            record = state.store_record(time.time() - self._context.clock())
            self._in_flight = _Creating(state=state, created=created, record=record)
            self._create(record)
            return
        if store is not None:
            try:
                self._bind(state, epoch=None)
            except BaseException as exc:  # noqa: BLE001 - a duplicate id, Redis down: caller's
                self._create_failed(exc)
                return
        self._opened(state, created)

    def _opened(self, state: SessionState, created: Transition) -> None:
        opening = self._opening
        assert opening is not None  # noqa: S101
        self._state = state
        self._opening = None
        self._release(created, opening.reply)

    def _create_failed(self, failure: BaseException) -> None:
        opening = self._opening
        assert opening is not None  # noqa: S101
        opening.reply.fail(failure)
        self._leave("create_failed", answer=lambda call: call.reply.fail(failure))

    def _create(self, record: SessionRecord, *, retry_for_s: float = 0.0) -> None:
        store, committer = self._context.store, self._context.committer
        assert store is not None and committer is not None  # noqa: S101
        create = functools.partial(store.create, self.session_id, record)
        committer.call(create, self._create_answered, what="create", retry_for_s=retry_for_s)

    def _lease_s(self) -> float:
        """How long the store keeps this owner's lease without a write."""
        return float(getattr(self._context.store, "lease_s", DEFAULT_LEASE_S))

    def _create_answered(self, epoch: object, error: BaseException | None) -> None:
        """Called on the loop by the committer: the store's create, as a message."""
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(
                Committed(error=error, epoch=epoch if isinstance(epoch, int) else None)
            )

    def _bind(self, state: SessionState, *, epoch: int | None) -> None:
        """Link the session to the store: create it there (``epoch`` None), or
        take the epoch the supervisor's takeover (or an earlier actor) holds."""
        record = state.store_record(time.time() - self._context.clock())
        if epoch is None:
            store = self._context.store
            assert store is not None  # noqa: S101
            epoch = store.create(self.session_id, record)
        self._bound(epoch, record)

    def _bound(self, epoch: int, record: SessionRecord) -> None:
        store = self._context.store
        assert store is not None  # noqa: S101
        self._mailbox.store_epoch = epoch
        self._binding = StoreBinding(
            store=store,
            session_id=self.session_id,
            epoch=epoch,
            record=record,
            clock=self._context.clock,
        )

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
        if context.store is not None and self._mailbox.store_epoch is not None:
            self._bind(state, epoch=self._mailbox.store_epoch)
        self.counters.bytes_retained = state.journal.retained_bytes
        self.parkable_since = state.idle_since(self._last_active)
        self._announce(state, "reactivated", "message")

    def on_receive(self, message: Any) -> Any:
        if self._gone:
            return None
        if isinstance(message, Committed):
            self._on_committed(message)
        elif isinstance(message, Fenced):
            self._on_fenced(message)
        elif isinstance(message, Shutdown) and self._waiting_out_an_outage():
            self._abandon_unknown_write(message)
        elif self._in_flight is not None:
            if self._held is None:
                self._held = deque()
            self._held.append(message)
        elif isinstance(message, Shutdown):
            self._on_shutdown(message)
        elif isinstance(message, Restart):
            self._on_restart()
        elif isinstance(message, FailSession):
            self._fail(message.reason)
        elif self._suspended:
            if self._held is None:
                self._held = deque()
            self._held.append(message)
        elif isinstance(message, Call):
            self._on_call(message)
        elif isinstance(message, Passivate):
            self._on_passivate(message)
        elif (
            isinstance(message, Replaced)
            and self._binding is not None
            and self._binding.epoch == message.epoch
        ):
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
        while self._ready():
            held = self._stash.next_ready(state.phase)
            if held is None:
                break
            self._run(held)

    def _ready(self) -> bool:
        """Whether the next message may run now (not gone, suspended or committing)."""
        return not self._gone and not self._suspended and self._in_flight is None

    def _run(self, call: Call, *, retry: bool = True) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        command = call.command
        try:
            transition = state.handle(command)
        except BaseException as exc:  # noqa: BLE001 - a crash, never the actor's end
            self._crashed(call, exc, retry=retry)
            return
        if self._binding is not None and transition.error is None:
            committer = self._context.committer
            if committer is not None:
                self._commit_later(committer, call, transition)
                return
            if not self._persist(call):
                return
        self._carry_out(call, transition)

    def _carry_out(self, call: Call, transition: Transition) -> None:
        """The rest of `_run`, once the transition is durable (or needs no write)."""
        state = self._state
        assert state is not None  # noqa: S101
        command = call.command
        if isinstance(transition.error, InvalidResumeTokenError) and self._taken_over():
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
        self._release(transition, call.reply, call.outbox)
        if isinstance(command, Close):
            self._forget_stored()
            self._leave(self._closing_reason)
        elif isinstance(transition.reply, TickResult) and transition.reply.expired:
            self._expire()

    def _persist(self, call: Call) -> bool:
        """Write the committed transition through the store; on a refusal undo it.

        ``False``: the call was answered with the store's error and nothing
        of it was released. A refused epoch means another process owns the
        session now: this one closes its transport (``replaced``) and leaves.
        """
        state, binding = self._state, self._binding
        assert state is not None and binding is not None  # noqa: S101
        try:
            binding.commit(state)
        except BaseException as exc:  # noqa: BLE001 - sorted out by _refused
            self._refused(call, exc)
            return False
        return True

    def _refused(self, call: Call, exc: BaseException) -> None:
        """The store refused the transition's commit: undo it and answer why."""
        state = self._state
        assert state is not None  # noqa: S101
        state.undo()
        if isinstance(exc, SessionReplacedError) and isinstance(call.command, Resume):
            # The client proved a token this process knows, and another took
            # the lease by proving the same token without writing since (its
            # connection ended before its resume): a takeover to make here,
            # as for a token this process never heard of (`_carry_out`).
            self._route_again(call)
        elif isinstance(exc, SessionReplacedError):
            call.reply.fail(exc)
            self._replaced()
        elif isinstance(exc, StoreError):
            call.reply.fail(exc)
        else:  # a bug in a store: a crash of this call
            self._crashed(call, exc, retry=False)

    def _commit_later(self, committer: Committer, call: Call, transition: Transition) -> None:
        """Hand the transition's commit to the committer; hold everything until
        its answer (`Committed`), so nothing of it is released before it is
        durable and this session's commits stay in order."""
        state, binding = self._state, self._binding
        assert state is not None and binding is not None  # noqa: S101
        try:
            commit = binding.prepare(state)
        except BaseException as exc:  # noqa: BLE001 - a bug: a crash of this call
            self._refused(call, exc)
            return
        if commit is None:
            self._carry_out(call, transition)
            return
        self._in_flight = (call, transition)
        committer.submit(commit, self._commit_answered)

    def _commit_answered(self, error: BaseException | None) -> None:
        """Called on the loop by the committer: the answer, as a message."""
        # A session already gone (a shutdown that could not wait) has nothing to undo.
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(Committed(error=error))

    def _on_committed(self, message: Committed) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if isinstance(in_flight, _Creating):
            if isinstance(message.error, StoreOutcomeUnknownError) and not in_flight.again:
                # The same record again (its token digest is this create's own:
                # the store answers a create it applied already as created),
                # until the store answers or the lease passed.
                self._in_flight = replace(in_flight, again=True)
                self._create(in_flight.record, retry_for_s=self._lease_s())
                return
            if message.error is not None or message.epoch is None:
                self._create_failed(message.error or RuntimeError("the store gave no epoch"))
                return
            self._bound(message.epoch, in_flight.record)
            self._opened(in_flight.state, in_flight.created)
        elif in_flight is not None:
            call, transition = in_flight
            binding = self._binding
            assert binding is not None  # noqa: S101 - only _replaced clears it, never in flight
            if message.error is None:
                binding.confirm()
                self._carry_out(call, transition)
            elif isinstance(message.error, StoreOutcomeUnknownError):
                # Applied or not, nobody knows: neither released nor undone
                # (either could contradict the store), and the session holds
                # until the store says which.
                self._in_flight = self._fencing = in_flight
                self._fence(binding)
                return
            else:
                self._refused(call, message.error)
        self._go_on()

    def _go_on(self) -> None:
        """A commit in flight was answered: run what waited for it."""
        if self._gone:
            return
        self._run_stashed()
        while self._held and self._ready():
            self.on_receive(self._held.popleft())

    def _fence(self, binding: StoreBinding) -> None:
        """Ask the store to fence the commit in doubt and say whether it was
        applied (`StoreBinding.settle`), trying again while it is away, up to
        the store's lease: past it this owner cannot keep the session anyway."""
        committer, store = self._context.committer, binding.store
        assert committer is not None and isinstance(store, BatchingStore)  # noqa: S101
        fence = functools.partial(store.fence, self.session_id, binding.epoch, secrets.token_hex(8))

        def answer(stored: object, error: BaseException | None) -> None:
            fenced = stored if isinstance(stored, StoredSession) else None
            with contextlib.suppress(InboxClosedError):
                self._mailbox.tell(Fenced(stored=fenced, error=error))

        what = f"session {self.session_id}: fence"
        committer.call(fence, answer, what=what, retry_for_s=self._lease_s())

    def _waiting_out_an_outage(self) -> bool:
        """Whether a write whose answer was lost is being tried until the store answers."""
        creating = self._in_flight
        return self._fencing is not None or (isinstance(creating, _Creating) and creating.again)

    def _abandon_unknown_write(self, message: Shutdown) -> None:
        """A shutdown does not wait out an outage: the write stays as the store
        has it, and its answer (later) finds this actor gone."""
        closed = RegistryClosedError("the session registry was shut down")
        if self._fencing is not None:
            self._fencing[0].reply.fail(closed)
        elif self._opening is not None:
            self._opening.reply.fail(closed)
        self._in_flight = self._fencing = None
        self._on_shutdown(message)

    def _on_fenced(self, message: Fenced) -> None:
        fencing, self._fencing = self._fencing, None
        binding = self._binding
        if fencing is None or binding is None:
            return  # nothing in doubt (cannot happen: one fence per commit in flight)
        self._in_flight = None
        call, transition = fencing
        if message.stored is not None:
            self._mailbox.store_epoch = message.stored.epoch
            if binding.settle(message.stored):
                self._carry_out(call, transition)  # applied: its effects go out once
            else:
                self._refused(call, StoreUnavailableError("the store did not apply the write"))
        elif isinstance(message.error, StoreUnavailableError):
            logger.warning(
                "session %s: a write's outcome stayed unknown past the store's lease; "
                "letting go (the stored copy stands, a resume takes it over)",
                self.session_id,
            )
            self._refused(call, SessionReplacedError(self.session_id))
        else:
            self._refused(call, message.error or RuntimeError("a fence gave nothing"))
        self._go_on()

    def _taken_over(self) -> bool:
        """Whether the store says another process owns this session now."""
        binding = self._binding
        if binding is None:
            return False
        try:
            return not binding.store.renew(self.session_id, binding.epoch)
        except StoreError:
            return False  # the store cannot say: answer as this process knows it

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
        self._binding = None
        replaced = SessionReplacedError(self.session_id)
        self._leave("replaced", answer=lambda call: call.reply.fail(replaced))

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
            elif isinstance(effect, _DELIVERIES):
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
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(Call(command=outcome, reply=NO_REPLY, internal=True))

    # -- crashes -------------------------------------------------------------------

    def _crash_error(self, call: Call, exc: BaseException) -> SessionCrashedError:
        name = type(call.command).__name__
        error = SessionCrashedError(f"session {self.session_id} crashed handling {name}")
        error.__cause__ = exc
        return error

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
        # A command retried after this crash answers its waiter with the
        # retry's outcome, not with this crash.
        if call.internal and retry:
            self._retry = call
        else:
            call.reply.fail(self._crash_error(call, exc))
        state = self._state
        assert state is not None  # noqa: S101
        try:
            state.check_invariants()
        except AssertionError:
            logger.error("session %s: restored state failed its invariants", self.session_id)
            sound = False
        else:
            sound = True
        self._suspended = True
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
        if not self._suspended:
            return
        state = self._state
        assert state is not None  # noqa: S101
        self._suspended = False
        self.incarnation += 1
        self.counters.restarts += 1
        self._announce(state, "restarted", "crash")
        retry, self._retry = self._retry, None
        if retry is not None:
            self._run(retry, retry=False)
        while self._held and self._ready():
            self.on_receive(self._held.popleft())

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
        for outbox in self._outboxes.values():
            outbox.retire("parked")
        self._outboxes.clear()
        return "parked"

    # -- endings ------------------------------------------------------------------

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

    def _close_attached(self, reason: str) -> SessionState:
        """Close the attached transport (if any) with ``reason``; the state."""
        state = self._state
        assert state is not None  # noqa: S101
        attachment = state.attachment
        if attachment is not None:
            outbox = self._outboxes.pop(attachment.generation, None)
            if outbox is not None:
                outbox.close_transport(reason)
        return state

    def _fail(self, reason: str) -> None:
        state = self._close_attached(reason)
        self._announce(state, "failed", reason)
        failure = SessionFailedError(f"session {self.session_id} failed and was closed")
        self._leave("failed", answer=lambda call: call.reply.fail(failure))

    def _expire(self) -> None:
        state = self._state
        assert state is not None  # noqa: S101
        self._announce(state, "expired", "disconnect_grace")
        self._closing_reason = "expired"
        self._run(Call(command=Close(), reply=NO_REPLY, internal=True))

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
        held: list[Any] = []
        if self._retry is not None:
            held.append(self._retry)
            self._retry = None
        held += self._stash.drain()
        if self._held:
            held += self._held
            self._held.clear()
        held += self._mailbox.close()
        for mail in held:
            call = carried_call(mail)
            if call is not None:
                if answer is not None:
                    answer(call)
                else:
                    answer_unknown(call.reply, call.command, self.session_id)
            elif isinstance(mail, Shutdown) and mail.reply is not None:
                mail.reply.resolve(None)
        self.counters.attached = False
        self._context.owner.session_gone(self._mailbox, self.actor_urn, reason)
        self._stop_quietly()

    def _forget_stored(self) -> None:
        """A closed session leaves the store too (if this process still owns it)."""
        binding, self._binding = self._binding, None
        if binding is None:
            return
        committer = self._context.committer
        if committer is not None:  # off the loop, after this session's last commit
            delete = functools.partial(binding.store.delete, self.session_id, binding.epoch)
            committer.call(delete, None, what=f"session {self.session_id}: store delete")
            return
        try:
            binding.store.delete(self.session_id, binding.epoch)
        except StoreError as exc:
            # Its keys expire by themselves (the store's key TTL).
            logger.warning("session %s: store delete failed (%s)", self.session_id, exc)

    def _stop_quietly(self) -> None:
        """Stop this actor now, without touching the mailbox (pykka's stop would queue)."""
        self.actor_stopped.set()
        pykka.ActorRegistry.unregister(self.actor_ref)
