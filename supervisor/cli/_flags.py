"""The command line's flags: every option of ``serve``, ``chaos`` and ``demo``, its
help and its validation (a bad value exits 2 naming the flag)."""

from __future__ import annotations

import argparse
import importlib.metadata

from supervisor.cli._chaos import ChaosConfig
from supervisor.cli._flag_values import (
    add_field_flags,
    durability,
    field_values,
    positive,
    store_outage,
    websocket_url,
)
from supervisor.cli._shared_flags import (
    SECRET_ENV,
    add_logging_flags,
    add_secret_flags,
    read_secret,
)
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._servers import SERVER_ALIASES, SERVERS, ServeOptions

__all__ = [
    "DEFAULT_SERVER",
    "SECRET_ENV",
    "add_field_flags",
    "field_values",
    "parser",
    "read_secret",
]

#: The server ``serve`` uses unless told: the one that needs no extra (README, "Embedding").
DEFAULT_SERVER = "trio"


def _version() -> str:
    try:
        return importlib.metadata.version("duplex-supervisor")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("demo engine")
    add_field_flags(group, EngineConfig, "demo engine")
    add_field_flags(group, GatewayConfig, "demo engine")


def _add_chaos_flags(parser: argparse.ArgumentParser, *, clients: int, duration: float) -> None:
    group = parser.add_argument_group("chaos clients")
    group.add_argument(
        "--clients",
        type=positive(int),
        default=clients,
        help=f"concurrent clients, one session each (default {clients})",
    )
    group.add_argument(
        "--duration",
        type=positive(float),
        default=duration,
        metavar="SECONDS",
        help=f"how long the clients stream before closing (default {duration:g})",
    )
    add_field_flags(group, ChaosConfig, "chaos clients")
    group.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (figures under 'totals') on stdout instead of a table",
    )


def _add_redis_flags(net: argparse._ArgumentGroup) -> None:
    net.add_argument(
        "--redis",
        metavar="URL",
        help="keep sessions in Redis (redis://host:port/db, or "
        "redis+cluster://host:port,host:port,... for a Redis Cluster): a client may resume "
        "on any process serving with the same URL; 'local': start a private redis-server "
        "from PATH on a free loopback port and stop it on exit (default: this process's "
        "memory only)",
    )
    net.add_argument(
        "--redis-durability",
        type=durability,
        default=0,
        metavar="replicas=K",
        help="with --redis: each commit (and each create and takeover) also waits until K "
        "replicas of its primary acknowledged it (WAIT), so a promoted replica holds every "
        "event a client was sent; a write they do not acknowledge is answered 'store "
        "unavailable' (default replicas=0: no wait)",
    )


def _add_demo_processes(demo: argparse.ArgumentParser) -> None:
    """Demo flags for more than one gateway process, and their store."""
    multi = demo.add_argument_group("more than one process")
    multi.add_argument(
        "--processes",
        type=positive(int),
        default=1,
        metavar="N",
        help="gateway processes sharing --redis; with 2 or more, one is SIGKILLed halfway "
        "through (default 1: the gateway in this process, sessions in memory)",
    )
    multi.add_argument(
        "--redis",
        metavar="URL",
        help="the Redis the processes share (redis://host:port/db), or 'local': start a "
        "redis-server from PATH on a free loopback port for the run and stop it after, or "
        "'cluster-local': start a private Redis Cluster (3 primaries, 3 replicas) and run "
        "--processes gateways on it (3 unless 2 or more are asked for); the primary serving "
        "the most sessions is SIGKILLed halfway, its replica promoted; the table adds "
        "'failovers seen' and each affected session's wait ('unavailable per affected "
        "session')",
    )
    multi.add_argument(
        "--redis-durability",
        type=durability,
        default=0,
        metavar="replicas=K",
        help="as for serve: each commit, create and takeover also waits for K replicas "
        "(WAIT); with cluster-local every node also runs with min-replicas-to-write K "
        "(default replicas=0)",
    )
    multi.add_argument(
        "--workers",
        type=positive(int),
        metavar="N",
        help="one 'serve --workers N --redis' process instead (N workers on one port, as "
        "the kernel spreads connections); one worker is SIGKILLed halfway through and "
        "started again by the parent, its clients resume on any worker; needs --redis",
    )
    multi.add_argument(
        "--store-outage",
        type=store_outage,
        metavar="AT:SECONDS",
        help="with --redis local: the redis-server keeps an append-only file (appendfsync "
        "always), is SIGKILLed AT seconds into the run and started again from that file "
        "SECONDS later (AT + SECONDS below --duration); clients answered "
        "'store_unavailable' try again with backoff; the table adds 'store outage (s)' "
        "and 'store retries'",
    )


def _add_demo_engines(demo: argparse.ArgumentParser) -> None:
    """Demo flags for engines in other processes."""
    workers = demo.add_argument_group("engines in other processes")
    workers.add_argument(
        "--engine-workers",
        type=positive(int),
        metavar="N",
        help="run the demo engine in N 'worker' processes fed over --bus; the first is "
        "SIGKILLed halfway through and the others take its work over; the table adds "
        "'engine workers killed', 'inputs redelivered' and 'fenced engine messages'",
    )
    workers.add_argument(
        "--bus",
        metavar="URL",
        help="the Redis of the engine bus (redis://host:port/db, or "
        "redis+cluster://host:port,... for a Redis Cluster), or 'local': start a "
        "redis-server from PATH for the run",
    )


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the gateway until Ctrl-C or SIGTERM",
        description="Serve resumable sessions over WebSocket, fed by the demo engine (or "
        "--engine). Ctrl-C or SIGTERM closes every connection with 1001 (going away), then "
        "exits (130 after Ctrl-C, 0 after SIGTERM).",
    )
    net = serve.add_argument_group("network")
    add_field_flags(net, GatewayConfig, "network")
    net.add_argument(
        "--server",
        choices=(*SERVERS, *SERVER_ALIASES),
        default=DEFAULT_SERVER,
        help="trio: the gateway's own WebSocket server on trio ('trio-websocket' is an old "
        "name for it); asgi-uvicorn: the ASGI app under uvicorn (asyncio); asgi-hypercorn: "
        f"the ASGI app under Hypercorn's trio worker (default {DEFAULT_SERVER}: no extra "
        "needed; asgi-uvicorn measured fastest, with pip install 'duplex-supervisor[asgi]')",
    )
    _add_store_and_worker_flags(serve, net)
    net.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a proxy (address or network) whose X-Forwarded-For names the client for limits "
        "and throttles (repeatable; default: none, the TCP peer is the client)",
    )
    add_field_flags(net, GatewayConfig, "page and TLS")
    net.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="accept browsers only from this Origin (repeatable; default: any)",
    )
    limits = serve.add_argument_group("limits")
    add_field_flags(limits, GatewayConfig, "limits")
    add_secret_flags(limits, "session.open must present the gateway's secret")
    add_field_flags(serve, ServeOptions, "serve")
    add_field_flags(serve, GatewayConfig, "serve")
    serve.add_argument(
        "--authenticate",
        metavar="MODULE:HOOK",
        help="HOOK(handshake) in MODULE returns the client's identity or None (refused: "
        "error unauthorized, close 4401); a resume must come from the same identity "
        "(default: none)",
    )
    add_field_flags(serve, GatewayConfig, "authenticate")
    _add_engine_bus_flags(serve)
    _add_engine_flags(serve)
    add_logging_flags(serve)


def _add_store_and_worker_flags(
    serve: argparse.ArgumentParser, net: argparse._ArgumentGroup
) -> None:
    """``serve --redis``, ``--redis-durability`` and ``--workers N``."""
    _add_redis_flags(net)
    net.add_argument(
        "--workers",
        type=positive(int),
        metavar="N",
        help="run N worker processes, each a whole gateway with its own loop, on one "
        "listening socket this process binds (the kernel gives each connection to one of "
        "them); a worker that dies is started again and its sessions are taken over on "
        "their next resume; SIGTERM drains them all. Needs --redis (URL or 'local'). With "
        "--metrics-port P, worker k serves its own /metrics on P+k (default: one process, "
        "no workers)",
    )


def _add_engine_bus_flags(serve: argparse.ArgumentParser) -> None:
    """Where ``serve``'s engine runs: here (``--engine``) or in workers (``--engine-bus``)."""
    serve.add_argument(
        "--engine",
        metavar="MODULE:FACTORY",
        help="your engine: FACTORY() in MODULE returns an object with start, answer and stop "
        "(the Engine protocol); default: the demo engine and its flags",
    )
    serve.add_argument(
        "--engine-bus",
        metavar="URL",
        help="feed engine workers ('duplex-supervisor worker') over the Redis at URL "
        "(redis://host:port/db, or redis+cluster://host:port,host:port,... for a Redis "
        "Cluster) instead of running an engine in this process (start the workers first: "
        "their client event types are read at start)",
    )
    serve.add_argument(
        "--engine-pool",
        default="default",
        metavar="NAME",
        help="the engine pool on --engine-bus (default 'default')",
    )


def _add_worker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = commands.add_parser(
        "worker",
        help="run an engine in this process, fed by gateways over a bus",
        description="Run your Engine (or the demo engine) as one worker of an engine pool: it "
        "takes the inputs and client events gateways ('serve --engine-bus URL') put on the "
        "bus, and sends the engine's events back. A worker that dies leaves its work to the "
        "others after --visibility-timeout. Runs until Ctrl-C or SIGTERM.",
    )
    worker.add_argument(
        "--bus",
        required=True,
        metavar="URL",
        help="the Redis of the bus (redis://host:port/db, or "
        "redis+cluster://host:port,host:port,... for a Redis Cluster)",
    )
    worker.add_argument(
        "--engine",
        metavar="MODULE:FACTORY",
        help="your engine: FACTORY() in MODULE returns an Engine; default: the demo engine",
    )
    worker.add_argument(
        "--engine-pool",
        default="default",
        metavar="NAME",
        help="the engine pool to serve (default 'default')",
    )
    worker.add_argument(
        "--visibility-timeout",
        type=positive(float),
        default=5.0,
        metavar="SECONDS",
        help="how long work a worker holds may go without its heartbeat before another "
        "worker takes it over (default 5; the same on every worker of the pool)",
    )
    _add_engine_flags(worker)
    add_logging_flags(worker)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="duplex-supervisor",
        description=(
            "Resumable duplex sessions as actors. 'demo' runs a WebSocket gateway and a crowd "
            "of chaos clients that cut their connections and resume, then reports whether any "
            "event was lost or repeated."
        ),
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    add_logging_flags(top)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_serve(commands)
    _add_worker(commands)

    _add_chaos(commands)
    _add_demo(commands)
    return top


def _add_chaos(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chaos = commands.add_parser(
        "chaos",
        help="run chaos clients against a gateway",
        description="Clients that cut their connections at random and resume; exit status 0 "
        "only if no event was lost or duplicated and no unexpected error came.",
    )
    chaos.add_argument(
        "url",
        type=websocket_url,
        help="the gateway, e.g. ws://127.0.0.1:8765/v1 or wss://...",
    )
    chaos.add_argument(
        "--ca-file",
        metavar="PATH",
        help="PEM certificates to trust for a wss:// gateway (default: the system's)",
    )
    add_secret_flags(chaos, "the gateway's session.open secret")
    _add_chaos_flags(chaos, clients=20, duration=10.0)
    add_logging_flags(chaos)


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="serve on a free loopback port and run chaos against it",
        description="The gateway and the chaos clients in one process, on loopback; a table "
        "(or --json) at the end. Exit status 0 only if lost, duplicated and errors are 0. "
        "With --processes 3 --redis URL: three 'serve --redis' processes sharing one Redis; "
        "each client connects and resumes on a process picked at random (so resumes take "
        "sessions over across processes), one process is killed with SIGKILL halfway "
        "through and its clients resume on the others; the table adds 'resumes across "
        "processes', 'takeovers' and 'stranded' (0 also needed for exit status 0). With "
        "--store-outage AT:SECONDS as well, Redis dies and comes back during the run. "
        "With --redis cluster-local: the processes on a private Redis Cluster whose "
        "primary is SIGKILLed halfway.",
    )
    _add_demo_processes(demo)
    _add_demo_engines(demo)
    demo.add_argument(
        "--server",
        choices=(*SERVERS, *SERVER_ALIASES),
        default=DEFAULT_SERVER,
        help=f"the server the demo's gateway runs on, as for serve (default {DEFAULT_SERVER})",
    )
    demo.add_argument(
        "--browser",
        action="store_true",
        help="also serve the demo page (as serve --demo-page) and print its URL; after the "
        "table the gateway stays up for the page until Ctrl-C (the trio server, one process)",
    )
    _add_chaos_flags(demo, clients=20, duration=12.0)
    _add_engine_flags(demo)
    add_logging_flags(demo)
