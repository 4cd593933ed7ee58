"""``demo --redis cluster-local``: gateway processes on a private Redis Cluster
whose busiest primary is SIGKILLed halfway (supervisor/cli/_demo_cluster.py).

The demo runs start real processes and a real cluster (skipped without
redis-server and redis-cli, failed instead under ``DUPLEX_REQUIRE_REDIS=1``);
the figures' own rules are checked on reports made by hand.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from supervisor.cli._chaos import ChaosReport, ClientReport
from supervisor.cli._demo_cluster import ClusterFigures
from supervisor.cli._local_redis_cluster import slot_of_session
from tests.redis_support import redis_binary
from tests.test_cli import _run
from tests.test_redis_demo import redis_servers

#: Sessions whose ids hash into the killed primary's slots, and others.
KILLED_SLOTS = [(0, 5460)]


def _cluster_demo(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    redis_binary()  # skip (or fail in CI) without redis-server
    redis_binary("redis-cli")
    result = _run(
        "demo",
        "--redis", "cluster-local",
        "--clients", "8",
        "--duration", "8",
        *flags,
        timeout=240,
        tmpdir=tmp_path,
    )  # fmt: skip
    assert redis_servers(tmp_path) == []  # every node of its cluster is gone
    return result


def _row(table: str, name: str) -> str:
    """The value in the table's row ``name``."""
    match = re.search(rf"│ {re.escape(name)} +│ +(.+?) │", table)
    assert match is not None, (name, table)
    return match.group(1)


def test_a_failover_under_replicas_1_loses_and_repeats_nothing(tmp_path: Path) -> None:
    result = _cluster_demo(tmp_path, "--redis-durability", "replicas=1")
    # A string, not a tuple: pytest shortens a tuple's repr, and the table is what says why.
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    table = result.stdout
    for name in ("lost", "duplicated", "errors", "stranded (no event after the kill)"):
        assert _row(table, name) == "0", name
    assert _row(table, "primaries SIGKILLed") == "1"
    assert re.fullmatch(r"1 \(after \d+\.\d s\)", _row(table, "failovers seen (replica promoted)"))
    assert _row(table, "redis durability") == "replicas=1"
    affected, _, sessions = _row(table, "sessions on the killed primary").partition(" of ")
    assert sessions == "8" and 1 <= int(affected) <= 8  # the busiest primary serves some
    unavailable = _row(table, "unavailable per affected session, max / p50 (s)")
    assert re.fullmatch(r"\d+\.\d / \d+\.\d", unavailable), unavailable
    assert _row(table, "verdict") == "nothing lost or repeated"
    assert "Traceback" not in result.stderr


def test_json_ok_and_the_exit_status_agree_without_durability(tmp_path: Path) -> None:
    result = _cluster_demo(tmp_path, "--json")
    lines = result.stdout.splitlines()
    assert len(lines) == 1, (result.stdout, result.stderr)
    report = json.loads(lines[0])
    totals = report["totals"]
    assert (result.returncode == 0) == report["ok"], (totals, result.stderr)
    assert totals["processes"] == 3
    assert totals["redis_durability_replicas"] == 0
    assert (totals["primaries_killed"], totals["failovers_seen"]) == (1, 1), totals
    assert totals["failover_s"] > 0 and totals["rejoined_s"] >= totals["failover_s"]
    assert totals["affected_sessions"] >= 1
    assert totals["unavailable_max_s"] >= totals["unavailable_p50_s"] > 0


def test_demo_help_teaches_the_cluster_run() -> None:
    result = _run("demo", "--help")
    assert result.returncode == 0
    assert "'cluster-local'" in result.stdout and "Redis Cluster" in result.stdout
    assert "'failovers seen'" in result.stdout and "replicas=K" in result.stdout
    assert "--redis-durability" in result.stdout


def test_the_cluster_demo_takes_no_workers_nor_store_outage() -> None:
    for flags in (["--workers", "2"], ["--store-outage", "1:1"]):
        result = _run("demo", "--redis", "cluster-local", *flags)
        assert result.returncode == 2, result.stderr
        assert "takes neither --workers nor --store-outage" in result.stderr


def test_durability_needs_replicas_to_wait_for() -> None:
    result = _run("demo", "--redis", "local", "--redis-durability", "replicas=1")
    assert result.returncode == 2
    assert "--redis-durability needs replicas: --redis cluster-local or a URL" in result.stderr


def _client(session_id: str, *, waits: list[tuple[float, float]], events: int) -> ClientReport:
    return ClientReport(
        sessions=1, session_id=session_id, waits_after_fault=waits, events_after_fault=events
    )


def _ids() -> tuple[str, str]:
    """A session id on the killed slots and one elsewhere."""
    inside = next(f"s{n}" for n in range(100) if slot_of_session(f"s{n}") <= 5460)
    outside = next(f"s{n}" for n in range(100) if slot_of_session(f"s{n}") > 5460)
    return inside, outside


def test_waits_are_sorted_by_the_slot_of_each_session() -> None:
    inside, outside = _ids()
    clients = [
        _client(inside, waits=[(0.0, 0.1), (0.1, 3.0), (3.0, 3.1)], events=5),
        # A cut's wait that began once the cluster was whole again is not the failover's.
        _client(outside, waits=[(0.0, 0.4), (3.4, 4.4)], events=9),
        _client("", waits=[], events=0),  # never opened: in neither list
    ]
    figures = ClusterFigures(
        processes=3, durability_replicas=1, killed_port=7000, killed_slots=KILLED_SLOTS
    )
    figures.failover_s, figures.rejoined_s = 2.0, 3.2
    figures.measure(ChaosReport(totals=ClientReport(), clients=clients))
    assert figures.affected_waits == [pytest.approx(2.9)]
    assert figures.other_waits == [pytest.approx(0.4)]
    assert figures.stranded == 0
    assert figures.ok


def test_a_session_with_no_event_after_the_kill_is_stranded() -> None:
    inside, outside = _ids()
    figures = ClusterFigures(
        processes=3, durability_replicas=0, killed_port=7000, killed_slots=KILLED_SLOTS
    )
    figures.failover_s = 2.0
    clients = [
        _client(inside, waits=[(0.0, 5.0)], events=0),
        _client(outside, waits=[(0.0, 0.3)], events=4),
    ]
    figures.measure(ChaosReport(totals=ClientReport(), clients=clients))
    assert figures.stranded == 1
    assert not figures.ok


@pytest.mark.parametrize(
    ("killed_port", "failover_s"), [(None, None), (7000, None)], ids=["no kill", "no promotion"]
)
def test_a_run_without_a_kill_or_a_promotion_is_not_ok(
    killed_port: int | None, failover_s: float | None
) -> None:
    figures = ClusterFigures(processes=3, durability_replicas=0, killed_port=killed_port)
    figures.failover_s = failover_s
    figures.measure(ChaosReport(totals=ClientReport(), clients=[]))
    assert not figures.ok
    rows = dict(figures.rows(ChaosReport(totals=ClientReport(), clients=[])))
    assert str(rows["failovers seen (replica promoted)"]).startswith("0 (")
