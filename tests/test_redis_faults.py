"""Faults across real processes sharing one real redis-server.

A process killed with SIGKILL: its session resumes in another process with
every event it journaled. A process stopped (SIGSTOP) while another takes its
session over, or past its lease, and then continued: its write is refused and
it lets go; nothing is written twice (the stream's IDs are the sequences).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.redis_store import RedisStore
from tests.redis_support import RedisServer

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def child(server: RedisServer, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The child program; killed (if still running) and its pipes closed after."""
    with subprocess.Popen(  # noqa: S603 - our own test program
        [sys.executable, "-m", "tests.redis_child", server.url, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.wait(20)


@pytest.fixture
def parent_registry(redis_server: RedisServer) -> Iterator[ThreadSessionRegistry]:
    store = RedisStore(redis_server.url)
    with ThreadSessionRegistry(
        replay_ttl_s=600,
        replay_max_bytes_per_session=64 << 20,
        sweep_interval_s=None,
        timeout=10.0,
        store=store,
    ) as registry:
        yield registry
    store.close()


def resume_all(registry: ThreadSessionRegistry, token: str) -> list[int]:
    result = registry.resume(
        "k",
        resume_token=token,
        last_received_server_event_seq=0,
        send=lambda frame: None,
        close=lambda reason: None,
    )
    for entry in result.replay_entries:
        assert dict(entry.payload)["n"] == entry.sequence
    return [entry.sequence for entry in result.replay_entries]


def stream_ids(server: RedisServer) -> list[object]:
    client = redis.Redis.from_url(server.url)
    try:
        return [entry_id for entry_id, _ in client.xrange("duplex:{k}:e") or []]
    finally:
        client.close()


def test_a_sigkilled_process_loses_no_journaled_event(
    redis_server: RedisServer, parent_registry: ThreadSessionRegistry
) -> None:
    with child(redis_server, "stream") as process:
        assert process.stdout is not None
        token = process.stdout.readline().strip()
        last_confirmed = 0
        while last_confirmed < 200:
            line = process.stdout.readline()
            assert line.startswith("sent "), line
            last_confirmed = int(line.split()[1])
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        sequences = resume_all(parent_registry, token)
        # Every event whose send_event returned is there; maybe one more that was
        # written before its caller heard back. Dense from 1: no gap, no duplicate.
        assert sequences[:last_confirmed] == list(range(1, last_confirmed + 1))
        assert sequences == list(range(1, len(sequences) + 1))
        assert len(stream_ids(redis_server)) == len(sequences)


def test_a_stopped_owner_whose_session_was_taken_over_is_refused(
    redis_server: RedisServer, parent_registry: ThreadSessionRegistry
) -> None:
    with child(redis_server, "hold", "10") as process:
        assert process.stdout is not None and process.stdin is not None
        token = process.stdout.readline().strip()
        assert process.stdout.readline().strip() == "ready"
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert resume_all(parent_registry, token) == [1, 2, 3]
            parent_registry.send_event("k", {"n": 4})
        finally:
            os.kill(process.pid, signal.SIGCONT)
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "SessionReplacedError"
        process.wait(20)
        assert stream_ids(redis_server) == [b"0-1", b"0-2", b"0-3", b"0-4"]


def test_an_owner_stopped_past_its_lease_lets_go(
    redis_server: RedisServer, parent_registry: ThreadSessionRegistry
) -> None:
    with child(redis_server, "hold", "0.5") as process:
        assert process.stdout is not None and process.stdin is not None
        token = process.stdout.readline().strip()
        assert process.stdout.readline().strip() == "ready"
        os.kill(process.pid, signal.SIGSTOP)
        client = redis.Redis.from_url(redis_server.url)
        try:
            # Wait (bounded) until the server's clock is past the stopped owner's lease.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                lease_until = int(client.hget("duplex:{k}:f", "lease_until") or 0)
                seconds, micros = client.time()
                if seconds * 1000 + micros // 1000 > lease_until + 100:
                    break
                time.sleep(0.1)
        finally:
            client.close()
            os.kill(process.pid, signal.SIGCONT)
        process.stdin.write("go\n")
        process.stdin.flush()
        # Its renewal or its write is refused first: either way it let go.
        assert process.stdout.readline().strip() in {"SessionReplacedError", "UnknownSessionError"}
        process.wait(20)
        assert stream_ids(redis_server) == [b"0-1", b"0-2", b"0-3"]
        assert resume_all(parent_registry, token) == [1, 2, 3]
