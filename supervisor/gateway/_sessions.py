"""The engine's work per session, run by the gateway on the serving loop (anyio).

Per session: one task running ``engine.start``, answer tasks for new inputs
(counted in flight by the session's `InputLedger`),
all in one cancel scope that the session's end cancels. Only what the seed
treats as the session's end stops this work (closed, expired, failed, an
overflowed journal, the registry gone): a send that fails or times out is the
transport's trouble, the event is journaled and a resume replays it.

Sequenced client events (``client_seq``) pass the session's
`ClientSequence` here, once each. With a session store, each one is marked
handled in the store (`actors._client_seqs.ClientWatermark`) once it is:
atomically with the journaling of an engine event that carries its
``client_seq`` (`actors._store.Commit`), once the engine's
``on_client_event`` returned, at once for an event with nothing more to do,
and for an input once its answer ended (or it was answered otherwise:
``input.duplicate``, ``busy``, ``input_limit``). The stored
``last_client_seq``, what a resume on another process starts from, stays
below the oldest event not yet handled (an input whose answer is in flight),
and that process takes the events handled above it as repeats: an input
whose process died mid-answer is answered there, once. Each session's
accepted events of the engine's declared types reach
``engine.on_client_event`` in order, through one task per session (queued
in its `_Inbox`, `supervisor.gateway._inbox`); a ``response.cancel``
cancels the scopes it names at once.

With a session store, an input new to this process asks the store first
(`SessionStore.claim_input`): an input another process already answered
(its ``response.done`` journaled, which the replay carries) is answered
``input.duplicate``, not a second time.

A little over 400 lines: `EngineWork` and `_Live`, the record it keeps and
changes per session, are read together.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.to_thread

from actors._errors import (
    InvalidInputError,
    JournalOverflowError,
    RegistryClosedError,
    SessionCrashedError,
    SessionFailedError,
    StoreUnavailableError,
)
from actors._store import input_key
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._engine import (
    ClientEvent,
    Engine,
    EngineSession,
    SessionEnded,
    SessionPresence,
    client_event_types,
)
from supervisor.gateway._inbox import _Inbox
from supervisor.gateway._ledgers import ClientSequence, InputLedger, InputVerdict, SequenceVerdict

# _Inbox lives in _inbox.py; listed so that its tests may import it from here.
__all__ = ["EngineWork", "TaskSpawner", "_Inbox"]


class TaskSpawner(Protocol):
    """An anyio task group or a trio nursery: where the engine's tasks run."""

    def start_soon(self, func: Callable[..., Any], *args: Any) -> object: ...


logger = logging.getLogger("duplex_supervisor.supervisor")

#: How long an engine's send waits before trying an unreachable store again.
STORE_RETRY_S = 0.2

#: Accepted client events waiting for the engine, per session: past this the
#: connection's reading waits (backpressure), nothing is dropped.
EVENT_BUFFER = 64

#: Errors of ``send_event`` that mean the session is over for good.
_SESSION_ENDED = (KeyError, SessionFailedError, RegistryClosedError)


@dataclass(slots=True)
class _Live:
    ledger: InputLedger
    session: EngineSession
    #: Who claims this session's inputs in the store: this process's engine
    #: work for the session, once. A session that left and came back here is
    #: new work, so an input the old work claimed and never finished is
    #: answered again (the ledger dedupes within one work's life).
    claimant: str
    presence: SessionPresence
    sequence: ClientSequence
    events: _Inbox | None
    #: One per running task (a scope is entered once); the session's end cancels all.
    scopes: set[anyio.CancelScope] = field(default_factory=set)
    #: Sequenced inputs accepted and not yet given to `EngineWork.answer`: their
    #: ``client_seq`` by input id, marked handled once answered.
    input_seqs: dict[str, int] = field(default_factory=dict)
    stopped: bool = False


@contextlib.contextmanager
def _task_scope(live: _Live) -> Iterator[anyio.CancelScope]:
    """A scope of one of the session's tasks, which the session's end cancels."""
    scope = anyio.CancelScope()
    if live.stopped:
        scope.cancel()
    live.scopes.add(scope)
    try:
        with scope:
            yield scope
    finally:
        live.scopes.discard(scope)


class EngineWork:
    """Runs ``engine`` for the sessions of ``registry`` in ``task_group``."""

    def __init__(
        self,
        registry: AsyncSessionRegistry,
        engine: Engine,
        task_group: TaskSpawner,
        *,
        max_inputs_per_session: int,
        max_inputs_in_flight: int,
        on_overflow: Callable[[str], None] | None = None,
        on_engine_close: Callable[[str, str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.engine = engine
        self._task_group = task_group
        self._max_ids = max_inputs_per_session
        self._max_in_flight = max_inputs_in_flight
        self._on_overflow = on_overflow
        self._on_engine_close = on_engine_close
        #: Client event types the engine takes (besides the gateway's own).
        self.event_types = client_event_types(engine)
        self._live: dict[str, _Live] = {}
        self._works = itertools.count(1)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def start(self, session_id: str, identity: object, *, last_client_seq: int = 0) -> None:
        """Start the engine's work for a session; ``last_client_seq``: what the
        session accepted before (`last_client_seq`, read before its resume)."""

        registry = self.registry
        send = self._sender(session_id, registry.send_event)
        send_batch = self._sender(session_id, registry.send_events)

        def send_many(payloads: Sequence[Mapping[str, object]]) -> Awaitable[None]:
            return send_batch(tuple(payloads))  # taken once: a retry sends the same batch

        def close(reason: str) -> None:
            if self._on_engine_close is not None:
                self._on_engine_close(session_id, reason)

        presence = SessionPresence()
        presence.last_client_seq = last_client_seq
        inbox = _Inbox(EVENT_BUFFER) if self.event_types else None
        live = _Live(
            ledger=InputLedger(max_ids=self._max_ids, max_in_flight=self._max_in_flight),
            session=EngineSession(
                session_id=session_id,
                identity=identity,
                _send=send,
                _send_many=send_many,
                _close=close,
                _presence=presence,
            ),
            claimant=f"{self.registry.system.registry_id}/{next(self._works)}",
            presence=presence,
            sequence=ClientSequence(last=last_client_seq),
            events=inbox,
        )
        self._live[session_id] = live
        self._task_group.start_soon(self._run, live, "start", None)
        if inbox is not None:
            self._task_group.start_soon(self._feed, live, inbox)

    def presence(self, session_id: str) -> SessionPresence | None:
        """The session's attachment and acks as its engine sees them (``None``: no work)."""
        live = self._live.get(session_id)
        return None if live is None else live.presence

    async def last_client_seq(self, session_id: str, *, wait_for_store: bool = True) -> int:
        """The session's last accepted ``client_seq`` (0: none): this process's,
        and with a store the store's if higher (another process may have held
        the session since this one last did, unbeknown to its work here);
        this process's sequence catches up with it. ``wait_for_store=False``:
        `StoreUnavailableError` at once if the store is away (a resume is
        answered ``store_unavailable`` rather than held)."""
        live = self._live.get(session_id)
        local = 0 if live is None else live.sequence.last
        store = self.registry.system.store
        if store is None:
            return local
        if wait_for_store:
            stored = await self._store_call(store.client_watermark, session_id)
        else:
            stored = await anyio.to_thread.run_sync(store.client_watermark, session_id)
        if live is not None:
            # Also the events handled above the watermark: repeats here.
            live.sequence.catch_up(stored)
            live.presence.last_client_seq = live.sequence.last
        return max(local, int(stored.last_client_seq))

    async def deliver(
        self, session_id: str, event: ClientEvent
    ) -> tuple[SequenceVerdict, int] | None:
        """Sequence ``event`` against its session and hand an accepted one on:
        the verdict and the session's last accepted ``client_seq``; ``None``: no
        such session. An accepted ``input`` is for the caller to answer."""
        live = self._live.get(session_id)
        if live is None:
            return None
        verdict = live.sequence.accept(event.client_seq)
        last = live.sequence.last
        if verdict != "accepted":
            return verdict, last
        live.presence.last_client_seq = last
        if event.type == "input":
            # Answered by `answer`, which the caller calls next.
            live.input_seqs[str(event.fields.get("client_event_id"))] = event.client_seq
        if event.type == "response.cancel":
            response_id = event.fields.get("response_id")
            if isinstance(response_id, str):
                live.presence.cancel(response_id)
        if live.events is not None and event.type in self.event_types:
            await live.events.put(event)
        elif event.type != "input":
            # Nothing more to do for it: handled.
            await self._handled(live, last)
        return verdict, last

    async def _handled(self, live: _Live, client_seq: int) -> None:
        """With a store: client event ``client_seq`` is handled, for a resume on
        another process. (An engine event carrying ``client_seq`` says so
        atomically with its journaling; this covers events it answers
        otherwise. An input is marked once its answer ended; if its process
        died between journaling its ``response.done`` and marking it, the
        next process answers its resend ``input.duplicate``, by its id.)"""
        store = self.registry.system.store
        if store is not None:
            await self._store_call(store.record_client_seq, live.session.session_id, client_seq)

    async def _store_call(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a thread, until the store answers."""
        while True:
            try:
                return await anyio.to_thread.run_sync(call, *args)
            except StoreUnavailableError:
                await anyio.sleep(STORE_RETRY_S)

    async def _feed(self, live: _Live, events: _Inbox) -> None:
        """One session's client events to ``engine.on_client_event``, in order."""
        handle = getattr(self.engine, "on_client_event")  # noqa: B009 - declared, checked
        with _task_scope(live):
            while (event := await events.get()) is not None:
                try:
                    await handle(live.session, event)
                except SessionEnded:
                    return
                except Exception:
                    logger.exception("the engine's on_client_event failed")
                await self._handled(live, event.client_seq)

    def answer(self, session_id: str, client_event_id: str, text: str) -> InputVerdict | None:
        """The ledger's verdict (an ``"answer"`` is started); ``None``: no such session."""
        live = self._live.get(session_id)
        if live is None:
            return None
        verdict = live.ledger.decide(client_event_id)
        client_seq = live.input_seqs.pop(client_event_id, None)
        if verdict == "answer":
            self._task_group.start_soon(
                self._run, live, "answer", (client_event_id, text), client_seq
            )
        elif client_seq is not None:
            # Answered already (here, or the client resends it under a new client_seq).
            self._task_group.start_soon(self._mark_handled, live, client_seq)
        return verdict

    async def _mark_handled(self, live: _Live, client_seq: int) -> None:
        with _task_scope(live):
            await self._handled(live, client_seq)

    def stop(self, session_id: str) -> None:
        """The session ended: cancel its work and tell the engine (idempotent)."""
        live = self._live.pop(session_id, None)
        if live is None:
            return
        live.stopped = True
        if live.events is not None:
            live.events.close()
        for scope in live.scopes:
            scope.cancel()
        try:
            self.engine.stop(session_id)
        except Exception:
            logger.exception("the engine's stop failed")

    def stop_all(self) -> None:
        """The gateway is stopping, and its sessions end with it: stop each one's work."""
        for session_id in list(self._live):
            self.stop(session_id)

    async def _run(
        self,
        live: _Live,
        kind: str,
        args: tuple[str, str] | None,
        client_seq: int | None = None,
    ) -> None:
        """The engine's ``start``, or its answer to an input (``args``; sequenced
        as ``client_seq``: marked handled once the answer ended)."""
        with _task_scope(live):
            try:
                if args is None:
                    await self.engine.start(live.session)
                elif (claimed := await self._claimed(live, args[0])) is None:
                    return  # unanswered and not marked handled: a resume's resend is answered
                elif claimed:
                    # An answer is cancellable by its input's id (barge-in).
                    with live.session.cancellable(args[0]):
                        await self.engine.answer(live.session, *args)
            except SessionEnded:
                return
            except Exception:
                logger.exception("the engine's %s failed", kind)
            finally:
                if args is not None:
                    live.ledger.done()
            if client_seq is not None:
                await self._handled(live, client_seq)

    async def _claimed(self, live: _Live, client_event_id: str) -> bool | None:
        """Whether this process answers the input (always, without a store);
        ``None`` if the store failed the claim with an error of its own (not
        unavailable, which is waited out): the store's failure, not the engine's."""
        store = self.registry.system.store
        if store is None:
            return True
        session_id = live.session.session_id
        try:
            claimed = await self._store_call(
                store.claim_input, session_id, live.claimant, input_key(client_event_id)
            )
        except Exception:
            logger.exception("an input's claim failed in the session store; left unanswered")
            return None
        if claimed is False:
            frame = {"type": "input.duplicate", "client_event_id": client_event_id}
            with contextlib.suppress(Exception):
                await self.registry.send_event(session_id, frame, journal=False)
        return bool(claimed)

    def _sender(
        self, session_id: str, to_session: Callable[[str, Any], Awaitable[object]]
    ) -> Callable[[Any], Awaitable[None]]:
        """An engine's send: ``to_session(session_id, what)`` until it is
        journaled, or the session ends (`_retries`).

        The registry is awaited in this one coroutine, not through a retrying
        helper and a closure made per event: under overload what an event
        makes lives until it is delivered, outlives the young GC generations,
        and brings the next full collection nearer."""

        async def send(what: Any) -> None:
            while True:
                try:
                    await to_session(session_id, what)
                except Exception as exc:  # noqa: BLE001 - sorted by _retries
                    if await self._retries(session_id, exc):
                        continue
                return

        return send

    async def _retries(self, session_id: str, exc: Exception) -> bool:
        """Whether a send to the session that raised ``exc`` must be made
        again (it was not journaled); ``False``: it was journaled (the
        transport's error, a send timeout too); raises `SessionEnded` once
        the session is over, and an engine's invalid payload as it is."""
        if isinstance(exc, SessionCrashedError):
            return True  # retryable and traceless: the crashed event was never journaled
        if isinstance(exc, StoreUnavailableError):
            # Not journaled (the session store is away): wait for it, so
            # the engine's next event is not silently lost.
            await anyio.sleep(STORE_RETRY_S)
            return True
        if isinstance(exc, JournalOverflowError):
            logger.warning("a session overflowed its journal; its engine work stops")
            self.stop(session_id)
            if self._on_overflow is not None:
                self._on_overflow(session_id)
            raise SessionEnded from None
        if isinstance(exc, _SESSION_ENDED):
            self.stop(session_id)
            raise SessionEnded from None
        if isinstance(exc, InvalidInputError):
            raise exc  # the engine's payload: its own bug
        return False
