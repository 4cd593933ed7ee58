"""Engine workers: your ordinary `Engine`, run in a process of its own, fed by a bus.

``duplex-supervisor worker --engine module:factory --bus URL`` runs
`EngineWorker` on trio: it reads the pool's input stream as one consumer of
its group (`supervisor.engine_bus.RedisEngineBus`), dispatches each message
by kind to the engine (``start`` for an ``open`` notice, ``answer`` for an
input, ``on_client_event`` for a client event, in ``client_seq`` order per
session), sends what the engine says back as engine messages, acknowledges
each entry once its work is done, and heartbeats the entries it holds so no
other worker claims them while it lives.

Each engine message's idempotency key is ``<entry id>:<n>``, the *n*-th
message the work for that entry sent: a worker that takes over a dead one's
entry does the same work again and produces the same keys, so what the dead
one already sent is dropped, not journaled twice. A send the bus refuses
(the entry was claimed by another worker while this one was stopped, the
session moved to a newer lease, or it ended) raises `SessionEnded` in the
engine's task, which ends it quietly.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from supervisor.engine_bus import Delivery, RedisEngineBus, call_until_reachable
from supervisor.gateway._engine import (
    ClientEvent,
    Engine,
    EngineSession,
    SessionEnded,
    SessionPresence,
    client_event_types,
)
from supervisor.messages import (
    CancelMessage,
    ClientEventMessage,
    EngineClose,
    EngineEvents,
    EngineMessage,
    InputMessage,
    SessionNotice,
)

__all__ = ["EngineWorker"]

logger = logging.getLogger("duplex_supervisor.supervisor")


@dataclass(slots=True)
class _Work:
    """The entry an engine task works for, and how many messages it sent."""

    entry_id: str
    sent: Iterator[int] = field(default_factory=itertools.count)


_current: contextvars.ContextVar[_Work] = contextvars.ContextVar("duplex_engine_work")


@dataclass(slots=True)
class _Remote:
    """A session as this worker knows it."""

    session_id: str
    generation: int
    presence: SessionPresence
    view: EngineSession = field(init=False)
    scopes: set[anyio.CancelScope] = field(default_factory=set)
    events: MemoryObjectSendStream[Delivery] | None = None


class EngineWorker:
    """One consumer of an engine pool's input stream, running ``engine``.

    ``batch``: at most how many entries one read takes (``XREADGROUP``'s
    ``COUNT``). A smaller one does not spread a burst of opens more evenly
    over the workers: measured, the split follows how fast each worker
    comes back to read (README, *Engines in other processes*).
    """

    def __init__(
        self,
        engine: Engine,
        bus: RedisEngineBus,
        *,
        consumer: str | None = None,
        batch: int = 16,
        poll_s: float = 0.5,
    ) -> None:
        self.engine = engine
        self.bus = bus
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.batch = batch
        self.poll_s = poll_s
        self.event_types = client_event_types(engine)
        self._held: set[str] = set()
        self._sessions: dict[str, _Remote] = {}
        self._group: anyio.abc.TaskGroup | None = None
        #: Entries this worker took over from another (claimed after the timeout).
        self.redelivered = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(consumer={self.consumer!r}, bus={self.bus!r})"

    async def _call(self, call: Callable[..., object], *args: object) -> object:
        return await call_until_reachable(call, *args)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Work until cancelled."""
        await self._call(self.bus.declare_event_types, self.event_types)
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._heartbeat)
            task_status.started()
            while True:
                found = await self._call(
                    functools.partial(self.bus.receive, self.consumer, count=self.batch)
                )
                for delivery in found:  # type: ignore[attr-defined]
                    self._held.add(delivery.entry_id)
                    if delivery.redelivered:
                        self.redelivered += 1
                    self._dispatch(group, delivery)

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(self.bus.visibility_s / 3)
            if self._held:
                await self._call(self.bus.heartbeat, self.consumer, list(self._held))

    async def _done(self, entry_id: str) -> None:
        with anyio.CancelScope(shield=True):
            await self._call(self.bus.acknowledge, self.consumer, [entry_id])
        self._held.discard(entry_id)

    # -- dispatch ------------------------------------------------------------

    def _remote(self, session_id: str, generation: int, identity: object = None) -> _Remote:
        remote = self._sessions.get(session_id)
        if remote is None:
            remote = _Remote(
                session_id=session_id, generation=generation, presence=SessionPresence()
            )
            remote.view = EngineSession(
                session_id=session_id,
                identity=identity,
                _send=lambda payload: self._send(remote, (payload,)),
                _send_many=lambda payloads: self._send(remote, payloads),
                _close=lambda reason: self._close(remote, reason),
                _presence=remote.presence,
            )
            self._sessions[session_id] = remote
        remote.generation = max(remote.generation, generation)
        return remote

    def _dispatch(self, group: anyio.abc.TaskGroup, delivery: Delivery) -> None:
        message = delivery.message
        known = self._sessions.get(message.session_id)
        if known is not None and message.lease_generation < known.generation:
            # Said under a lease the session has moved past: nothing to do.
            group.start_soon(self._done, delivery.entry_id)
            return
        if isinstance(message, SessionNotice):
            self._notice(group, delivery, message)
            return
        remote = self._remote(message.session_id, message.lease_generation)
        if isinstance(message, InputMessage):
            view = remote.view
            group.start_soon(
                self._work,
                remote,
                delivery,
                lambda: self.engine.answer(view, message.client_event_id, message.text),
                message.client_event_id,
            )
        elif isinstance(message, ClientEventMessage):
            if remote.events is None:
                send, receive = anyio.create_memory_object_stream[Delivery](max_buffer_size=256)
                remote.events = send
                group.start_soon(self._feed, remote, receive)
            remote.events.send_nowait(delivery)
        elif isinstance(message, CancelMessage):
            remote.presence.cancel(message.response_id)
            group.start_soon(self._done, delivery.entry_id)

    def _notice(
        self, group: anyio.abc.TaskGroup, delivery: Delivery, notice: SessionNotice
    ) -> None:
        if notice.kind == "close":
            remote = self._sessions.pop(notice.session_id, None)
            if remote is not None:
                for scope in remote.scopes:
                    scope.cancel()
                if remote.events is not None:
                    remote.events.close()
            self.engine.stop(notice.session_id)
            group.start_soon(self._done, delivery.entry_id)
            return
        remote = self._remote(notice.session_id, notice.lease_generation, notice.identity)
        if notice.kind == "open":
            view = remote.view
            group.start_soon(self._work, remote, delivery, lambda: self.engine.start(view), None)
        else:
            remote.presence.set_attached(notice.kind == "attach")
            group.start_soon(self._done, delivery.entry_id)

    async def _feed(self, remote: _Remote, events: MemoryObjectReceiveStream[Delivery]) -> None:
        on_client_event = getattr(self.engine, "on_client_event", None)
        async with events:
            async for delivery in events:
                message = delivery.message
                if not isinstance(message, ClientEventMessage):  # only those are fed here
                    continue
                remote.presence.last_client_seq = max(
                    remote.presence.last_client_seq, message.client_seq
                )
                if on_client_event is None or message.type not in self.event_types:
                    await self._done(delivery.entry_id)
                    continue
                event = ClientEvent(
                    type=message.type,
                    client_seq=message.client_seq,
                    fields=dict(message.fields),
                    data=message.data,
                )
                await self._work(
                    remote, delivery, functools.partial(on_client_event, remote.view, event), None
                )

    async def _work(
        self,
        remote: _Remote,
        delivery: Delivery,
        call: Callable[[], Awaitable[object]],
        cancel_key: str | None,
    ) -> None:
        _current.set(_Work(entry_id=delivery.entry_id))
        try:
            with anyio.CancelScope() as scope:
                remote.scopes.add(scope)
                try:
                    if cancel_key is not None and remote.view is not None:
                        with remote.view.cancellable(cancel_key):
                            await call()
                    else:
                        await call()
                finally:
                    remote.scopes.discard(scope)
        except SessionEnded:
            pass
        except Exception:
            # Redelivering it would only fail again: logged, and done.
            logger.exception(
                "engine worker %s: the engine failed on %s", self.consumer, delivery.entry_id
            )
        await self._done(delivery.entry_id)

    # -- what the engine says ---------------------------------------------------

    async def _publish(self, message: EngineMessage, work: _Work) -> None:
        verdict = await self._call(self.bus.publish, self.consumer, work.entry_id, message)
        if verdict in ("fenced", "stale", "orphaned"):
            raise SessionEnded(message.session_id)

    async def _send(self, remote: _Remote, payloads: Sequence[Mapping[str, object]]) -> None:
        work = _current.get()
        message = EngineEvents(
            session_id=remote.session_id,
            lease_generation=remote.generation,
            message_id=f"{work.entry_id}:{next(work.sent)}",
            payloads=tuple(payloads),
        )
        await self._publish(message, work)

    def _close(self, remote: _Remote, reason: str) -> None:
        work = _current.get()
        message = EngineClose(
            session_id=remote.session_id,
            lease_generation=remote.generation,
            message_id=f"{work.entry_id}:{next(work.sent)}",
            reason=reason,
        )
        if self._group is not None:
            self._group.start_soon(self._publish_quietly, message, work)

    async def _publish_quietly(self, message: EngineMessage, work: _Work) -> None:
        with contextlib.suppress(SessionEnded):
            await self._publish(message, work)
