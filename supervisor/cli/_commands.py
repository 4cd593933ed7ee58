"""``duplex-supervisor``: serve the gateway, run chaos clients, or both (demo)."""
# The flags are in supervisor/cli/_flags.py, the servers in
# supervisor/gateway/_servers.py, logging in supervisor/gateway/_logs.py.

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

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
    ClientReport,
    Targets,
    run_chaos,
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


@dataclass(frozen=True, slots=True, kw_only=True)
class _RunFigures:
    """What a run reports beside the clients' totals (each demo adds its own)."""

    processes: int = 1
    workers: WorkerFigures | None = None
    pool: PoolFigures | None = None
    figures: ProcessesFigures | None = None
    cluster: ClusterFigures | None = None


def _table(report: ChaosReport, gateway: Gateway | None, run: _RunFigures) -> Table:
    t = report.totals
    table = Table(title="duplex-supervisor chaos run", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, object]] = [
        ("sessions", t.sessions),
        ("events delivered", t.events_delivered),
        ("disconnects", t.disconnects),
        ("resumes", t.resumes),
        ("replayed events", t.replayed),
        ("inputs (answered)", f"{t.inputs} ({t.answered})"),
        ("lost", t.lost),
        ("duplicated", t.duplicated),
        ("client events sent", t.client_events_sent),
        ("client events received once", t.client_events_received_once),
        ("lost upstream", t.lost_upstream),
        ("duplicated upstream", t.duplicated_upstream),
        ("errors", t.errors),
        *_error_kinds(t.error_codes),
        *_run_rows(report, run),
    ]
    if gateway is not None:
        stats = gateway.registry.stats()
        rows.append(("server: events journaled", stats.events_journaled))
        rows.append(("server: crashes / restarts", f"{stats.crashes} / {stats.restarts}"))
    for name, value in rows:
        table.add_row(name, str(value))
    ok = _verdict(report, run)
    table.add_row("verdict", "[green]nothing lost or repeated[/]" if ok else "[red]FAILED[/]")
    return table


def _error_kinds(codes: dict[str, int]) -> list[tuple[str, object]]:
    """The errors' kinds, when there were any: a failed run says what it met."""
    if not codes:
        return []
    return [("errors by kind", ", ".join(f"{code} {n}" for code, n in sorted(codes.items())))]


def _run_rows(report: ChaosReport, run: _RunFigures) -> list[tuple[str, object]]:
    """The table's rows of what the run did beside the clients (processes, workers)."""
    t, pool, figures = report.totals, run.pool, run.figures
    rows: list[tuple[str, object]] = []
    if run.processes > 1:
        rows.append(("resumes across processes", t.resumes_across_processes))
        rows.append(("takeovers (sessions of the killed process)", t.takeovers))
        rows.append(("stranded (never resumed)", t.stranded))
        rows.append(("store retries (store_unavailable, tried again)", t.store_retries))
    if pool is not None:
        rows.append(("takeovers (sessions of the killed worker)", t.takeovers))
        rows.append(("stranded (never resumed)", t.stranded))
        rows.append(
            (
                "workers killed / started again",
                f"{pool.workers_killed} / {pool.workers_started_again}",
            )
        )
    if figures is not None:
        rows.append(
            ("processes SIGKILLed", 1 if figures.process_killed else "0 (raise --duration)")
        )
        if figures.outage_asked:
            outage = figures.store_outage_s
            rows.append(
                ("store outage (s)", "not over at the end" if outage is None else f"{outage:.1f}")
            )
    if run.cluster is not None:
        rows += run.cluster.rows(report)
    if run.workers is not None:
        rows.append(("engine workers killed", run.workers.engine_workers_killed))
        rows.append(("inputs redelivered", run.workers.inputs_redelivered))
        rows.append(("fenced engine messages", run.workers.fenced_engine_messages))
    return rows


def _totals_json(report: ChaosReport, gateway: Gateway | None, run: _RunFigures) -> str:
    t = report.totals
    totals: dict[str, object] = {
        "sessions": t.sessions,
        "events_delivered": t.events_delivered,
        "disconnects": t.disconnects,
        "resumes": t.resumes,
        "replayed": t.replayed,
        "inputs": t.inputs,
        "answered": t.answered,
        "lost": t.lost,
        "duplicated": t.duplicated,
        "client_events_sent": t.client_events_sent,
        "client_events_received_once": t.client_events_received_once,
        "lost_upstream": t.lost_upstream,
        "duplicated_upstream": t.duplicated_upstream,
        "errors": t.errors,
        "error_codes": t.error_codes,
    }
    totals.update(_run_totals(report, run))
    result: dict[str, object] = {"totals": totals, "ok": _verdict(report, run)}
    if gateway is not None:  # the table's "server:" rows
        stats = gateway.registry.stats()
        result["server"] = {
            "events_journaled": stats.events_journaled,
            "crashes": stats.crashes,
            "restarts": stats.restarts,
        }
    return json.dumps(result)


def _run_totals(report: ChaosReport, run: _RunFigures) -> dict[str, object]:
    """``--json``'s totals of what the run did beside the clients (`_run_rows`)."""
    t, pool, figures, workers = report.totals, run.pool, run.figures, run.workers
    totals: dict[str, object] = {}
    if run.processes > 1:
        totals["processes"] = run.processes
        totals["resumes_across_processes"] = t.resumes_across_processes
        totals["takeovers"] = t.takeovers
        totals["stranded"] = t.stranded
        totals["store_retries"] = t.store_retries
    if pool is not None:
        totals["workers"] = pool.workers
        totals["takeovers"] = t.takeovers
        totals["stranded"] = t.stranded
        totals["workers_killed"] = pool.workers_killed
        totals["workers_started_again"] = pool.workers_started_again
    if figures is not None:
        totals["processes_killed"] = int(figures.process_killed)
        if figures.outage_asked:
            totals["store_outage_s"] = figures.store_outage_s
    if run.cluster is not None:
        totals.update(run.cluster.totals(report))
    if workers is not None:
        totals["engine_workers"] = workers.engine_workers
        totals["engine_workers_killed"] = workers.engine_workers_killed
        totals["inputs_redelivered"] = workers.inputs_redelivered
        totals["fenced_engine_messages"] = workers.fenced_engine_messages
    return totals


def _chaos_config(args: argparse.Namespace) -> ChaosConfig:
    return ChaosConfig(
        clients=args.clients,
        duration_s=args.duration,
        **field_values(args, ChaosConfig),
        secret=read_secret(args) if args.command == "chaos" else None,
        ca_file=getattr(args, "ca_file", None),
    )


#: Seconds between two progress lines when stderr is no terminal (a log, a pipe).
PROGRESS_LINE_INTERVAL_S = 2.0


def _progress_text(totals: ClientReport) -> str:
    return (
        f"{totals.events_delivered} events, {totals.disconnects} cuts, "
        f"{totals.resumes} resumes, lost {totals.lost}, dup {totals.duplicated}"
    )


async def _run_chaos(
    url: str | Targets, config: ChaosConfig, console: Console, gateway: Gateway | None
) -> ChaosReport:
    if not console.is_terminal:
        # rich draws no bar off a terminal: a line every few seconds instead,
        # so a long run is never silent.
        last = -PROGRESS_LINE_INTERVAL_S

        def line(elapsed: float, totals: ClientReport) -> None:
            nonlocal last
            if elapsed - last >= PROGRESS_LINE_INTERVAL_S:
                last = elapsed
                console.print(
                    f"chaos: {min(elapsed, config.duration_s):.0f}/{config.duration_s:g} s, "
                    + _progress_text(totals),
                    highlight=False,
                )

        return await run_chaos(url, config, progress=line)
    with Progress(
        TextColumn("[bold]chaos[/]"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=config.duration_s)

        def progress(elapsed: float, totals: ClientReport) -> None:
            bar.update(
                task,
                completed=min(elapsed, config.duration_s),
                description=_progress_text(totals),
            )

        return await run_chaos(url, config, progress=progress)


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
    run = _RunFigures(
        processes=processes, workers=workers, pool=pool, figures=figures, cluster=cluster
    )
    if args.json:
        print(_totals_json(report, gateway, run))
    else:
        Console().print(_table(report, gateway, run))
    return 0 if _verdict(report, run) else 1


def _verdict(report: ChaosReport, run: _RunFigures) -> bool:
    """Nothing lost or repeated, and the run did what it was asked (the killed
    worker started again, the process killed, the store outage over, the
    primary failed over): the table's verdict, ``--json``'s ``ok`` and the
    exit status alike."""
    pool, figures, cluster = run.pool, run.figures, run.cluster
    restarted = pool is None or pool.workers_started_again >= pool.workers_killed
    done = (figures is None or figures.ok) and (cluster is None or cluster.ok)
    return report.ok and restarted and done


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
        report = await _run_chaos(gateway.url, _chaos_config(args), console, gateway)
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
        return await _run_chaos(targets, config, console, None)

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
        return await _run_chaos(targets, config, console, None)

    report, cluster = await run_cluster_demo(args, server, _chaos_config(args), crowd)
    return _finish(args, report, None, cluster=cluster)


async def _demo_serve_workers(args: argparse.Namespace, console: Console, server: str) -> int:
    """``demo --workers N --redis URL``: see supervisor/cli/_demo_serve_workers.py."""
    if args.redis is None or args.processes > 1:
        raise ValueError("demo --workers N needs --redis (URL or 'local') and no --processes")

    async def crowd(targets: Targets, config: ChaosConfig) -> ChaosReport:
        return await _run_chaos(targets, config, console, None)

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
        return await _run_chaos(url, config, console, gateway)

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
            report = await _run_chaos(url, _chaos_config(args), console, None)
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
    report = await _run_chaos(args.url, config, Console(stderr=True), None)
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
