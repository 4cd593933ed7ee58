"""``demo --redis cluster-local``: gateway processes on a private Redis Cluster, a primary killed.

The demo starts a cluster of its own (`local_redis_cluster`: 3 primaries, 3
replicas, ``cluster-node-timeout`` 1000 ms, ``cluster-require-full-coverage
no``) and ``--processes`` ``serve --redis redis+cluster://...`` children on it
(3 unless told 2 or more), and runs the chaos crowd against them as ``demo
--processes`` does: each connect and resume goes to a process picked at random.
Halfway through, the primary serving the most of the clients' sessions is
killed with SIGKILL. The
cluster promotes its replica; the demo watches for that (another node serving
those slots), then starts the killed node again, and it rejoins as the new
primary's replica. With ``--redis-durability replicas=K`` every node runs with
``min-replicas-to-write K``, so a commit waits for its replica and a primary
left without one refuses writes: the killed primary's sessions are then
unavailable until the old node is back as a replica.

What each client waited is measured by the clients themselves
(`Targets.store_fault_at`, set at the kill): per session, the longest wait
for a new event that began before the cluster was whole again (the killed
node back as a replica; the run's end if it never was). The sessions whose
slots the killed primary served (their ids hash to those slots) are the
affected ones; the others show what the failover cost the sessions it did not
touch (their waits include the chaos clients' own cuts and reconnect delays).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from supervisor.cli._chaos import ChaosConfig, ChaosReport, Targets
from supervisor.cli._demo_processes import gateway_processes, serve_command
from supervisor.cli._local_redis_cluster import (
    LocalRedisCluster,
    local_redis_cluster,
    slot_of_session,
)

__all__ = ["DEFAULT_PROCESSES", "ClusterFigures", "run_cluster_demo"]

#: Gateway processes when ``--processes`` does not ask for 2 or more.
DEFAULT_PROCESSES = 3

#: Bounds the wait for the promotion and for the killed node's return.
_FAILOVER_LIMIT_S = 60.0


@dataclass(slots=True, kw_only=True)
class ClusterFigures:
    """What the demo did to the cluster, and what the sessions waited."""

    processes: int
    durability_replicas: int
    #: The killed primary's port and the slot ranges it served.
    killed_port: int | None = None
    killed_slots: list[tuple[int, int]] = field(default_factory=list)
    #: Seconds from the SIGKILL to a replica serving its slots (``None``: not seen).
    failover_s: float | None = None
    #: Seconds from the SIGKILL to the killed node linked again as a replica.
    rejoined_s: float | None = None
    #: Per session (client), its longest wait for a new event that began
    #: between the kill and the cluster's being whole again.
    affected_waits: list[float] = field(default_factory=list)
    other_waits: list[float] = field(default_factory=list)
    #: Sessions that received no new event after the kill.
    stranded: int = 0

    @property
    def failovers_seen(self) -> int:
        return int(self.failover_s is not None)

    @property
    def ok(self) -> bool:
        """A primary killed, its replica promoted, every session through again."""
        return self.killed_port is not None and self.failovers_seen == 1 and self.stranded == 0

    def measure(self, report: ChaosReport) -> None:
        """Sort the clients' waits into the affected sessions' and the others'."""
        for client in report.clients:
            if not client.session_id:
                continue  # never opened: counted as an error already
            slot = slot_of_session(client.session_id)
            affected = any(low <= slot <= high for low, high in self.killed_slots)
            whole = math.inf if self.rejoined_s is None else self.rejoined_s
            waits = [end - began for began, end in client.waits_after_fault if began < whole]
            if waits:
                (self.affected_waits if affected else self.other_waits).append(max(waits))
            if self.killed_port is not None and client.events_after_fault == 0:
                self.stranded += 1

    def rows(self, report: ChaosReport) -> list[tuple[str, object]]:
        """The table's rows after the chaos clients' own."""
        t = report.totals
        sessions = len(self.affected_waits) + len(self.other_waits)
        return [
            ("gateway processes", self.processes),
            ("resumes across processes", t.resumes_across_processes),
            ("store retries (store_unavailable, tried again)", t.store_retries),
            ("redis durability", f"replicas={self.durability_replicas}"),
            ("primaries SIGKILLed", 0 if self.killed_port is None else 1),
            ("failovers seen (replica promoted)", self._failovers()),
            ("killed node back as a replica after (s)", _seconds(self.rejoined_s)),
            ("sessions on the killed primary", f"{len(self.affected_waits)} of {sessions}"),
            ("unavailable per affected session, max / p50 (s)", _spread(self.affected_waits)),
            ("the other sessions' longest wait, max / p50 (s)", _spread(self.other_waits)),
            ("stranded (no event after the kill)", self.stranded),
        ]

    def _failovers(self) -> str:
        if self.killed_port is None:
            return "0 (raise --duration)"
        if self.failover_s is None:
            return "0 (not promoted)"
        return f"1 (after {self.failover_s:.1f} s)"

    def totals(self, report: ChaosReport) -> dict[str, object]:
        """``--json``'s keys under ``totals``, after the clients' own."""
        t = report.totals
        return {
            "processes": self.processes,
            "resumes_across_processes": t.resumes_across_processes,
            "store_retries": t.store_retries,
            "redis_durability_replicas": self.durability_replicas,
            "primaries_killed": 0 if self.killed_port is None else 1,
            "failovers_seen": self.failovers_seen,
            "failover_s": self.failover_s,
            "rejoined_s": self.rejoined_s,
            "affected_sessions": len(self.affected_waits),
            "unavailable_max_s": max(self.affected_waits, default=None),
            "unavailable_p50_s": _median(self.affected_waits),
            "others_wait_max_s": max(self.other_waits, default=None),
            "others_wait_p50_s": _median(self.other_waits),
            "stranded": self.stranded,
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _spread(values: list[float]) -> str:
    return f"{_seconds(max(values, default=None))} / {_seconds(_median(values))}"


async def _until(check: Callable[[], bool], limit_s: float) -> bool:
    """Poll ``check`` (in a thread: it runs redis-cli) until true or ``limit_s``."""
    with trio.move_on_after(limit_s):
        while not await trio.to_thread.run_sync(check):
            await trio.sleep(0.1)
        return True
    return False


def _busiest(primaries: dict[int, list[tuple[int, int]]], session_ids: list[str]) -> int:
    """The primary serving the most of ``session_ids`` (the first, on a tie)."""
    slots = [slot_of_session(session_id) for session_id in session_ids]

    def serving(port: int) -> int:
        return sum(any(low <= slot <= high for low, high in primaries[port]) for slot in slots)

    return max(sorted(primaries), key=serving)


def _promoted(cluster: LocalRedisCluster, old: int, slot: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return cluster.primary_of_slot(slot) != old
        except LookupError:  # marked failed, nobody promoted yet
            return False

    return check


async def run_cluster_demo(
    args: argparse.Namespace,
    server: str,
    config: ChaosConfig,
    run: Callable[[Targets, ChaosConfig], Awaitable[ChaosReport]],
) -> tuple[ChaosReport, ClusterFigures]:
    """Start the cluster and the gateways, run the crowd with ``run(targets,
    config)``, SIGKILL a primary halfway, watch the failover."""
    durability = args.redis_durability
    figures = ClusterFigures(
        processes=args.processes if args.processes > 1 else DEFAULT_PROCESSES,
        durability_replicas=durability,
    )
    with local_redis_cluster(min_replicas_to_write=durability) as cluster:
        command = serve_command(args, server, cluster.url)
        async with gateway_processes(command, figures.processes) as gateways:
            targets = Targets([gateway.url for gateway in gateways])

            async def fail_one() -> None:
                await trio.sleep(config.duration_s / 2)
                primaries = await trio.to_thread.run_sync(cluster.primaries)
                victim = _busiest(primaries, targets.session_ids)
                # Marked first: each client's wait runs from the kill.
                began = targets.store_fault_at = trio.current_time()
                await trio.to_thread.run_sync(cluster.kill, victim)
                figures.killed_port, figures.killed_slots = victim, primaries[victim]
                first_slot = primaries[victim][0][0]
                if not await _until(_promoted(cluster, victim, first_slot), _FAILOVER_LIMIT_S):
                    return
                figures.failover_s = trio.current_time() - began
                await trio.to_thread.run_sync(cluster.start_node, victim)
                if await _until(cluster.settled, _FAILOVER_LIMIT_S):
                    figures.rejoined_s = trio.current_time() - began

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail_one)
                report = await run(targets, config)
                nursery.cancel_scope.cancel()
    figures.measure(report)
    return report, figures
