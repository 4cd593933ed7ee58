"""The engine-bus row of the gateway benchmark: its shape, never its speed.

``python -m benchmarks --quick --only gateway_bus`` runs the same load
against the gateway with its engine in-process and with its engine in worker
processes over the Redis Streams bus; this checks that both arrived stamped
events and that the table and the JSON carry both sides and their ratios.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.gateway_bus import WORKERS
from tests.benchmark_support import run_quick_with_redis


def test_quick_mode_measures_the_bus_beside_the_in_process_engine(tmp_path: Path) -> None:
    units, entry = run_quick_with_redis("gateway_bus", tmp_path)
    assert units["gateway_bus/trio 100 clients"] == "events/s, bus"
    assert units["gateway_bus/trio 100 clients p99"] == "ms p99, bus"
    assert units["gateway_bus/trio"] == "CPU us/event, all procs"
    assert entry["workers"] == WORKERS
    (load,) = entry["loads"].values()
    for key in ("events_per_s", "p99_ms", "inprocess_events_per_s", "inprocess_p99_ms"):
        assert load[key] > 0, key
    assert load["events_ratio"] == load["events_per_s"] / load["inprocess_events_per_s"]
    assert load["p99_ratio"] == load["inprocess_p99_ms"] / load["p99_ms"]
    assert load["total_cpu_us_per_event"] > load["gateway_cpu_us_per_event"] > 0
    engines = [p["engine"] for p in entry["points"]]
    assert sorted(engines) == ["bus", "in-process"]
    for point in entry["points"]:
        assert (point["opened"], point["dropped"], point["errors"]) == (100, 0, {})
    # Every worker held sessions during the load: the workers were all up before the gateway.
    ((*held,),) = load["entries_held_per_worker"]
    assert len(held) == WORKERS
    assert all(n > 0 for n in held)
