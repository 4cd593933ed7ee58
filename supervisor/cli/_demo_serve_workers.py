"""``demo --workers N --redis URL``: one gateway of N worker processes, one killed.

The demo is the parent of ``serve --workers N`` itself (the same `WorkerPool`
that ``serve`` runs): it binds one loopback port and starts N ``serve``
workers on it. The chaos clients all connect to that one URL, so the kernel
picks the worker of each connection and of each resume. Halfway through,
worker 0 is killed with SIGKILL: its clients' connections break, each resumes
through the same URL on whichever worker accepts it (a takeover), and the pool
starts worker 0 again.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from supervisor.cli._chaos import ChaosConfig, ChaosReport, Targets
from supervisor.cli._demo_processes import serve_command
from supervisor.cli._flags import SECRET_ENV
from supervisor.cli._serve_workers import WorkerPool
from supervisor.gateway._servers import listening_socket

__all__ = ["PoolFigures", "run_serve_workers_demo"]

#: How long after the run the demo waits for the killed worker to listen again.
_RESTART_WAIT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolFigures:
    """What the table and ``--json`` add for ``demo --workers``."""

    workers: int
    workers_killed: int
    workers_started_again: int


async def run_serve_workers_demo(
    args: argparse.Namespace,
    server: str,
    redis_url: str,
    config: ChaosConfig,
    run: Callable[[Targets, ChaosConfig], Awaitable[ChaosReport]],
) -> tuple[ChaosReport, PoolFigures]:
    """Serve ``args.workers`` workers on one port and ``redis_url``, run the crowd
    with ``run(targets, config)``, SIGKILL worker 0 halfway through."""
    with listening_socket("127.0.0.1", 0) as listener:
        listener.listen(4096)
        pool = WorkerPool(
            command=serve_command(args, server, redis_url),
            count=args.workers,
            listener=listener,
            env={k: v for k, v in os.environ.items() if k != SECRET_ENV},
        )
        url = f"ws://127.0.0.1:{listener.getsockname()[1]}/v1"
        targets = Targets([url], workers=True)
        killed = 0

        async def kill_one() -> None:
            nonlocal killed
            await trio.sleep(config.duration_s / 2)
            # Said first: a client whose connection breaks knows why.
            targets.worker_killed = True
            os.kill(pool.workers[0].pid, signal.SIGKILL)  # no goodbye, no flush
            killed = 1

        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            async with trio.open_nursery() as crowd:
                crowd.start_soon(kill_one)
                report = await run(targets, config)
                crowd.cancel_scope.cancel()
            if not killed:
                raise ValueError("the run ended before a worker was killed: raise --duration")
            with trio.move_on_after(_RESTART_WAIT_S):
                while pool.workers[0].starts < 2:
                    await trio.sleep(0.05)
            figures = PoolFigures(
                workers=args.workers, workers_killed=killed, workers_started_again=pool.restarts
            )
            nursery.cancel_scope.cancel()  # the pool drains its workers (SIGTERM)
    return report, figures
