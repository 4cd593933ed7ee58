"""Scenarios 3 and 4: a slow client beside healthy ones; engine threads pushing events
(and 4b: one engine thread's blocking ``send_event`` latency)."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable

import trio

from benchmarks.common import BIG, Result, Size, noop_close, noop_send, pct, registry
from benchmarks.references import LockRegistry
from supervisor.doors._threads import ThreadSessionRegistry

__all__ = ["engine_threads", "slow_client", "thread_send_latency"]

HEALTHY = 100
SLOW_SEND_S = 0.05


async def _slow_send(frame: dict[str, object]) -> None:
    await trio.sleep(SLOW_SEND_S)


async def _drive(
    send_event: Callable[[str, dict[str, object]], Awaitable[object]],
    session_ids: list[str],
    seconds: float,
) -> tuple[float, list[float]]:
    """Producers, one per session, for ``seconds``: (events/s, latencies)."""
    latencies: list[float] = []
    counts = [0]
    stop_at = trio.current_time() + seconds

    async def produce(session_id: str) -> None:
        i = 0
        while trio.current_time() < stop_at:
            start = time.perf_counter()
            await send_event(session_id, {"i": i})
            latencies.append(time.perf_counter() - start)
            i += 1
        counts[0] += i

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for session_id in session_ids:
            nursery.start_soon(produce, session_id)
    return counts[0] / (time.perf_counter() - start), latencies


async def _ours(seconds: float, *, with_slow: bool) -> tuple[float, list[float]]:
    async with registry() as door:
        healthy = [f"h{i}" for i in range(HEALTHY)]
        for session_id in healthy:
            await door.create(session_id, send=noop_send, close=noop_close)
        async with trio.open_nursery() as nursery:
            if with_slow:
                await door.create("slow", send=_slow_send, close=noop_close)
                nursery.start_soon(_drive, door.send_event, ["slow"], seconds)
            rate, latencies = await _drive(door.send_event, healthy, seconds)
        return rate, latencies


async def _baseline(seconds: float, *, with_slow: bool) -> tuple[float, list[float]]:
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    healthy = [f"h{i}" for i in range(HEALTHY)]
    for session_id in healthy:
        await base.create(session_id, send=noop_send)
    async with trio.open_nursery() as nursery:
        if with_slow:
            await base.create("slow", send=_slow_send)
            nursery.start_soon(_drive, base.send_event, ["slow"], seconds)
        return await _drive(base.send_event, healthy, seconds)


async def slow_client(size: Size) -> list[Result]:
    seconds = size.slow_client_s
    calm, _ = await _ours(seconds, with_slow=False)
    stormy, latencies = await _ours(seconds, with_slow=True)
    base_calm, _ = await _baseline(seconds, with_slow=False)
    base_stormy, base_lat = await _baseline(seconds, with_slow=True)
    figures = {
        "healthy_events_per_s": stormy,
        "healthy_events_per_s_without_slow": calm,
        "healthy_p99_us": pct(latencies, 0.99) * 1e6,
        "baseline_healthy_events_per_s": base_stormy,
        "baseline_healthy_events_per_s_without_slow": base_calm,
        "baseline_healthy_p99_us": pct(base_lat, 0.99) * 1e6,
    }
    return [
        Result(
            "slow_client",
            "healthy events/s",
            stormy,
            calm,
            "ours without the slow client",
            stormy / calm,
            ">= 0.83 (within 1.2x)",
            figures,
        ),
        Result(
            "slow_client_vs_baseline",
            "healthy events/s",
            stormy,
            base_stormy,
            "lock baseline with the slow client",
            stormy / base_stormy,
            ">= 1.0",
            {},
        ),
    ]


def _ours_threads(events: int, threads: int) -> float:
    delivered = threading.Semaphore(0)
    total = events // threads * threads

    def send(frame: dict[str, object]) -> None:
        delivered.release()

    with ThreadSessionRegistry(
        replay_ttl_s=600, replay_max_bytes_per_session=BIG, sweep_interval_s=None
    ) as door:
        for t in range(threads):
            door.create(f"t{t}", send=send, close=lambda reason: None)

        def push(t: int) -> None:
            for i in range(events // threads):
                door.send_event_nowait(f"t{t}", {"i": i})

        start = time.perf_counter()
        workers = [threading.Thread(target=push, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for _ in range(total):
            delivered.acquire()
        return total / (time.perf_counter() - start)


async def _baseline_threads(events: int, threads: int) -> float:
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    for t in range(threads):
        await base.create(f"t{t}", send=noop_send)
    token = trio.lowlevel.current_trio_token()

    def push(t: int) -> None:
        for i in range(events // threads):
            trio.from_thread.run(base.send_event, f"t{t}", {"i": i}, trio_token=token)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for t in range(threads):
            nursery.start_soon(trio.to_thread.run_sync, push, t)
    return events // threads * threads / (time.perf_counter() - start)


async def engine_threads(size: Size) -> list[Result]:
    threads = 8
    ours = await trio.to_thread.run_sync(_ours_threads, size.thread_events, threads)
    reference = await _baseline_threads(size.thread_events, threads)
    return [
        Result(
            "engine_threads",
            "events/s",
            ours,
            reference,
            "lock baseline via from_thread",
            ours / reference,
            ">= 1.0",
            {"threads": float(threads)},
        )
    ]


def _ours_blocking_latencies(calls: int) -> list[float]:
    latencies = []
    with ThreadSessionRegistry(
        replay_ttl_s=600, replay_max_bytes_per_session=BIG, sweep_interval_s=None
    ) as door:
        door.create("t", send=lambda frame: None, close=lambda reason: None)
        for i in range(calls):
            start = time.perf_counter()
            door.send_event("t", {"i": i})
            latencies.append(time.perf_counter() - start)
            if i % 1000 == 999:
                door.acknowledge("t", i + 1)
    return latencies


async def thread_send_latency(size: Size) -> list[Result]:
    """A plain thread's blocking ``send_event`` (a blocking transport), against
    the lock baseline reached from a thread as the lock design must
    (``trio.from_thread.run``, its send on the loop)."""
    calls = size.latency_calls // 4
    ours = await trio.to_thread.run_sync(_ours_blocking_latencies, calls)
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    await base.create("t", send=noop_send)
    token = trio.lowlevel.current_trio_token()

    def push() -> list[float]:
        latencies = []
        for i in range(calls):
            start = time.perf_counter()
            trio.from_thread.run(base.send_event, "t", {"i": i}, trio_token=token)
            latencies.append(time.perf_counter() - start)
        return latencies

    reference = await trio.to_thread.run_sync(push)
    p50, ref50 = pct(ours, 0.5) * 1e6, pct(reference, 0.5) * 1e6
    return [
        Result(
            "thread_send_latency",
            "us p50",
            p50,
            ref50,
            "lock baseline via from_thread",
            ref50 / p50,
            "",
            {"p99_us": pct(ours, 0.99) * 1e6, "baseline_p99_us": pct(reference, 0.99) * 1e6},
        )
    ]
