"""The trio shell: the gateway on its own WebSocket server (h11 + wsproto on trio).

``serve_gateway`` opens a trio session registry, runs an engine (the
`DemoEngine` unless given one) and
serves `supervisor.gateway._protocol` on one path (``/v1``), plus
``GET /healthz``, ``/readyz`` and ``/metrics``. The protocol itself is
`supervisor.gateway._core`, run by `GatewayService`;
this module only accepts connections and moves their bytes.

Every step of a connection, from its first byte to its last close, runs in
that connection's own task under one error boundary (`Gateway.connection`):
nothing a peer does ends the server or another connection. Every wait on a
peer is bounded: the upgrade and first frame by ``handshake_timeout_s``, a
close by ``close_timeout_s`` (then TCP is aborted), a send by
``send_timeout_s``, silence by ``idle_timeout_s``.
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
from collections.abc import Callable
from typing import cast

import trio

from actors._commands import LifecycleEvent
from supervisor._faults import FaultPlan
from supervisor._log_limit import LogLimiter
from supervisor._options import RegistryOptions
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._auth import Authenticate, Handshake, TrustedProxies, client_address
from supervisor.gateway._collector import young_collections
from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._engine import DemoEngine, Engine, EngineConfig
from supervisor.gateway._limits import AddressCounter
from supervisor.gateway._listener import REFUSALS, accept_forever, refuse_raw
from supervisor.gateway._operations import http_routes, serve_operations
from supervisor.gateway._registry import open_registry
from supervisor.gateway._service import GOING_AWAY, GatewayService
from supervisor.gateway._sessions import TaskSpawner
from supervisor.gateway._websocket import (
    STREAM_ERRORS,
    ServerWebSocket,
    Upgrade,
    UpgradeRefusedError,
    WebSocketClosedError,
    accept,
    read_upgrade,
    reject,
)

__all__ = ["GOING_AWAY", "Gateway", "GatewayConfig", "GatewayCounters", "serve_gateway"]

logger = logging.getLogger("duplex_supervisor.supervisor")

INTERNAL_ERROR = 1011


class Gateway:
    """The trio server around one `GatewayService`; see `serve_gateway`."""

    def __init__(self, config: GatewayConfig, service: GatewayService) -> None:
        self.config = config
        self.service = service
        self.port = config.port
        self._ssl = ssl_context(config)
        self._trusted = TrustedProxies(config.trusted_proxies)
        self.connections = AddressCounter(
            config.max_connections, config.max_connections_per_address
        )
        self._routes = http_routes(service)

    @property
    def registry(self) -> AsyncSessionRegistry:
        return self.service.registry

    @property
    def counters(self) -> GatewayCounters:
        return self.service.counters

    @property
    def engine(self) -> Engine:
        return self.service.engine

    @property
    def log(self) -> LogLimiter:
        return self.service.log

    @property
    def url(self) -> str:
        scheme = "wss" if self.config.tls_cert else "ws"
        return f"{scheme}://{self.config.host}:{self.port}{self.config.path}"

    def throttled_addresses(self) -> int:
        """Addresses the failure throttles hold now (bounded and expiring)."""
        return self.service.throttled_addresses()

    def observe(self, event: LifecycleEvent) -> None:
        self.service.observe(event)

    async def go_away(self) -> None:
        await self.service.go_away()

    def _log(self, level: int, kind: str, message: str, *args: object, **kw: object) -> None:
        self.service.log.log(level, kind, message, *args, now=trio.current_time(), **kw)  # type: ignore[arg-type]

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
                upgraded = await self._upgrade(stream, peer)
                if upgraded is not None:
                    ws, handshake = upgraded
                    nursery.start_soon(ws.run_reader)
                    ws.send_now_in(nursery)
                    await self._attached(ws, handshake)
                nursery.cancel_scope.cancel()
        except* (WebSocketClosedError, UpgradeRefusedError, *STREAM_ERRORS):
            pass  # the peer left, or spoke no WebSocket: this connection ends
        except* Exception as group:  # noqa: BLE001 - the boundary: logged, never raised
            self._log(logging.ERROR, "handler", "a connection failed", exc_info=group)
        finally:
            self.connections.release(peer)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    def _handshake(self, upgrade: Upgrade, peer: str) -> Handshake:
        path, _, query = upgrade.path.partition("?")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in upgrade.headers.items()}
        forwarded = [headers["x-forwarded-for"]] if "x-forwarded-for" in headers else []
        return Handshake(
            path=path,
            query=query,
            headers=headers,
            peer=peer,
            client=client_address(peer, forwarded, self._trusted),
        )

    async def _upgrade(
        self, stream: trio.abc.Stream, peer: str
    ) -> tuple[ServerWebSocket, Handshake] | None:
        """The TLS handshake and the HTTP upgrade, within the handshake timeout."""
        with trio.move_on_after(self.config.handshake_timeout_s):
            upgrade = await read_upgrade(stream, self._routes)
            if upgrade.path.split("?", 1)[0] != self.config.path:
                await reject(stream, upgrade.http, 404)
                return None
            if self.config.allowed_origins:
                origin = upgrade.headers.get(b"origin", b"").decode("latin-1")
                if origin not in self.config.allowed_origins:
                    await reject(stream, upgrade.http, 403)
                    return None
            ws = await accept(
                stream,
                upgrade,
                peer=peer,
                # Ours answers oversize frames first; this cap only stops a
                # peer that floods far past it (1009).
                max_message_bytes=self.config.max_frame_bytes * 4,
                close_timeout_s=self.config.close_timeout_s,
            )
            return ws, self._handshake(upgrade, peer)
        return None

    async def _attached(self, ws: ServerWebSocket, handshake: Handshake) -> None:
        closing: tuple[int, str | None] = (1000, None)
        try:
            await self.service.converse(ws, handshake, keepalive=True)
        except* WebSocketClosedError:
            pass
        except* Exception as group:  # noqa: BLE001 - the boundary: logged, 1011
            # A bug of ours: this connection ends (1011), the gateway does not.
            self._log(logging.ERROR, "handler", "a connection's handler failed", exc_info=group)
            closing = (INTERNAL_ERROR, "internal_error")
        finally:
            with trio.CancelScope(shield=True):
                await ws.close(*closing)


async def _flush_logs(gateway: Gateway) -> None:
    while True:
        await trio.sleep(gateway.config.log_interval_s)
        gateway.service.log.flush(trio.current_time())


def ssl_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """The server's TLS context; an error names the certificate and key it concerns."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        error = OSError(f"--tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {why}")
        error.errno = exc.errno
        raise error from None
    return context


async def _listen(
    nursery: trio.Nursery,
    gateway: Gateway,
    listener: socket.socket | None,
    task_status: trio.TaskStatus[None],
) -> None:
    """Listen (on ``listener`` if given) and accept into ``nursery``; started once listening."""
    config = gateway.config
    if listener is not None:
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(listener))]
    else:
        try:
            listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        except OSError as exc:
            error = OSError(f"{config.host}:{config.port}: {exc.strerror or exc}")
            error.errno = exc.errno
            raise error from None
    gateway.port = listeners[0].socket.getsockname()[1]
    for each in listeners:
        await nursery.start(
            functools.partial(
                accept_forever,
                each.socket,
                gateway.connection,
                nursery,
                log=gateway.service.log,
                plain_http=config.tls_cert is None,
            )
        )
    nursery.start_soon(_flush_logs, gateway)
    task_status.started()


# Over ~60 lines: its documented options, and nested tasks that share one shutdown
# (the guard's shield, `stop`, `serving`), which a split would pass back and forth.
async def serve_gateway(
    config: GatewayConfig,
    *,
    engine: Engine | None = None,
    engine_config: EngineConfig | None = None,
    authenticate: Authenticate | None = None,
    faults: FaultPlan | None = None,
    registry_options: RegistryOptions | None = None,
    on_started: Callable[[GatewayService], None] | None = None,
    listener: socket.socket | None = None,
    task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``nursery.start`` gets the `Gateway` (its ``url``).

    ``engine``: your `Engine` (default: a
    `DemoEngine` with ``engine_config``).
    ``authenticate``: a hook given each handshake (see `supervisor.gateway._auth`).
    ``faults``: a `FaultPlan` for the registry, to
    test what clients see when sessions or the supervisor fail.
    ``registry_options``: the registry's `RegistryOptions`
    (then ``config``'s replay TTL and bytes, disconnect grace and send
    timeout are not used; see `supervisor.gateway._registry`).
    ``listener``: a listening socket to accept on instead of binding
    ``config``'s host and port (``serve --workers``: the parent's, shared).
    Cancelled, it first closes every connection with 1001 (going away).
    """
    the_engine: Engine = engine if engine is not None else DemoEngine(engine_config)
    box: list[Gateway] = []

    def observe(event: LifecycleEvent) -> None:
        if box:
            box[0].observe(event)

    stop = trio.Event()

    async def run(task_status: trio.TaskStatus[Gateway]) -> None:
        # Until up, a cancellation from outside stops the start. Once up, the
        # registry (with its outbox pumps), the engine and the connection
        # handlers run shielded, and only `stop` ends them: a cancellation
        # from outside (Ctrl-C, SIGTERM) first tells every client to go away.
        # Cancelled first, their sockets would just drop, and a pump cancelled
        # in the middle of a send would give its socket up unclosed.
        with trio.CancelScope() as guard, young_collections(config.gc_young_threshold):
            async with open_registry(
                config, registry_options, observer=observe, faults=faults
            ) as registry:
                serving = trio.CancelScope()

                async def serve(task_status: trio.TaskStatus[None]) -> None:
                    with serving:
                        async with trio.open_nursery() as nursery:
                            service = GatewayService(
                                config,
                                registry,
                                the_engine,
                                cast(TaskSpawner, nursery),  # trio's start_soon, typed its own way
                                authenticate=authenticate,
                            )
                            box.append(Gateway(config, service))
                            if on_started is not None:
                                on_started(service)
                            if config.metrics_port is not None:
                                await nursery.start(serve_operations, service)
                            await _listen(nursery, box[0], listener, task_status)

                async with trio.open_nursery() as outer:
                    await outer.start(serve)
                    gateway = box[0]
                    guard.shield = True
                    logger.info("gateway listening on %s", gateway.url)
                    task_status.started(gateway)
                    try:
                        await stop.wait()
                    finally:
                        with trio.CancelScope(shield=True):
                            await gateway.go_away()
                        serving.cancel()

    async with trio.open_nursery() as nursery:
        task_status.started(await nursery.start(run))
        try:
            await trio.sleep_forever()
        finally:
            stop.set()
