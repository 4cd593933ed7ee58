"""Scenarios 5 to 7: resume with a long replay, many sessions (live and parked), restart."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import tracemalloc
from typing import Any

import trio

from actors._commands import ResumeResult
from actors._credential import ResumeToken
from actors._errors import SessionCrashedError
from actors._journal import EventJournal
from benchmarks.common import BIG, Result, Size, noop_close, noop_send, pct, registry
from benchmarks.references import LockRegistry
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy

__all__ = ["many_sessions", "many_sessions_parked", "restart", "resume_replay"]

REPLAY = 1000


def _activation(token: ResumeToken, generation: int) -> dict[str, object]:
    return {"type": "session.resumed", "attachment_generation": generation}


async def resume_replay(size: Size) -> list[Result]:
    ours: list[float] = []
    async with registry() as door:
        created = await door.create("s", send=noop_send, close=noop_close)
        await door.send_events("s", [{"i": i} for i in range(REPLAY)])
        token = created.resume_token.plaintext
        for _ in range(size.resume_rounds):
            await door.detach("s")
            start = time.perf_counter()
            result: ResumeResult = await door.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=0,
                send=noop_send,
                close=noop_close,
                activation_payload_factory=_activation,
            )
            ours.append(time.perf_counter() - start)
            token = result.resume_token.plaintext
    base = LockRegistry(replay_ttl_s=600, replay_max_bytes_per_session=BIG)
    base_token = (await base.create("s", send=noop_send)).plaintext
    for i in range(REPLAY):
        await base.send_event("s", {"i": i})
    reference: list[float] = []
    for _ in range(size.resume_rounds):
        start = time.perf_counter()
        new_token, _ = await base.resume("s", resume_token=base_token, last_seq=0, send=noop_send)
        reference.append(time.perf_counter() - start)
        base_token = new_token.plaintext
    p50, ref50 = pct(ours, 0.5) * 1e3, pct(reference, 0.5) * 1e3
    return [
        Result(
            "resume_replay",
            "ms p50",
            p50,
            ref50,
            "lock baseline",
            ref50 / p50,
            "",
            {"replayed_events": float(REPLAY), "p99_ms": pct(ours, 0.99) * 1e3},
        )
    ]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def many_sessions(size: Size) -> list[Result]:
    n = size.many_sessions
    gc.collect()
    async with registry() as door:
        before = _rss_bytes()
        start = time.perf_counter()
        for i in range(n):
            await door.create(f"s{i}", send=noop_send, close=noop_close)
        created_s = time.perf_counter() - start
        gc.collect()
        per_session = (_rss_bytes() - before) / n
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(door.has_attachment, f"s{i}")
        answer_s = time.perf_counter() - start
    return [
        Result(
            "many_sessions",
            "s to create",
            created_s,
            None,
            None,
            None,
            f"< 5 s for 10,000 (ran {n})",
            {
                "sessions": float(n),
                "rss_per_session_kb": per_session / 1024,
                "one_answer_each_s": answer_s,
            },
        ),
    ]


async def restart(size: Size) -> list[Result]:
    plan = FaultPlan()
    latencies = []
    # A budget no run exhausts: each round crashes once on purpose.
    policy = RestartPolicy(max_restarts=size.restart_rounds + 1)
    async with registry(faults=plan, restart_policy=policy) as door:
        await door.create("s", send=noop_send, close=noop_close)
        for i in range(size.restart_rounds):
            plan.crash("send_event.recorded", session_id="s")
            start = time.perf_counter()
            with contextlib.suppress(SessionCrashedError):
                await door.send_event("s", {"i": i})
            await door.send_event("s", {"i": i})
            latencies.append(time.perf_counter() - start)
    p50 = pct(latencies, 0.5) * 1e3
    return [
        Result(
            "restart",
            "ms p50",
            p50,
            None,
            None,
            None,
            "< 5 ms",
            {"p99_ms": pct(latencies, 0.99) * 1e3},
        )
    ]


PARK_BATCH = 5_000  # live at once while creating (parked after each batch)
REACTIVATIONS = 200
BIG_JOURNAL_ROUNDS = 20


class _ShiftedClock:
    """The registry's clock, which the benchmark moves past the passivation limit."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


async def _park_all(door: Any, clock: _ShiftedClock, parked: int) -> None:
    """Jump past the passivation limit, sweep, and wait until ``parked`` are parked."""
    clock.offset += _PASSIVATE_AFTER_S + 1
    await door.sweep()
    while door.stats().parked < parked:
        await trio.sleep(0.005)


_PASSIVATE_AFTER_S = 30.0


async def many_sessions_parked(size: Size) -> list[Result]:
    """100,000 sessions (10x ``many_sessions``): create, detach, park; then wake some."""
    n = size.many_sessions * 10
    clock = _ShiftedClock()
    gc.collect()
    async with registry(clock=clock, passivate_after_s=_PASSIVATE_AFTER_S) as door:
        before = _rss_bytes()
        start = time.perf_counter()
        for first in range(0, n, PARK_BATCH):
            batch = [f"p{i}" for i in range(first, min(n, first + PARK_BATCH))]
            async with trio.open_nursery() as nursery:
                for sid in batch:
                    nursery.start_soon(_create_detached, door, sid)
            await _park_all(door, clock, first + len(batch))
        create_and_park_s = time.perf_counter() - start
        gc.collect()
        rss_per_parked = (_rss_bytes() - before) / n
        threads_after = threading.active_count()
        stats = door.stats()
        wake = []
        for i in range(0, n, max(1, n // REACTIVATIONS)):
            began = time.perf_counter()
            await door.has_attachment(f"p{i}")
            wake.append(time.perf_counter() - began)
        big = await _reactivate_with_journal(door, clock, stats.parked)
    return [
        Result(
            "many_sessions_parked",
            "s to create and park",
            create_and_park_s,
            None,
            None,
            None,
            f"{n:,} in <= 20 s; <= 4 KB each; <= 10 threads after; "
            "p50 wake <= 2 ms (10 ms with 1,000 events)",
            {
                "sessions": float(stats.sessions),
                "parked": float(stats.parked),
                "create_and_park_s": create_and_park_s,
                "rss_per_parked_session_kb": rss_per_parked / 1024,
                "threads_after": float(threads_after),
                "reactivate_p50_ms": pct(wake, 0.5) * 1e3,
                "reactivate_1000_events_p50_ms": pct(big, 0.5) * 1e3,
                "journal_bytes_per_retained_event": journal_bytes_per_event(),
            },
        )
    ]


def journal_bytes_per_event(events: int = 10_000) -> float:
    """Python heap bytes one retained text-delta event holds (tracemalloc)."""
    journal = EventJournal(max_bytes=BIG, ttl_s=600.0, clock=lambda: 0.0, strict=True)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(events):
            journal.record({"type": "text.delta", "text": "hello, world", "i": i})
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - before) / events
    finally:
        tracemalloc.stop()


async def _create_detached(door: Any, session_id: str) -> None:
    await door.create(session_id, send=noop_send, close=noop_close)
    await door.detach(session_id)


async def _reactivate_with_journal(door: Any, clock: _ShiftedClock, parked: int) -> list[float]:
    """Wake p50 of a session parked with 1,000 journaled events."""
    await door.create("big", send=noop_send, close=noop_close)
    await door.send_events("big", [{"i": i} for i in range(REPLAY)])
    await door.detach("big")
    times = []
    for _ in range(BIG_JOURNAL_ROUNDS):
        await _park_all(door, clock, parked + 1)
        began = time.perf_counter()
        await door.has_attachment("big")
        times.append(time.perf_counter() - began)
    return times
