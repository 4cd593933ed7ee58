"""The WebSocket gateway: one endpoint, resumable sessions, a demo engine behind.

``serve_gateway`` opens a trio session registry and a :class:`DemoEngine`, and
serves :mod:`supervisor.gateway.protocol` on one path (``/v1``). It is a
reference integration: an engine of your own replaces :class:`DemoEngine` by
sending through the same registry.

Resume follows the seed's flow: ``authenticate_resume`` before anything else,
``begin_resume``/``end_resume`` around ``resume``, the activation frame built
by the activation factory so the replay follows it in order, the replaced
socket closed by the gateway with reason ``replaced``. A connection's handler
detaches its own attachment generation when the connection ends. Failed
resumes and wrong secrets are throttled per peer address, so the owner coming
from another address is never locked out.

Every step of a connection, from its first byte to its last close, runs in
that connection's own task under one error boundary (:meth:`Gateway.connection`):
nothing a peer does ends the server or another connection. Every wait on a
peer is bounded: the upgrade and first frame by ``handshake_timeout_s``, a
close by ``close_timeout_s`` (then TCP is aborted), a send by
``send_timeout_s``, silence by ``idle_timeout_s``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import ssl
from collections.abc import Mapping

import trio

from actors.errors import InvalidSequenceError, SessionCrashedError, SessionError
from actors.messages import LifecycleEvent
from supervisor.async_door import AsyncSessionRegistry
from supervisor.faults import FaultPlan
from supervisor.gateway.admission import Admission, Close, Send
from supervisor.gateway.config import GatewayConfig, GatewayCounters
from supervisor.gateway.engine import DemoEngine, EngineConfig
from supervisor.gateway.limits import AddressCounter, InputRate, LogLimiter
from supervisor.gateway.listener import REFUSALS, accept_forever, refuse_raw
from supervisor.gateway.protocol import (
    CLOSE_CODES,
    FATAL,
    REPLACED_CLOSE_CODE,
    Ack,
    CloseSession,
    Input,
    OpenSession,
    ProtocolError,
    ResumeSession,
    error_frame,
    parse_client_frame,
)
from supervisor.gateway.websocket import (
    STREAM_ERRORS,
    ServerWebSocket,
    UpgradeRefusedError,
    WebSocketClosedError,
    accept,
    read_upgrade,
    reject,
)
from supervisor.trio_registry import open_session_registry

__all__ = ["Gateway", "GatewayConfig", "GatewayCounters", "serve_gateway"]

logger = logging.getLogger("duplex_supervisor.supervisor")

GOING_AWAY = 1001
INTERNAL_ERROR = 1011


class Gateway:
    """Serves one registry and engine; see :func:`serve_gateway`."""

    def __init__(self, config: GatewayConfig, registry: AsyncSessionRegistry) -> None:
        self.config = config
        self.registry = registry
        self.engine: DemoEngine | None = None
        self.counters = GatewayCounters()
        self.port = config.port
        self.log = LogLimiter(logger, config.log_interval_s)
        self._ssl = _ssl_context(config)
        self.admission = Admission(config, registry, self.counters)
        self.connections = AddressCounter(
            config.max_connections, config.max_connections_per_address
        )
        self._live: dict[str, ServerWebSocket] = {}
        self._sockets: set[ServerWebSocket] = set()

    @property
    def url(self) -> str:
        scheme = "wss" if self.config.tls_cert else "ws"
        return f"{scheme}://{self.config.host}:{self.port}{self.config.path}"

    def throttled_addresses(self) -> int:
        """Addresses the failure throttles hold now (bounded and expiring)."""
        return self.admission.throttled_addresses()

    def observe(self, event: LifecycleEvent) -> None:
        """Registry observer: a session that ended stops producing and frees its place."""
        if event.kind in ("closed", "expired", "failed"):
            if self.engine is not None:
                self.engine.stop(event.session_id)
            self.admission.release(event.session_id)
        elif event.kind in ("send_timeout", "send_failed"):
            # The attachment is given up, never the session: the engine goes
            # on journaling, and a resume replays what the client missed.
            self._log(
                logging.INFO,
                event.kind,
                "gave up a client's connection (%s); its session waits for a resume",
                event.kind,
            )

    def on_overflow(self, session_id: str) -> None:
        ws = self._live.get(session_id)
        if ws is not None and self.engine is not None:
            error = ProtocolError("overflow", "the session's journal overflowed; it is closed")
            self.engine._nursery.start_soon(self._end_session, session_id, ws, error)

    async def go_away(self) -> None:
        # All at once: each close waits for its client's answer, and one
        # silent client must not use up the others' time.
        with trio.move_on_after(2):
            async with trio.open_nursery() as nursery:
                for ws in list(self._sockets):
                    nursery.start_soon(ws.aclose, GOING_AWAY, "going_away")

    def _log(self, level: int, kind: str, message: str, *args: object, **kw: object) -> None:
        self.log.log(level, kind, message, *args, now=trio.current_time(), **kw)  # type: ignore[arg-type]

    # -- one connection ------------------------------------------------------------

    async def connection(self, sock: trio.socket.SocketType, peer: str) -> None:
        """One TCP connection, accepted and not yet read, inside its error boundary."""
        refusal = self.connections.refusal(peer)
        if refusal is not None:
            self.counters.refused[refusal] = self.counters.refused.get(refusal, 0) + 1
            self._log(logging.WARNING, "refused", "refused a connection: %s cap reached", refusal)
            with trio.CancelScope(shield=True):
                if self._ssl is None:
                    await refuse_raw(sock, REFUSALS[refusal], linger_s=1.0)
                else:
                    sock.close()
            return
        self.connections.take(peer)
        self.counters.connections += 1
        stream: trio.abc.Stream = trio.SocketStream(sock)
        try:
            if self._ssl is not None:
                stream = trio.SSLStream(stream, self._ssl, server_side=True, https_compatible=True)
            async with trio.open_nursery() as nursery:
                ws = await self._upgrade(stream, peer)
                if ws is not None:
                    nursery.start_soon(ws.run_reader)
                    await self._attached(ws, peer)
                nursery.cancel_scope.cancel()
        except* (WebSocketClosedError, UpgradeRefusedError, *STREAM_ERRORS):
            pass  # the peer left, or spoke no WebSocket: this connection ends
        except* Exception as group:  # noqa: BLE001 - the boundary: logged, never raised
            self._log(logging.ERROR, "handler", "a connection failed", exc_info=group)
        finally:
            self.connections.release(peer)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _upgrade(self, stream: trio.abc.Stream, peer: str) -> ServerWebSocket | None:
        """The TLS handshake and the HTTP upgrade, within the handshake timeout."""
        with trio.move_on_after(self.config.handshake_timeout_s):
            upgrade = await read_upgrade(stream)
            if upgrade.path.split("?", 1)[0] != self.config.path:
                await reject(stream, upgrade.http, 404)
                return None
            if self.config.allowed_origins:
                origin = upgrade.headers.get(b"origin", b"").decode("latin-1")
                if origin not in self.config.allowed_origins:
                    await reject(stream, upgrade.http, 403)
                    return None
            return await accept(
                stream,
                upgrade,
                peer=peer,
                # Ours answers oversize frames first; this cap only stops a
                # peer that floods far past it (1009).
                max_message_bytes=self.config.max_frame_bytes * 4,
                close_timeout_s=self.config.close_timeout_s,
            )
        return None

    async def _attached(self, ws: ServerWebSocket, peer: str) -> None:
        self._sockets.add(ws)
        closing: tuple[int, str | None] = (1000, None)
        try:
            await self._serve(ws, peer)
        except* WebSocketClosedError:
            pass
        except* Exception as group:  # noqa: BLE001 - the boundary: logged, 1011
            # A bug of ours: this connection ends (1011), the gateway does not.
            self._log(logging.ERROR, "handler", "a connection's handler failed", exc_info=group)
            closing = (INTERNAL_ERROR, "internal_error")
        finally:
            self._sockets.discard(ws)
            with trio.CancelScope(shield=True):
                await ws.aclose(*closing)

    async def _serve(self, ws: ServerWebSocket, peer: str) -> None:
        first: str | bytes = ""
        with trio.move_on_after(self.config.handshake_timeout_s) as waited:
            first = await ws.get_message()
        if waited.cancelled_caught:
            await self._fatal(ws, ProtocolError("handshake_timeout", "no first frame in time"))
            return
        try:
            frame = self._parse(first)
            if isinstance(frame, OpenSession):
                assert self.engine is not None  # noqa: S101 - set before serving
                send, close = self._transport(ws)
                session_id, generation = await self.admission.open(
                    send, close, peer, frame, self.engine
                )
            elif isinstance(frame, ResumeSession):
                send, close = self._transport(ws)
                session_id, generation = await self.admission.resume(send, close, peer, frame)
            else:
                raise ProtocolError("bad_request", "first frame must be session.open or resume")
        except ProtocolError as error:
            await self._fatal(ws, error)
            return
        except SessionError as exc:
            # A crash (retryable) or a failed session: this client is told,
            # the gateway and every other session go on.
            self._log(
                logging.WARNING, "open", "a session open/resume failed: %s", type(exc).__name__
            )
            await self._fatal(ws, ProtocolError("session_failed", type(exc).__name__))
            return
        self._live[session_id] = ws
        # A resume stays unconfirmed until the client speaks on the new
        # connection: session.resumed may have died with the link, leaving the
        # client only the token it presented.
        heard = [isinstance(frame, OpenSession)]
        try:
            await self._converse(ws, session_id, heard)
        finally:
            if self._live.get(session_id) is ws:
                del self._live[session_id]
            with trio.CancelScope(shield=True):
                if not heard[0]:
                    await self._abandon_resume(session_id, generation)
                await self.registry.detach(session_id, attachment_generation=generation)

    async def _abandon_resume(self, session_id: str, generation: int) -> None:
        with contextlib.suppress(KeyError, SessionError):
            if await self.registry.abandon_resume(session_id, attachment_generation=generation):
                self.counters.unconfirmed_resumes += 1

    def _parse(self, message: str | bytes) -> object:
        limit = self.config.max_frame_bytes
        # A text frame's bytes are its UTF-8, up to 4 per character.
        if len(message) > limit or (
            isinstance(message, str)
            and len(message) * 4 > limit
            and len(message.encode("utf-8", "surrogatepass")) > limit
        ):
            raise ProtocolError("bad_request", f"frame over {limit} bytes")
        return parse_client_frame(message)

    def _transport(self, ws: ServerWebSocket) -> tuple[Send, Close]:
        async def send(frame: Mapping[str, object]) -> None:
            await ws.send_message(json.dumps(frame, separators=(",", ":"), ensure_ascii=False))

        async def close(reason: str) -> None:
            code = REPLACED_CLOSE_CODE if reason == "replaced" else CLOSE_CODES.get(reason, 1011)
            await ws.aclose(code, reason)

        return send, close

    async def _converse(self, ws: ServerWebSocket, session_id: str, heard: list[bool]) -> None:
        rate = InputRate(self.config.max_inputs_per_second)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keepalive, ws, nursery.cancel_scope)
            while True:
                try:
                    message = await ws.get_message()
                except WebSocketClosedError:
                    break
                heard[0] = True
                if not await self._on_frame(ws, session_id, message, rate):
                    break
            nursery.cancel_scope.cancel()

    async def _on_frame(
        self, ws: ServerWebSocket, session_id: str, message: str | bytes, rate: InputRate
    ) -> bool:
        """Handle one frame after the handshake; ``False`` ends the connection."""
        try:
            try:
                frame = self._parse(message)
                if isinstance(frame, Ack):
                    try:
                        await self.registry.acknowledge(session_id, frame.server_event_seq)
                    except InvalidSequenceError as exc:
                        raise ProtocolError("bad_request", str(exc)) from None
                elif isinstance(frame, Input):
                    duplicate = self._input(session_id, frame, rate)
                    if duplicate is not None:
                        await self.registry.send_event(session_id, duplicate, journal=False)
                elif isinstance(frame, CloseSession):
                    await self._end_session(session_id, ws, None)
                    return False
                else:
                    raise ProtocolError("bad_request", "the session is already open")
            except ProtocolError as error:
                self._count(error)
                await self.registry.send_event(session_id, error_frame(error), journal=False)
        except KeyError:
            await self._fatal(ws, ProtocolError("session_failed", "the session is gone"))
            return False
        except (WebSocketClosedError, SessionError):
            # An answer's send failed (the peer left, or stopped reading past
            # the send timeout) or the session failed under us: this
            # connection ends, not the server with every other session.
            return False
        return True

    def _input(self, session_id: str, frame: Input, rate: InputRate) -> dict[str, object] | None:
        """Start answering an input; the ``input.duplicate`` frame for a repeat;
        :class:`ProtocolError` for one refused (it is not remembered)."""
        assert self.engine is not None  # noqa: S101
        cid = frame.client_event_id
        if not rate.allow(trio.current_time()):
            raise ProtocolError(
                "rate_limited",
                f"more than {self.config.max_inputs_per_second:g} inputs a second",
                client_event_id=cid,
            )
        outcome = self.engine.answer(
            session_id, cid, frame.text, max_in_flight=self.config.max_inputs_in_flight
        )
        if outcome == "duplicate":
            return {"type": "input.duplicate", "client_event_id": cid}
        if outcome == "busy":
            raise ProtocolError(
                "busy",
                f"{self.config.max_inputs_in_flight} answers are still on their way",
                client_event_id=cid,
            )
        if outcome == "input_limit":
            raise ProtocolError(
                "input_limit", "the session answered its maximum of inputs", client_event_id=cid
            )
        if outcome == "gone":
            raise KeyError(session_id)
        return None

    async def _end_session(
        self, session_id: str, ws: ServerWebSocket, error: ProtocolError | None
    ) -> None:
        if self.engine is not None:
            self.engine.stop(session_id)
        try:
            await self.registry.close(session_id)
        except SessionCrashedError:
            # Retryable, and a crashed close left no trace: close it again.
            await self.registry.close(session_id)
        if error is None:
            await ws.aclose(1000, "session_closed")
        else:
            await self._fatal(ws, error)

    async def _keepalive(self, ws: ServerWebSocket, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(self.config.ping_interval_s)
            with trio.move_on_after(self.config.idle_timeout_s) as waited:
                try:
                    await ws.ping()
                except WebSocketClosedError:
                    scope.cancel()
                    return
            if waited.cancelled_caught:
                self._log(logging.INFO, "idle", "a peer went silent past the idle timeout")
                scope.cancel()
                return

    def _count(self, error: ProtocolError) -> None:
        self.counters.errors[error.code] = self.counters.errors.get(error.code, 0) + 1

    async def _fatal(self, ws: ServerWebSocket, error: ProtocolError) -> None:
        self._count(error)
        try:
            await ws.send_message(json.dumps(error_frame(error)))
            code = CLOSE_CODES[error.code] if error.code in FATAL else CLOSE_CODES["bad_request"]
            await ws.aclose(code, error.code)
        except WebSocketClosedError:
            pass


async def _flush_logs(gateway: Gateway) -> None:
    while True:
        await trio.sleep(gateway.config.log_interval_s)
        gateway.log.flush(trio.current_time())


def _ssl_context(config: GatewayConfig) -> ssl.SSLContext | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


async def serve_gateway(
    config: GatewayConfig,
    *,
    engine_config: EngineConfig | None = None,
    faults: FaultPlan | None = None,
    task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``nursery.start`` gets the :class:`Gateway` (its ``url``).

    ``faults``: a :class:`~supervisor.faults.FaultPlan` for the registry, to
    test what clients see when sessions or the supervisor fail.
    """
    gateway_box: list[Gateway] = []

    def observe(event: LifecycleEvent) -> None:
        if gateway_box:
            gateway_box[0].observe(event)

    async with open_session_registry(
        replay_ttl_s=config.replay_ttl_s,
        replay_max_bytes_per_session=config.replay_max_bytes_per_session,
        disconnect_grace_s=config.disconnect_grace_s,
        send_timeout_s=config.send_timeout_s,
        observer=observe,
        faults=faults,
    ) as registry:
        gateway = Gateway(config, registry)
        gateway_box.append(gateway)
        # Once up, the engine and the connection handlers run shielded: a
        # cancellation from outside (Ctrl-C) first tells every client to go
        # away, and only then stops them. Cancelled first, their sockets
        # would just drop.
        serving = trio.CancelScope()

        async def serve(task_status: trio.TaskStatus[None]) -> None:
            with serving:
                async with trio.open_nursery() as nursery:
                    gateway.engine = DemoEngine(
                        registry, nursery, engine_config, on_overflow=gateway.on_overflow
                    )
                    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
                    gateway.port = listeners[0].socket.getsockname()[1]
                    for listener in listeners:
                        nursery.start_soon(
                            functools.partial(
                                accept_forever,
                                listener.socket,
                                gateway.connection,
                                nursery,
                                log=gateway.log,
                                plain_http=config.tls_cert is None,
                            )
                        )
                    nursery.start_soon(_flush_logs, gateway)
                    serving.shield = True
                    task_status.started()

        async with trio.open_nursery() as outer:
            await outer.start(serve)
            logger.info("gateway listening on %s", gateway.url)
            task_status.started(gateway)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await gateway.go_away()
                serving.cancel()
