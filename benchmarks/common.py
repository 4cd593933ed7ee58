"""What every scenario shares: sizes, the result record, small transports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from supervisor.doors._trio import open_session_registry

__all__ = [
    "BIG",
    "FULL",
    "QUICK",
    "Counter",
    "Result",
    "Size",
    "noop_close",
    "noop_send",
    "pct",
    "registry",
]

BIG = 1 << 30  # journal bytes: never the limit in a benchmark


@dataclass(frozen=True, slots=True)
class Size:
    """How much work each scenario does (``--quick`` shrinks it)."""

    latency_calls: int
    throughput_events: int
    slow_client_s: float
    thread_events: int
    resume_rounds: int
    many_sessions: int
    restart_rounds: int
    #: Clients at 20 events/s each the gateway is measured with, per shell and mode.
    gateway_loads: tuple[int, ...]
    #: Seconds counted per load, after ``gateway_warmup_s`` seconds of traffic.
    gateway_s: float
    gateway_warmup_s: float
    #: Loads measured past the sizes to find the most clients held (0: none).
    gateway_search_steps: int
    gateway_max_clients: int
    #: Load generator processes per load.
    gateway_loaders: int
    #: Interleaved pairs (sessions in memory, in Redis) per load, trio shell.
    gateway_redis_pairs: int = 3
    #: Clients measured first per worker count (``gateway_workers``), then searched from.
    gateway_workers_loads: tuple[int, ...] = (100, 400)
    #: Loads measured past them per worker count to find the most clients held.
    gateway_workers_steps: int = 5


FULL = Size(
    latency_calls=20_000,
    throughput_events=100_000,
    slow_client_s=3.0,
    thread_events=40_000,
    resume_rounds=30,
    many_sessions=10_000,
    restart_rounds=200,
    gateway_loads=(200, 1000),
    gateway_s=4.0,
    gateway_warmup_s=1.5,
    gateway_search_steps=4,
    gateway_max_clients=3200,
    gateway_loaders=1,
)
QUICK = Size(
    latency_calls=3_000,
    throughput_events=20_000,
    slow_client_s=1.5,
    thread_events=8_000,
    resume_rounds=10,
    many_sessions=2_000,
    restart_rounds=50,
    gateway_loads=(100,),
    gateway_s=1.0,
    gateway_warmup_s=0.3,
    gateway_search_steps=0,
    gateway_max_clients=100,
    gateway_loaders=1,
    gateway_redis_pairs=1,
    gateway_workers_loads=(100,),
    gateway_workers_steps=0,
)


@dataclass(slots=True)
class Result:
    """One table row. ``ratio``: reference / ours for a latency, ours / reference
    for a throughput, so higher is better."""

    name: str
    unit: str
    ours: float
    reference: float | None = None
    reference_name: str | None = None
    ratio: float | None = None
    target: str = ""
    figures: Mapping[str, object] = field(default_factory=dict)
    #: False: a table row only (its figures live in another row's JSON entry).
    in_json: bool = True


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def noop_send(frame: dict[str, object]) -> None:
    return None


async def noop_close(reason: str) -> None:
    return None


class Counter:
    """A transport that counts frames and wakes a waiter at ``target``."""

    def __init__(self, target: int = -1) -> None:
        self.count = 0
        self.target = target
        self.done = trio.Event()

    async def send(self, frame: dict[str, object]) -> None:
        self.count += 1
        if self.count == self.target:
            self.done.set()


def registry(**kwargs: Any) -> Any:
    """The trio door with benchmark defaults (huge journals, no ticker)."""
    options: dict[str, Any] = {
        "replay_ttl_s": 600.0,
        "replay_max_bytes_per_session": BIG,
        "sweep_interval_s": None,
    }
    options.update(kwargs)
    return open_session_registry(**options)
