"""``demo --processes N --redis`` and inputs across real ``serve --redis`` processes.

Real processes, a real redis-server (skipped with a message saying how to run
them when ``redis-server`` is not on PATH; see tests/redis_support.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from actors._store import input_key
from benchmarks.common import QUICK
from benchmarks.gateway import redis_store
from supervisor.cli._demo_processes import local_redis
from supervisor.cli._wire_client import WireClient
from supervisor.redis_store import RedisStore
from tests.gateway_support import LIMIT, read_until
from tests.redis_support import RedisServer, redis_binary
from tests.test_cli import MODULE, _env, _run, _serve_process


def redis_servers(under: Path = Path("/")) -> list[int]:
    """Pids of redis-servers running in ``under`` or below (a demo runs its
    own in a temporary directory: with ``TMPDIR`` set, under that)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"redis-server" in cmdline and cwd.startswith(str(under)):
            pids.append(int(entry.name))
    return pids


def _totals(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    lines = result.stdout.splitlines()
    assert len(lines) == 1, (result.stdout, result.stderr)
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    totals = report["totals"]
    assert isinstance(totals, dict)
    return totals


def _crowd_on_three_processes(
    *flags: str, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``demo --processes 3 --redis local`` with 9 clients, cutting often, ``--json``
    (its temporary files under ``tmpdir`` when given)."""
    return _run(
        "demo",
        "--processes", "3",
        "--redis", "local",
        "--clients", "9",
        "--drop-rate", "1.5",
        "--input-rate", "2",
        "--json",
        *flags,
        timeout=180,
        tmpdir=tmpdir,
    )  # fmt: skip


def test_demo_on_three_processes_loses_and_repeats_nothing_through_a_kill(tmp_path: Path) -> None:
    redis_binary()  # skip (or fail in CI) without redis-server
    result = _crowd_on_three_processes("--duration", "6", tmpdir=tmp_path)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    totals = _totals(result)
    assert (totals["lost"], totals["duplicated"], totals["errors"]) == (0, 0, 0), totals
    assert totals["processes"] == 3
    assert totals["stranded"] == 0  # every client of the killed process resumed
    assert isinstance(totals["takeovers"], int) and totals["takeovers"] >= 1, totals
    across = totals["resumes_across_processes"]
    assert isinstance(across, int) and across >= totals["takeovers"], totals
    assert totals["answered"] == totals["inputs"], totals
    assert redis_servers(tmp_path) == []  # its redis-server is gone


def test_demo_through_a_store_outage_retries_and_loses_nothing() -> None:
    # The demo's own redis-server is SIGKILLed 2 s in and restarted from its
    # append-only file 2 s later; one gateway process is SIGKILLed at 4 s.
    redis_binary()
    result = _crowd_on_three_processes("--store-outage", "2:2", "--duration", "8")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    totals = _totals(result)
    assert (totals["lost"], totals["duplicated"], totals["errors"]) == (0, 0, 0), totals
    assert (totals["lost_upstream"], totals["duplicated_upstream"]) == (0, 0), totals
    assert totals["client_events_received_once"] == totals["client_events_sent"], totals
    assert totals["answered"] == totals["inputs"], totals
    assert (totals["stranded"], totals["processes_killed"]) == (0, 1), totals
    # Resumes met the outage, were answered store_unavailable and tried again.
    retries = totals["store_retries"]
    assert isinstance(retries, int) and retries >= 1, totals
    outage = totals["store_outage_s"]
    assert isinstance(outage, float) and outage >= 2, totals


def test_demo_table_shows_the_store_outage_rows() -> None:
    redis_binary()
    result = _run(
        "demo",
        "--processes", "2",
        "--redis", "local",
        "--store-outage", "1:2",
        "--clients", "4",
        "--duration", "5",
        "--drop-rate", "2",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    for row in ("store outage (s)", "store retries", "processes SIGKILLed", "stranded"):
        assert row in result.stdout, result.stdout
    assert "nothing lost or repeated" in result.stdout


def test_demo_store_outage_needs_its_own_redis_and_must_end_in_the_run() -> None:
    given = _run(
        "demo", "--processes", "2", "--redis", "redis://127.0.0.1:1/0",
        "--store-outage", "1:1", "--duration", "5",
    )  # fmt: skip
    assert given.returncode == 2, given.stderr
    assert "--redis local" in given.stderr and "Traceback" not in given.stderr
    late = _run(
        "demo", "--processes", "2", "--redis", "local",
        "--store-outage", "3:2", "--duration", "5",
    )  # fmt: skip
    assert late.returncode == 2, late.stderr
    assert "before --duration" in late.stderr
    for bad in ("3", "x:1", "1:0", "-1:1"):
        malformed = _run("demo", "--store-outage", bad)
        assert malformed.returncode == 2, (bad, malformed.stderr)
        assert "--store-outage" in malformed.stderr, malformed.stderr


def test_demo_on_two_processes_of_a_given_redis_prints_the_rows(
    redis_server: RedisServer,
) -> None:
    result = _run(
        "demo",
        "--processes", "2",
        "--redis", redis_server.url,
        "--clients", "4",
        "--duration", "4",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    for row in ("resumes across processes", "takeovers", "stranded", "lost", "duplicated"):
        assert row in result.stdout, result.stdout
    assert "nothing lost or repeated" in result.stdout


def test_demo_with_local_redis_and_no_redis_server_names_the_fix(tmp_path: Path) -> None:
    env = _env(PATH=str(tmp_path))  # no redis-server there
    result = subprocess.run(  # noqa: S603 - our own command line
        [*MODULE, "demo", "--processes", "3", "--redis", "local", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "redis-server" in result.stderr and "apt-get install" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_help_teaches_the_processes_run() -> None:
    result = _run("demo", "--help")
    assert result.returncode == 0
    assert "--processes" in result.stdout and "--redis" in result.stdout
    assert "SIGKILL" in result.stdout and "'local'" in result.stdout
    assert "--store-outage" in result.stdout and "AT:SECONDS" in result.stdout
    assert "append-only file" in result.stdout and "store_unavailable" in result.stdout


async def test_an_input_answered_before_a_cut_is_not_answered_again_elsewhere(
    redis_server: RedisServer,
) -> None:
    # Answers only (no stream): the resend after the resume must get the one
    # journaled answer (replayed) and input.duplicate, never a second answer.
    serve = [*MODULE, "serve", "--port", "0", "--event-rate", "0", "--redis", redis_server.url]
    store = RedisStore(redis_server.url)
    try:
        with trio.fail_after(LIMIT * 2):
            async with _serve_process(serve) as first, _serve_process(serve) as second:
                client = await WireClient.connect(first.url)
                await client.send_json({"type": "session.open"})
                created = (await read_until(client, "session.created"))[-1]
                session_id = str(created["session_id"])
                await client.send_json({"type": "input", "client_event_id": "q1", "text": "hi"})
                await client.cut()  # before any answer arrived
                # Wait until the first process journaled the answer's end.
                while store.claim_input(session_id, "the-test", input_key("q1")) is not False:
                    await trio.sleep(0.05)

                other = await WireClient.connect(second.url)
                try:
                    await other.send_json(
                        {
                            "type": "session.resume",
                            "session_id": session_id,
                            "resume_token": created["resume_token"],
                            "last_received_server_event_seq": 0,
                        }
                    )
                    await other.send_json({"type": "input", "client_event_id": "q1", "text": "hi"})
                    frames = await read_until(other, "input.duplicate")
                    # A second answer would come right after; give it the time.
                    with trio.move_on_after(1):
                        while True:
                            frames.append(await other.receive_json())
                finally:
                    await other.cut()
                    for served in (first, second):
                        served.process.send_signal(2)
        answers = [f for f in frames if f.get("type") == "response.done"]
        assert [a.get("client_event_id") for a in answers] == ["q1"], frames
        seqs = [f["server_event_seq"] for f in frames if "server_event_seq" in f]
        assert seqs == list(range(1, len(seqs) + 1)), frames
    finally:
        store.close()


def test_local_redis_is_stopped_when_the_block_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_binary()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its directory under ours
    with local_redis() as url:
        assert url.startswith("redis://127.0.0.1:")
        store = RedisStore(url)
        store.ping()
        store.close()
        ours = redis_servers(tmp_path)
        assert len(ours) == 1
    assert redis_servers(tmp_path) == []  # waited for: stopped, not just signalled


async def test_the_gateway_benchmark_measures_the_redis_store_beside_memory() -> None:
    redis_binary()
    size = dataclasses.replace(QUICK, gateway_loads=(4,), gateway_s=0.6, gateway_warmup_s=0.2)
    figures = await redis_store(size)
    assert figures["redis_pairs"] == 1
    loads = figures["redis_loads"]
    assert isinstance(loads, dict)
    load = loads["4"]
    for key in (
        "memory_cpu_us_per_event",
        "redis_gateway_cpu_us_per_event",
        "redis_total_cpu_us_per_event",
        "redis_ratio",
    ):
        assert load[key] > 0, (key, load)
    # The Redis server worked for the Redis variant: more CPU per event in all.
    assert load["redis_total_cpu_us_per_event"] > load["redis_gateway_cpu_us_per_event"]
    assert figures["redis_ratio"] == load["redis_ratio"]


def test_demo_across_processes_needs_both_flags() -> None:
    for argv in (["--processes", "3"], ["--redis", "local"], ["--processes", "1", "--redis", "x"]):
        result = _run("demo", *argv, "--duration", "1")
        assert result.returncode == 2, (argv, result.stderr)
        assert "--processes 2 or more and --redis" in result.stderr
        assert "Traceback" not in result.stderr
