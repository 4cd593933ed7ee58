"""The gateway benchmark's server process: one shell, one session layer, one engine loop.

``python -m benchmarks.gateway_server --shell SHELL --mode MODE --rate HZ``

Prints ``listening URL`` once it accepts connections, then serves until
killed. ``--shell`` is one of the gateway's server shells (``trio``: its own
h11 + wsproto server; ``asgi-uvicorn``; ``asgi-hypercorn``, the trio
worker). ``--mode`` is what sits behind it:

``ours``
    The gateway itself (`serve_gateway` or
    `GatewayApp`) with `StampedEngine`:
    sessions, journal, outbox, the protocol core.
``floor``
    The same server, the same accepted-WebSocket wrappers and the same engine
    loop, writing each event straight to its socket: no registry, no journal.
``baseline``
    The same again with the seed's lock-per-session algorithm
    (`LockRegistry`) between the engine loop
    and the socket: journal under the locks, then the send.

``--redis URL`` (with ``--shell trio --mode ours`` only): the gateway keeps
its sessions in Redis (`RedisStore`, as ``serve --redis``), so every journaled
event is also written there.

``--engine-bus URL --engine-pool NAME`` (with ``--shell trio --mode ours``
only): no engine in this process; the gateway feeds the pool's engine workers
over the Redis Streams bus (a `BusEngine`, as ``serve --engine-bus``). The
benchmark starts those workers first, each ``duplex-supervisor worker
--engine benchmarks.gateway_server:StampedEngine`` (`benchmarks.gateway_bus`).

Each session's engine loop sends one event every ``1/rate`` seconds (a
random phase per session, so sessions do not fire in step), stamped with
``t`` (``time.monotonic()``) just before its send call, as the load
generator (`benchmarks.gateway_load`) measures latency from it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import random
import resource
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import anyio
import trio

from benchmarks.references import LockRegistry
from supervisor._log_limit import LogLimiter
from supervisor.cli._commands import _registry_options
from supervisor.gateway._auth import Handshake
from supervisor.gateway._collector import young_collections
from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._core import TransportClosedError
from supervisor.gateway._engine import Engine, EngineSession, SessionEnded
from supervisor.gateway._listener import accept_forever
from supervisor.gateway._protocol import frame_text
from supervisor.gateway._server import Gateway, serve_gateway
from supervisor.gateway._servers import hypercorn_settings, listening_socket, uvicorn_config
from supervisor.gateway._service import GatewayService, Transport
from supervisor.gateway.asgi import GatewayApp

__all__ = ["MODES", "SHELLS", "StampedEngine", "main"]

SHELLS = ("trio", "asgi-uvicorn", "asgi-hypercorn")
MODES = ("ours", "floor", "baseline")

logger = logging.getLogger("benchmarks.gateway")

#: Events/s per session: the load generator's and the workers' (whose factory takes no argument).
RATE_HZ = 20.0
DELTA = "the quick resumable strea"[:24]
BIG = 1 << 30

Send = Callable[[Mapping[str, object]], Awaitable[None]]


async def stream_events(send: Send, rate_hz: float) -> None:
    """The engine loop every mode shares: one stamped delta per period, on schedule."""
    period = 1 / rate_hz
    next_at = anyio.current_time() + period * random.random()
    while True:
        await anyio.sleep_until(next_at)
        await send({"type": "response.output_text.delta", "delta": DELTA, "t": time.monotonic()})
        next_at += period
        now = anyio.current_time()
        if next_at < now - 1.0:
            next_at = now  # more than a second behind: the shortfall shows in events/s


class StampedEngine:
    """An `Engine` running `stream_events`."""

    def __init__(self, rate_hz: float = RATE_HZ) -> None:
        self.rate_hz = rate_hz

    async def start(self, session: EngineSession) -> None:
        with contextlib.suppress(SessionEnded):
            await stream_events(session.send, self.rate_hz)

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        return None

    def stop(self, session_id: str) -> None:
        return None


class ReferenceService:
    """What a shell needs of a `GatewayService`, serving ``session.open`` and
    then `stream_events` either straight to the socket (``floor``) or through
    a `LockRegistry` (``baseline``). Acks are journal trims in the baseline
    and ignored by the floor; ``session.close`` (or the peer leaving) ends it."""

    def __init__(self, config: GatewayConfig, mode: str, rate_hz: float) -> None:
        self.config = config
        self.mode = mode
        self.rate_hz = rate_hz
        self.counters = GatewayCounters()
        self.log = LogLimiter(logger, config.log_interval_s)
        self.accepting = True
        self._sockets: set[Transport] = set()
        self._locks = LockRegistry(
            replay_ttl_s=config.replay_ttl_s,
            replay_max_bytes_per_session=BIG,
            lock=anyio.Lock,
        )

    async def go_away(self) -> None:
        self.accepting = False

    async def converse(self, ws: Transport, handshake: Handshake, *, keepalive: bool) -> None:
        self._sockets.add(ws)
        session_id = ""
        try:
            opening = json.loads(await ws.receive())
            if opening.get("type") != "session.open":
                return
            session_id = uuid.uuid4().hex

            async def to_socket(frame: Mapping[str, object]) -> None:
                await ws.send(frame_text(frame))

            sequence = 0

            async def floor_send(payload: Mapping[str, object]) -> None:
                nonlocal sequence
                sequence += 1
                await ws.send(frame_text({**payload, "server_event_seq": sequence}))

            async def baseline_send(payload: Mapping[str, object]) -> None:
                await self._locks.send_event(session_id, payload)

            send: Send = floor_send
            if self.mode == "baseline":
                await self._locks.create(session_id, send=to_socket)
                send = baseline_send
            created = {"type": "session.created", "session_id": session_id}
            await ws.send(frame_text({**created, "attachment_generation": 1}))
            async with anyio.create_task_group() as group:
                group.start_soon(stream_events, send, self.rate_hz)
                await self._read(ws, session_id)
                group.cancel_scope.cancel()
        except* TransportClosedError:
            pass
        finally:
            self._sockets.discard(ws)
            if session_id and self.mode == "baseline":
                with anyio.CancelScope(shield=True):
                    await self._locks.close(session_id)

    async def _read(self, ws: Transport, session_id: str) -> None:
        while True:
            message = json.loads(await ws.receive())
            kind = message.get("type")
            if kind == "session.close":
                return
            if kind == "ack" and self.mode == "baseline":
                await self._locks.acknowledge(session_id, int(message["server_event_seq"]))


# -- the shells ----------------------------------------------------------------------


def _announce(url: str) -> None:
    print(f"listening {url}", flush=True)


def _bus_engine(url: str, pool: str) -> Engine:
    from supervisor.engine_bus import RedisEngineBus  # noqa: PLC0415 - only the bus needs redis-py
    from supervisor.gateway._bus_engine import BusEngine  # noqa: PLC0415

    return BusEngine(RedisEngineBus(url, pool=pool))


async def _serve_trio(
    config: GatewayConfig,
    mode: str,
    rate_hz: float,
    redis_url: str | None = None,
    engine: Engine | None = None,
) -> None:
    if mode == "ours":
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(
                functools.partial(
                    serve_gateway,
                    config,
                    engine=engine or StampedEngine(rate_hz),
                    registry_options=_registry_options(config, redis_url),
                )
            )
            _announce(gateway.url)
        return
    service = ReferenceService(config, mode, rate_hz)
    gateway = Gateway(config, cast(GatewayService, service))
    listeners = await trio.open_tcp_listeners(0, host=config.host)
    gateway.port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            await nursery.start(
                functools.partial(
                    accept_forever,
                    listener.socket,
                    gateway.connection,
                    nursery,
                    log=service.log,
                    plain_http=True,
                )
            )
        _announce(gateway.url)


class ReferenceApp(GatewayApp):
    """`GatewayApp` with a `ReferenceService` in place of the gateway's."""

    def __init__(self, config: GatewayConfig, mode: str, rate_hz: float) -> None:
        super().__init__(config)
        self._mode, self._rate_hz = mode, rate_hz

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        service = ReferenceService(self.config, self._mode, self._rate_hz)
        self.service = cast(GatewayService, service)
        try:
            yield
        finally:
            self.service = None


def _app(config: GatewayConfig, mode: str, rate_hz: float) -> GatewayApp:
    if mode == "ours":
        return GatewayApp(config, engine=StampedEngine(rate_hz))
    return ReferenceApp(config, mode, rate_hz)


def _url(config: GatewayConfig, port: int) -> str:
    return f"ws://{config.host}:{port}{config.path}"


def _serve_uvicorn(config: GatewayConfig, mode: str, rate_hz: float) -> None:
    import uvicorn  # noqa: PLC0415 - only this shell needs it

    # The settings of ``serve --server asgi-uvicorn``, one place for both.
    sock = listening_socket(config.host, 0)
    server = uvicorn.Server(uvicorn_config(_app(config, mode, rate_hz), config, backlog=4096))

    async def main() -> None:
        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.01)
            _announce(_url(config, sock.getsockname()[1]))

        announcer = asyncio.create_task(announce())
        await server.serve(sockets=[sock])
        announcer.cancel()

    asyncio.run(main())


async def _serve_hypercorn(config: GatewayConfig, mode: str, rate_hz: float) -> None:
    from hypercorn.trio import serve  # noqa: PLC0415 - only this shell needs it

    # The settings of ``serve --server asgi-hypercorn``, one place for both.
    settings = hypercorn_settings(config)
    settings.bind = [f"{config.host}:0"]
    settings.backlog = 4096
    app: Any = _app(config, mode, rate_hz)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(functools.partial(serve, app, settings))
        _announce(_url(config, int(binds[0].rsplit(":", 1)[1])))


def config_for_benchmark() -> GatewayConfig:
    """Caps far above any load the benchmark offers, all from one address."""
    many = 1_000_000
    return GatewayConfig(
        port=0,
        max_sessions=many,
        max_sessions_per_address=many,
        max_connections=many,
        max_connections_per_address=many,
        max_inputs_per_second=1e9,
        disconnect_grace_s=None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shell", choices=SHELLS, required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--rate", type=float, default=20.0, help="events/s per session")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval (s) before serving (default: Python's, 0.005)",
    )
    parser.add_argument(
        "--redis", metavar="URL", help="sessions in this Redis (--shell trio --mode ours only)"
    )
    parser.add_argument(
        "--engine-bus",
        metavar="URL",
        help="feed the engine workers of --engine-pool on this Redis instead of an engine "
        "in this process (--shell trio --mode ours only)",
    )
    parser.add_argument("--engine-pool", default="default", metavar="NAME")
    args = parser.parse_args(argv)
    if args.redis is not None and (args.shell, args.mode) != ("trio", "ours"):
        parser.error("--redis is for --shell trio --mode ours")
    if args.engine_bus is not None and (args.shell, args.mode) != ("trio", "ours"):
        parser.error("--engine-bus is for --shell trio --mode ours")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, hard), hard))
    logging.basicConfig(level=logging.WARNING)
    config = config_for_benchmark()
    # Every server gets the young GC threshold a gateway sets for itself
    # (`GatewayConfig.gc_young_threshold`): the references are not to be
    # slowed by a process setting only ours would have.
    with young_collections(config.gc_young_threshold):
        if args.shell == "trio":
            bus = args.engine_bus
            engine = None if bus is None else _bus_engine(bus, args.engine_pool)
            trio.run(_serve_trio, config, args.mode, args.rate, args.redis, engine)
        elif args.shell == "asgi-uvicorn":
            _serve_uvicorn(config, args.mode, args.rate)
        else:
            trio.run(_serve_hypercorn, config, args.mode, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
