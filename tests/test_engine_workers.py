"""Engines in other processes: ``serve --engine-bus`` feeding ``worker`` processes
over a real redis-server (and, where the ``bus_at`` fixture says, over the
real local Redis Cluster), with workers killed, stopped and Redis restarted."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from supervisor.cli._wire_client import WireClient
from tests.engine_worker_support import MODULE, VISIBILITY_S, bus_counts, worker_pids, workers
from tests.gateway_support import LIMIT, Frame, read_until
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer
from tests.test_cli import _serve_process

SLOW = "tests.engine_worker_support:slow_answer_engine"


def _serve(url: str, pool: str = "default") -> list[str]:
    return [*MODULE, "serve", "--port", "0", "--engine-bus", url, "--engine-pool", pool]


@pytest.fixture(params=["redis", "cluster"])
def bus_at(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """``(url, pool)``: a redis-server of the test's own, or the shared cluster
    under a pool of the test's own."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url, f"w-{uuid.uuid4().hex[:8]}"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url, "default"


async def _open(url: str) -> WireClient:
    client = await WireClient.connect(url)
    await client.send_json({"type": "session.open"})
    await read_until(client, "session.created")
    return client


async def _mid_answer(client: WireClient, url: str, pool: str) -> tuple[Frame, int]:
    """Send input c1; its first delta, and the pid of the worker now in its pause."""
    await client.send_json({"type": "input", "client_event_id": "c1", "text": "hi"})
    first = (await read_until(client, "response.output_text.delta"))[-1]
    # The answering worker says who it is; it holds the input's entry.
    pid = int(str(first["delta"]).removeprefix("pid "))
    assert pid in worker_pids(url, pool)
    return first, pid


async def _frames_for(client: WireClient, seconds: float) -> list[Frame]:
    frames: list[Frame] = []
    with trio.move_on_after(seconds):
        while True:
            frames.append(await client.receive_json())
    return frames


async def test_a_gateway_feeds_workers_inputs_and_client_events(
    bus_at: tuple[str, str],
) -> None:
    url, pool = bus_at
    with workers(url, 2, "tests.engine_worker_support:quiet_demo_engine", pool=pool):
        with trio.fail_after(LIMIT * 2):
            async with _serve_process(_serve(url, pool)) as served:
                client = await _open(served.url)
                await client.send_json({"type": "input", "client_event_id": "c1", "text": "hello"})
                done = (await read_until(client, "response.done"))[-1]
                assert done["client_event_id"] == "c1"
                audio = base64.b64encode(b"\x01" * 640).decode()
                await client.send_json(
                    {"type": "input_audio.append", "client_seq": 1, "audio": audio}
                )
                received = (await read_until(client, "input_audio.received"))[-1]
                assert received["bytes"] == 640 and received["client_seq"] == 1
                await client.send_json({"type": "input", "client_event_id": "c1", "text": "hello"})
                await read_until(client, "input.duplicate")
                await client.cut()
                served.process.send_signal(signal.SIGTERM)


async def test_a_worker_killed_mid_answer_is_answered_once_by_another(
    bus_at: tuple[str, str],
) -> None:
    url, pool = bus_at
    with workers(url, 2, SLOW, pool=pool, SLOW_ANSWER_S="2") as processes:
        with trio.fail_after(LIMIT * 2):
            async with _serve_process(_serve(url, pool)) as served:
                client = await _open(served.url)
                first, pid = await _mid_answer(client, url, pool)
                os.kill(pid, signal.SIGKILL)
                frames = [first, *await _frames_for(client, VISIBILITY_S + 2 + 3)]
                kinds = [f["type"] for f in frames if "server_event_seq" in f]
                # The other worker did the answer again: its first delta had
                # the dead one's idempotency key (dropped), its done is new.
                assert kinds == ["response.output_text.delta", "response.done"], frames
                seqs = [f["server_event_seq"] for f in frames if "server_event_seq" in f]
                assert seqs == [1, 2]
                assert bus_counts(url, pool)["redelivered"] == 1
                assert bus_counts(url, pool)["duplicates"] == 1
                assert sum(p.poll() is None for p in processes) == 1
                await client.cut()
                served.process.send_signal(signal.SIGTERM)


async def test_a_stopped_worker_resumed_late_is_fenced_not_doubled(
    bus_at: tuple[str, str],
) -> None:
    url, pool = bus_at
    with workers(url, 2, SLOW, pool=pool, SLOW_ANSWER_S="2"):
        with trio.fail_after(LIMIT * 3):
            async with _serve_process(_serve(url, pool)) as served:
                client = await _open(served.url)
                first, pid = await _mid_answer(client, url, pool)
                os.kill(pid, signal.SIGSTOP)
                done = await read_until(client, "response.done")  # by the other worker
                os.kill(pid, signal.SIGCONT)  # its late send of the same answer
                deadline = time.monotonic() + LIMIT
                while bus_counts(url, pool)["fenced"] < 1:
                    assert time.monotonic() < deadline, bus_counts(url, pool)
                    await trio.sleep(0.1)
                later = await _frames_for(client, 1.0)
                events = [f for f in [first, *done, *later] if "server_event_seq" in f]
                assert [f["type"] for f in events] == [
                    "response.output_text.delta",
                    "response.done",
                ], events
                await client.cut()
                served.process.send_signal(signal.SIGTERM)


async def test_work_goes_on_after_redis_restarts(redis_server: RedisServer) -> None:
    url = redis_server.url
    with workers(url, 2, "tests.engine_worker_support:quiet_demo_engine"):
        with trio.fail_after(LIMIT * 3):
            async with _serve_process(_serve(url)) as served:
                client = await _open(served.url)
                await client.send_json({"type": "input", "client_event_id": "c1", "text": "a"})
                await read_until(client, "response.done", client_event_id="c1")
                redis_server.restart()
                await client.send_json({"type": "input", "client_event_id": "c2", "text": "b"})
                await read_until(client, "response.done", client_event_id="c2")
                later = await _frames_for(client, 1.0)
                assert not [f for f in later if f.get("type") == "response.done"], later
                await client.cut()
                served.process.send_signal(signal.SIGTERM)


def _readme_commands() -> list[list[str]]:
    """The commands of README.md's "Engines in other processes", word by word."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Engines in other processes\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    return [line.split() for block in blocks for line in block.splitlines() if line.strip()]


async def test_the_readmes_worker_and_serve_commands_run_as_written(
    redis_server: RedisServer,
) -> None:
    worker, serve, _demo = _readme_commands()
    assert worker[:2] == ["duplex-supervisor", "worker"]
    assert serve[:2] == ["duplex-supervisor", "serve"]
    # The README's Redis is this test's own; serve on a free port.
    worker = [redis_server.url if word.startswith("redis://") else word for word in worker]
    serve = [redis_server.url if word.startswith("redis://") else word for word in serve]
    engine = worker[worker.index("--engine") + 1]
    bus = worker[worker.index("--bus") + 1]
    with workers(bus, 1, engine):
        with trio.fail_after(LIMIT * 2):
            async with _serve_process([*MODULE, *serve[1:], "--port", "0"]) as served:
                client = await _open(served.url)
                await client.send_json({"type": "input", "client_event_id": "c1", "text": "hi"})
                await read_until(client, "response.done", client_event_id="c1")
                await client.cut()
                served.process.send_signal(signal.SIGTERM)


def test_the_readmes_demo_kills_a_worker_and_loses_nothing() -> None:
    from tests.redis_support import redis_binary
    from tests.test_cli import _run

    redis_binary()  # --bus local starts one: skipped (or failed in CI) without
    *_, demo = _readme_commands()
    assert demo[:2] == ["duplex-supervisor", "demo"]
    result = _run(*demo[1:], "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    totals = report["totals"]
    assert report["ok"] is True
    assert totals["engine_workers_killed"] == 1
    assert totals["lost"] == 0 and totals["duplicated"] == 0
    assert totals["answered"] == totals["inputs"] > 0
    assert {"inputs_redelivered", "fenced_engine_messages"} <= set(totals)


def test_the_demo_with_engine_workers_needs_both_flags() -> None:
    from tests.test_cli import _run

    result = _run("demo", "--engine-workers", "2", timeout=60)
    assert result.returncode == 2
    assert "--engine-workers N and --bus" in result.stderr


async def test_a_killed_gateways_session_gets_the_rest_of_its_answer_on_the_new_owner(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url
    serve = [*_serve(url), "--redis", url]
    with workers(url, 1, SLOW, SLOW_ANSWER_S="3"):
        with trio.fail_after(LIMIT * 3):
            async with _serve_process(serve) as first, _serve_process(serve) as second:
                client = await WireClient.connect(first.url)
                await client.send_json({"type": "session.open"})
                created = (await read_until(client, "session.created"))[-1]
                await client.send_json({"type": "input", "client_event_id": "c1", "text": "hi"})
                delta = (await read_until(client, "response.output_text.delta"))[-1]
                await client.cut()
                first.process.send_signal(signal.SIGKILL)  # mid-answer
                await first.process.wait()
                other = await WireClient.connect(second.url)
                await other.send_json(
                    {
                        "type": "session.resume",
                        "session_id": created["session_id"],
                        "resume_token": created["resume_token"],
                        "last_received_server_event_seq": delta["server_event_seq"],
                    }
                )
                frames = await read_until(other, "response.done", client_event_id="c1")
                frames += await _frames_for(other, 1.0)
                done = [f for f in frames if f.get("type") == "response.done"]
                assert len(done) == 1, frames
                assert done[0]["server_event_seq"] == 2
                await other.cut()
                second.process.send_signal(signal.SIGTERM)


def test_the_demo_with_engine_workers_runs_on_a_cluster(redis_cluster: LocalCluster) -> None:
    from tests.test_cli import _run

    result = _run(
        *("demo", "--engine-workers", "2", "--bus", redis_cluster.url),
        *("--clients", "4", "--duration", "4", "--json"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    totals = report["totals"]
    assert report["ok"] is True, report
    assert totals["engine_workers_killed"] == 1
    assert totals["lost"] == 0 and totals["duplicated"] == 0
    assert totals["answered"] == totals["inputs"] > 0
