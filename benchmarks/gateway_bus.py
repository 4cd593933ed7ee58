"""Scenario 8b: the gateway benchmark's load with the engine in worker processes,
fed over the Redis Streams engine bus, beside the same engine in the gateway.

Same server process (`benchmarks.gateway_server`, trio shell, ``ours``),
same load generator, same 20 stamped events/s per session, interleaved in
one run (``Size.gateway_redis_pairs`` pairs per load, in-process first):

``in-process``
    `StampedEngine` in the gateway's process (``serve``).
``bus``
    The gateway with ``--engine-bus`` on a redis-server of this scenario's
    own (no persistence) and `WORKERS` ``duplex-supervisor worker --engine
    benchmarks.gateway_server:StampedEngine`` processes, started first, each
    point on a fresh engine pool. Every event goes worker -> Lua publish ->
    the gateway's output stream -> its pump -> the session -> the socket; the
    stamp is taken in the worker, so the p99 includes that whole way.

Reported per load: events/s and p99 of both and their ratios (bus /
in-process for events/s, in-process / bus for p99: higher is better), and
CPU per delivered event, the bus's counting the workers and Redis. JSON:
``scenarios.gateway_bus.trio``. Without ``redis-server`` on PATH the
scenario says so in its row and measures nothing.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from benchmarks.common import Result, Size
from benchmarks.gateway import RATE_HZ, Point, measure_sized
from benchmarks.gateway_processes import cpu_seconds
from supervisor.cli._demo_workers import worker_command

if TYPE_CHECKING:
    from supervisor.engine_bus import RedisEngineBus  # needs redis-py, as the scenario does

__all__ = ["WORKERS", "gateway_bus"]

#: Engine worker processes behind the bus (the issue's "N workers").
WORKERS = 2


def _worker_command(url: str, pool: str) -> list[str]:
    engine = "benchmarks.gateway_server:StampedEngine"
    return worker_command(url, pool, "--engine", engine, "--log-level", "info")


#: What ``duplex-supervisor worker`` logs once it serves (`supervisor.cli._commands`).
_READY = "serving pool"


@asynccontextmanager
async def _workers(url: str, pool: str) -> AsyncIterator[list[trio.Process]]:
    """`WORKERS` worker processes on ``pool``, each past its start (its log says so)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="duplex-bench-workers-") as directory:
        logs = [Path(directory, f"worker-{n}.log") for n in range(WORKERS)]
        processes: list[trio.Process] = []
        try:
            for log in logs:
                with log.open("wb") as stderr:
                    processes.append(
                        await trio.lowlevel.open_process(
                            _worker_command(url, pool),
                            stdin=subprocess.DEVNULL,
                            stderr=stderr,
                            env=env,
                        )
                    )
            with trio.fail_after(60):
                # A worker reading an empty stream is not listed by XINFO CONSUMERS
                # (Redis lists a consumer once it was delivered an entry): its log line is.
                while not all(_READY in log.read_text() for log in logs):
                    if any(p.returncode is not None for p in processes):
                        raise RuntimeError("an engine worker exited at start")
                    await trio.sleep(0.05)
            yield processes
        finally:
            with trio.CancelScope(shield=True):
                for process in processes:
                    if process.returncode is None:
                        process.kill()
                    await process.wait()


#: How often `_bus_point` asks Redis what each worker holds during a load.
_SAMPLE_S = 0.25


async def _most_held(bus: RedisEngineBus, most: dict[str, int]) -> None:
    """Keep in ``most`` the most entries each worker held at once, until cancelled.

    Sampled during the load, not read at its end: once the clients go, each
    worker acknowledges its sessions' entries as their close notices arrive,
    so what a worker holds at the end depends on when one looks."""
    while True:
        for consumer, pending in (await trio.to_thread.run_sync(bus.workers)).items():
            most[consumer] = max(most.get(consumer, 0), pending)
        await trio.sleep(_SAMPLE_S)


async def _bus_point(url: str, clients: int, size: Size) -> tuple[Point, list[int]]:
    """One load through the bus; the point and the most entries each worker held at once."""
    import redis  # noqa: PLC0415 - only this scenario needs redis-py

    from supervisor.engine_bus import RedisEngineBus  # noqa: PLC0415

    pool = f"bench-{os.getpid()}-{time.monotonic_ns()}"  # each point its own pool
    bus = RedisEngineBus(url, pool=pool)
    client = redis.Redis.from_url(url)
    try:
        async with _workers(url, pool) as processes:

            def workers_and_redis_cpu() -> float:
                info = client.info("cpu")
                redis_cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
                return redis_cpu + sum(cpu_seconds(p.pid) for p in processes)

            held: dict[str, int] = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_most_held, bus, held)
                point = await measure_sized(
                    "trio",
                    "ours",
                    clients,
                    size,
                    server_args=("--engine-bus", url, "--engine-pool", pool),
                    extra_cpu=workers_and_redis_cpu,
                )
                nursery.cancel_scope.cancel()
    finally:
        client.close()
        bus.close()
    return point, sorted(held.values(), reverse=True)


def _us_per_event(cpu: float, point: Point) -> float:
    return cpu / point.events_per_s * 1e6 if point.events_per_s else math.nan


def _median(values: list[float]) -> float | None:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


async def _load(
    url: str, clients: int, size: Size
) -> tuple[dict[str, object], list[dict[str, object]]]:
    local: list[Point] = []
    remote: list[Point] = []
    splits: list[list[int]] = []
    for _ in range(size.gateway_redis_pairs):  # interleaved: a drift hits both alike
        local.append(await measure_sized("trio", "ours", clients, size))
        point, split = await _bus_point(url, clients, size)
        remote.append(point)
        splits.append(split)
    events = _median([p.events_per_s for p in remote])
    local_events = _median([p.events_per_s for p in local])
    p99 = _median([p.p99_ms for p in remote])
    local_p99 = _median([p.p99_ms for p in local])
    figures: dict[str, object] = {
        "offered_events_per_s": clients * RATE_HZ,
        "events_per_s": events,
        "p50_ms": _median([p.p50_ms for p in remote]),
        "p99_ms": p99,
        "held": all(p.held for p in remote),
        "inprocess_events_per_s": local_events,
        "inprocess_p50_ms": _median([p.p50_ms for p in local]),
        "inprocess_p99_ms": local_p99,
        "inprocess_held": all(p.held for p in local),
        "events_ratio": _ratio(events, local_events),
        "p99_ratio": _ratio(local_p99, p99),
        "events_ratios": [
            _ratio(r.events_per_s, m.events_per_s) for r, m in zip(remote, local, strict=True)
        ],
        "gateway_cpu_us_per_event": _median([p.server_cpu_us_per_event for p in remote]),
        "total_cpu_us_per_event": _median(
            [_us_per_event(p.server_cpu + p.extra_cpu, p) for p in remote]
        ),
        "inprocess_cpu_us_per_event": _median([p.server_cpu_us_per_event for p in local]),
        "entries_held_per_worker": splits,
    }
    points = [{**p.as_json(), "engine": "in-process"} for p in local]
    points += [{**p.as_json(), "engine": "bus"} for p in remote]
    return figures, points


async def gateway_bus(size: Size) -> list[Result]:
    """Rows per load: events/s and p99, bus beside in-process; one JSON entry."""
    if shutil.which("redis-server") is None:
        return [Result("gateway_bus/trio", "skipped: no redis-server on PATH", math.nan)]
    from supervisor.cli._demo_processes import local_redis  # noqa: PLC0415 - needs redis-py

    loads: dict[str, dict[str, object]] = {}
    points: list[dict[str, object]] = []
    with local_redis() as url:
        for offered in size.gateway_loads:
            loads[str(offered)], measured = await _load(url, offered, size)
            points += measured
    results: list[Result] = []
    for clients, load in loads.items():
        results += [
            Result(
                f"gateway_bus/trio {clients} clients",
                "events/s, bus",
                _number(load, "events_per_s"),
                _optional(load, "inprocess_events_per_s"),
                "engine in the gateway, same run",
                _optional(load, "events_ratio"),
                f"report (offered {float(str(load['offered_events_per_s'])):,.0f} ev/s)",
                in_json=False,
            ),
            Result(
                f"gateway_bus/trio {clients} clients p99",
                "ms p99, bus",
                _number(load, "p99_ms"),
                _optional(load, "inprocess_p99_ms"),
                "engine in the gateway, same run",
                _optional(load, "p99_ratio"),
                "report",
                in_json=False,
            ),
        ]
    first = next(iter(loads.values()))
    total = _optional(first, "total_cpu_us_per_event")
    local = _optional(first, "inprocess_cpu_us_per_event")
    results.append(
        Result(
            "gateway_bus/trio",
            "CPU us/event, all procs",
            total if total is not None else math.nan,
            local,
            "engine in the gateway, same run",
            _ratio(local, total),
            f"report ({WORKERS} workers + Redis)",
            figures={
                "workers": WORKERS,
                "pairs": size.gateway_redis_pairs,
                "loads": loads,
                "points": points,
            },
        )
    )
    return results


def _optional(mapping: dict[str, object], key: str) -> float | None:
    value = mapping.get(key)
    return float(value) if isinstance(value, int | float) else None


def _number(mapping: dict[str, object], key: str) -> float:
    value = _optional(mapping, key)
    return math.nan if value is None else value
