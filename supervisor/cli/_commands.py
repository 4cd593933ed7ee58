"""``duplex-supervisor``: serve the gateway, run chaos clients, or both (demo)."""
# The flags are in supervisor/cli/_flags.py, the servers in
# supervisor/gateway/_servers.py, logging in supervisor/gateway/_logs.py.

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio
from rich.console import Console

from supervisor._extras import MissingExtraError, require
from supervisor.cli._demo_cluster import ClusterFigures, run_cluster_demo
from supervisor.cli._demo_processes import (
    LOCAL_REDIS,
    ProcessesFigures,
    StoreOutage,
    drain,
    listening_url,
    local_redis,
    local_redis_server,
    reap,
    run_processes_demo,
    serve_command,
)
from supervisor.cli._demo_serve_workers import PoolFigures, run_serve_workers_demo
from supervisor.cli._flags import SECRET_ENV, field_values, parser, read_secret
from supervisor.cli._local_redis_cluster import CLUSTER_LOCAL
from supervisor.cli._run_report import (
    RunFigures,
    report_table,
    run_chaos_shown,
    totals_json,
    verdict,
)
from supervisor.cli._serve_workers import (
    WorkerFds,
    announce_ready,
    inherited_listener,
    serve_workers,
    watch_lifeline,
    worker_fds,
)

if TYPE_CHECKING:
    from supervisor.cli._demo_workers import WorkerFigures
from supervisor._options import RegistryOptions
from supervisor.cli._chaos import (
    ChaosConfig,
    ChaosReport,
    Targets,
)
from supervisor.cli._wire_client import WireClosedError
from supervisor.gateway._engine import (
    DemoEngine,
    Engine,
    EngineConfig,
    load_callable,
    load_engine_factory,
)
from supervisor.gateway._logs import configure_logging
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.gateway._servers import NEEDS, SERVER_ALIASES, ServeOptions, run_server

__all__ = ["main"]

logger = logging.getLogger("duplex_supervisor.supervisor")


def _chaos_config(args: argparse.Namespace) -> ChaosConfig:
    return ChaosConfig(
        clients=args.clients,
        duration_s=args.duration,
        **field_values(args, ChaosConfig),
        secret=read_secret(args) if args.command == "chaos" else None,
        ca_file=getattr(args, "ca_file", None),
    )


def _finish(
    args: argparse.Namespace,
    report: ChaosReport,
    gateway: Gateway | None,
    workers: WorkerFigures | None = None,
    *,
    pool: PoolFigures | None = None,
    figures: ProcessesFigures | None = None,
    cluster: ClusterFigures | None = None,
) -> int:
    # The cluster demo's processes rows are its own (no gateway is killed).
    processes = 1 if cluster is not None else getattr(args, "processes", 1)
    run = RunFigures(
        processes=processes, workers=workers, pool=pool, figures=figures, cluster=cluster
    )
    if args.json:
        print(totals_json(report, gateway, run))
    else:
        Console().print(report_table(report, gateway, run))
    return 0 if verdict(report, run) else 1


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**field_values(args, EngineConfig))


async def _demo(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    server = SERVER_ALIASES.get(args.server, args.server)
    # Checked here, once: a child process would say it in its own log.
    if server in NEEDS:
        require(NEEDS[server], f"--server {server}")
    if args.redis is not None:
        require("redis", "--redis")
    if args.redis_durability and args.redis in (None, LOCAL_REDIS):
        raise ValueError("--redis-durability needs replicas: --redis cluster-local or a URL")
    if args.browser and (server != "trio" or args.processes > 1 or args.redis is not None):
        raise ValueError("demo --browser runs the trio server in one process")
    if args.engine_workers is not None or args.bus is not None:
        return await _demo_workers(args, console, server)
    if args.redis == CLUSTER_LOCAL:
        return await _demo_cluster(args, console, server)
    if args.workers is not None:
        return await _demo_serve_workers(args, console, server)
    if args.processes > 1 or args.redis is not None:
        return await _demo_processes(args, console, server)
    if server != "trio":
        return await _demo_in_process(args, console, server)
    engine = DemoEngine(_engine_config(args))
    # Every demo client comes from 127.0.0.1: the per-address caps fit the crowd.
    crowd = max(256, 2 * args.clients)
    config = GatewayConfig(
        port=0,
        max_connections_per_address=crowd,
        max_sessions_per_address=crowd,
        demo_page=args.browser,
    )
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(
            lambda task_status: serve_gateway(config, engine=engine, task_status=task_status)
        )
        page = f"http://{config.host}:{gateway.port}/"
        if args.browser:
            console.print(f"the demo page: open {page} to watch a session resume")
        report = await run_chaos_shown(gateway.url, _chaos_config(args), console, gateway)
        status = _finish(args, report, gateway)
        if args.browser:
            console.print(f"the demo page stays at {page} until Ctrl-C")
            await trio.sleep_forever()
        nursery.cancel_scope.cancel()
    return status


async def _demo_processes(args: argparse.Namespace, console: Console, server: str) -> int:
    """``demo --processes N --redis URL``: see supervisor/cli/_demo_processes.py."""
    if args.processes < 2 or args.redis is None:
        raise ValueError("the demo across processes needs --processes 2 or more and --redis")

    async def crowd(targets: Targets, config: ChaosConfig) -> ChaosReport:
        return await run_chaos_shown(targets, config, console, None)

    config = _chaos_config(args)
    if args.store_outage is None:
        outage = None
    else:
        outage = StoreOutage(at_s=args.store_outage[0], seconds=args.store_outage[1])
        if args.redis != LOCAL_REDIS:
            raise ValueError("--store-outage kills the demo's own Redis: give --redis local")
        if outage.at_s + outage.seconds >= config.duration_s:
            raise ValueError("--store-outage AT:SECONDS must end before --duration")
    if args.redis != LOCAL_REDIS:
        report, figures = await run_processes_demo(args, server, args.redis, config, crowd)
    else:
        # With an outage, an append-only file synced at every write: the
        # store comes back with all it had.
        with local_redis_server(None if outage is None else "always") as redis:
            report, figures = await run_processes_demo(
                args, server, redis.url, config, crowd, outage=outage, redis=redis
            )
    return _finish(args, report, None, figures=figures)


async def _demo_cluster(args: argparse.Namespace, console: Console, server: str) -> int:
    """``demo --redis cluster-local``: see supervisor/cli/_demo_cluster.py."""
    if args.workers is not None or args.store_outage is not None:
        raise ValueError("demo --redis cluster-local takes neither --workers nor --store-outage")

    async def crowd(targets: Targets, config: ChaosConfig) -> ChaosReport:
        return await run_chaos_shown(targets, config, console, None)

    report, cluster = await run_cluster_demo(args, server, _chaos_config(args), crowd)
    return _finish(args, report, None, cluster=cluster)


async def _demo_serve_workers(args: argparse.Namespace, console: Console, server: str) -> int:
    """``demo --workers N --redis URL``: see supervisor/cli/_demo_serve_workers.py."""
    if args.redis is None or args.processes > 1:
        raise ValueError("demo --workers N needs --redis (URL or 'local') and no --processes")

    async def crowd(targets: Targets, config: ChaosConfig) -> ChaosReport:
        return await run_chaos_shown(targets, config, console, None)

    with contextlib.ExitStack() as stack:
        url = args.redis if args.redis != LOCAL_REDIS else stack.enter_context(local_redis())
        report, pool = await run_serve_workers_demo(args, server, url, _chaos_config(args), crowd)
    return _finish(args, report, None, pool=pool)


async def _demo_workers(args: argparse.Namespace, console: Console, server: str) -> int:
    """``demo --engine-workers N --bus URL``: see supervisor/cli/_demo_workers.py."""
    if args.engine_workers is None or args.bus is None:
        raise ValueError("the demo with engine workers needs --engine-workers N and --bus")
    if server != "trio" or args.processes > 1 or args.redis is not None or args.browser:
        raise ValueError("demo --engine-workers runs one trio gateway in this process")
    require("redis", "--bus")
    from supervisor.cli._demo_workers import run_workers_demo  # noqa: PLC0415 - needs redis-py

    async def crowd(url: str, config: ChaosConfig, gateway: Gateway) -> ChaosReport:
        return await run_chaos_shown(url, config, console, gateway)

    report, gateway, figures = await run_workers_demo(args, _chaos_config(args), crowd)
    return _finish(args, report, gateway, figures)


async def _demo_in_process(args: argparse.Namespace, console: Console, server: str) -> int:
    """An ASGI server runs on its own loop: ``serve`` in a child process, chaos here."""
    command = serve_command(args, server, None)
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=env)
    assert process.stderr is not None  # noqa: S101 - asked for above
    try:
        url = await listening_url(process.stderr)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, process.stderr)
            report = await run_chaos_shown(url, _chaos_config(args), console, None)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                await process.wait()
            nursery.cancel_scope.cancel()
    finally:
        await reap(process)
    if process.returncode != 0:
        raise ValueError(f"the {server} server exited {process.returncode} after SIGTERM")
    return _finish(args, report, None)


async def _chaos(args: argparse.Namespace) -> int:
    config = _chaos_config(args)
    report = await run_chaos_shown(args.url, config, Console(stderr=True), None)
    return _finish(args, report, None)


def _gateway_config(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        **field_values(args, GatewayConfig),
        shared_secret=read_secret(args),
        allowed_origins=tuple(args.allowed_origin),
        trusted_proxies=tuple(args.trusted_proxy),
    )


def _engine(args: argparse.Namespace) -> Engine:
    if getattr(args, "engine_bus", None) is not None:
        if args.engine is not None:
            raise ValueError("--engine and --engine-bus: the engine runs in the workers, not here")
        from supervisor.engine_bus import RedisEngineBus  # noqa: PLC0415 - only the bus needs redis-py
        from supervisor.gateway._bus_engine import BusEngine  # noqa: PLC0415

        return BusEngine(RedisEngineBus(args.engine_bus, pool=args.engine_pool))
    if args.engine is None:
        return DemoEngine(_engine_config(args))
    engine = load_engine_factory(args.engine)()
    if not isinstance(engine, Engine):
        raise ValueError(f"--engine {args.engine}: the factory returned no Engine: {engine!r}")
    return engine


def _registry_options(
    config: GatewayConfig, redis_url: str | None, *, durability_replicas: int = 0
) -> RegistryOptions | None:
    """With ``--redis``: the gateway's registry options plus a RedisStore."""
    if redis_url is None:
        return None
    require("redis", "--redis")
    from supervisor.stores._redis import RedisStore  # noqa: PLC0415 - only --redis needs redis-py

    store = RedisStore(redis_url, durability_replicas=durability_replicas)
    store.ping()  # unreachable: a clear error now, not at the first session
    return RegistryOptions(
        replay_ttl_s=config.replay_ttl_s,
        replay_max_bytes_per_session=config.replay_max_bytes_per_session,
        disconnect_grace_s=config.disconnect_grace_s,
        passivate_after_s=config.passivate_after_s,
        send_timeout_s=config.send_timeout_s,
        store=store,
    )


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    fds = worker_fds()
    if args.workers is not None and fds is None:
        return serve_workers(args, argv)
    if args.redis == LOCAL_REDIS:
        with local_redis() as url:
            args.redis = url
            return _serve_here(args, fds)
    return _serve_here(args, fds)


def _serve_here(args: argparse.Namespace, fds: WorkerFds | None) -> int:
    """``serve`` in this process (alone, or as one worker of ``serve --workers``)."""
    authenticate = None
    if args.authenticate is not None:
        authenticate = load_callable(args.authenticate, "--authenticate")
    config = _gateway_config(args)
    listener = None
    if fds is not None:  # a worker: the parent's socket, its pipes
        listener = inherited_listener(fds.listen)
        watch_lifeline(fds.lifeline)

    def on_listening(url: str) -> None:
        if fds is not None:
            announce_ready(fds.ready)

    options = ServeOptions(
        config=config,
        registry_options=_registry_options(
            config, args.redis, durability_replicas=args.redis_durability
        ),
        engine=_engine(args),
        authenticate=authenticate,
        **field_values(args, ServeOptions),
        listener=listener,
        on_listening=on_listening,
    )
    return run_server(args.server, options)


async def _worker(args: argparse.Namespace) -> int:
    """``worker``: the engine as one consumer of the pool, until Ctrl-C or SIGTERM."""
    require("redis", "worker --bus")
    from supervisor.engine_bus import RedisEngineBus  # noqa: PLC0415 - only the bus needs redis-py
    from supervisor.worker import EngineWorker  # noqa: PLC0415

    bus = RedisEngineBus(args.bus, pool=args.engine_pool, visibility_s=args.visibility_timeout)
    worker = EngineWorker(_engine(args), bus)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: worker.run(task_status=task_status))
            logger.info("engine worker %s serving pool %r", worker.consumer, args.engine_pool)
            async for signum in signals:
                nursery.cancel_scope.cancel()
                bus.close()
                return 130 if signum == signal.SIGINT else 0
    return 0


def _logging(args: argparse.Namespace) -> None:
    default = "info" if args.command in ("serve", "worker") else "warning"
    level = "debug" if getattr(args, "verbose", False) else getattr(args, "log_level", default)
    configure_logging(
        level=getattr(logging, level.upper()),
        log_format=getattr(args, "log_format", "text"),
        third_party_level=getattr(
            logging, getattr(args, "third_party_log_level", "warning").upper()
        ),
        interval_s=getattr(args, "log_interval", 10.0),
    )


#: Errors a user can mend (a flag, a port, a missing extra): one line, exit 2.
_SAID_IN_ONE_LINE = (OSError, ValueError, WireClosedError, MissingExtraError)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    _logging(args)
    try:
        if args.command == "serve":
            return _serve(args, argv)
        runner = {"chaos": _chaos, "demo": _demo, "worker": _worker}[args.command]
        return trio.run(runner, args)
    except BaseExceptionGroup as group:
        # Raised inside trio nurseries, these arrive in exception groups.
        interrupted, others = group.split(KeyboardInterrupt)
        if interrupted is not None and others is None:
            return 130
        known, others = group.split(_SAID_IN_ONE_LINE)
        if known is None or others is not None:
            raise
        print(f"duplex-supervisor: {_first_leaf(known)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except _SAID_IN_ONE_LINE as exc:
        print(f"duplex-supervisor: {exc}", file=sys.stderr)
        return 2


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
