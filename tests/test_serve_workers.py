"""``serve --workers N``: N gateway processes on one socket, one Redis; a worker
killed is started again and its session resumes on any worker; SIGTERM drains all.

Real processes and a real redis-server (skipped with a message saying how to
run them when ``redis-server`` is not on PATH; see tests/redis_support.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from supervisor.cli._serve_workers import RestartBackoff, WorkerPool
from supervisor.gateway._servers import listening_socket
from tests.gateway_support import contiguous, read_until_closed, seqs
from tests.redis_support import RedisServer, redis_binary
from tests.test_cli import MODULE, _run, _serve_process
from tests.test_redis_demo import redis_servers
from tests.worker_support import (
    free_ports,
    holder,
    resume_after,
    serving_workers,
    stream_until_killed,
)

LIMIT = 90.0


def test_a_worker_that_keeps_dying_waits_longer_each_time() -> None:
    backoff = RestartBackoff(first_s=0.25, max_s=2.0, stable_after_s=30.0)
    delays: list[float] = []
    previous: float | None = None
    for _ in range(6):  # each death 1 s after its start: not stable
        previous = backoff.delay(previous_s=previous, ran_s=1.0)
        delays.append(previous)
    assert delays == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    # A worker that ran past stable_after_s is started again at once.
    assert backoff.delay(previous_s=2.0, ran_s=30.0) == 0.0


def test_workers_without_a_store_name_the_fix() -> None:
    result = _run("serve", "--workers", "2", "--port", "0")
    assert result.returncode == 2, result.stderr
    assert "--workers needs a store" in result.stderr
    assert "--redis local" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_help_teaches_workers() -> None:
    result = _run("serve", "--help")
    assert result.returncode == 0
    shown = " ".join(result.stdout.split())
    assert "--workers N" in shown and "Needs --redis (URL or 'local')" in shown
    assert "worker k serves its own /metrics on P+k" in shown


def test_a_worker_that_cannot_start_stops_the_pool_with_its_reason() -> None:
    result = _run(
        "serve", "--workers", "2", "--port", "0", "--redis", "redis://127.0.0.1:1/0",
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "could not start" in result.stderr
    assert "127.0.0.1:1" in result.stderr  # the worker's own line: Redis unreachable
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("server", ["trio", "asgi-uvicorn", "asgi-hypercorn"])
async def test_a_killed_workers_session_resumes_on_another_and_sigterm_drains(
    server: str, redis_server: RedisServer
) -> None:
    needs = {"asgi-uvicorn": "uvicorn", "asgi-hypercorn": "hypercorn"}.get(server)
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} not installed (the asgi extra)")
    metrics = free_ports(2)
    command = [
        *MODULE, "serve", "--workers", "2", "--port", "0", "--server", server,
        "--redis", redis_server.url, "--metrics-port", str(metrics), "--event-rate", "50",
    ]  # fmt: skip
    with trio.fail_after(LIMIT):
        async with serving_workers(command) as workers:
            victim = -1

            async def kill() -> None:
                nonlocal victim
                victim = await holder(metrics, 2)
                os.kill(workers.pids()[victim], signal.SIGKILL)

            frames = await stream_until_killed(workers.url, kill)
            await workers.wait_for(rb"worker %d \(pid \d+\) exited on SIGKILL" % victim)
            # Through the same port: whichever worker accepts takes the session over.
            client, after = await resume_after(workers.url, frames)
            try:
                # The killed worker is started again (a new pid at its index).
                await workers.wait_for(rb"worker %d \(pid \d+\) listening" % victim, count=2)
                workers.process.send_signal(signal.SIGTERM)
                rest, closed = await read_until_closed(client)
            finally:
                await client.cut()
            assert (closed.code, closed.reason) == (1001, "going_away")
            assert await workers.process.wait() == 0
    numbers = seqs(frames) + seqs(after + rest)
    assert contiguous(1, numbers), numbers  # nothing lost, nothing repeated
    assert b"Traceback" not in workers.log, workers.log.decode()


def test_demo_on_workers_of_one_port_loses_and_repeats_nothing_through_a_kill() -> None:
    redis_binary()  # skip (or fail in CI) without redis-server
    result = _run(
        "demo",
        "--workers", "2",
        "--redis", "local",
        "--clients", "8",
        "--duration", "6",
        "--drop-rate", "1",
        "--json",
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert len(lines) == 1, (result.stdout, result.stderr)
    totals = json.loads(lines[0])["totals"]
    assert (totals["lost"], totals["duplicated"], totals["errors"]) == (0, 0, 0), totals
    assert (totals["lost_upstream"], totals["duplicated_upstream"]) == (0, 0), totals
    assert totals["stranded"] == 0, totals
    assert totals["workers"] == 2
    assert (totals["workers_killed"], totals["workers_started_again"]) == (1, 1), totals
    assert totals["answered"] == totals["inputs"], totals
    assert "exited on SIGKILL" in result.stderr  # the parent said so, and started it again


def test_demo_workers_needs_a_store_and_no_processes() -> None:
    for argv in (["--workers", "2"], ["--workers", "2", "--redis", "x", "--processes", "2"]):
        result = _run("demo", *argv, "--duration", "1")
        assert result.returncode == 2, result.stderr
        assert "--workers N needs --redis" in result.stderr


def test_demo_help_teaches_workers() -> None:
    shown = " ".join(_run("demo", "--help").stdout.split())
    assert "--workers N" in shown and "started again by the parent" in shown


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one", "workers"])
async def test_serve_redis_local_starts_and_stops_its_own_redis(workers: list[str]) -> None:
    redis_binary()
    command = [*MODULE, "serve", "--port", "0", "--redis", "local", *workers]
    with trio.fail_after(LIMIT):
        async with _serve_process(command) as served:
            # Its own child (other runs' may be up meanwhile).
            ours = {pid for pid in redis_servers() if _parent(pid) == served.process.pid}
            assert len(ours) == 1
            served.process.send_signal(signal.SIGTERM)
        assert served.process.returncode == 0, served.log.decode()
    assert not ours & set(redis_servers())  # stopped with the server


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


#: A worker that says it listens, then dies at once (status 1), every time.
_DIES_AT_ONCE = """
import os
listen, ready, lifeline = os.environ["DUPLEX_SUPERVISOR_WORKER_FDS"].split(",")
os.write(int(ready), b"r")
raise SystemExit(1)
"""


async def test_the_pool_waits_longer_each_time_a_worker_dies_quickly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = RestartBackoff(first_s=0.05, max_s=0.2, stable_after_s=60.0)
    with listening_socket("127.0.0.1", 0) as listener, trio.fail_after(LIMIT):
        listener.listen(8)
        pool = WorkerPool(
            command=[sys.executable, "-c", _DIES_AT_ONCE], count=1, listener=listener,
            backoff=backoff,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            while pool.restarts < 5:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "starting it again" in r.getMessage()]
    delays = [line.rsplit(" in ", 1)[1] for line in said[:5]]
    assert delays == ["0.00 s", "0.05 s", "0.10 s", "0.20 s", "0.20 s"], said
    assert all("exited with status 1" in line for line in said), said
