"""``python -m benchmarks [--quick] [--json FILE] [--only NAME ...]``.

Runs every scenario in this process, each beside its reference measured in
the same run, and prints one table. Ratios: reference / ours for latencies,
ours / reference for throughputs, so higher is better. No number is asserted.
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
from benchmarks.hot_path import send_latency, throughput
from benchmarks.isolation import engine_threads, slow_client
from benchmarks.lifecycle import (
    gateway,
    many_sessions,
    many_sessions_parked,
    restart,
    resume_replay,
)

SCENARIOS: dict[str, Callable[[Size], Awaitable[list[Result]]]] = {
    "send_latency": send_latency,
    "throughput": throughput,
    "slow_client": slow_client,
    "engine_threads": engine_threads,
    "resume_replay": resume_replay,
    "many_sessions": many_sessions,
    "many_sessions_parked": many_sessions_parked,
    "restart": restart,
    "gateway": gateway,
}


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _row(result: Result) -> str:
    reference = f"{result.reference:,.1f}" if result.reference is not None else "-"
    ratio = f"{result.ratio:.2f}" if result.ratio is not None else "-"
    return (
        f"{result.name:<26} {result.ours:>12,.1f} {result.unit:<20} {reference:>12} "
        f"{(result.reference_name or '-'):<34} {ratio:>6}  {result.target}"
    )


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
        "--only",
        nargs="+",
        choices=sorted(SCENARIOS),
        metavar="NAME",
        help=f"run only these scenarios: {', '.join(SCENARIOS)}",
    )
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    size = QUICK if args.quick else FULL
    started = time.perf_counter()

    def progress(name: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] running {name} ...", file=sys.stderr)

    results = trio.run(_run, names, size, progress)
    print(
        f"{'scenario':<26} {'ours':>12} {'unit':<20} {'reference':>12} {'reference is':<34} "
        f"{'ratio':>6}  target"
    )
    for result in results:
        print(_row(result))
    print(
        f"(ratio: reference/ours for latencies, ours/reference for throughputs; higher is "
        f"better; {time.perf_counter() - started:.0f} s)"
    )
    if args.json:
        scenarios = {
            r.name: {
                "unit": r.unit,
                "ours": r.ours,
                "reference": r.reference,
                "reference_name": r.reference_name,
                "ratio": r.ratio,
                "target": r.target,
                **r.figures,
            }
            for r in results
        }
        document = {
            "note": "ratio is reference/ours for latencies and ours/reference for "
            "throughputs, so higher is better; all measured in one run",
            "quick": args.quick,
            "machine": _machine(),
            "scenarios": scenarios,
        }
        with open(args.json, "w") as out:
            json.dump(document, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
