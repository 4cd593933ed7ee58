"""Soak: a gateway under churning chaos clients for a bounded time.

``DUPLEX_SOAK_SECONDS`` sets how long (default 100 s, about two minutes with
set-up and drain, a small share of CI's 30 minutes);
``DUPLEX_SOAK_SECONDS=1800 pytest tests/test_soak.py`` soaks for half an hour.
``DUPLEX_FIGURES=figures.jsonl`` appends the run's figures to that file.

Load: ``LANES`` lanes, each running chaos rounds of 2-5 s back to back (one
client per round: it opens a session, acknowledges, sends inputs, cuts its
TCP connection about once a second, resumes, and closes the session at the
end of the round), so sessions are opened and closed all the time while the
engine streams 50 events/s into each. Faults on top: now and then a
session's sweep crashes (the supervisor restarts it; at most once per
session, well inside the restart budget) and a send is delayed.

Checked: nothing lost, repeated or refused (lost = duplicated = errors = 0),
every input answered once, every crash restarted, every session closed at
the end and no thread left over. Flatness: RSS and thread count are
sampled every second; after the warm-up (the first 20% of the run) and until
the last rounds start closing (the final 2 s), their spread (max - min) must
stay under ``RSS_SPREAD_BOUND`` and ``THREAD_SPREAD_BOUND``. Measured on a
2-core machine, four runs of 100 s (about 344 sessions, 66,000 events, 1,460
cuts and resumes, 80 crashes each): RSS spread 0.46-0.57 MiB around 52 MiB,
thread spread 0-1 (then one session thread per lane plus the supervisor's;
since step 13 sessions run on the gateway's loop and start no thread). The bounds, 4 MiB
and 4 threads, leave a wide margin for a noisier machine, yet a leak of ~100
bytes per event, or of a thread per session, breaks them; and at the end
the thread count must come back to what it was before the first client.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading

import pytest
import trio

from supervisor._faults import FaultPlan
from supervisor.cli._chaos import ChaosConfig, ClientReport, run_chaos
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig
from tests.soak_support import Sample, record_figures, sample_resources, serving

DURATION_S = float(os.environ.get("DUPLEX_SOAK_SECONDS", "100"))
LANES = 12
WARM_UP = 0.2
RSS_SPREAD_BOUND = 4 << 20
THREAD_SPREAD_BOUND = 4
ENGINE = EngineConfig(event_rate_hz=50)


async def _lane(url: str, lane: int, deadline: float, reports: list[ClientReport]) -> None:
    rng = random.Random(lane)  # noqa: S311 - test data
    for round_ in range(10**9):
        left = deadline - trio.current_time()
        if left < 1:
            return
        config = ChaosConfig(
            clients=1,
            duration_s=min(rng.uniform(2, 5), left),
            drop_rate=1.0,
            max_reconnect_delay_s=0.3,
            input_rate_hz=2.0,
            ack_every=5,
            seed=lane * 100_000 + round_,
        )
        report = await run_chaos(url, config)
        reports.append(report.totals)


async def _inject(gateway: Gateway, plan: FaultPlan) -> None:
    """A sweep crash or a delayed send for a random live session, twice a second."""
    rng = random.Random(99)  # noqa: S311 - test data
    crashed: set[str] = set()
    while True:
        await trio.sleep(0.5)
        live = [s for s in gateway.registry.session_ids() if s not in crashed]
        if not live:
            continue
        session_id = rng.choice(live)
        if rng.random() < 0.5:
            crashed.add(session_id)  # once per session: restarts stay within budget
            plan.crash(rng.choice(["tick.enter", "tick.pruned"]), session_id=session_id)
        else:
            plan.delay_send(session_id, seconds=0.05, nth=rng.randint(1, 40))


def _total(reports: list[ClientReport]) -> ClientReport:
    total = ClientReport()
    for report in reports:
        for f in dataclasses.fields(ClientReport):
            if f.name != "error_codes":
                setattr(total, f.name, getattr(total, f.name) + getattr(report, f.name))
        for code, n in report.error_codes.items():
            total.error_codes[code] = total.error_codes.get(code, 0) + n
    return total


def _spread(values: list[int]) -> int:
    return max(values) - min(values)


@pytest.mark.timeout(DURATION_S + 150)
async def test_soak_loses_nothing_and_stays_flat() -> None:
    plan = FaultPlan()
    samples: list[Sample] = []
    reports: list[ClientReport] = []
    with trio.fail_after(DURATION_S + 60):
        async with serving(GatewayConfig(port=0), engine=ENGINE, faults=plan) as gw:
            idle_threads = threading.active_count()
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_resources, samples)
                nursery.start_soon(_inject, gw, plan)
                async with trio.open_nursery() as lanes:
                    for lane in range(LANES):
                        lanes.start_soon(_lane, gw.url, lane, started + DURATION_S, reports)
                nursery.cancel_scope.cancel()
            elapsed = trio.current_time() - started
            # Every session was closed by its client, and its thread is gone.
            while gw.registry.session_ids() or threading.active_count() > idle_threads:
                await trio.sleep(0.05)
            stats, counters = gw.registry.stats(), gw.counters

    totals = _total(reports)
    steady = [s for s in samples if DURATION_S * WARM_UP <= s.at_s <= DURATION_S - 2]
    assert len(steady) >= 2, f"DUPLEX_SOAK_SECONDS={DURATION_S} leaves no steady window"
    rss_spread = _spread([s.rss for s in steady])
    thread_spread = _spread([s.threads for s in steady])
    crashes = plan.fired["tick.enter"] + plan.fired["tick.pruned"]
    record_figures(
        "test_soak_loses_nothing_and_stays_flat",
        {
            "duration_s": round(elapsed, 1),
            "lanes": LANES,
            **dataclasses.asdict(totals),
            "events_journaled": stats.events_journaled,
            "crashes_injected": crashes,
            "restarts": stats.restarts,
            "delays_injected": plan.fired["send.delay"],
            "rollbacks": stats.rollbacks,
            "samples": len(steady),
            "rss_mib_min_max": [round(f(s.rss for s in steady) / 2**20, 2) for f in (min, max)],
            "rss_spread_mib": round(rss_spread / 2**20, 2),
            "threads_min_max": [f(s.threads for s in steady) for f in (min, max)],
            "thread_spread": thread_spread,
        },
    )
    assert (totals.lost, totals.duplicated, totals.errors) == (0, 0, 0), totals
    assert totals.error_codes == {} and counters.errors == {}
    assert totals.answered == totals.inputs > 0
    assert totals.resumes == totals.disconnects > 0
    assert totals.sessions == len(reports) == counters.sessions_opened
    # (a close drops what its attachment had not sent yet: nothing to resume then)
    assert 0 < totals.events_delivered <= stats.events_journaled
    assert stats.crashes == stats.restarts == crashes
    assert stats.sessions_failed == stats.sessions_expired == stats.gap_errors == 0
    assert len(steady) >= DURATION_S * 0.5
    assert rss_spread < RSS_SPREAD_BOUND, [s.rss for s in steady]
    assert thread_spread <= THREAD_SPREAD_BOUND, [s.threads for s in steady]
