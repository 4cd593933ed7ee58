"""Scenarios 5 to 7: resume with a long replay, 10,000 sessions, restart."""

from __future__ import annotations

import contextlib
import gc
import time

import trio

from actors.credential import ResumeToken
from actors.errors import SessionCrashedError
from actors.messages import ResumeResult
from benchmarks.common import BIG, Result, Size, noop_close, noop_send, pct, registry
from benchmarks.references import LockRegistry
from supervisor.faults import FaultPlan
from supervisor.policy import RestartPolicy

__all__ = ["many_sessions", "restart", "resume_replay"]

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
