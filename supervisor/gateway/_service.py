"""The gateway behind every shell: one registry, one engine, the protocol core run
against a transport.

`GatewayService` is what the trio server (`supervisor.gateway._server`)
and the ASGI app (`supervisor.gateway.asgi`) share. A shell accepts a
WebSocket, wraps it as a `Transport` (`supervisor.gateway._transport`,
re-exported here) and calls `GatewayService.converse`,
which feeds a `ConnectionCore` the client's
messages and the clock, and carries its actions out (the registry, the
engine, the socket). It runs on anyio, so on trio or asyncio alike; the
registry must be the door of the loop it runs on.

One module over 400 lines: `GatewayService` alone is about 400, its methods
(the registry's observer, a connection's loop, each action carried out)
working on one shared state (the registry, the engine's work, the live
sockets, the counters), which splitting the class would only scatter over
mixins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from actors._commands import LifecycleEvent
from actors._errors import (
    InvalidSequenceError,
    SessionError,
    SessionReplacedError,
    StoreUnavailableError,
)
from supervisor._log_limit import LogLimiter
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._actions import (
    Action,
    AnswerInput,
    CallAck,
    CloseSocket,
    DeliverEvent,
    EndConnection,
    EndSession,
    OpenRequested,
    Ping,
    ResumeRequested,
    SendDirect,
    SendThroughSession,
)
from supervisor.gateway._admission import Admission, Close, Send, store_unavailable
from supervisor.gateway._auth import Authenticate, Handshake
from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._core import ConnectionCore, Phase, TransportClosedError
from supervisor.gateway._departures import Departures
from supervisor.gateway._engine import Engine
from supervisor.gateway._operations import GatewayMetrics
from supervisor.gateway._protocol import (
    CLOSE_CODES,
    REPLACED_CLOSE_CODE,
    ProtocolError,
    frame_text,
)
from supervisor.gateway._sessions import EngineWork, TaskSpawner
from supervisor.gateway._transport import Transport, _SocketSend

# _SocketSend lives in _transport.py; listed so that its tests may import it from here.
__all__ = ["GOING_AWAY", "GatewayService", "Transport", "TransportClosedError", "_SocketSend"]

logger = logging.getLogger("duplex_supervisor.supervisor")

GOING_AWAY = 1001


@dataclass(slots=True)
class _Connection:
    ws: Transport
    core: ConnectionCore
    handshake: Handshake
    identity: object = None
    pings: anyio.abc.TaskGroup | None = None


class GatewayService:
    """Sessions of ``registry`` fed by ``engine``; see the module docstring."""

    def __init__(
        self,
        config: GatewayConfig,
        registry: AsyncSessionRegistry,
        engine: Engine,
        task_group: TaskSpawner,
        *,
        authenticate: Authenticate | None = None,
        counters: GatewayCounters | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.engine = engine
        self.counters = counters or GatewayCounters()
        self.log = LogLimiter(logger, config.log_interval_s)
        self.departures = Departures(registry, self.counters, task_group, self.log)
        self.admission = Admission(
            config,
            registry,
            self.counters,
            self.departures.until_stored,
            authenticate=authenticate,
        )
        self.work = EngineWork(
            registry,
            engine,
            task_group,
            max_inputs_per_session=config.max_inputs_per_session,
            max_inputs_in_flight=config.max_inputs_in_flight,
            on_overflow=self.on_overflow,
            on_engine_close=self.on_engine_close,
        )
        self._task_group = task_group
        # An engine that runs tasks of its own (BusEngine's pump) gets the group.
        run_in = getattr(engine, "run_in", None)
        if callable(run_in):
            run_in(task_group)
        self._live: dict[str, Transport] = {}
        self._sockets: set[Transport] = set()
        #: False once shutting down: /readyz answers 503, new connections 1001.
        self.accepting = True
        self.frames_delivered = 0
        self.sends_in_progress = 0
        self.metrics = GatewayMetrics(self)
        #: The operations port bound (``config.metrics_port``, or the free one 0 picked).
        self.metrics_port: int | None = None

    def throttled_addresses(self) -> int:
        return self.admission.throttled_addresses()

    def connections_open(self) -> int:
        return len(self._sockets)

    def _log(self, level: int, kind: str, message: str, *args: object, **kw: object) -> None:
        self.log.log(level, kind, message, *args, now=anyio.current_time(), **kw)  # type: ignore[arg-type]

    # -- the registry's observer -----------------------------------------------------

    def observe(self, event: LifecycleEvent) -> None:
        """A session that ended, or that another process took over (through a
        session store), stops its engine work here and frees its place."""
        if event.kind in ("closed", "expired", "failed", "replaced"):
            self.work.stop(event.session_id)
            self.admission.release(event.session_id)
        elif event.kind in ("send_timeout", "send_failed"):
            # The attachment is given up, never the session: the engine goes
            # on journaling, and a resume replays what the client missed.
            # The real clock: the observer may run outside any task (an
            # asyncio callback), where anyio has no clock to read.
            self.log.log(
                logging.INFO,
                event.kind,
                "gave up a client's connection (%s); its session waits for a resume",
                event.kind,
                now=time.monotonic(),
            )

    def on_overflow(self, session_id: str) -> None:
        ws = self._live.get(session_id)
        if ws is not None:
            error = ProtocolError("overflow", "the session's journal overflowed; it is closed")
            self._task_group.start_soon(self._end_session, session_id, ws, error)

    def on_engine_close(self, session_id: str, reason: str) -> None:
        # In a task of its own: the close stops the engine's work, which may
        # be the very task that asked for it.
        self._task_group.start_soon(self._engine_closed, session_id, reason)

    async def _engine_closed(self, session_id: str, reason: str) -> None:
        ws = self._live.get(session_id)
        if ws is not None:
            frame = {"type": "session.closed", "reason": reason}
            with contextlib.suppress(KeyError, SessionError, TransportClosedError):
                await self.registry.send_event(session_id, frame, journal=False)
        with contextlib.suppress(KeyError, SessionError):
            await self._end_session(session_id, ws, None)

    async def go_away(self, timeout_s: float = 2.0) -> None:
        """Close every connection with 1001, all at once (one silent client must
        not use up the others' time); then the engine hears ``stop`` for every
        session, which ends with the gateway (sessions live in memory only)."""
        self.accepting = False
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as group:
                for ws in list(self._sockets):
                    group.start_soon(ws.close, GOING_AWAY, "going_away")
        self.work.stop_all()

    # -- one connection ------------------------------------------------------------

    async def converse(self, ws: Transport, handshake: Handshake, *, keepalive: bool) -> None:
        """Serve one accepted WebSocket until it ends; the caller closes it after.

        Raises nothing the peer causes; a bug of ours escapes to the shell's
        error boundary (which closes 1011).
        """
        self._sockets.add(ws)
        core = ConnectionCore(
            self.config,
            anyio.current_time(),
            keepalive=keepalive,
            event_types=self.work.event_types,
        )
        try:
            if not self.accepting:
                await ws.close(GOING_AWAY, "going_away")
                return
            conn = _Connection(ws=ws, core=core, handshake=handshake)
            if not self.config.authenticate_on_first_frame:
                conn.identity = await self._identify(conn)
            if core.phase is Phase.ENDED:
                return
            async with anyio.create_task_group() as pings:
                conn.pings = pings
                try:
                    await self._loop(conn)
                finally:
                    pings.cancel_scope.cancel()
        except* TransportClosedError:
            pass  # the peer left, or we closed: the connection is over
        finally:
            self._sockets.discard(ws)
            core.ended()
            with anyio.CancelScope(shield=True):
                await self._left(ws, core)

    async def _identify(self, conn: _Connection) -> object:
        try:
            return await self.admission.identify(conn.handshake)
        except ProtocolError as error:
            await self._act(conn, conn.core.fail(error))
        return None

    async def _loop(self, conn: _Connection) -> None:
        core = conn.core
        while core.phase is not Phase.ENDED:
            deadline = core.next_deadline()
            wait = math.inf if deadline is None else deadline - anyio.current_time()
            message: str | bytes | None = None
            with anyio.move_on_after(max(0.0, wait)):
                message = await conn.ws.receive()
            now = anyio.current_time()
            actions = core.tick(now) if message is None else core.receive(message, now)
            await self._act(conn, actions)

    async def _act(self, conn: _Connection, actions: list[Action]) -> None:
        for action in actions:
            more = await self._do(conn, action)
            if more:
                await self._act(conn, more)

    async def _do(self, conn: _Connection, action: Action) -> list[Action]:
        """Carry one action out; the actions its outcome leads to."""
        ws, core = conn.ws, conn.core
        if isinstance(action, SendDirect):
            self._count(action.frame)
            await ws.send(frame_text(action.frame))
        elif isinstance(action, CloseSocket):
            await ws.close(action.code, action.reason)
        elif isinstance(action, EndConnection):
            self._log(logging.INFO, "idle", "a peer went silent past the idle timeout")
        elif isinstance(action, Ping) and conn.pings is not None:
            conn.pings.start_soon(self._ping, ws, core)
        elif isinstance(action, OpenRequested | ResumeRequested):
            return await self._admit(conn, action)
        elif core.session_id is not None:
            session_id = core.session_id
            try:
                if isinstance(action, SendThroughSession):
                    self._count(action.frame)
                    await self.registry.send_event(session_id, action.frame, journal=False)
                elif isinstance(action, CallAck):
                    try:
                        await self.registry.acknowledge(session_id, action.server_event_seq)
                    except InvalidSequenceError as exc:
                        return core.fail(ProtocolError("bad_request", str(exc)))
                    except StoreUnavailableError:
                        # Acks are cumulative: the next covers this one, and
                        # the events stay journaled meanwhile.
                        return []
                    presence = self.work.presence(session_id)
                    if presence is not None:
                        presence.acked_server_event_seq = max(
                            presence.acked_server_event_seq, action.server_event_seq
                        )
                elif isinstance(action, DeliverEvent):
                    return await self._deliver(core, session_id, action)
                elif isinstance(action, AnswerInput):
                    verdict = self.work.answer(session_id, action.client_event_id, action.text)
                    if verdict is None:
                        raise KeyError(session_id)
                    return core.input_verdict(action.client_event_id, verdict)
                elif isinstance(action, EndSession):
                    await self._end_session(session_id, ws, None)
            except SessionReplacedError:
                await self._replaced_here(ws, core)
            except KeyError:
                return core.session_gone()
            except (SessionError, TransportClosedError):
                # An answer's send failed (the peer stopped reading past the
                # send timeout) or the session failed under us: this
                # connection ends, not the server with every other session.
                core.ended()
        return []

    async def _deliver(
        self, core: ConnectionCore, session_id: str, action: DeliverEvent
    ) -> list[Action]:
        event = action.event
        outcome = await self.work.deliver(session_id, event)
        if outcome is None:
            raise KeyError(session_id)
        verdict, last = outcome
        if verdict == "repeat":
            self.counters.client_events_repeated += 1
        elif verdict == "accepted":
            self.counters.client_events_accepted += 1
        actions = core.event_verdict(event, verdict, last, anyio.current_time())
        if verdict == "accepted" and event.type == "input":
            client_event_id = str(event.fields["client_event_id"])
            answer = self.work.answer(session_id, client_event_id, str(event.fields["text"]))
            if answer is None:
                raise KeyError(session_id)
            actions += core.input_verdict(client_event_id, answer)
        return actions

    async def _admit(
        self, conn: _Connection, action: OpenRequested | ResumeRequested
    ) -> list[Action]:
        core, address = conn.core, conn.handshake.client
        if self.config.authenticate_on_first_frame:
            handshake = dataclasses.replace(conn.handshake, credential=action.frame.secret)
            try:
                conn.identity = await self.admission.identify(handshake)
            except ProtocolError as error:
                return core.fail(error)
        resumed = isinstance(action, ResumeRequested)
        try:
            session_id, generation = await self._open_or_resume(conn, action)
        except StoreUnavailableError:
            # Nothing changed (a store write leaves no trace): the client may
            # come back once the store answers.
            return self._refused(core, address, resumed, store_unavailable())
        except ProtocolError as error:
            return self._refused(core, address, resumed, error)
        except SessionError as exc:
            # A crash (retryable) or a failed session: this client is told,
            # the gateway and every other session go on.
            self._log(
                logging.WARNING, "open", "a session open/resume failed: %s", type(exc).__name__
            )
            return core.fail(ProtocolError("session_failed", type(exc).__name__))
        await self._admitted(conn, session_id, generation, resumed=resumed)
        return []

    async def _open_or_resume(
        self, conn: _Connection, action: OpenRequested | ResumeRequested
    ) -> tuple[str, int]:
        """The admission's open or resume, attached to this connection's socket."""
        send, close = _socket_transport(self, conn.ws)
        address, identity = conn.handshake.client, conn.identity
        if isinstance(action, OpenRequested):
            return await self.admission.open(send, close, address, action.frame, identity)
        return await self.admission.resume(
            send,
            close,
            address,
            action.frame,
            identity,
            last_client_seq=await self.work.last_client_seq(
                action.frame.session_id, wait_for_store=False
            ),
        )

    async def _admitted(
        self, conn: _Connection, session_id: str, generation: int, *, resumed: bool
    ) -> None:
        """Open or resumed: the engine works for the session, the connection serves it."""
        identity = conn.identity
        if resumed:
            self._resume_outcome("resumed")
            if session_id not in self.work:
                # Taken over from another process through a session store:
                # this process's engine adopts the session (the old one's
                # stops when its writes are refused), and its client_seq,
                # read again now that the old owner is fenced off.
                last = await self.work.last_client_seq(session_id)
                self.work.start(session_id, identity, last_client_seq=last)
        else:
            self.work.start(session_id, identity)
        address = conn.handshake.client
        logger.debug("%s %s from %s", "resumed" if resumed else "opened", session_id, address)
        conn.core.admitted(
            session_id,
            generation,
            resumed=resumed,
            now=anyio.current_time(),
            last_client_seq=await self.work.last_client_seq(session_id),
        )
        self._live[session_id] = conn.ws
        presence = self.work.presence(session_id)
        if presence is not None:
            presence.set_attached(True)

    def _refused(
        self, core: ConnectionCore, address: str, resumed: bool, error: ProtocolError
    ) -> list[Action]:
        """An open or resume answered ``error``: counted, logged, the connection failed."""
        if error.code == "store_unavailable":
            self._log(logging.WARNING, "open", "a session open/resume met an unreachable store")
        if resumed:
            self._resume_outcome(error.code)
            if error.code in ("invalid_resume_token", "resume_throttled", "unauthorized"):
                # INFO: a client's mistake or probe, not the server's trouble.
                self._log(
                    logging.INFO,
                    "resume_refused",
                    "refused a resume from %s: %s",
                    address,
                    error.code,
                )
        return core.fail(error)

    async def _ping(self, ws: Transport, core: ConnectionCore) -> None:
        with contextlib.suppress(TransportClosedError):
            await ws.ping()
            core.pong(anyio.current_time())

    async def _left(self, ws: Transport, core: ConnectionCore) -> None:
        """The connection ended: roll back an unconfirmed resume, detach."""
        session_id, generation = core.session_id, core.attachment_generation
        if session_id is None or generation is None:
            return
        if self._live.get(session_id) is ws:
            del self._live[session_id]
            presence = self.work.presence(session_id)
            if presence is not None:
                presence.set_attached(False)
        await self.departures.detach(session_id, generation, unconfirmed=core.unconfirmed_resume)

    async def _replaced_here(self, ws: Transport, core: ConnectionCore) -> None:
        """Another process took this connection's session over: 4000 ``replaced``,
        whichever call of ours learnt it first (the session closes it so too)."""
        self._log(logging.INFO, "replaced", "a session was taken over by another process")
        core.ended()
        with contextlib.suppress(TransportClosedError):
            await ws.close(REPLACED_CLOSE_CODE, "replaced")

    async def _end_session(
        self, session_id: str, ws: Transport | None, error: ProtocolError | None
    ) -> None:
        self.work.stop(session_id)
        await self.departures.close(session_id)
        if ws is None:
            return
        with contextlib.suppress(TransportClosedError):
            if error is None:
                await ws.close(1000, "session_closed")
            else:
                frame = {"type": "error", "code": error.code, "message": error.message}
                self._count(frame)
                await ws.send(frame_text(frame))
                await ws.close(CLOSE_CODES[error.code], error.code)

    def _count(self, frame: Mapping[str, object]) -> None:
        if frame.get("type") == "error":
            code = str(frame.get("code"))
            self.counters.errors[code] = self.counters.errors.get(code, 0) + 1

    def _resume_outcome(self, outcome: str) -> None:
        outcomes = self.counters.resume_outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1


def _socket_transport(service: GatewayService, ws: Transport) -> tuple[Send, Close]:
    """A client's socket as the registry's ``send``/``close``: each send timed and counted."""

    async def close(reason: str) -> None:
        code = REPLACED_CLOSE_CODE if reason == "replaced" else CLOSE_CODES.get(reason, 1011)
        await ws.close(code, reason)

    return _SocketSend(service, ws), close
