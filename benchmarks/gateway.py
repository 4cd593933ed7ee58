"""Scenario 8: the gateway, events to real clients, ours beside the floor and the
lock baseline behind the same server, per server shell.

Every point is a fresh server process (`benchmarks.gateway_server`: a
shell, a mode, 20 events/s per session) and load generator process(es)
(`benchmarks.gateway_load`) on loopback; this process only starts
them and reads their figures. A load is *held* when every client opened its
session and stayed, at least 95 % of the offered events/s arrived, and the
p99 latency (engine send to client receive) is under 50 ms. Per shell and
mode: the sizes (200 and 1,000 clients at 20 events/s each), then a search
for the most clients held (doubling from the largest held size, then
bisecting); its events/s is the *saturation* figure.

The Redis store (trio shell, ``ours`` only, when ``redis-server`` is on PATH;
it starts one with AOF ``everysec``): at the smallest size only (at 1,000
clients the Redis variant is far past its saturation, about 1,200 of 20,000
events/s delivered on 2 shared cores, and its 1,000 sessions take most of a
minute to open), ``ours`` with sessions in memory and ``ours`` with sessions in Redis, interleaved
(``Size.gateway_redis_pairs`` pairs), compared by CPU per delivered event:
the gateway process's, and the gateway's plus the Redis server's (from its
``INFO cpu``). JSON: ``scenarios.gateway.trio.redis_*``.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from benchmarks.common import Result, Size, pct
from benchmarks.gateway_processes import Lines, ServerFactory, benchmark_server, start, stop
from benchmarks.gateway_server import MODES, RATE_HZ, SHELLS

__all__ = ["RATE_HZ", "Point", "gateway", "measure_point", "measure_sized", "saturate"]

P99_LIMIT_MS = 50.0
HELD_SHARE = 0.95


@dataclass(slots=True)
class Point:
    """One load against one server: what the generator saw."""

    shell: str
    mode: str
    clients: int
    offered_events_per_s: float
    events_per_s: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    opened: int = 0
    dropped: int = 0
    #: Events received in the window without the engine's stamp (not `StampedEngine`'s).
    unstamped: int = 0
    #: Share of one CPU the server process used in the window (threads included).
    server_cpu: float = 0.0
    #: The busiest load generator's share of one CPU (near 1: it was the limit).
    loader_cpu: float = 0.0
    #: Share of one CPU ``extra_cpu`` (e.g. the Redis server) used in the window.
    extra_cpu: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return (
            self.opened == self.clients
            and self.dropped == 0
            and self.events_per_s >= HELD_SHARE * self.offered_events_per_s
            and self.p99_ms < P99_LIMIT_MS
        )

    @property
    def server_cpu_us_per_event(self) -> float:
        """The server's CPU per event delivered: steadier than events/s on a busy machine."""
        return self.server_cpu / self.events_per_s * 1e6 if self.events_per_s else math.nan

    def as_json(self) -> dict[str, object]:
        figures = asdict(self)
        figures["held"] = self.held
        figures["server_cpu_us_per_event"] = self.server_cpu_us_per_event
        for key in ("p50_ms", "p99_ms", "server_cpu_us_per_event"):
            if math.isnan(figures[key]):
                figures[key] = None
        return figures


async def measure_point(
    shell: str,
    mode: str,
    clients: int,
    *,
    warmup_s: float,
    seconds: float,
    loaders: int = 1,
    server_args: Sequence[str] = (),
    extra_cpu: Callable[[], float] | None = None,
    server: ServerFactory | None = None,
) -> Point:
    """``clients`` at `RATE_HZ` against a fresh ``shell``/``mode`` server.

    ``extra_cpu``: CPU seconds of another process serving the load (read at
    the window's start and end). ``server``: what serves the point instead of
    `benchmark_server` (``shell`` and ``mode`` then only label it)."""
    point = Point(shell, mode, clients, clients * RATE_HZ)
    python = sys.executable
    if server is None:
        server = functools.partial(benchmark_server, shell, mode, server_args)
    generators: list[tuple[trio.Process, Lines]] = []
    async with server() as served:
        try:
            shares = [clients // loaders + (i < clients % loaders) for i in range(loaders)]
            for share in shares:
                command = [python, "-m", "benchmarks.gateway_load", "--url", served.url]
                command += ["--clients", str(share), "--warmup", str(warmup_s)]
                command += ["--seconds", str(seconds)]
                generators.append(await start(command, stdin=True))
            with trio.fail_after(120):
                for _, lines in generators:
                    while await lines.next() != "ready":
                        pass
            for process, _ in generators:
                assert process.stdin is not None
                await process.stdin.send_all(b"go\n")
            await trio.sleep(warmup_s)
            cpu_started, started = served.cpu_seconds(), trio.current_time()
            extra_started = extra_cpu() if extra_cpu is not None else 0.0
            reports: list[dict[str, Any]] = []
            with trio.fail_after(warmup_s + seconds + 60):
                for _, lines in generators:
                    reports.append(json.loads(await lines.next()))
            elapsed = trio.current_time() - started
            point.server_cpu = (served.cpu_seconds() - cpu_started) / elapsed
            if extra_cpu is not None:
                point.extra_cpu = (extra_cpu() - extra_started) / elapsed
        finally:
            for process, _ in generators:
                await stop(process)
    latencies = [s for report in reports for s in report["latencies_s"]]
    window = max(report["window_s"] for report in reports)
    point.events_per_s = sum(report["received"] for report in reports) / window
    point.unstamped = sum(report["received"] - report["stamped"] for report in reports)
    if latencies:
        point.p50_ms = pct(latencies, 0.5) * 1e3
        point.p99_ms = pct(latencies, 0.99) * 1e3
    point.opened = sum(report["opened"] for report in reports)
    point.dropped = sum(report["dropped"] for report in reports)
    point.loader_cpu = max(report["loader_cpu"] for report in reports)
    for report in reports:
        for what, n in report["errors"].items():
            point.errors[what] = point.errors.get(what, 0) + n
    print(
        f"  gateway {shell} {mode} {clients} clients: {point.events_per_s:,.0f} ev/s, "
        f"p99 {point.p99_ms:.1f} ms, {'held' if point.held else 'not held'}",
        file=sys.stderr,
    )
    return point


async def measure_sized(
    shell: str,
    mode: str,
    clients: int,
    size: Size,
    *,
    server_args: Sequence[str] = (),
    extra_cpu: Callable[[], float] | None = None,
    server: ServerFactory | None = None,
) -> Point:
    """`measure_point` with ``size``'s warm-up, window and load generators."""
    return await measure_point(
        shell,
        mode,
        clients,
        warmup_s=size.gateway_warmup_s,
        seconds=size.gateway_s,
        loaders=size.gateway_loaders,
        server_args=server_args,
        extra_cpu=extra_cpu,
        server=server,
    )


def _round(clients: float) -> int:
    step = 50 if clients >= 200 else 10
    return max(step, round(clients / step) * step)


async def saturate(
    known: dict[int, Point],
    measure: Callable[[int], Awaitable[Point]],
    *,
    steps: int,
    max_clients: int,
) -> Point | None:
    """The largest load held: doubling from the largest held while none failed
    (up to ``max_clients``), else bisecting between the largest held and the
    smallest failed above it (or halving if none held), at most ``steps`` more
    loads. ``known`` (clients -> point) gains every point measured."""

    def bounds() -> tuple[int, int | None]:
        held = max((c for c, p in known.items() if p.held), default=0)
        above = [c for c, p in known.items() if not p.held and c > held]
        return held, min(above, default=None)

    for _ in range(steps):
        held, failed = bounds()
        if failed is None:
            if held == 0 or held * 2 > max_clients:
                break
            candidate = held * 2
        else:
            candidate = _round((held + failed) / 2) if held else _round(failed / 2)
            if candidate in known or candidate >= failed or candidate <= held:
                break
        known[candidate] = await measure(candidate)
    held, _ = bounds()
    return known.get(held)


def _figure(point: Point | None, key: str) -> float | None:
    if point is None:
        return None
    value = float(getattr(point, key))
    return None if math.isnan(value) else value


def _ratio(ours: float | None, reference: float | None) -> float | None:
    return ours / reference if ours is not None and reference else None


async def _shell(shell: str, size: Size) -> tuple[dict[str, object], Result]:
    known: dict[str, dict[int, Point]] = {mode: {} for mode in MODES}
    points: list[Point] = []

    async def measure(mode: str, clients: int) -> Point:
        point = await measure_sized(shell, mode, clients, size)
        points.append(point)
        return point

    for clients in size.gateway_loads:
        for mode in MODES:  # interleaved: a drift of the machine hits all three alike
            known[mode][clients] = await measure(mode, clients)
    best: dict[str, Point | None] = {}
    for mode in MODES:
        best[mode] = await saturate(
            known[mode],
            functools.partial(measure, mode),
            steps=size.gateway_search_steps,
            max_clients=size.gateway_max_clients,
        )
    ours, floor, base = (_figure(best[m], "events_per_s") for m in MODES)
    loads: dict[str, dict[str, object]] = {}
    for clients in size.gateway_loads:
        row: dict[str, object] = {"offered_events_per_s": clients * RATE_HZ}
        for mode in MODES:
            point = known[mode][clients]
            prefix = "" if mode == "ours" else f"{mode}_"
            row[f"{prefix}events_per_s"] = point.events_per_s
            row[f"{prefix}p50_ms"] = _figure(point, "p50_ms")
            row[f"{prefix}p99_ms"] = _figure(point, "p99_ms")
            row[f"{prefix}held"] = point.held
        loads[str(clients)] = row
    entry: dict[str, object] = {
        "events_per_s": ours,
        "p50_ms": _figure(best["ours"], "p50_ms"),
        "p99_ms": _figure(best["ours"], "p99_ms"),
        "clients_held": best["ours"].clients if best["ours"] else 0,
        "floor_events_per_s": floor,
        "baseline_events_per_s": base,
        "ratio": _ratio(ours, floor),
        "baseline_ratio": _ratio(ours, base),
        "floor_clients_held": best["floor"].clients if best["floor"] else 0,
        "baseline_clients_held": best["baseline"].clients if best["baseline"] else 0,
        "loads": loads,
        "points": [p.as_json() for p in sorted(points, key=lambda p: (p.mode, p.clients))],
    }
    row_result = Result(
        f"gateway/{shell}",
        "events/s at saturation",
        ours or 0.0,
        floor,
        "floor, same server",
        _ratio(ours, floor),
        ">= 0.8 (fastest shell)",
    )
    return entry, row_result


def _us_per_event(cpu: float, point: Point) -> float:
    return cpu / point.events_per_s * 1e6 if point.events_per_s else math.nan


async def redis_store(size: Size) -> dict[str, object]:
    """``ours`` on trio, sessions in memory vs in Redis: CPU per event, interleaved."""
    if shutil.which("redis-server") is None:
        return {"redis_skipped": "redis-server not on PATH"}
    import redis  # noqa: PLC0415 - only this figure needs redis-py

    from supervisor.cli._demo_processes import local_redis  # noqa: PLC0415

    loads: dict[str, dict[str, object]] = {}
    with local_redis(appendfsync="everysec") as url:
        client = redis.Redis.from_url(url)

        def redis_cpu() -> float:
            info = client.info("cpu")
            return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

        for clients in size.gateway_loads[:1]:
            memory: list[Point] = []
            stored: list[Point] = []
            for _ in range(size.gateway_redis_pairs):  # interleaved: a drift hits both alike
                for points, args in ((memory, ()), (stored, ("--redis", url))):
                    extra = redis_cpu if args else None
                    points.append(
                        await measure_sized(
                            "trio", "ours", clients, size, server_args=args, extra_cpu=extra
                        )
                    )
            memory_us = [_us_per_event(p.server_cpu, p) for p in memory]
            gateway_us = [_us_per_event(p.server_cpu, p) for p in stored]
            total_us = [_us_per_event(p.server_cpu + p.extra_cpu, p) for p in stored]
            ratios = [t / m for t, m in zip(total_us, memory_us, strict=True)]
            loads[str(clients)] = {
                "memory_cpu_us_per_event": statistics.median(memory_us),
                "redis_gateway_cpu_us_per_event": statistics.median(gateway_us),
                "redis_total_cpu_us_per_event": statistics.median(total_us),
                "redis_ratio": statistics.median(ratios),
                "redis_ratio_spread": [min(ratios), max(ratios)],
                "redis_p99_ms": statistics.median(p.p99_ms for p in stored),
                "memory_p99_ms": statistics.median(p.p99_ms for p in memory),
                "redis_held": all(p.held for p in stored),
            }
        client.close()
    worst = max(float(str(load["redis_ratio"])) for load in loads.values())
    return {"redis_loads": loads, "redis_ratio": worst, "redis_pairs": size.gateway_redis_pairs}


async def gateway(size: Size) -> list[Result]:
    """Every shell; one table row per shell and load, one JSON entry per shell."""
    results: list[Result] = []
    for shell in SHELLS:
        entry, row = await _shell(shell, size)
        if shell == "trio":
            entry.update(await redis_store(size))
            ratio = entry.get("redis_ratio")
            results.append(
                Result(
                    "gateway/trio Redis store",
                    "CPU per event vs memory",
                    float(ratio) if isinstance(ratio, float) else math.nan,
                    1.0,
                    "sessions in memory, same shell",
                    None,
                    "<= 3x (gateway + Redis CPU)",
                    in_json=False,
                )
            )
        row.figures = entry
        results.append(row)
        results.append(
            Result(
                f"gateway/{shell} vs baseline",
                "events/s at saturation",
                row.ours,
                _figure_of(entry, "baseline_events_per_s"),
                "lock baseline, same server",
                _figure_of(entry, "baseline_ratio"),
                ">= 1.0",
                in_json=False,
            )
        )
        loads = entry["loads"]
        assert isinstance(loads, dict)
        for clients, load in loads.items():
            results.append(
                Result(
                    f"gateway/{shell} {clients} clients",
                    "ms p99",
                    _figure_of(load, "p99_ms") or math.nan,
                    _figure_of(load, "floor_p99_ms"),
                    "floor p99, same server",
                    None,
                    f"<= 50 ms at {float(load['offered_events_per_s']):,.0f} ev/s",
                    in_json=False,
                )
            )
    return results


def _figure_of(mapping: dict[str, object], key: str) -> float | None:
    value = mapping.get(key)
    return float(value) if isinstance(value, int | float) else None
