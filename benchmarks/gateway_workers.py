"""Scenario 8c: the gateway benchmark's load against ``serve --workers 2`` beside
``serve --workers 1``, both on one Redis store, to find what the second worker buys.

Each point is a fresh pool of ``serve`` worker processes on one listening
socket: this process is their parent, with the same `WorkerPool` that
``serve --workers N`` runs (as ``demo --workers`` is), so the workers are
whole ``serve`` processes (trio server, ``--engine
benchmarks.gateway_server:StampedEngine``, the benchmark's caps) that take
connections from the one socket they inherit, and the kernel hands each of
the load generator's connections to whichever worker accepts it first. Both
worker counts keep their sessions in the same redis-server of this scenario's
own (no persistence, flushed before every point), so the worker count is the
only difference.

Per worker count: the loads of ``Size.gateway_workers_loads``, then the
gateway benchmark's search (`saturate`: the largest load held), one step for
one worker, one for two, and so on (interleaved: a drift of the machine hits
both alike). Reported: the events/s at saturation of both and their ratio
(the issue's target: >= 1.6x), events/s per load, CPU per delivered event of
every worker process (and with Redis's), and how evenly the kernel spread
the connections: each worker's established connections on the port (from
``/proc/net/tcp`` and the workers' descriptors), at the sample during the
load where all workers held the most. JSON: ``scenarios.gateway_workers.trio``.
Without ``redis-server`` on PATH the scenario says so in its row and
measures nothing.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from benchmarks.common import Result, Size
from benchmarks.gateway import RATE_HZ, Point, measure_sized, saturate
from benchmarks.gateway_processes import Served, cpu_seconds
from supervisor.cli._serve_workers import WorkerPool
from supervisor.gateway._servers import listening_socket

__all__ = ["WORKERS", "connections_per_process", "gateway_workers", "serve_workers"]

#: The worker count measured beside one worker (the issue's ``serve --workers 2``).
WORKERS = 2
#: The benchmark's caps (`benchmarks.gateway_server.config_for_benchmark`) as serve flags.
_MANY = "1000000"
_SERVE_FLAGS = (
    *("--server", "trio", "--engine", "benchmarks.gateway_server:StampedEngine"),
    *("--max-sessions", _MANY, "--max-sessions-per-address", _MANY),
    *("--max-connections", _MANY, "--max-connections-per-address", _MANY),
    *("--max-inputs-per-second", "1e9", "--disconnect-grace", "none"),
    *("--log-level", "warning"),
)
#: How often the connections of each worker are counted during a load.
_SAMPLE_S = 0.5
_ESTABLISHED = "01"


def serve_command(redis_url: str) -> list[str]:
    """One worker's ``serve`` command line (the pool adds its socket and pipes)."""
    return [sys.executable, "-m", "supervisor", "serve", "--redis", redis_url, *_SERVE_FLAGS]


def connections_per_process(port: int, pids: Sequence[int]) -> list[int]:
    """How many established TCP connections to local ``port`` each of ``pids`` holds."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _ESTABLISHED and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    counts: list[int] = []
    for pid in pids:
        held = 0
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone
            descriptors = []
        for descriptor in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            except OSError:  # closed since the listing
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held += 1
        counts.append(held)
    return counts


async def _fullest_split(port: int, pool: WorkerPool, split: list[int]) -> None:
    """Keep in ``split`` each worker's connections at the sample where all held
    the most, until cancelled (the split is settled once every client connected)."""
    while True:
        counts = connections_per_process(port, [worker.pid for worker in pool.workers])
        if sum(counts) > sum(split):
            split[:] = counts
        await trio.sleep(_SAMPLE_S)


@asynccontextmanager
async def serve_workers(count: int, redis_url: str, split: list[int]) -> AsyncIterator[Served]:
    """``count`` ``serve`` workers on one fresh loopback socket, drained (SIGTERM)
    at the block's end; ``split`` gets each worker's connections (`_fullest_split`)."""
    with listening_socket("127.0.0.1", 0) as listener:
        listener.listen(4096)  # as serve --workers
        pool = WorkerPool(
            command=serve_command(redis_url), count=count, listener=listener, drain_timeout_s=15
        )
        port = listener.getsockname()[1]

        def cpu() -> float:
            return sum(cpu_seconds(worker.pid) for worker in pool.workers)

        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            nursery.start_soon(_fullest_split, port, pool, split)
            try:
                yield Served(f"ws://127.0.0.1:{port}/v1", cpu)
            finally:
                if pool.restarts:
                    split.clear()  # a worker died: its count is not the kernel's split
                nursery.cancel_scope.cancel()


def _us_per_event(cpu: float, point: Point) -> float | None:
    return cpu / point.events_per_s * 1e6 if point.events_per_s else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def _events(point: Point | None) -> float | None:
    return point.events_per_s if point is not None else None


def _label(workers: int) -> str:
    return f"ours, {workers} worker{'s' if workers > 1 else ''}"


async def gateway_workers(size: Size) -> list[Result]:
    """One row for the saturation ratio, one per load, CPU and spread; one JSON entry."""
    if shutil.which("redis-server") is None:
        return [Result("gateway_workers/trio", "skipped: no redis-server on PATH", math.nan)]
    import redis  # noqa: PLC0415 - only this scenario needs redis-py

    from supervisor.cli._demo_processes import local_redis  # noqa: PLC0415

    counts = (1, WORKERS)
    known: dict[int, dict[int, Point]] = {n: {} for n in counts}
    records: list[dict[str, object]] = []
    with local_redis() as url:
        client = redis.Redis.from_url(url)

        def redis_cpu() -> float:
            info = client.info("cpu")
            return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

        async def measure(workers: int, clients: int) -> Point:
            client.flushdb()  # every point starts from an empty store
            split: list[int] = []
            point = await measure_sized(
                "trio",
                _label(workers),
                clients,
                size,
                extra_cpu=redis_cpu,
                server=functools.partial(serve_workers, workers, url, split),
            )
            records.append({**point.as_json(), "workers": workers, "connections": split})
            return point

        try:
            for clients in size.gateway_workers_loads:
                for workers in counts:  # interleaved: a drift hits both alike
                    known[workers][clients] = await measure(workers, clients)
            for _ in range(size.gateway_workers_steps):
                for workers in counts:  # one search step each, in turn
                    await saturate(
                        known[workers],
                        functools.partial(measure, workers),
                        steps=1,
                        max_clients=size.gateway_max_clients,
                    )
        finally:
            client.close()
    best = {n: _largest_held(known[n]) for n in counts}
    return _results(size, known, best, records)


def _largest_held(known: dict[int, Point]) -> Point | None:
    """What `saturate` returns: the point of the most clients held."""
    return max((p for p in known.values() if p.held), key=lambda p: p.clients, default=None)


def _results(
    size: Size,
    known: dict[int, dict[int, Point]],
    best: dict[int, Point | None],
    records: list[dict[str, object]],
) -> list[Result]:
    one, many = known[1], known[WORKERS]
    loads: dict[str, dict[str, object]] = {}
    for clients in size.gateway_workers_loads:
        alone, pooled = one[clients], many[clients]
        loads[str(clients)] = {
            "offered_events_per_s": clients * RATE_HZ,
            "events_per_s": pooled.events_per_s,
            "p99_ms": _finite(pooled.p99_ms),
            "held": pooled.held,
            "one_worker_events_per_s": alone.events_per_s,
            "one_worker_p99_ms": _finite(alone.p99_ms),
            "one_worker_held": alone.held,
            "events_ratio": _ratio(pooled.events_per_s, alone.events_per_s),
            "cpu_us_per_event": _us_per_event(pooled.server_cpu, pooled),
            "one_worker_cpu_us_per_event": _us_per_event(alone.server_cpu, alone),
            "with_redis_cpu_us_per_event": _us_per_event(
                pooled.server_cpu + pooled.extra_cpu, pooled
            ),
            "one_worker_with_redis_cpu_us_per_event": _us_per_event(
                alone.server_cpu + alone.extra_cpu, alone
            ),
        }
    splits = [
        split
        for record in records
        if record["workers"] == WORKERS and isinstance(split := record["connections"], list)
    ]
    shares = [max(split) / sum(split) for split in splits if split and sum(split)]
    largest_share = statistics.median(shares) if shares else None
    top, top_alone = best[WORKERS], best[1]
    saturation, reference = _events(top), _events(top_alone)
    ratio = _ratio(saturation, reference)
    entry: dict[str, object] = {
        "workers": WORKERS,
        "events_per_s": saturation,
        "clients_held": top.clients if top else 0,
        "p99_ms": _finite(top.p99_ms) if top else None,
        "one_worker_events_per_s": reference,
        "one_worker_clients_held": top_alone.clients if top_alone else 0,
        "one_worker_p99_ms": _finite(top_alone.p99_ms) if top_alone else None,
        "ratio": ratio,
        "connections_per_worker": splits,
        "largest_share": largest_share,
        "loads": loads,
        "points": records,
    }
    results = [
        Result(
            "gateway_workers/trio",
            "events/s at saturation",
            saturation if saturation is not None else math.nan,
            reference,
            "serve --workers 1, same run",
            ratio,
            f">= 1.6 ({WORKERS} workers / 1)",
            figures=entry,
        )
    ]
    for offered, load in loads.items():
        results.append(
            Result(
                f"gateway_workers/trio {offered} clients",
                f"events/s, {WORKERS} workers",
                float(str(load["events_per_s"])),
                float(str(load["one_worker_events_per_s"])),
                "1 worker, same run",
                _optional(load, "events_ratio"),
                f"report (offered {float(str(load['offered_events_per_s'])):,.0f} ev/s)",
                in_json=False,
            )
        )
    first = loads[str(size.gateway_workers_loads[0])]
    pooled_cpu = _optional(first, "cpu_us_per_event")
    alone_cpu = _optional(first, "one_worker_cpu_us_per_event")
    results.append(
        Result(
            "gateway_workers/trio CPU",
            "CPU us/event, workers",
            pooled_cpu if pooled_cpu is not None else math.nan,
            alone_cpu,
            "1 worker, same run",
            _ratio(alone_cpu, pooled_cpu),
            f"report ({first['offered_events_per_s']:,.0f} ev/s offered)",
            in_json=False,
        )
    )
    results.append(
        Result(
            "gateway_workers/trio spread",
            "largest worker's share",
            largest_share if largest_share is not None else math.nan,
            1 / WORKERS,
            "an even split",
            None,
            "report (connections, median of points)",
            in_json=False,
        )
    )
    return results


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _optional(mapping: dict[str, object], key: str) -> float | None:
    value = mapping.get(key)
    return float(value) if isinstance(value, int | float) else None
