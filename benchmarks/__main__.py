"""``python -m benchmarks [--quick] [--json FILE] [--plot DIR] [--only NAME ...]``.

Runs every scenario, each beside its reference measured in the same run, and
prints one table. Every scenario runs in this process except ``gateway``,
which starts a server process and load generator processes per load
(`benchmarks.gateway`); ``gateway_bus``, which does the same with engine
worker processes and a redis-server besides (`benchmarks.gateway_bus`); and
``gateway_workers``, the same load against ``serve --workers 2`` beside
``serve --workers 1`` on one redis-server, their saturation's ratio and how
evenly the kernel spread the connections (`benchmarks.gateway_workers`).
Ratios: reference / ours for latencies, ours / reference for throughputs, so
higher is better. No number is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable

import trio

from benchmarks.common import FULL, QUICK, Result, Size
from benchmarks.gateway import gateway
from benchmarks.gateway_bus import gateway_bus
from benchmarks.gateway_workers import gateway_workers
from benchmarks.hot_path import send_latency, throughput
from benchmarks.isolation import engine_threads, slow_client, thread_send_latency
from benchmarks.lifecycle import (
    many_sessions,
    many_sessions_parked,
    restart,
    resume_replay,
)
from supervisor._extras import MissingExtraError, require
from supervisor.gateway._servers import NEEDS

SCENARIOS: dict[str, Callable[[Size], Awaitable[list[Result]]]] = {
    "send_latency": send_latency,
    "throughput": throughput,
    "slow_client": slow_client,
    "engine_threads": engine_threads,
    "thread_send_latency": thread_send_latency,
    "resume_replay": resume_replay,
    "many_sessions": many_sessions,
    "many_sessions_parked": many_sessions_parked,
    "restart": restart,
    "gateway": gateway,
    "gateway_bus": gateway_bus,
    "gateway_workers": gateway_workers,
}


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _row(result: Result) -> str:
    if result.ours != result.ours:  # NaN: nothing arrived
        return f"{result.name:<34} {'-':>12} {result.unit:<22} {'-':>12}"
    reference = f"{result.reference:,.1f}" if result.reference is not None else "-"
    ratio = f"{result.ratio:.2f}" if result.ratio is not None else "-"
    return (
        f"{result.name:<34} {result.ours:>12,.1f} {result.unit:<22} {reference:>12} "
        f"{(result.reference_name or '-'):<34} {ratio:>6}  {result.target}"
    )


def _scenarios(results: list[Result]) -> dict[str, dict[str, object]]:
    """JSON entries by scenario name; ``group/part`` names nest (``gateway/trio``
    is ``scenarios["gateway"]["trio"]``)."""
    scenarios: dict[str, dict[str, object]] = {}
    for r in results:
        if not r.in_json:
            continue
        entry = {
            "unit": r.unit,
            "ours": r.ours,
            "reference": r.reference,
            "reference_name": r.reference_name,
            "ratio": r.ratio,
            "target": r.target,
            **r.figures,
        }
        group, _, part = r.name.partition("/")
        if part:
            scenarios.setdefault(group, {})[part] = entry
        else:
            scenarios[r.name] = entry
    return scenarios


async def _run(names: list[str], size: Size, progress: Callable[[str], None]) -> list[Result]:
    results: list[Result] = []
    for name in names:
        progress(name)
        results.extend(await SCENARIOS[name](size))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs (under 2 minutes)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    parser.add_argument(
        "--plot",
        metavar="DIR",
        help="also write the gateway's charts (PNG) to DIR (needs matplotlib: '.[bench]')",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(SCENARIOS),
        metavar="NAME",
        help=f"run only these scenarios: {', '.join(SCENARIOS)}",
    )
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    try:  # said before minutes of running, not after
        if args.plot:
            require("matplotlib", "--plot")
        if "gateway" in names:
            for module in NEEDS.values():  # the scenario measures every shell
                require(module, "the gateway scenario")
    except MissingExtraError as exc:
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 2
    size = QUICK if args.quick else FULL
    started = time.perf_counter()

    def progress(name: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] running {name} ...", file=sys.stderr)

    results = trio.run(_run, names, size, progress)
    print(
        f"{'scenario':<34} {'ours':>12} {'unit':<22} {'reference':>12} {'reference is':<34} "
        f"{'ratio':>6}  target"
    )
    for result in results:
        print(_row(result))
    print(
        f"(ratio: reference/ours for latencies, ours/reference for throughputs; higher is "
        f"better; {time.perf_counter() - started:.0f} s)"
    )
    document = {
        "note": "ratio is reference/ours for latencies and ours/reference for "
        "throughputs, so higher is better; all measured in one run",
        "quick": args.quick,
        "machine": _machine(),
        "scenarios": _scenarios(results),
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(document, out, indent=2)
    if args.plot:
        gateway = document["scenarios"].get("gateway")
        if gateway is None:
            print("--plot: the gateway scenario did not run; no charts", file=sys.stderr)
        else:
            from benchmarks.plot import plot_gateway  # noqa: PLC0415 - matplotlib is optional

            for path in plot_gateway(gateway, args.plot):
                print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
