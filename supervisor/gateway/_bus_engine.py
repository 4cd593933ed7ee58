"""`BusEngine`: the gateway's engine when the engine runs in worker processes.

``serve --engine-bus URL`` puts a `BusEngine` where an in-process engine
would be. To the gateway it is an ordinary `RealtimeEngine`; it forwards
what the gateway tells an engine to the pool's input stream as messages
(`supervisor.messages`) and applies what the workers send back, read from
this process's own output stream (`supervisor.engine_bus`):

- ``start`` claims the session for this process (a new lease generation: an
  open, or a takeover after a resume elsewhere), sends ``open``, then
  ``attach``/``detach`` as clients come and go;
- ``answer``, ``on_client_event`` and ``response.cancel`` become ``input``,
  ``client_event`` and ``cancel`` messages;
- ``stop`` sends ``close`` and gives the session up on the bus.

One task (the pump, started by the gateway through `run_in`) reads the
output stream and journals each engine message through the session's own
``send_many`` (or closes it), after the lease fence: a message from an older
generation than the one this process holds, or for a session it does not
hold, is refused and counted (`fenced`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import Callable

import anyio

from supervisor.engine_bus import LeaseFence, RedisEngineBus, call_until_reachable
from supervisor.gateway._engine import ClientEvent, EngineSession, SessionEnded
from supervisor.gateway._sessions import TaskSpawner
from supervisor.messages import (
    CancelMessage,
    ClientEventMessage,
    EngineClose,
    EngineEvents,
    GatewayMessage,
    InputMessage,
    SessionNotice,
)

__all__ = ["BusEngine"]

logger = logging.getLogger("duplex_supervisor.gateway")


def _json_or_none(identity: object) -> object:
    try:
        json.dumps(identity)
    except (TypeError, ValueError):
        return None
    return identity


class BusEngine:
    """A `RealtimeEngine` whose work is done by engine workers over ``bus``."""

    def __init__(
        self,
        bus: RedisEngineBus,
        *,
        gateway: str | None = None,
        client_event_types: frozenset[str] | None = None,
    ) -> None:
        self.bus = bus
        self.gateway = gateway or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        declared = client_event_types
        if declared is None:
            declared = bus.declared_event_types()
            if not bus.workers_have_read():
                logger.warning(
                    "engine bus %r: no engine worker of this pool has started, so the client "
                    "event types its engine takes are unknown here and refused until this "
                    "gateway restarts; inputs wait on the bus for the first worker",
                    bus,
                )
        # A cancel reaches the workers whether or not their engine takes it as an event.
        self.client_event_types = frozenset(declared) | {"response.cancel"}
        self.fence = LeaseFence()
        self.applied = 0
        self._sessions: dict[str, EngineSession] = {}
        #: Set once ``start`` claimed the session (and told the workers):
        #: what the gateway sends for it before that waits.
        self._claimed: dict[str, anyio.Event] = {}
        self._tasks: TaskSpawner | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gateway={self.gateway!r}, bus={self.bus!r})"

    def run_in(self, task_group: TaskSpawner) -> None:
        """The gateway's hook: run the pump (and ``stop``'s messages) in ``task_group``."""
        self._tasks = task_group
        task_group.start_soon(self._pump)

    async def _call(self, call: Callable[..., object], *args: object) -> object:
        return await call_until_reachable(call, *args)

    async def _submit(self, message: GatewayMessage) -> None:
        await self._call(self.bus.submit, message)

    def _claim_of(self, session_id: str) -> anyio.Event:
        return self._claimed.setdefault(session_id, anyio.Event())

    async def _generation(self, session_id: str) -> int:
        await self._claim_of(session_id).wait()
        generation = self.fence.generation(session_id)
        if generation is None:
            raise SessionEnded(session_id)
        return generation

    # -- the Engine protocol ----------------------------------------------------

    async def start(self, session: EngineSession) -> None:
        if self._tasks is None:
            raise RuntimeError("BusEngine needs GatewayService to call run_in first")
        sid = session.session_id
        generation = int(await self._call(self.bus.claim_session, sid, self.gateway))  # type: ignore[call-overload]
        self.fence.hold(sid, generation)
        self._sessions[sid] = session
        identity = _json_or_none(session.identity)
        await self._submit(
            SessionNotice(
                session_id=sid, lease_generation=generation, kind="open", identity=identity
            )
        )
        self._claim_of(sid).set()
        while True:
            await session.wait_attached()
            await self._submit(
                SessionNotice(session_id=sid, lease_generation=generation, kind="attach")
            )
            await session.wait_detached()
            await self._submit(
                SessionNotice(session_id=sid, lease_generation=generation, kind="detach")
            )

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        sid = session.session_id
        await self._submit(
            InputMessage(
                session_id=sid,
                lease_generation=await self._generation(sid),
                client_event_id=client_event_id,
                text=text,
            )
        )

    async def on_client_event(self, session: EngineSession, event: ClientEvent) -> None:
        sid = session.session_id
        generation = await self._generation(sid)
        if event.type == "response.cancel":
            response_id = event.fields.get("response_id")
            if isinstance(response_id, str):
                await self._submit(
                    CancelMessage(
                        session_id=sid, lease_generation=generation, response_id=response_id
                    )
                )
            return
        await self._submit(
            ClientEventMessage(
                session_id=sid,
                lease_generation=generation,
                client_seq=event.client_seq,
                type=event.type,
                fields={k: v for k, v in event.fields.items() if k not in ("type", "client_seq")},
                data=event.data,
            )
        )

    def stop(self, session_id: str) -> None:
        generation = self.fence.generation(session_id)
        self.fence.drop(session_id)
        self._sessions.pop(session_id, None)
        claim = self._claimed.pop(session_id, None)
        if claim is not None:
            claim.set()  # what waits for it finds the session gone
        if generation is not None and self._tasks is not None:
            self._tasks.start_soon(self._stopped, session_id, generation)

    async def _stopped(self, session_id: str, generation: int) -> None:
        with anyio.CancelScope(shield=True):
            await self._submit(
                SessionNotice(session_id=session_id, lease_generation=generation, kind="close")
            )
            await self._call(self.bus.release_session, session_id, self.gateway)

    # -- what the workers say -----------------------------------------------------

    async def _pump(self) -> None:
        after = "0-0"
        while True:
            found = await self._call(self.bus.read_events, self.gateway, after)
            for entry_id, message in found:  # type: ignore[attr-defined]
                after = entry_id
                session = self._sessions.get(message.session_id)
                if not self.fence.admit(message) or session is None:
                    continue
                try:
                    if isinstance(message, EngineEvents):
                        await session.send_many(message.payloads)
                        self.applied += 1
                    elif isinstance(message, EngineClose):
                        await session.close(message.reason)
                except SessionEnded:
                    pass
            if found:
                await self._call(self.bus.trim_events, self.gateway, after)
