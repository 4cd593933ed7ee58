"""``serve --server``: run the gateway on one of its shells until SIGINT or SIGTERM.

``trio``
    The gateway's own WebSocket server (h11 + wsproto on trio,
    `supervisor.gateway._server`), the trio door. ``trio-websocket`` is
    accepted as an old name for it: the project's first server was built on
    the trio-websocket library, which this one replaced (issue 10).
``asgi-uvicorn``
    `GatewayApp` under uvicorn (asyncio, the
    asyncio door; uvicorn's ``websockets`` protocol implementation).
``asgi-hypercorn``
    `GatewayApp` under Hypercorn's trio worker
    (the trio door).

Both ASGI servers are held to the trio server's limits by classes of ours
(`supervisor.gateway._uvicorn`, `supervisor.gateway._hypercorn`); the README's
shell table says what each enforces, and ``serve`` warns where one cannot.

Each drains alike: SIGINT or SIGTERM logs one line, closes every client with
1001 (going away), then stops; SIGTERM exits 0, SIGINT 130. A bind that fails
names ``host:port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from supervisor._extras import require
from supervisor._options import RegistryOptions
from supervisor.gateway._auth import Authenticate
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._engine import Engine
from supervisor.gateway._flag_spec import flag
from supervisor.gateway._server import Gateway, serve_gateway, ssl_context
from supervisor.gateway.asgi import GatewayApp

if TYPE_CHECKING:
    from supervisor.gateway._uvicorn import UvicornShell

__all__ = ["NEEDS", "SERVERS", "SERVER_ALIASES", "ServeOptions", "run_server"]

logger = logging.getLogger("duplex_supervisor.supervisor")

SERVERS = ("trio", "asgi-uvicorn", "asgi-hypercorn")
SERVER_ALIASES = {"trio-websocket": "trio"}

_EXIT_STATUS: dict[int, int] = {signal.SIGTERM: 0, signal.SIGINT: 130}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    config: GatewayConfig
    engine: Engine
    authenticate: Authenticate | None = None
    stats_interval_s: float = field(
        default=10.0,
        metadata=flag(
            "seconds between stats log lines: sessions held, live (with a thread) and "
            "parked, attached and detached, events journaled, resumes, connections open, error "
            "frames sent (default {default})",
            group="serve",
        ),
    )
    #: The registry's options (``serve --redis``: a store); None: from ``config``.
    registry_options: RegistryOptions | None = None
    #: Called with the running gateway's URL (tests and the log read it).
    on_listening: Callable[[str], None] = field(default=lambda url: None)
    #: A listening socket to serve on instead of binding ``config``'s host and port
    #: (``serve --workers``: the one the parent bound, shared by every worker).
    listener: socket.socket | None = None


def _going_away(signum: int) -> None:
    logger.info(
        "%s: closing every connection (1001 going away), then stopping",
        signal.Signals(signum).name,
    )


def _bind_error(config: GatewayConfig, exc: BaseException) -> OSError:
    """``host:port: why`` (the errno kept as an attribute, out of the message)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    error = OSError(f"{config.host}:{config.port}: {why}")
    error.errno = exc.errno if isinstance(exc, OSError) else None
    return error


def _url(config: GatewayConfig, port: int) -> str:
    scheme = "wss" if config.tls_cert else "ws"
    return f"{scheme}://{config.host}:{port}{config.path}"


#: The package each ASGI server needs (the ``asgi`` extra installs them).
NEEDS = {"asgi-uvicorn": "uvicorn", "asgi-hypercorn": "hypercorn"}


def run_server(server: str, options: ServeOptions) -> int:
    """Serve with ``server`` (a name of `SERVERS` or an alias); the exit status."""
    name = SERVER_ALIASES.get(server, server)
    ssl_context(options.config)  # every server: a bad certificate or key named up front
    if name in NEEDS:
        require(NEEDS[name], f"--server {name}")
    if name == "trio":
        return trio.run(_serve_trio, options)
    if name == "asgi-uvicorn":
        return _serve_uvicorn(options)
    if name == "asgi-hypercorn":
        return trio.run(_serve_hypercorn, options)
    raise ValueError(f"--server {server!r}: choose one of {', '.join(SERVERS)}")


# -- trio ------------------------------------------------------------------------------


async def _serve_trio(options: ServeOptions) -> int:
    # Signals as messages, not a KeyboardInterrupt raised in whatever task
    # runs: that would crash the handlers before the gateway says going-away.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(
                lambda task_status: serve_gateway(
                    options.config,
                    engine=options.engine,
                    authenticate=options.authenticate,
                    registry_options=options.registry_options,
                    listener=options.listener,
                    task_status=task_status,
                )
            )
            options.on_listening(gateway.url)
            nursery.start_soon(_log_stats_trio, gateway, options.stats_interval_s)
            signum: int = signal.SIGINT
            async for received in signals:
                signum = received
                break
            _going_away(signum)
            nursery.cancel_scope.cancel()
    return _EXIT_STATUS.get(signum, 0)


async def _log_stats_trio(gateway: Gateway, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        log_stats(gateway.service)


def log_stats(service: object) -> None:
    """One INFO line of the registry's and the gateway's figures (``--stats-interval``):
    ``sessions`` = ``live`` + ``parked`` = ``attached`` + ``detached``."""
    from supervisor.gateway._service import GatewayService  # noqa: PLC0415 - a type only

    assert isinstance(service, GatewayService)  # noqa: S101
    stats = service.registry.stats()
    logger.info(
        "sessions=%d live=%d parked=%d attached=%d detached=%d events=%d resumes=%d "
        "connections_open=%d errors=%d",
        stats.sessions,
        stats.live,
        stats.parked,
        stats.attached,
        stats.detached,
        stats.events_journaled,
        stats.resumes,
        service.connections_open(),
        sum(service.counters.errors.values()),
    )


# -- the ASGI servers' settings (the gateway benchmark measures these too) -----------------


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn to listen on (``serve`` and the benchmark).

    Made with ``IPPROTO_TCP`` named: asyncio turns Nagle's algorithm off
    (TCP_NODELAY) only for connections whose socket says so, and with it on,
    the second frame of an answer waited for the client's delayed ACK
    (~40 ms a round trip).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _bound(options: ServeOptions) -> socket.socket:
    """The socket an ASGI server serves on: ``options.listener``, or one bound now."""
    if options.listener is not None:
        return options.listener
    try:
        return listening_socket(options.config.host, options.config.port)
    except OSError as exc:
        raise _bind_error(options.config, exc) from None


def uvicorn_config(
    app: object, config: GatewayConfig, shell: UvicornShell | None = None, **extra: Any
) -> Any:
    """The ``uvicorn.Config`` that ``serve --server asgi-uvicorn`` runs ``app`` with;
    with ``shell``, its protocol classes (the trio server's limits, see
    `supervisor.gateway._uvicorn`)."""
    import uvicorn  # noqa: PLC0415 - only this server needs it

    protocols: dict[str, Any] = {"ws": "websockets-sansio"}
    if shell is not None:
        protocols = {"http": shell.http_protocol, "ws": shell.ws_protocol}
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        **protocols,
        ws_ping_interval=config.ping_interval_s,
        ws_ping_timeout=config.idle_timeout_s,
        ws_max_size=config.max_frame_bytes * 4,
        **extra,
    )


def hypercorn_settings(config: GatewayConfig) -> Any:
    """The Hypercorn ``Config`` of ``serve --server asgi-hypercorn``, without its bind."""
    from hypercorn.config import Config  # noqa: PLC0415 - only this server needs it

    settings = Config()
    settings.accesslog = None
    settings.errorlog = logging.getLogger("hypercorn.error")
    settings.websocket_ping_interval = config.ping_interval_s
    settings.websocket_max_message_size = config.max_frame_bytes * 4
    settings.include_server_header = False
    # Runs from accept to the first request: the handshake timeout of the others.
    settings.keep_alive_timeout = config.handshake_timeout_s
    return settings


# -- uvicorn -----------------------------------------------------------------------------


def _gateway_app(options: ServeOptions) -> GatewayApp:
    """The ASGI app an ASGI server serves, with ``serve``'s engine and options."""
    return GatewayApp(
        options.config,
        engine=options.engine,
        authenticate=options.authenticate,
        registry_options=options.registry_options,
    )


def _serve_uvicorn(options: ServeOptions) -> int:
    from supervisor.gateway._uvicorn import (  # noqa: PLC0415 - needs uvicorn
        GatewayServer,
        UvicornShell,
    )

    config = options.config
    app = _gateway_app(options)
    sock = _bound(options)
    port = sock.getsockname()[1]
    shell = UvicornShell(config)
    shell.listener = sock
    server = GatewayServer(
        uvicorn_config(
            app,
            config,
            shell,
            ssl_certfile=config.tls_cert,
            ssl_keyfile=config.tls_key,
            timeout_graceful_shutdown=int(config.close_timeout_s) + 1,
        ),
        go_away=app.go_away,
        on_signal=_going_away,
    )

    async def main() -> None:
        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.01)
            logger.info("gateway listening on %s", _url(config, port))
            options.on_listening(_url(config, port))
            while True:
                await asyncio.sleep(options.stats_interval_s)
                if app.service is not None:
                    log_stats(app.service)

        asyncio.get_running_loop().set_exception_handler(shell.exception_handler)
        announcer = asyncio.create_task(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcer

    try:
        asyncio.run(main())
    finally:
        shell.close()
    received = server.signals_received
    return _EXIT_STATUS.get(received[0], 0) if received else 0


# -- Hypercorn (trio worker) -------------------------------------------------------------


def _hypercorn_serve_settings(options: ServeOptions) -> Any:
    """`hypercorn_settings` for ``serve``: its socket bound, its TLS files."""
    config = options.config
    settings = hypercorn_settings(config)
    # Bound here, before Hypercorn runs the app's lifespan: a busy port is
    # then the first thing said, not something after "gateway app started".
    settings.bind = [f"fd://{_bound(options).detach()}"]
    settings.graceful_timeout = config.close_timeout_s + 1
    if config.tls_cert is not None:
        settings.certfile, settings.keyfile = config.tls_cert, config.tls_key
        logger.warning(
            "asgi-hypercorn with TLS: out of descriptors, waiting connections are not shed "
            "(trio's accept loop waits and retries); --server trio or asgi-uvicorn shed them"
        )
    return settings


async def _serve_hypercorn(options: ServeOptions) -> int:
    from hypercorn.trio import serve  # noqa: PLC0415 - only this server needs it

    from supervisor.gateway._hypercorn import HypercornShell  # noqa: PLC0415 - needs it

    config = options.config
    app = _gateway_app(options)
    settings = _hypercorn_serve_settings(options)
    received: list[int] = []

    async def shutdown_trigger() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                received.append(signum)
                break
        _going_away(received[0])
        await app.go_away()

    async def stats() -> None:
        while True:
            await trio.sleep(options.stats_interval_s)
            if app.service is not None:
                log_stats(app.service)

    shell = HypercornShell(config)
    with shell.installed():
        async with trio.open_nursery() as outer:
            outer.start_soon(stats)
            # Hypercorn returns once the trigger fired and its connections closed.
            async with trio.open_nursery() as nursery:
                try:
                    binds: list[str] = await nursery.start(
                        lambda task_status: serve(
                            app,  # type: ignore[arg-type]
                            settings,
                            shutdown_trigger=shutdown_trigger,
                            task_status=task_status,
                        )
                    )
                except* OSError as group:
                    raise _bind_error(config, group) from None
                port = int(binds[0].rsplit(":", 1)[1])
                await shell.accepting.wait()
                logger.info("gateway listening on %s", _url(config, port))
                options.on_listening(_url(config, port))
            outer.cancel_scope.cancel()
    return _EXIT_STATUS.get(received[0], 0) if received else 0
