"""Engines and processes for the engine worker tests (run by ``worker --engine``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import anyio
import redis

from supervisor.engine_bus import RedisEngineBus
from supervisor.gateway._engine import ClientEvent, DemoEngine, EngineConfig, EngineSession

MODULE = [sys.executable, "-m", "supervisor"]

#: Short, so that a test waits about a second for a dead worker's work.
VISIBILITY_S = 1.0


class SlowAnswerEngine:
    """Answers each input with a delta, a pause, then ``response.done``: a worker
    killed or stopped during the pause is one caught mid-answer."""

    client_event_types = frozenset({"input_audio.append"})

    async def start(self, session: EngineSession) -> None:
        return

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        await session.send({"type": "response.output_text.delta", "delta": f"pid {os.getpid()}"})
        await anyio.sleep(float(os.environ.get("SLOW_ANSWER_S", "3")))
        done: Mapping[str, object] = {
            "type": "response.done",
            "response_id": client_event_id,
            "client_event_id": client_event_id,
            "input_chars": len(text),
        }
        await session.send(done)

    async def on_client_event(self, session: EngineSession, event: ClientEvent) -> None:
        await session.send(
            {
                "type": "input_audio.received",
                "client_seq": event.client_seq,
                "bytes": len(event.data or b""),
            }
        )

    def stop(self, session_id: str) -> None:
        return


def slow_answer_engine() -> SlowAnswerEngine:
    return SlowAnswerEngine()


def quiet_demo_engine() -> DemoEngine:
    return DemoEngine(EngineConfig(event_rate_hz=0))


@contextmanager
def plain_redis(url: str) -> Iterator[redis.Redis]:
    """A client of ``url``, its connections closed after."""
    client = redis.Redis.from_url(url)
    try:
        yield client
    finally:
        client.close()
        client.connection_pool.disconnect()


@contextmanager
def workers(
    url: str, count: int, engine: str, *, pool: str = "default", **env: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes of ``pool`` on ``url`` (one Redis or a
    cluster), ready (their event types declared)."""
    command = [
        *MODULE,
        "worker",
        "--bus",
        url,
        "--engine",
        engine,
        "--engine-pool",
        pool,
        "--visibility-timeout",
        str(VISIBILITY_S),
    ]
    processes = [
        subprocess.Popen(command, env={**os.environ, **env}, stderr=subprocess.DEVNULL)  # noqa: S603
        for _ in range(count)
    ]
    try:
        bus = RedisEngineBus(url, pool=pool)
        try:
            deadline = time.monotonic() + 30
            while not bus.declared_event_types():
                assert time.monotonic() < deadline, "the workers never declared their types"
                time.sleep(0.05)
        finally:
            bus.close()
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def worker_pids(url: str, pool: str = "default") -> set[int]:
    """The pids of the workers that joined the pool's consumer group."""
    bus = RedisEngineBus(url, pool=pool)
    try:
        names = bus.workers()
    finally:
        bus.close()
    return {int(name.rsplit("-", 2)[-2]) for name in names}


def bus_counts(url: str, pool: str = "default") -> dict[str, int]:
    """The pool's ``redelivered``, ``fenced`` and ``duplicates``."""
    bus = RedisEngineBus(url, pool=pool)
    try:
        return bus.counts()
    finally:
        bus.close()
