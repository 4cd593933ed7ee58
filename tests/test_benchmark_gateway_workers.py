"""The ``serve --workers`` row of the gateway benchmark: its shape, never its speed.

``python -m benchmarks --quick --only gateway_workers`` runs the same load
against ``serve --workers 1`` and ``serve --workers 2`` on one Redis; this
checks that both delivered `StampedEngine`'s events (every worker took
connections and no event arrived unstamped), that the kernel's split of the
connections is counted whole, and that the table and the JSON carry both
sides and their ratios.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from benchmarks.gateway_workers import WORKERS, connections_per_process
from tests.benchmark_support import run_quick_with_redis


def test_connections_are_counted_for_the_process_that_accepted_them() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            # The clients' ends are this process's too, but on other local ports.
            assert connections_per_process(port, [os.getpid()]) == [3]
            accepted.pop().close()
            assert connections_per_process(port, [os.getpid()]) == [2]
        finally:
            for sock in clients + accepted:
                sock.close()


def test_quick_mode_measures_two_workers_beside_one(tmp_path: Path) -> None:
    units, entry = run_quick_with_redis("gateway_workers", tmp_path)
    assert units["gateway_workers/trio"] == "events/s at saturation"
    assert units["gateway_workers/trio 100 clients"] == f"events/s, {WORKERS} workers"
    assert units["gateway_workers/trio CPU"] == "CPU us/event, workers"
    assert units["gateway_workers/trio spread"] == "largest worker's share"
    assert entry["workers"] == WORKERS
    (load,) = entry["loads"].values()
    for key in ("events_per_s", "one_worker_events_per_s", "cpu_us_per_event"):
        assert load[key] > 0, key
    assert load["with_redis_cpu_us_per_event"] > load["cpu_us_per_event"]
    assert load["events_ratio"] == load["events_per_s"] / load["one_worker_events_per_s"]
    if entry["ratio"] is not None:  # both held 100 clients (not under every load)
        assert entry["ratio"] == entry["events_per_s"] / entry["one_worker_events_per_s"]
    assert sorted(p["workers"] for p in entry["points"]) == [1, WORKERS]
    for point in entry["points"]:
        assert (point["opened"], point["dropped"], point["errors"]) == (100, 0, {})
        assert point["unstamped"] == 0  # every event from StampedEngine, in every worker
        # Each connection counted once, in the worker that accepted it: every worker took some.
        assert len(point["connections"]) == point["workers"]
        assert sum(point["connections"]) == 100
        assert all(n > 0 for n in point["connections"])
    (split,) = entry["connections_per_worker"]
    assert entry["largest_share"] == max(split) / 100
