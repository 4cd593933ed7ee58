"""The ASGI shell: the gateway as an ASGI application (uvicorn, Hypercorn, FastAPI, Starlette).

`GatewayApp` speaks the same ``/v1`` protocol as the trio server (the
protocol is `supervisor.gateway._core`, run by
`GatewayService`) and answers
``GET /healthz``, ``/readyz`` and ``/metrics``. Paths are relative to where
it is mounted. Its registry is the door of the loop it runs on: the asyncio
door under uvicorn (or any asyncio server), the trio door under Hypercorn's
trio worker.

It needs its lifespan: as the app itself, the server's ``lifespan`` events
start and stop it; mounted in FastAPI or Starlette (which do not forward
lifespan to mounted apps), pass ``lifespan=gateway.lifespan``::

    gateway = GatewayApp(GatewayConfig(), engine=MyEngine())
    app = FastAPI(lifespan=gateway.lifespan)
    app.mount("/gateway", gateway)          # ws://host/gateway/v1

Keepalive is the server's: uvicorn pings (``ws_ping_interval``,
``ws_ping_timeout``), Hypercorn pings with ``websocket_ping_interval``; ASGI
has no ping of its own. The limits before the upgrade (handshake timeout,
connection caps, descriptors) and a TCP abort are the server's too: ``serve``
runs uvicorn and Hypercorn with classes of ours that add them (see
`supervisor.gateway._servers`); under a server of your own, they are its
configuration's. After a close of ours, a receive waits for the peer's answer
``close_timeout_s`` at most. Everything else (limits, throttles, close codes,
unconfirmed resumes) is the protocol core's, the same as on the trio server.
A refused connection is answered before the upgrade with the trio server's
HTTP status (404 path, 403 origin, 429/503 connection caps, 503 shutting
down) where the server offers the ``websocket.http.response`` extension
(uvicorn and Hypercorn do), else closed, which the server answers with 403.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.abc
import sniffio

from actors._commands import LifecycleEvent
from supervisor._faults import FaultPlan
from supervisor._options import RegistryOptions
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._auth import Authenticate, Handshake, TrustedProxies, client_address
from supervisor.gateway._collector import young_collections
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._core import TransportClosedError
from supervisor.gateway._engine import DemoEngine, Engine
from supervisor.gateway._limits import AddressCounter
from supervisor.gateway._logs import redact_query_strings
from supervisor.gateway._operations import http_routes, serve_operations
from supervisor.gateway._registry import open_registry
from supervisor.gateway._sendgate import SendGate
from supervisor.gateway._service import GatewayService

__all__ = ["GatewayApp"]

logger = logging.getLogger("duplex_supervisor.supervisor")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

INTERNAL_ERROR = 1011

#: A scope extension a server may offer (``serve``'s uvicorn does): a callable
#: that drops the TCP connection at once, for a close that could not finish
#: within the close timeout (a peer that stopped reading holds every send).
ABORT_EXTENSION = "duplex.abort"


class _AsgiWebSocket:
    """An accepted ASGI WebSocket as the gateway's ``Transport``."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        close_timeout_s: float,
        abort: Callable[[], None] | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._close_timeout_s = close_timeout_s
        self._abort = abort
        # Not an anyio.Lock: its acquire checkpoints even when free (see _sendgate).
        self._lock = SendGate(anyio.Event)
        self._closed = False
        self._disconnected = False
        #: The receive in progress: once our close is out, it waits for the
        #: peer's answer (the disconnect) ``close_timeout_s`` at most.
        self._receiving: anyio.CancelScope | None = None

    async def receive(self) -> str | bytes:
        if self._disconnected:
            raise TransportClosedError("disconnected")
        with anyio.CancelScope() as scope:
            self._receiving = scope
            if self._closed:
                scope.deadline = anyio.current_time() + self._close_timeout_s
            try:
                message = await self._receive()
            finally:
                self._receiving = None
        if scope.cancelled_caught:
            # The peer never answered our close: the connection is over.
            self._disconnected = True
            raise TransportClosedError("close unanswered")
        if message["type"] == "websocket.receive":
            text = message.get("text")
            if text is not None:
                return str(text)
            return bytes(message.get("bytes") or b"")
        self._disconnected = True
        raise TransportClosedError("disconnected")

    async def send(self, text: str) -> None:
        async with self._lock:
            if self._closed or self._disconnected:
                raise TransportClosedError("closed")
            try:
                await self._send({"type": "websocket.send", "text": text})
            except Exception as exc:
                self._disconnected = True
                raise TransportClosedError("peer gone") from exc

    async def close(self, code: int, reason: str | None) -> None:
        with anyio.move_on_after(self._close_timeout_s) as waited:
            async with self._lock:
                if self._closed or self._disconnected:
                    return
                self._closed = True
                with contextlib.suppress(Exception):
                    await self._send(
                        {"type": "websocket.close", "code": code, "reason": reason or ""}
                    )
                receiving = self._receiving
                if receiving is not None:
                    receiving.deadline = min(
                        receiving.deadline, anyio.current_time() + self._close_timeout_s
                    )
        if waited.cancelled_caught and self._abort is not None:
            # A send held the connection past the close timeout (the peer
            # reads nothing): the server drops it, and that send ends too.
            self._disconnected = True
            self._abort()

    async def ping(self) -> None:
        raise NotImplementedError("an ASGI server pings by itself")


class GatewayApp:
    """An ASGI application serving the gateway; see the module docstring.

    ``engine``: your `Engine` (default: a
    `DemoEngine`). ``authenticate``: a hook
    given each handshake (`supervisor.gateway._auth`). ``registry_options``:
    the registry's `RegistryOptions` (see
    `supervisor.gateway._registry`).
    """

    def __init__(
        self,
        config: GatewayConfig | None = None,
        *,
        engine: Engine | None = None,
        authenticate: Authenticate | None = None,
        faults: FaultPlan | None = None,
        registry_options: RegistryOptions | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self._registry_options = registry_options
        self.engine: Engine = engine if engine is not None else DemoEngine()
        self._authenticate = authenticate
        self._faults = faults
        self._trusted = TrustedProxies(self.config.trusted_proxies)
        self.connections = AddressCounter(
            self.config.max_connections, self.config.max_connections_per_address
        )
        self.service: GatewayService | None = None

    @property
    def registry(self) -> AsyncSessionRegistry:
        if self.service is None:
            raise RuntimeError("the gateway is not running (no lifespan)")
        return self.service.registry

    # -- lifespan ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Start the registry and engine for the running loop; on exit, 1001 to every
        client, then stop. FastAPI/Starlette: ``FastAPI(lifespan=gateway.lifespan)``."""
        if self.service is not None:
            raise RuntimeError("this gateway is already running")
        registry_cm = open_registry(
            self.config, self._registry_options, observer=self._observe, faults=self._faults
        )
        with young_collections(self.config.gc_young_threshold):
            async with registry_cm as registry, anyio.create_task_group() as group:
                self.service = GatewayService(
                    self.config, registry, self.engine, group, authenticate=self._authenticate
                )
                redact_query_strings()
                if self.config.metrics_port is not None:
                    await group.start(serve_operations, self.service)
                logger.info("gateway app started (%s door)", sniffio.current_async_library())
                try:
                    yield
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.go_away()
                    group.cancel_scope.cancel()
        self.service = None

    def _observe(self, event: LifecycleEvent) -> None:
        if self.service is not None:
            self.service.observe(event)

    async def go_away(self) -> None:
        """Close every connection with 1001 and refuse new ones (a server's shutdown)."""
        if self.service is not None:
            await self.service.go_away()

    # -- ASGI ----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        try:
            async with self.lifespan():
                await send({"type": "lifespan.startup.complete"})
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
        except Exception as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            raise
        await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, send: Send) -> None:
        answer = None
        extra: list[tuple[bytes, bytes]] = []
        if scope.get("method") != "GET":
            answer = (405, "text/plain", b"the upgrade must be a GET\n")
        elif self.service is not None:
            answer = http_routes(self.service)(_route_path(scope))
        if answer is None:
            # What the trio server answers a GET that is no route and no upgrade.
            answer = (426, "text/plain", b"this endpoint speaks WebSocket only\n")
            extra = [(b"sec-websocket-version", b"13")]
        status, content_type, body = answer
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type.encode()),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _handshake(self, scope: Scope) -> Handshake:
        headers: dict[str, str] = {}
        forwarded: list[str] = []
        for name, value in scope.get("headers", []):
            key, text = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
            if key == "x-forwarded-for":
                forwarded.append(text)
        client = scope.get("client")
        peer = str(client[0]) if client else "unknown"
        return Handshake(
            path=_route_path(scope),
            query=bytes(scope.get("query_string", b"")).decode("latin-1"),
            headers=headers,
            peer=peer,
            client=client_address(peer, forwarded, self._trusted),
        )

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        service = self.service
        handshake = self._handshake(scope)
        origin = handshake.headers.get("origin", "")
        refused: int | None = None
        if service is None or not service.accepting:
            refused = 503
        elif handshake.path != self.config.path:
            refused = 404
        elif self.config.allowed_origins and origin not in self.config.allowed_origins:
            refused = 403
        else:
            cap = self.connections.refusal(handshake.client)
            if cap is not None:
                refused = 429 if cap == "address" else 503
        if refused is not None or service is None:
            await _refuse(scope, send, refused or 503)
            return
        self.connections.take(handshake.client)
        try:
            await send({"type": "websocket.accept"})
            abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
            ws = _AsgiWebSocket(receive, send, self.config.close_timeout_s, abort)
            closing: tuple[int, str | None] = (1000, None)
            try:
                await service.converse(ws, handshake, keepalive=False)
            except Exception:
                logger.exception("a connection's handler failed")
                closing = (INTERNAL_ERROR, "internal_error")
            with anyio.CancelScope(shield=True):
                await ws.close(*closing)
        finally:
            self.connections.release(handshake.client)


async def _refuse(scope: Scope, send: Send, status: int) -> None:
    """Refuse an upgrade with the trio server's HTTP status where the server lets
    the app answer one (the ``websocket.http.response`` extension), else 403."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [(b"content-length", b"0"), (b"connection", b"close")],
        }
    )
    await send({"type": "websocket.http.response.body", "body": b""})


def _route_path(scope: Scope) -> str:
    path = str(scope.get("path", "/"))
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"
