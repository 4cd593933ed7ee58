"""``demo --engine-workers N --bus URL``: the engine in N worker processes, one killed.

The gateway runs in this process with a `BusEngine`; the demo engine runs in
N ``duplex-supervisor worker`` child processes on the bus. Halfway through
the chaos run the first worker is killed with SIGKILL: its held work (the
sessions' streams, answers on their way) waits for the visibility timeout
and is taken over by the others. ``--bus local`` starts a redis-server of the
demo's own (see `local_redis`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from supervisor.cli._chaos import ChaosConfig, ChaosReport
from supervisor.cli._demo_processes import LOCAL_REDIS, local_redis
from supervisor.cli._flags import SECRET_ENV
from supervisor.engine_bus import RedisEngineBus
from supervisor.gateway._bus_engine import BusEngine
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway

__all__ = ["WorkerFigures", "run_workers_demo", "worker_command"]

#: The demo's visibility timeout: short, so a killed worker's work moves
#: on well within the chaos clients' wait for their last answers.
DEMO_VISIBILITY_S = 1.5


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFigures:
    """What the table and ``--json`` add for the engine workers."""

    engine_workers: int
    engine_workers_killed: int
    inputs_redelivered: int
    fenced_engine_messages: int


def worker_command(url: str, pool: str, *flags: str) -> list[str]:
    """``duplex-supervisor worker`` on ``pool`` of the bus at ``url``, as a child's argv."""
    return [
        sys.executable,
        "-m",
        "supervisor",
        "worker",
        "--bus",
        url,
        "--engine-pool",
        pool,
        *flags,
    ]


def _worker_command(args: argparse.Namespace, url: str, pool: str) -> list[str]:
    return worker_command(
        url,
        pool,
        "--visibility-timeout",
        str(DEMO_VISIBILITY_S),
        "--event-rate",
        str(args.event_rate),
        "--delta-chars",
        str(args.delta_chars),
        "--log-level",
        "warning",
    )


@contextmanager
def _workers(
    args: argparse.Namespace, url: str, pool: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    processes = [
        subprocess.Popen(_worker_command(args, url, pool), env=env)  # noqa: S603 - our own argv
        for _ in range(args.engine_workers)
    ]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


async def _declared(bus: RedisEngineBus, processes: list[subprocess.Popen[bytes]]) -> None:
    """Wait until the workers said which client events their engine takes."""
    deadline = time.monotonic() + 30
    while not await trio.to_thread.run_sync(bus.declared_event_types):
        if any(p.poll() is not None for p in processes):
            raise ValueError("an engine worker exited at start")
        if time.monotonic() > deadline:
            raise ValueError("the engine workers did not start within 30 s")
        await trio.sleep(0.05)


async def run_workers_demo(
    args: argparse.Namespace,
    config: ChaosConfig,
    crowd: Callable[[str, ChaosConfig, Gateway], Awaitable[ChaosReport]],
) -> tuple[ChaosReport, Gateway, WorkerFigures]:
    """The demo across worker processes; its report and the workers' figures."""
    if args.bus == LOCAL_REDIS:
        with local_redis() as url:
            return await _run(args, url, config, crowd)
    return await _run(args, args.bus, config, crowd)


async def _run(
    args: argparse.Namespace,
    url: str,
    config: ChaosConfig,
    crowd: Callable[[str, ChaosConfig, Gateway], Awaitable[ChaosReport]],
) -> tuple[ChaosReport, Gateway, WorkerFigures]:
    pool = f"demo-{os.getpid()}-{time.monotonic_ns()}"  # a shared Redis: a pool of our own
    bus = RedisEngineBus(url, pool=pool, visibility_s=DEMO_VISIBILITY_S)
    killed = 0
    try:
        with _workers(args, url, pool) as processes:
            await _declared(bus, processes)
            engine = BusEngine(bus)
            capacity = max(256, 2 * config.clients)
            gateway_config = GatewayConfig(
                port=0, max_connections_per_address=capacity, max_sessions_per_address=capacity
            )
            async with trio.open_nursery() as nursery:
                gateway: Gateway = await nursery.start(
                    lambda task_status: serve_gateway(
                        gateway_config, engine=engine, task_status=task_status
                    )
                )

                async def kill_one_halfway() -> None:
                    nonlocal killed
                    await trio.sleep(config.duration_s / 2)
                    processes[0].send_signal(signal.SIGKILL)
                    killed = 1

                nursery.start_soon(kill_one_halfway)
                report = await crowd(gateway.url, config, gateway)
                counts = await trio.to_thread.run_sync(bus.counts)
                nursery.cancel_scope.cancel()
    finally:
        bus.close()
    figures = WorkerFigures(
        engine_workers=args.engine_workers,
        engine_workers_killed=killed,
        inputs_redelivered=counts["redelivered"],
        fenced_engine_messages=counts["fenced"] + engine.fence.fenced,
    )
    return report, gateway, figures
