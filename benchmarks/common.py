"""What every scenario shares: sizes, the result record, small transports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from supervisor._trio_registry import open_session_registry

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
    gateway_clients: int
    gateway_s: float


FULL = Size(20_000, 100_000, 3.0, 40_000, 30, 10_000, 200, 200, 5.0)
QUICK = Size(3_000, 20_000, 1.5, 8_000, 10, 2_000, 50, 100, 2.0)


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
    figures: dict[str, float] = field(default_factory=dict)


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
