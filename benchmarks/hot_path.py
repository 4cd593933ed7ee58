"""Scenarios 1 and 2: the awaited send's latency and the throughput of many sessions."""

from __future__ import annotations

import time

import trio

from benchmarks.common import BIG, Counter, Result, Size, noop_close, noop_send, pct, registry
from benchmarks.references import LockRegistry, floor_round_trips
from supervisor.doors._trio import TrioSessionRegistry

__all__ = ["send_latency", "throughput"]


# -- 1. latency ---------------------------------------------------------------------


async def send_latency(size: Size) -> list[Result]:
    n = size.latency_calls
    floor = await floor_round_trips(n)
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    await base.create("s", send=noop_send)
    base_lat = []
    for i in range(n):
        start = time.perf_counter()
        await base.send_event("s", {"i": i})
        base_lat.append(time.perf_counter() - start)
    ours = []
    async with registry() as door:
        await door.create("s", send=noop_send, close=noop_close)
        for i in range(n):
            start = time.perf_counter()
            await door.send_event("s", {"i": i})
            ours.append(time.perf_counter() - start)
            if i % 1000 == 999:
                await door.acknowledge("s", i + 1)
    p50, p99 = pct(ours, 0.5) * 1e6, pct(ours, 0.99) * 1e6
    floor50 = pct(floor, 0.5) * 1e6
    base50 = pct(base_lat, 0.5) * 1e6
    figures = {
        "p50_us": p50,
        "p99_us": p99,
        "floor_p50_us": floor50,
        "floor_p99_us": pct(floor, 0.99) * 1e6,
    }
    figures |= {"baseline_p50_us": base50, "baseline_p99_us": pct(base_lat, 0.99) * 1e6}
    return [
        Result(
            "send_latency",
            "us p50",
            p50,
            floor50,
            "floor",
            floor50 / p50,
            ">= 0.67 (1.5x floor)",
            figures,
        ),
        Result(
            "send_latency_vs_baseline",
            "us p50",
            p50,
            base50,
            "lock baseline",
            base50 / p50,
            ">= 0.5",
            {},
        ),
    ]


# -- 2. throughput ----------------------------------------------------------------------


async def _baseline_throughput(events: int, sessions: int, producers: int) -> float:
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    for s in range(sessions):
        await base.create(f"s{s}", send=noop_send)
    per = events // producers
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for p in range(producers):
            nursery.start_soon(_produce_base, base, p, per, sessions // producers)
    return per * producers / (time.perf_counter() - start)


async def _produce_base(base: LockRegistry, p: int, count: int, own: int) -> None:
    for i in range(count):
        await base.send_event(f"s{p * own + i % own}", {"i": i})


async def throughput(size: Size) -> list[Result]:
    sessions, producers = 1000, 100
    events = size.throughput_events
    per = events // producers
    own = sessions // producers
    reference = await _baseline_throughput(events, sessions, producers)
    results = []
    for mode in ("awaited", "nowait", "batch"):
        counter = Counter()
        counter.target = per * producers
        async with registry() as door:
            for s in range(sessions):
                await door.create(f"s{s}", send=counter.send, close=noop_close)
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for p in range(producers):
                    nursery.start_soon(_produce_ours, door, mode, p, per, own)
            await counter.done.wait()
            rate = per * producers / (time.perf_counter() - start)
        target = {"awaited": ">= 0.25", "nowait": ">= 0.5 (goal 1.0)", "batch": ">= 1.0"}[mode]
        results.append(
            Result(
                f"throughput_{mode}",
                "events/s",
                rate,
                reference,
                "lock baseline",
                rate / reference,
                target,
                {"events": float(per * producers)},
            )
        )
    return results


async def _produce_ours(
    registry: TrioSessionRegistry, mode: str, p: int, count: int, own: int
) -> None:
    if mode == "batch":
        for i in range(0, count, 32):
            batch = [{"i": i + k} for k in range(min(32, count - i))]
            await registry.send_events(f"s{p * own + (i // 32) % own}", batch)
        return
    for i in range(count):
        session_id = f"s{p * own + i % own}"
        if mode == "awaited":
            await registry.send_event(session_id, {"i": i})
        else:
            while True:
                try:
                    registry.send_event_nowait(session_id, {"i": i})
                    break
                except trio.WouldBlock:
                    await trio.sleep(0)
            if i % 64 == 63:
                await trio.sleep(0)
