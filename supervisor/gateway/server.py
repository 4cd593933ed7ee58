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
resumes are throttled per peer address, so the owner coming from another
address is never locked out.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import secrets
import ssl
from collections import deque
from dataclasses import dataclass, field

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from actors.credential import ResumeToken
from actors.errors import (
    InvalidResumeTokenError,
    InvalidSequenceError,
    JournalGapError,
    SessionCrashedError,
    SessionError,
)
from actors.messages import LifecycleEvent
from supervisor.async_door import AsyncSessionRegistry
from supervisor.faults import FaultPlan
from supervisor.gateway.engine import DemoEngine, EngineConfig
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
from supervisor.trio_registry import open_session_registry

__all__ = ["Gateway", "GatewayConfig", "GatewayCounters", "serve_gateway"]

logger = logging.getLogger("duplex_supervisor.supervisor")

GOING_AWAY = 1001


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig:
    """Everything ``duplex-supervisor serve`` takes as flags."""

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = "/v1"
    max_frame_bytes: int = 65_536
    handshake_timeout_s: float = 5.0
    ping_interval_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_sessions: int = 10_000
    disconnect_grace_s: float | None = 60.0
    replay_ttl_s: float = 120.0
    replay_max_bytes_per_session: int = 4 << 20
    send_timeout_s: float = 10.0
    shared_secret: str | None = field(default=None, repr=False)
    allowed_origins: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    close_timeout_s: float = 5.0
    resume_failures_allowed: int = 5
    resume_failure_window_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/'")
        if self.max_frame_bytes < 256:
            raise ValueError("max_frame_bytes must be at least 256")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        for name in ("handshake_timeout_s", "ping_interval_s", "idle_timeout_s", "close_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


@dataclass(slots=True)
class GatewayCounters:
    connections: int = 0
    sessions_opened: int = 0
    resumes: int = 0
    replaced: int = 0
    #: Resumes rolled back because the connection ended before the client spoke.
    unconfirmed_resumes: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class _ResumeThrottle:
    """More than ``allowed`` failed resumes from one address within ``window_s``."""

    def __init__(self, allowed: int, window_s: float) -> None:
        self._allowed = allowed
        self._window_s = window_s
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, peer: str) -> deque[float]:
        failures = self._failures.setdefault(peer, deque())
        cutoff = trio.current_time() - self._window_s
        while failures and failures[0] <= cutoff:
            failures.popleft()
        return failures

    def blocked(self, peer: str) -> bool:
        return len(self._recent(peer)) >= self._allowed

    def failed(self, peer: str) -> None:
        self._recent(peer).append(trio.current_time())


@dataclass(slots=True)
class _Activation:
    """The ``session.resumed`` frame; a ReplayCountingFactory."""

    session_id: str

    def __call__(self, token: ResumeToken, generation: int) -> dict[str, object]:
        return self.activation_payload(token, generation, -1)

    def activation_payload(
        self, token: ResumeToken, generation: int, replayed: int
    ) -> dict[str, object]:
        return {
            "type": "session.resumed",
            "session_id": self.session_id,
            "resume_token": token.plaintext,
            "attachment_generation": generation,
            "replayed": replayed,
        }


class Gateway:
    """Serves one registry and engine; see :func:`serve_gateway`."""

    def __init__(self, config: GatewayConfig, registry: AsyncSessionRegistry) -> None:
        self.config = config
        self.registry = registry
        self.engine: DemoEngine | None = None
        self.counters = GatewayCounters()
        self.port = config.port
        self._throttle = _ResumeThrottle(
            config.resume_failures_allowed, config.resume_failure_window_s
        )
        self._live: dict[str, WebSocketConnection] = {}
        self._sockets: set[WebSocketConnection] = set()

    @property
    def url(self) -> str:
        scheme = "wss" if self.config.tls_cert else "ws"
        return f"{scheme}://{self.config.host}:{self.port}{self.config.path}"

    def observe(self, event: LifecycleEvent) -> None:
        """Registry observer: a session that ended stops producing."""
        if event.kind in ("closed", "expired", "failed") and self.engine is not None:
            self.engine.stop(event.session_id)

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

    # -- one connection ------------------------------------------------------------

    async def handle(self, request: WebSocketRequest) -> None:
        if request.path.split("?", 1)[0] != self.config.path:
            await request.reject(404)
            return
        if self.config.allowed_origins:
            origin = dict(request.headers).get(b"origin", b"").decode("latin-1")
            if origin not in self.config.allowed_origins:
                await request.reject(403)
                return
        ws = await request.accept()
        self.counters.connections += 1
        remote = request.remote
        peer = str(getattr(remote, "address", remote))
        self._sockets.add(ws)
        try:
            await self._serve(ws, peer)
        except* ConnectionClosed:
            # Also out of _converse's nursery, in a group: this connection
            # ended, and the handler nursery every session shares must not.
            pass
        except* Exception as group:
            # A bug of ours: this connection ends (1011), the gateway does not.
            logger.error("a connection's handler failed", exc_info=group)
            with trio.move_on_after(1), contextlib.suppress(ConnectionClosed):
                await ws.aclose(1011, "internal_error")
        finally:
            self._sockets.discard(ws)

    async def _serve(self, ws: WebSocketConnection, peer: str) -> None:
        first: str | bytes = ""
        with trio.move_on_after(self.config.handshake_timeout_s) as waited:
            first = await ws.get_message()
        if waited.cancelled_caught:
            await self._fatal(ws, ProtocolError("handshake_timeout", "no first frame in time"))
            return
        try:
            frame = self._parse(first)
            if isinstance(frame, OpenSession):
                session_id, generation = await self._open(ws, frame)
            elif isinstance(frame, ResumeSession):
                session_id, generation = await self._resume(ws, peer, frame)
            else:
                raise ProtocolError("bad_request", "first frame must be session.open or resume")
        except ProtocolError as error:
            await self._fatal(ws, error)
            return
        except SessionError as exc:
            # A crash (retryable) or a failed session: this client is told,
            # the gateway and every other session go on.
            logger.warning("a session open/resume failed: %s", type(exc).__name__)
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

    def _transport(self, ws: WebSocketConnection) -> tuple[object, object]:
        async def send(frame: dict[str, object]) -> None:
            await ws.send_message(json.dumps(frame, separators=(",", ":"), ensure_ascii=False))

        async def close(reason: str) -> None:
            code = REPLACED_CLOSE_CODE if reason == "replaced" else CLOSE_CODES.get(reason, 1011)
            await ws.aclose(code, reason)

        return send, close

    async def _open(self, ws: WebSocketConnection, frame: OpenSession) -> tuple[str, int]:
        expected = self.config.shared_secret
        if expected is not None and not (
            frame.secret is not None
            and hmac.compare_digest(frame.secret.encode(), expected.encode())
        ):
            raise ProtocolError("unauthorized", "session.open needs the gateway's secret")
        if len(self.registry.session_ids()) >= self.config.max_sessions:
            raise ProtocolError("overloaded", "the gateway holds its maximum of sessions")
        assert self.engine is not None  # noqa: S101 - serve_gateway sets it before serving
        session_id = "sess_" + secrets.token_urlsafe(12)
        send, close = self._transport(ws)
        created = await self.registry.create(session_id, send=send, close=close)  # type: ignore[arg-type]
        created_frame = {
            "type": "session.created",
            "session_id": session_id,
            "resume_token": created.resume_token.plaintext,
            "attachment_generation": created.attachment_generation,
        }
        await self.registry.send_event(session_id, created_frame, journal=False)
        self.engine.start(session_id)
        self.counters.sessions_opened += 1
        return session_id, created.attachment_generation

    async def _resume(
        self, ws: WebSocketConnection, peer: str, frame: ResumeSession
    ) -> tuple[str, int]:
        if self._throttle.blocked(peer):
            raise ProtocolError("resume_throttled", "too many failed resumes from this address")
        session_id = frame.session_id
        try:
            await self.registry.authenticate_resume(
                session_id,
                resume_token=frame.resume_token,
                last_received_server_event_seq=frame.last_received_server_event_seq,
            )
        except InvalidResumeTokenError:
            self._throttle.failed(peer)
            raise ProtocolError("invalid_resume_token", "the resume token is not valid") from None
        except KeyError:
            self._throttle.failed(peer)
            raise ProtocolError("unknown_session", "no such session") from None
        except JournalGapError as gap:
            raise ProtocolError(
                "journal_gap",
                "events after that sequence are gone",
                requested=gap.requested,
                first_retained=gap.first_retained,
                head=gap.head,
                reason=gap.reason,
            ) from None
        except InvalidSequenceError as exc:
            raise ProtocolError("bad_request", str(exc)) from None
        send, close = self._transport(ws)
        await self.registry.begin_resume(session_id)
        try:
            result = await self.registry.resume(
                session_id,
                resume_token=frame.resume_token,
                last_received_server_event_seq=frame.last_received_server_event_seq,
                send=send,  # type: ignore[arg-type]
                close=close,  # type: ignore[arg-type]
                activation_payload_factory=_Activation(session_id),
            )
        except InvalidResumeTokenError:
            # Lost a race with another resume of the same token.
            self._throttle.failed(peer)
            raise ProtocolError("invalid_resume_token", "the resume token is not valid") from None
        except (KeyError, SessionError) as exc:
            raise ProtocolError("session_failed", type(exc).__name__) from None
        finally:
            with trio.CancelScope(shield=True):
                await self.registry.end_resume(session_id)
        self.counters.resumes += 1
        if result.replaced_attachment is not None:
            self.counters.replaced += 1
            with trio.move_on_after(2):
                await result.replaced_attachment.close("replaced")
        return session_id, result.attachment_generation

    async def _converse(self, ws: WebSocketConnection, session_id: str, heard: list[bool]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keepalive, ws, nursery.cancel_scope)
            while True:
                try:
                    message = await ws.get_message()
                except ConnectionClosed:
                    break
                heard[0] = True
                if not await self._on_frame(ws, session_id, message):
                    break
            nursery.cancel_scope.cancel()

    async def _on_frame(
        self, ws: WebSocketConnection, session_id: str, message: str | bytes
    ) -> bool:
        """Handle one frame after the handshake; ``False`` ends the connection."""
        assert self.engine is not None  # noqa: S101
        try:
            try:
                frame = self._parse(message)
                if isinstance(frame, Ack):
                    try:
                        await self.registry.acknowledge(session_id, frame.server_event_seq)
                    except InvalidSequenceError as exc:
                        raise ProtocolError("bad_request", str(exc)) from None
                elif isinstance(frame, Input):
                    if not self.engine.answer(session_id, frame.client_event_id, frame.text):
                        duplicate = {
                            "type": "input.duplicate",
                            "client_event_id": frame.client_event_id,
                        }
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
        except (ConnectionClosed, SessionError):
            # An answer's send failed (the peer left, or stopped reading past
            # the send timeout) or the session failed under us: this
            # connection ends, not the server with every other session.
            return False
        return True

    async def _end_session(
        self, session_id: str, ws: WebSocketConnection, error: ProtocolError | None
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

    async def _keepalive(self, ws: WebSocketConnection, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(self.config.ping_interval_s)
            with trio.move_on_after(self.config.idle_timeout_s) as waited:
                try:
                    await ws.ping()
                except ConnectionClosed:
                    scope.cancel()
                    return
            if waited.cancelled_caught:
                logger.info("a peer went silent past the idle timeout; detaching it")
                scope.cancel()
                return

    def _count(self, error: ProtocolError) -> None:
        self.counters.errors[error.code] = self.counters.errors.get(error.code, 0) + 1

    async def _fatal(self, ws: WebSocketConnection, error: ProtocolError) -> None:
        self._count(error)
        try:
            await ws.send_message(json.dumps(error_frame(error)))
            code = CLOSE_CODES[error.code] if error.code in FATAL else CLOSE_CODES["bad_request"]
            await ws.aclose(code, error.code)
        except ConnectionClosed:
            pass


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
                    server = await nursery.start(
                        lambda task_status: serve_websocket(
                            gateway.handle,
                            config.host,
                            config.port,
                            _ssl_context(config),
                            handler_nursery=nursery,
                            # Ours answers oversize frames first; the library's
                            # cap only stops a peer that floods far past it.
                            max_message_size=config.max_frame_bytes * 4,
                            connect_timeout=config.handshake_timeout_s,
                            # A half-open peer never answers our close: do
                            # not hold its handler for the library's minute.
                            disconnect_timeout=config.close_timeout_s,
                            task_status=task_status,
                        )
                    )
                    gateway.port = server.port
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
