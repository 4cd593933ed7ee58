"""The seed's methods, written once: the async doors, and through them the thread door.

`AsyncSessionRegistry` has every method of the seed's registry, with
the same names, parameters, results and errors, plus ``send_event_nowait``,
``send_events``, ``abandon_resume``, ``sweep``, ``stats`` and
``session_ids``. What a loop supplies, the shutdown and the undoing of a
cancelled call are in `supervisor.doors._door_loop`; how a call reaches its
session, in `supervisor.doors._door_calls`; the engine-lease calls, in
`supervisor.doors._door_leases`.

Callers never park a thread: a call is a message to the session's actor, and
the actor answers by scheduling a callback on the caller's loop.

The module is long because every method carries the docstring the API
reference is built from (the seed's contract, written once for all doors):
more than a third of its lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from actors._commands import (
    Acknowledge,
    ActivationPayloadFactory,
    AuthenticateResume,
    Close,
    CloseCallable,
    Resume,
    ResumeResult,
    SendCallable,
    SendEvent,
    SendEvents,
    SessionCreated,
    TransportAttachment,
)
from actors._errors import UnknownSessionError
from actors._journal import JournalEntry
from supervisor._system import RegistryStats
from supervisor._validate import (
    check_generation,
    check_session_id,
    check_transport,
    check_unjournaled,
)
from supervisor.doors._door_leases import EngineLeaseCalls
from supervisor.doors._door_loop import LoopDoor

__all__ = ["AsyncSessionRegistry"]


class AsyncSessionRegistry(EngineLeaseCalls, LoopDoor):
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sessions={len(self._system.session_ids())})"

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
        # Awaited here, not in a helper: one coroutine fewer per create.
        try:
            created: SessionCreated = await reply.wait()
        except BaseException as exc:
            await self._create_unanswered(session_id, reply, outbox, exc)
            raise
        return created

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
        if not self._calls.has_room(session_id):
            raise self._would_block(session_id)
        # Coalesced: the events of one loop tick reach the session as one
        # message (each still accepted or refused on its own).
        self._calls.queue(session_id, payload, journal=journal)

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
        released = await self._release(session_id, attachment_generation)
        return released is not None

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

    # Over ~60 lines for its docstring, the API reference's contract; the body is 16.
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
        self._calls.flush(session_id)
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
        activates = activation_payload_factory is not None
        return await self._await_resume(session_id, reply, outbox, activates=activates)

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
        self._calls.flush(session_id)
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
