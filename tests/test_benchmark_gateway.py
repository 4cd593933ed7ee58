"""The gateway benchmark's harness: what it measures and reports, never how fast.

Every figure below is a structure (keys present, every client opened, events
arrived stamped); no test asserts a time or a rate.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gateway import P99_LIMIT_MS, Point, measure_point, saturate
from benchmarks.gateway_server import MODES, SHELLS

KEYS = (
    "events_per_s",
    "p50_ms",
    "p99_ms",
    "floor_events_per_s",
    "baseline_events_per_s",
    "ratio",
)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", MODES)
async def test_every_server_streams_stamped_events_to_a_generator_process(
    shell: str, mode: str
) -> None:
    point = await measure_point(shell, mode, 4, warmup_s=0.2, seconds=0.6)
    assert (point.opened, point.dropped, point.errors) == (4, 0, {})
    assert point.events_per_s > 0
    assert not math.isnan(point.p50_ms)
    assert point.p50_ms <= point.p99_ms
    # /proc counts a process's CPU in 10 ms ticks: a light server (the floor)
    # may be charged none in this short window, so only the figure's sanity.
    assert math.isfinite(point.server_cpu) and point.server_cpu >= 0
    assert point.loader_cpu > 0


def _point(clients: int, *, held: bool) -> Point:
    point = Point("trio", "ours", clients, clients * 20.0, opened=clients)
    point.events_per_s = clients * 20.0
    point.p99_ms = 1.0 if held else P99_LIMIT_MS
    return point


def test_a_load_is_held_only_with_every_event_on_time() -> None:
    assert _point(10, held=True).held
    assert not _point(10, held=False).held  # p99 at the limit
    short = _point(10, held=True)
    short.events_per_s = 0.94 * 200
    assert not short.held
    dropped = _point(10, held=True)
    dropped.dropped = 1
    assert not dropped.held


async def test_the_search_bisects_between_held_and_failed() -> None:
    limit = 700
    measured: list[int] = []

    async def measure(clients: int) -> Point:
        measured.append(clients)
        return _point(clients, held=clients <= limit)

    known = {200: _point(200, held=True), 1000: _point(1000, held=False)}
    best = await saturate(known, measure, steps=3, max_clients=4000)
    assert measured == [600, 800, 700]
    assert best is not None
    assert best.clients == 700


async def test_the_search_doubles_while_nothing_failed_and_stops_at_the_cap() -> None:
    measured: list[int] = []

    async def measure(clients: int) -> Point:
        measured.append(clients)
        return _point(clients, held=True)

    best = await saturate({200: _point(200, held=True)}, measure, steps=5, max_clients=1000)
    assert measured == [400, 800]
    assert best is not None
    assert best.clients == 800


async def test_the_search_halves_when_nothing_held() -> None:
    measured: list[int] = []

    async def measure(clients: int) -> Point:
        measured.append(clients)
        return _point(clients, held=False)

    best = await saturate({200: _point(200, held=False)}, measure, steps=2, max_clients=1000)
    assert measured == [100, 50]
    assert best is None


def test_quick_mode_reports_every_key_per_shell_and_draws_the_charts(tmp_path: Path) -> None:
    # A process of its own, as CI runs it (and matplotlib stays out of this one).
    out = tmp_path / "bench.json"
    argv = ["--quick", "--only", "gateway", "--json", str(out), "--plot", str(tmp_path)]
    done = subprocess.run(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "benchmarks", *argv], capture_output=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"gateway/trio" in done.stdout
    document = json.loads(out.read_text())
    gateway = document["scenarios"]["gateway"]
    assert set(gateway) == set(SHELLS)
    for entry in gateway.values():
        assert set(KEYS) <= set(entry)
        (load,) = entry["loads"].values()
        assert {"events_per_s", "floor_events_per_s", "baseline_events_per_s"} <= set(load)
        assert {p["mode"] for p in entry["points"]} == set(MODES)
    for name in ("gateway_events.png", "gateway_p99.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
