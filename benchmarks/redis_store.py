"""``python -m benchmarks.redis_store [URL]``: what a session store costs.

Not part of ``python -m benchmarks`` (it needs a redis-server). Without a URL
it starts one on 127.0.0.1 (a free port, a temporary directory, AOF with
``appendfsync everysec``, Redis's default for AOF) and stops it after.

* ``per_event_us``: ``send_event`` through the thread door, one session,
  nobody attached... p50 of single calls, with no store and with each store;
* ``cross_process_resume_1000_ms``: a resume on a second registry (its own
  session system and its own Redis connection, as another process would
  have) of a session another registry journaled 1,000 events in: takeover,
  load, replay of 1,000 events. p50 over the runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from actors._store import SessionStore
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.redis_store import RedisStore
from supervisor.stores._memory import MemoryStore

EVENTS = 2000
RESUMES = 20


def _registry(store: SessionStore | None) -> ThreadSessionRegistry:
    return ThreadSessionRegistry(
        replay_ttl_s=600,
        replay_max_bytes_per_session=64 << 20,
        sweep_interval_s=None,
        timeout=30.0,
        store=store,
    )


def per_event_us(store: SessionStore | None) -> float:
    with _registry(store) as registry:
        registry.create("bench", send=lambda frame: None, close=lambda reason: None)
        registry.detach("bench")
        samples = []
        payload = {"type": "response.output_text.delta", "delta": "hello world"}
        for _ in range(EVENTS):
            start = time.perf_counter()
            registry.send_event("bench", payload)
            samples.append(time.perf_counter() - start)
        registry.close("bench")
    return statistics.median(samples) * 1e6


def cross_process_resume_ms(url: str) -> float:
    owner_store, other_store = RedisStore(url), RedisStore(url)
    samples = []
    with _registry(owner_store) as owner, _registry(other_store) as other:
        payload = {"type": "response.output_text.delta", "delta": "hello world"}
        for run in range(RESUMES):
            session_id = f"resume-{run}"
            created = owner.create(session_id, send=lambda frame: None, close=lambda reason: None)
            owner.send_events(session_id, [payload] * 1000)
            owner.detach(session_id)
            start = time.perf_counter()
            result = other.resume(
                session_id,
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=lambda frame: None,
                close=lambda reason: None,
            )
            samples.append(time.perf_counter() - start)
            if len(result.replay_entries) != 1000:
                raise AssertionError(f"replayed {len(result.replay_entries)} of 1000")
            other.close(session_id)
    owner_store.close()
    other_store.close()
    return statistics.median(samples) * 1e3


@contextmanager
def _local_redis() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not on PATH: pass a redis:// URL")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        process = subprocess.Popen(  # noqa: S603 - our own argv
            [
                *(binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", directory),
                *("--save", "", "--appendonly", "yes", "--appendfsync", "everysec"),
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            store = RedisStore(url)
            for _ in range(100):
                try:
                    store.ping()
                    break
                except ConnectionError:
                    time.sleep(0.1)
            store.close()
            yield url
        finally:
            process.terminate()
            process.wait(10)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.redis_store",
        description=(
            "What a session store costs: send_event per event with no store, "
            "the memory store and the Redis store, and a cross-process resume "
            "replaying 1,000 events. Prints JSON."
        ),
    )
    parser.add_argument(
        "url",
        nargs="?",
        help=(
            "a running Redis (redis://HOST:PORT/DB); without it a redis-server "
            "from PATH is started on a free port (AOF, appendfsync everysec) and stopped after"
        ),
    )
    args = parser.parse_args(argv)
    with _local_redis() if args.url is None else _given(args.url) as url:
        redis_store = RedisStore(url, prefix=f"bench-{time.time_ns()}:")
        figures = {
            "per_event_us": {
                "no_store": round(per_event_us(None), 1),
                "memory_store": round(per_event_us(MemoryStore()), 1),
                "redis_store": round(per_event_us(redis_store), 1),
            },
            "cross_process_resume_1000_ms": round(cross_process_resume_ms(url), 2),
        }
        redis_store.close()
    per_event = figures["per_event_us"]
    assert isinstance(per_event, dict)
    per_event["redis_over_no_store"] = round(per_event["redis_store"] / per_event["no_store"], 2)
    print(json.dumps(figures, indent=2))


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    main(sys.argv[1:])
