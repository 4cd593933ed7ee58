"""The seed's methods, written once: the async doors, and through them the thread door.

`AsyncSessionRegistry` has every method of the seed's registry, with
the same names, parameters, results and errors, plus ``send_event_nowait``,
``send_events``, ``abandon_resume``, ``sweep``, ``stats`` and
``session_ids``. A subclass says how its loop waits (`LoopReply`),
pumps an outbox, sleeps, shields a wait and spells cancellation; the trio and
asyncio doors are those subclasses, and the thread door runs the trio one on
a loop thread of its own. Shutdown is written here once for all three.

Callers never park a thread: a call is a message to the session's actor, and
the actor answers by scheduling a callback on the caller's loop.

The module is long because every method carries the docstring the API
reference is built from (the seed's contract, written once for all doors):
more than a third of its lines.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from actors._errors import (
    RegistryClosedError,
    SessionCrashedError,
    SessionError,
    UnknownSessionError,
)
from actors._journal import JournalEntry
from actors._messages import (
    AbortResume,
    Acknowledge,
    ActivationPayloadFactory,
    AuthenticateResume,
    BeginResume,
    Close,
    CloseCallable,
    Command,
    DetachedAttachment,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    LifecycleEvent,
    ReleaseAttachment,
    Resume,
    ResumeResult,
    SendCallable,
    SendEvent,
    SendEvents,
    SessionCreated,
    SettleLeaseGeneration,
    TransportAttachment,
)
from actors._ports import NoWaiter
from supervisor._actor import RegistryStats, SessionSystem
from supervisor._options import RegistryOptions
from supervisor._outbox import CoalescingPort, OutboxCore
from supervisor._validate import (
    check_generation,
    check_session_id,
    check_transport,
    check_unjournaled,
)

__all__ = ["AsyncSessionRegistry", "LoopReply"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: How long a cancelled resume waits, shielded, to learn whether to roll back.
_ABORT_WAIT_S = 30.0
#: How long shutdown waits for every session to stop.
_STOP_WAIT_S = 10.0


class LoopReply:
    """A reply settled on its loop; the first answer wins.

    ``resolve``/``fail`` may come from any thread: off the loop they ride the
    port, on it they land at once (unless callbacks submitted before them
    still wait: then they queue behind). A subclass wakes its loop's waiter.
    """

    __slots__ = ("_done", "_error", "_on_settled", "_port", "_settled_key", "_value")

    def __init__(self, port: CoalescingPort) -> None:
        self._port = port
        self._on_settled: Callable[[str], None] | None = None
        self._settled_key = ""
        self._done = False
        self._value: object = None
        self._error: BaseException | None = None

    def resolve(self, value: object) -> None:
        self._settle(value, None)

    def fail(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, value: object, error: BaseException | None) -> None:
        if self._port.may_run_now():
            self._land(value, error)
        else:
            self._port.submit(lambda: self._land(value, error))

    def settle_later(self, on_settled: Callable[[str], None], key: str) -> None:
        """Call ``on_settled(key)`` once this reply is settled (set before it
        is sent); a function and its argument, not a closure: one is set per
        awaited call."""
        self._on_settled = on_settled
        self._settled_key = key

    def _land(self, value: object, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self._value = value
        self._error = error
        # Dropped once run: an actor may hold this reply until its next
        # message, and the callback holds the registry (the drop-in's
        # finalizer needs the registry to become garbage).
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled(self._settled_key)
        self._wake()

    def _outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def _wake(self) -> None:
        raise NotImplementedError

    async def wait(self) -> Any:
        raise NotImplementedError


def report_refused(
    notify: Callable[[LifecycleEvent], None], session_id: str, error: BaseException
) -> None:
    """Log a refused ``send_event_nowait`` event and tell the observer."""
    reason = type(error).__name__
    logger.warning("a send_event_nowait to session %s was refused: %s", session_id, reason)
    notify(LifecycleEvent(kind="event_refused", session_id=session_id, reason=reason))


def _released(count: int) -> None:
    """What a settled _CountedNoWaiter releases again: nothing."""


class _CountedNoWaiter(NoWaiter):
    """The reply of ``count`` coalesced ``send_event_nowait`` calls.

    Nobody waits, but their slots are freed, and every refusal is logged and
    reaches the observer as an ``event_refused`` event.
    """

    __slots__ = ("_count", "_notify", "_port", "_release", "_session_id")

    def __init__(
        self,
        port: CoalescingPort,
        release: Callable[[int], None],
        count: int,
        *,
        session_id: str,
        notify: Callable[[LifecycleEvent], None],
    ) -> None:
        self._port = port
        self._release = release
        self._count = count
        self._session_id = session_id
        self._notify = notify

    def resolve(self, value: object) -> None:
        if isinstance(value, tuple):
            # Each refused event with its own error, in the burst's order.
            for item in value:
                if isinstance(item, BaseException):
                    report_refused(self._notify, self._session_id, item)
        self._settle()

    def fail(self, error: BaseException) -> None:
        for _ in range(self._count):
            report_refused(self._notify, self._session_id, error)
        self._settle()

    def _settle(self) -> None:
        # Dropped once used, for the reason LoopReply drops its callback.
        release, self._release = self._release, _released
        count = self._count
        if self._port.on_loop():
            release(count)
        else:
            self._port.submit(lambda: release(count))


class AsyncSessionRegistry:
    """The seed's registry, async, for one event loop.

    Do not build one yourself: ``open_session_registry()`` of the trio door
    (`supervisor.open_session_registry`) or of the asyncio door
    (`supervisor.open_asyncio_registry`) yields one, bound to the
    running loop, and shuts it down when its block ends. Every method is a
    message to the session's actor; a caller waits on its loop, never on a
    thread.

    Unknown sessions are answered as the seed answered them:
    `UnknownSessionError` (a ``KeyError``) from
    ``send_event``, ``send_event_nowait``, ``send_events``, ``acknowledge``,
    ``begin_resume``, ``authenticate_resume``, ``resume`` and
    ``abandon_resume``; ``False`` or ``None`` from the others. After
    shutdown every call raises `RegistryClosedError`, but
    ``stats()`` and ``session_ids()``, which still answer.

    Cancellation: a call cancelled while it waits its turn (the session has
    ``max_pending_per_session`` calls in flight) sends nothing. Once sent,
    the session carries it out whether or not its caller is still waiting;
    the caller just never sees the answer. ``create`` and ``resume`` are
    the exceptions: cancelled, they are undone (a ``resume`` only before its
    commit point; see each).
    """

    #: Whether transports' ``send``/``close`` are async functions (the thread
    #: door's hosted registry runs blocking ones on worker threads).
    _async_transports = True

    def __init__(self, *, options: RegistryOptions, port: CoalescingPort) -> None:
        self._options = options
        self._system = options.start_system(port)
        # Bound once: every outbox holds it (a bound method per outbox was
        # one more object per session for the garbage collector).
        self._notify = self._system.notify
        self._port = port
        self._strict = options.strict
        self._send_timeout_s = options.send_timeout_s
        self._max_pending = options.max_pending_per_session
        # Calls in flight per session (touched on the loop only).
        self._pending: dict[str, int] = {}
        # Outboxes whose pumps may still run (for the drain on exit); finished
        # ones are dropped whenever the list doubles: O(1) a create, amortized.
        self._outboxes: list[OutboxCore] = []
        self._prune_outboxes_at = 64
        # send_event_nowait calls of this loop tick, per session, not yet sent:
        # (journal flag, payloads). Flushed at the end of the tick, or before
        # any other call to that session, so per-session order holds.
        self._bursts: dict[str, tuple[bool, list[Mapping[str, object]]]] = {}
        self._flush_scheduled = False
        # Per session, an event set when one of its calls settles.
        self._room: dict[str, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sessions={len(self._system.session_ids())})"

    # -- what a loop supplies ---------------------------------------------------------

    def _new_reply(self) -> LoopReply:
        raise NotImplementedError

    def _start_outbox(
        self, session_id: str, send: SendCallable, close: CloseCallable
    ) -> OutboxCore:
        raise NotImplementedError

    def _would_block(self, session_id: str) -> BaseException:
        raise NotImplementedError

    def _new_event(self) -> Any:
        """The loop's one-shot event (``set()``, ``await wait()``)."""
        raise NotImplementedError

    async def _wait_for_room(self, session_id: str) -> None:
        """Return once a call of the session settled (it may have room then)."""
        event = self._room.get(session_id)
        if event is None:
            event = self._room[session_id] = self._new_event()
        await event.wait()

    def _room_freed(self, session_id: str) -> None:
        event = self._room.pop(session_id, None)
        if event is not None:
            event.set()

    def _is_cancellation(self, exc: BaseException) -> bool:
        raise NotImplementedError

    async def _shielded(self, reply: LoopReply, timeout: float) -> Any:
        """Wait for ``reply`` where no cancellation reaches, up to ``timeout``."""
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def _now(self) -> float:
        """The loop's clock (real time: the drain deadline is not logical time)."""
        raise NotImplementedError

    async def _run_timers(self) -> None:
        """The supervisor's timers (restart backoffs), looked at on the loop.

        Sleeps until the next timer is due, or `Timers.POLL_S` at most, so a
        timer on a clock that jumps (a fake or shifted one) still fires.
        """
        timers = self._system.timers
        while True:
            wait = timers.wait_s()
            await self._sleep(timers.POLL_S if wait is None else max(wait, 0.001))
            self._system.poll_timers()

    # -- shutdown, the same for every door ---------------------------------------------

    async def _shut_down(self) -> None:
        """Drain, then stop every session, then the supervisor. Runs once.

        1. No new call is taken (`RegistryClosedError`).
        2. Queued ``send_event_nowait`` calls go to their sessions, and for
           up to ``drain_timeout_s`` calls in flight settle and outboxes send
           what they hold.
        3. Every session stops: calls still waiting get
           ``RegistryClosedError``; outboxes are retired with the reason
           ``"shutdown"``, their unsent frames dropped (logged with a count).
           No transport's ``close`` is called: the transports belong to
           their owners, as in the seed.
        4. The supervisor stops (nothing to join: no actor has a thread).

        Must be called shielded from cancellation (each door does).
        """
        if self._closed:
            return
        self._closed = True
        self._flush_all()
        deadline = self._now() + self._options.drain_timeout_s
        # A call still in flight (a send_event_nowait whose frame is on its way
        # from the actor to its outbox) is undrained too, not only queued frames.
        while not self._drained() and self._now() < deadline:
            await self._sleep(0.005)
        if not self._drained():
            logger.warning(
                "registry shut down with %d calls in flight and %d outboxes not drained",
                sum(self._pending.values()),
                sum(1 for o in self._outboxes if not o.idle),
            )
        stopped = self._new_reply()
        self._system.shutdown(stopped)
        try:
            await self._shielded(stopped, _STOP_WAIT_S)
        except (SessionError, TimeoutError):
            logger.warning("stopping the sessions did not answer")
        self._system.join()

    def _drained(self) -> bool:
        return not self._pending and all(o.idle for o in self._outboxes)

    # -- plumbing -------------------------------------------------------------------

    def _keep(self, outbox: OutboxCore) -> None:
        self._outboxes.append(outbox)
        if len(self._outboxes) >= self._prune_outboxes_at:
            self._outboxes = [o for o in self._outboxes if not o.finished]
            self._prune_outboxes_at = 2 * len(self._outboxes) + 64

    @property
    def system(self) -> SessionSystem:
        """The actors behind this registry (for tests and diagnostics)."""
        return self._system

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` soon on the registry's loop; callable from any thread."""
        self._port.submit(fn)

    def report_refused(self, session_id: str, error: BaseException) -> None:
        """Log a refused ``send_event_nowait`` and tell the observer."""
        report_refused(self._system.notify, session_id, error)

    def _check_open(self) -> None:
        if self._closed:
            raise RegistryClosedError("the session registry is shut down")

    def _release(self, session_id: str, count: int = 1) -> None:
        left = self._pending.get(session_id, count) - count
        if left <= 0:
            self._pending.pop(session_id, None)
        else:
            self._pending[session_id] = left
        self._room_freed(session_id)

    def _flush(self, session_id: str) -> None:
        burst = self._bursts.pop(session_id, None)
        if burst is None:
            return
        journal, payloads = burst
        reply = _CountedNoWaiter(
            self._port,
            lambda count: self._release(session_id, count),
            len(payloads),
            session_id=session_id,
            notify=self._notify,
        )
        command: Command
        if len(payloads) == 1:
            command = SendEvent(payload=payloads[0], journal=journal)
        else:
            command = SendEvents(payloads=tuple(payloads), journal=journal, atomic=False)
        self._system.call(session_id, command, reply)

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        for session_id in list(self._bursts):
            self._flush(session_id)

    def _has_room(self, session_id: str) -> bool:
        """Whether the session has fewer than ``max_pending_per_session`` calls in flight."""
        return self._pending.get(session_id, 0) < self._max_pending

    def _call_in_room(self, session_id: str, command: Command, reply: LoopReply) -> None:
        """Send ``command`` to its session in one of its places (`_has_room`);
        ``reply``, once settled, gives the place back."""
        self._pending[session_id] = self._pending.get(session_id, 0) + 1
        reply.settle_later(self._release, session_id)
        self._system.call(session_id, command, reply)

    def _ask(self, session_id: str, command: Command) -> Awaitable[Any]:
        """Send ``command`` and return what to await for its answer.

        Not a coroutine itself: with room in the session, the caller awaits
        the reply's own ``wait`` (a coroutine less per awaited call).
        """
        self._check_open()
        self._flush(session_id)
        if not self._has_room(session_id):
            return self._ask_once_room(session_id, command)
        reply = self._new_reply()
        self._call_in_room(session_id, command, reply)
        return reply.wait()

    async def _ask_once_room(self, session_id: str, command: Command) -> Any:
        while not self._has_room(session_id):
            await self._wait_for_room(session_id)
        reply = self._new_reply()
        self._call_in_room(session_id, command, reply)
        return await reply.wait()

    # -- the seed's methods ------------------------------------------------------------

    async def create(
        self,
        session_id: str,
        *,
        send: SendCallable,
        close: CloseCallable,
        lease_generation: int = 0,
    ) -> SessionCreated:
        """Open a session with ``send``/``close`` as its first attachment (generation 1).

        Starts the session's actor and an outbox for the transport. The
        result carries the resume token: the only time the registry shows
        it (it keeps only its digest); hand it to the client.

        Args:
            session_id: A non-empty string (strict mode), new to the registry.
            send: The transport's ``send(frame)``; frames reach it in order.
            close: The transport's ``close(reason)``; the library calls it
                only when it gives up on the transport itself (see the
                shutdown page).
            lease_generation: The engine lease generation this connection
                serves (see the README's *Engine leases*).

        Returns:
            SessionCreated: the session id, attachment generation 1 and the
            resume token.

        Raises:
            DuplicateSessionError: the id is taken (a ``ValueError``, as in
                the seed).
            InvalidSessionIdError: not a non-empty string (strict mode).
            RegistryClosedError: the registry is shut down.

        Cancellation: a create cancelled before it returned is undone: the
        session is closed again (nobody saw its token).
        """
        check_session_id(session_id, strict=self._strict)
        check_transport(send, close, asynchronous=self._async_transports, strict=self._strict)
        check_generation(
            lease_generation, what="lease_generation", optional=False, strict=self._strict
        )
        self._check_open()
        outbox = self._start_outbox(session_id, send, close)
        reply = self._new_reply()
        self._system.create(
            session_id,
            send=send,
            close=close,
            lease_generation=lease_generation,
            outbox=outbox,
            reply=reply,
        )
        try:
            created: SessionCreated = await reply.wait()
        except BaseException as exc:
            outbox.stop("create_failed", close=False)
            if self._is_cancellation(exc):
                await self._undo_cancelled_create(session_id, reply)
            raise
        return created

    async def _undo_cancelled_create(self, session_id: str, reply: LoopReply) -> None:
        """The caller gave up before it saw its token: the session must not stay."""
        try:
            await self._shielded(reply, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - not created: nothing to undo
            return
        closing = self._new_reply()
        self._system.close(session_id, Close(), closing)
        try:
            await self._shielded(closing, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - a crashed close leaves it to the owner
            logger.warning("closing the cancelled create of %s failed", session_id)

    async def send_event(
        self,
        session_id: str,
        payload: Mapping[str, object],
        *,
        journal: bool = True,
        on_accepted: Callable[[], None] | None = None,
    ) -> JournalEntry | None:
        """Journal ``payload`` (unless ``journal=False``) and send it to the attachment.

        The event gets the next sequence; its frame is the payload plus
        ``server_event_seq``. Returns once the frame's send finished (at
        once when detached: the event waits in the journal for a resume).

        Args:
            session_id: The session.
            payload: A mapping of JSON values (strict mode); unjournaled
                payloads need only be a mapping (audio bytes are fine).
            journal: ``False`` sends without journaling or a sequence (not
                replayed; dropped while detached), as in the seed.
            on_accepted: Called on the registry's loop once the event is
                journaled, or, unjournaled, after its send succeeded; never
                for a detached unjournaled event. It must not raise (an
                exception is logged and ignored).

        Returns:
            JournalEntry | None: the journaled entry, or ``None`` unjournaled.

        Raises:
            UnknownSessionError: no such session.
            JournalOverflowError: the journal's cap was hit (sticky).
            InvalidPayloadError: not a JSON mapping (strict mode).
            SendTimeoutError: the send ran past ``send_timeout_s``.
            SessionCrashedError: the session crashed on this call; it left
                no trace and may be retried.
            Exception: whatever the transport's ``send`` raised; the event
                stays journaled and the attachment attached, as in the seed.

        Cancellation: once sent to the session the event is journaled, and
        its frame may still reach the client after the caller was cancelled.
        """
        check_session_id(session_id, strict=self._strict)
        check_unjournaled(payload, journal=journal, strict=self._strict)
        command = SendEvent(payload=payload, journal=journal, on_accepted=on_accepted)
        entry: JournalEntry | None = await self._ask(session_id, command)
        return entry

    def send_event_nowait(
        self, session_id: str, payload: Mapping[str, object], *, journal: bool = True
    ) -> None:
        """Queue an event for ``session_id`` and return at once, without waiting.

        The calls of one loop tick reach their session as one message; each
        event is still accepted or refused on its own, and per-session order
        holds (a later awaited call to the session is sent after them). An
        event refused later (a bad payload, an overflowing journal, a
        session closed meanwhile) is logged and reaches the observer as an
        ``event_refused`` lifecycle event; a failed send of its frame makes
        the library give up on that transport (``close("send_failed")``).

        Raises:
            UnknownSessionError: the registry holds no such session.
            trio.WouldBlock: (trio door; ``asyncio.QueueFull`` on asyncio)
                the session has ``max_pending_per_session`` calls in flight.
            RegistryClosedError: the registry is shut down.
        """
        check_session_id(session_id, strict=self._strict)
        check_unjournaled(payload, journal=journal, strict=self._strict)
        self._check_open()
        if not self._system.knows(session_id):
            raise UnknownSessionError(session_id)
        if not self._has_room(session_id):
            raise self._would_block(session_id)
        self._pending[session_id] = self._pending.get(session_id, 0) + 1
        # Coalesced: the events of one loop tick reach the session as one
        # message (each still accepted or refused on its own).
        burst = self._bursts.get(session_id)
        if burst is not None and burst[0] != journal:
            self._flush(session_id)
            burst = None
        if burst is None:
            burst = self._bursts[session_id] = (journal, [])
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._port.submit(self._flush_all)
        burst[1].append(payload)

    async def send_events(
        self,
        session_id: str,
        payloads: Sequence[Mapping[str, object]],
        *,
        journal: bool = True,
    ) -> tuple[JournalEntry | None, ...]:
        """Send a batch of events in one round trip: all journaled or none.

        Like ``send_event`` for each payload, in order, with consecutive
        sequences, but one message to the session and one wait.

        Returns:
            tuple[JournalEntry | None, ...]: one entry (or ``None``,
            unjournaled) per payload.

        Raises:
            UnknownSessionError: no such session.
            JournalOverflowError: the batch does not fit; none was recorded.
            InvalidPayloadError: one payload is invalid; none was recorded.

        Cancellation: as ``send_event``.
        """
        check_session_id(session_id, strict=self._strict)
        for payload in payloads:
            check_unjournaled(payload, journal=journal, strict=self._strict)
        command = SendEvents(payloads=tuple(payloads), journal=journal)
        entries: tuple[JournalEntry | None, ...] = await self._ask(session_id, command)
        return entries

    async def acknowledge(self, session_id: str, sequence: int) -> int:
        """Drop journaled events up to ``sequence``: the client has them.

        Returns:
            int: how many entries were removed.

        Raises:
            UnknownSessionError: no such session.
            InvalidSequenceError: negative, newer than the journal's head, or
                not an int.
        """
        check_session_id(session_id, strict=self._strict)
        removed: int = await self._ask(session_id, Acknowledge(sequence=sequence))
        return removed

    async def detach(self, session_id: str, *, attachment_generation: int | None = None) -> bool:
        """Drop the attached transport; events are journaled for a resume meanwhile.

        ``attachment_generation`` names the connection asking, so a socket
        that already lost a takeover cannot detach the winner; ``None``
        means whichever is attached. The engine owns the disconnect grace
        (unless ``disconnect_grace_s`` is set). The transport's ``close`` is
        not called: the caller owns it.

        Returns:
            bool: whether this call detached; ``False`` if nothing was
            attached, the generation is not current, or the session is
            unknown (as in the seed).
        """
        released = await self.release_attachment(
            session_id, attachment_generation=attachment_generation
        )
        return released is not None

    async def release_attachment(
        self, session_id: str, *, attachment_generation: int | None = None
    ) -> DetachedAttachment | None:
        """``detach`` that also hands back the lease generation the dropped connection served.

        Returns:
            DetachedAttachment | None: the dropped attachment's generation
            and engine lease generation; ``None`` where ``detach`` answers
            ``False``. Fence the engine's own detach on that lease.
        """
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=True, strict=self._strict
        )
        command = ReleaseAttachment(attachment_generation=attachment_generation)
        released: DetachedAttachment | None = await self._ask(session_id, command)
        return released

    async def begin_resume(self, session_id: str) -> None:
        """Claim that a resume of ``session_id`` is about to land and activate.

        Hold the claim from before the engine's lease resume until
        ``end_resume``. While any claim is open, a lease generation that
        loses its owner is parked for the next activation instead of going
        to the connection that activation is about to replace.

        Raises:
            UnknownSessionError: no such session.
        """
        check_session_id(session_id, strict=self._strict)
        await self._ask(session_id, BeginResume())

    async def end_resume(self, session_id: str) -> int | None:
        """Release a ``begin_resume`` claim, whether or not the resume activated.

        Returns:
            int | None: a lease generation the caller must detach itself (it
            was parked for an activation that never came and nobody is
            attached to take it over); ``None`` when nothing is owed or the
            session is unknown.
        """
        check_session_id(session_id, strict=self._strict)
        owed: int | None = await self._ask(session_id, EndResume())
        return owed

    async def settle_lease_generation(self, session_id: str, lease_generation: int) -> int | None:
        """Find an owner for the lease generation of a resume whose connection never served.

        The engine already moved its lease to ``lease_generation``. The
        owner is, in order: the resume waiting to activate (it absorbs the
        generation when it activates); else the attached connection (its
        own detach must be able to detach this lease); else nobody, and the
        generation is returned for the caller to put back into disconnect
        grace. Generations only move forward.

        Returns:
            int | None: the generation nobody owns, or ``None`` (owned, or
            the session is unknown).
        """
        check_session_id(session_id, strict=self._strict)
        check_generation(
            lease_generation, what="lease_generation", optional=False, strict=self._strict
        )
        command = SettleLeaseGeneration(lease_generation=lease_generation)
        owed: int | None = await self._ask(session_id, command)
        return owed

    async def has_attachment(self, session_id: str) -> bool:
        """Whether some connection is attached now (``False`` for an unknown session).

        For a resume that failed to activate: it has no generation of its
        own, and must know whether rolling the lease back would roll back
        somebody else's live attachment.
        """
        check_session_id(session_id, strict=self._strict)
        return bool(await self._ask(session_id, HasAttachment()))

    async def is_current_attachment(self, session_id: str, attachment_generation: int) -> bool:
        """Whether ``attachment_generation`` is attached now (``False`` if unknown)."""
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=False, strict=self._strict
        )
        command = IsCurrentAttachment(attachment_generation=attachment_generation)
        return bool(await self._ask(session_id, command))

    async def authenticate_resume(
        self, session_id: str, *, resume_token: str, last_received_server_event_seq: int
    ) -> None:
        """Check a resume's token, then its sequence, without resuming.

        The seed's order of checks: the token first, so a wrong token never
        learns about the journal.

        Raises:
            UnknownSessionError: no such session.
            InvalidResumeTokenError: neither the current token nor a live
                recovery token.
            JournalGapError: events after the sequence are gone (TTL,
                acknowledged, or overflow; see its attributes).
            InvalidSequenceError: a bad sequence.
        """
        check_session_id(session_id, strict=self._strict)
        command = AuthenticateResume(
            resume_token=resume_token,
            last_received_server_event_seq=last_received_server_event_seq,
        )
        await self._ask(session_id, command)

    async def resume(
        self,
        session_id: str,
        *,
        resume_token: str,
        last_received_server_event_seq: int,
        send: SendCallable,
        close: CloseCallable,
        activation_payload_factory: ActivationPayloadFactory | None = None,
        lease_generation: int | None = None,
    ) -> ResumeResult:
        """Take the session over with a new transport, after proving the token.

        Checks the token, then the sequence; rotates the token; makes
        ``send``/``close`` the attachment (the next generation), replacing
        any attached one (returned in ``replaced_attachment``, not closed:
        its owner closes it; the gateway says ``"replaced"``). With an
        ``activation_payload_factory``, the new ``send`` gets the activation
        frame, then the replay, then live events, and this returns once they
        were sent; a failed activation rolls back (detached, the presented
        token usable once more). Without one, the caller sends the replay
        (``replay_entries``), as in the seed.

        Args:
            session_id: The session.
            resume_token: The token the client presented.
            last_received_server_event_seq: The last sequence the client has.
            send: The new transport's ``send``.
            close: The new transport's ``close``.
            activation_payload_factory: ``(new_token, generation) -> frame``,
                called on the outbox's loop just before the frame is sent.
            lease_generation: The engine lease generation the new connection
                serves (see the README's *Engine leases*).

        Returns:
            ResumeResult: the new token and generation, the replay, and the
            replaced attachment.

        Raises:
            UnknownSessionError: no such session.
            InvalidResumeTokenError: a wrong token.
            JournalGapError: the replay cannot be complete.
            InvalidSequenceError: a bad sequence.
            Exception: what the activation's send or factory raised (rolled
                back).

        Cancellation: cancelled before its commit point, it rolls back like
        a failed activation. The commit point: with a factory, the
        activation and replay reached the new ``send``; without one, the
        result reached this caller. A resume queued behind another's
        activation waits for that outcome.
        """
        check_session_id(session_id, strict=self._strict)
        check_transport(send, close, asynchronous=self._async_transports, strict=self._strict)
        check_generation(
            lease_generation, what="lease_generation", optional=True, strict=self._strict
        )
        self._check_open()
        self._flush(session_id)
        command = Resume(
            resume_token=resume_token,
            last_received_server_event_seq=last_received_server_event_seq,
            send=send,
            close=close,
            activation_payload_factory=activation_payload_factory,
            lease_generation=lease_generation,
        )
        outbox = self._start_outbox(session_id, send, close)
        reply = self._new_reply()
        self._system.call(session_id, command, reply, outbox)
        try:
            result: ResumeResult = await reply.wait()
        except BaseException as exc:
            if self._is_cancellation(exc):
                activates = activation_payload_factory is not None
                await self._roll_back_cancelled(session_id, reply, outbox, activates=activates)
            outbox.stop("resume_failed", close=False)
            raise
        return result

    async def _roll_back_cancelled(
        self, session_id: str, reply: LoopReply, outbox: OutboxCore, *, activates: bool
    ) -> None:
        outbox.abort_activation()
        try:
            result = await self._shielded(reply, _ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - it failed or was aborted: nothing stands
            return
        if not isinstance(result, ResumeResult) or activates:
            # With an activation, success means it reached the wire: committed.
            return
        abort = self._new_reply()
        command = AbortResume(attachment_generation=result.attachment_generation)
        self._system.call(session_id, command, abort, internal=True)
        try:
            await self._shielded(abort, _ABORT_WAIT_S)
        except SessionCrashedError:
            logger.warning("rolling back a cancelled resume of %s crashed once", session_id)

    async def abandon_resume(self, session_id: str, *, attachment_generation: int) -> bool:
        """Roll back a resume the client may never have seen the answer to.

        For a transport that can lose the activation after ``send`` returned
        (a link that dropped before the client read it): if the resume of
        ``attachment_generation`` is still the current one, it is undone as a
        failed activation would be: detached, the presented token usable
        once more, the rotated token still valid.

        Returns:
            bool: whether it was rolled back (``False``: not the current one).

        Raises:
            UnknownSessionError: no such session.
        """
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=False, strict=self._strict
        )
        command = AbortResume(attachment_generation=attachment_generation)
        return bool(await self._ask(session_id, command))

    async def close(self, session_id: str) -> TransportAttachment | None:
        """Remove the session; its actor answers what is queued, then stops.

        The transport's ``close`` is not called: as in the seed, the
        attachment is returned for its owner to close. A create of the same
        id right after succeeds.

        Returns:
            TransportAttachment | None: the attachment it had, or ``None``
            (detached, or unknown).
        """
        check_session_id(session_id, strict=self._strict)
        self._check_open()
        self._flush(session_id)
        reply = self._new_reply()
        self._system.close(session_id, Close(), reply)
        attachment: TransportAttachment | None = await reply.wait()
        return attachment

    # -- beyond the seed -------------------------------------------------------------------

    async def sweep(self) -> None:
        """Tick every session now: TTL pruning and disconnect grace, at once.

        Returns once every session has been ticked (parked ones on their
        data, without waking them). Sessions left detached and idle for
        ``passivate_after_s`` are asked to park as well; each parks when that
        request's turn comes in its mailbox, which may be after this returns
        (parking is invisible to callers). The registry also sweeps every
        ``sweep_interval_s`` by itself.
        """
        self._check_open()
        reply = self._new_reply()
        self._system.sweep(reply)
        await reply.wait()

    def stats(self) -> RegistryStats:
        """The registry's figures, read without an actor round trip."""
        return self._system.stats()

    def session_ids(self) -> list[str]:
        """The ids of the sessions the registry holds now."""
        return self._system.session_ids()

    def frames_queued(self) -> int:
        """Frames waiting in the attachments' outboxes, summed: accepted for
        delivery and not yet written (a delivery's frames count until its last
        is written). Call it on the registry's loop; it costs a walk over the
        outboxes and their queued deliveries, and nothing per send."""
        return sum(outbox.frames_queued for outbox in self._outboxes)
