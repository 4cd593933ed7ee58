"""What a chaos run or a demo reports: its table, its ``--json``, its verdict
(the exit status), and the progress shown while it runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from supervisor.cli._chaos import ChaosConfig, ChaosReport, ClientReport, Targets, run_chaos
from supervisor.cli._demo_cluster import ClusterFigures
from supervisor.cli._demo_processes import ProcessesFigures
from supervisor.cli._demo_serve_workers import PoolFigures
from supervisor.gateway._server import Gateway

if TYPE_CHECKING:
    from supervisor.cli._demo_workers import WorkerFigures

__all__ = [
    "PROGRESS_LINE_INTERVAL_S",
    "RunFigures",
    "report_table",
    "run_chaos_shown",
    "totals_json",
    "verdict",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFigures:
    """What a run reports beside the clients' totals (each demo adds its own)."""

    processes: int = 1
    workers: WorkerFigures | None = None
    pool: PoolFigures | None = None
    figures: ProcessesFigures | None = None
    cluster: ClusterFigures | None = None


def report_table(report: ChaosReport, gateway: Gateway | None, run: RunFigures) -> Table:
    t = report.totals
    table = Table(title="duplex-supervisor chaos run", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows: list[tuple[str, object]] = [
        ("sessions", t.sessions),
        ("events delivered", t.events_delivered),
        ("disconnects", t.disconnects),
        ("resumes", t.resumes),
        ("replayed events", t.replayed),
        ("inputs (answered)", f"{t.inputs} ({t.answered})"),
        ("lost", t.lost),
        ("duplicated", t.duplicated),
        ("client events sent", t.client_events_sent),
        ("client events received once", t.client_events_received_once),
        ("lost upstream", t.lost_upstream),
        ("duplicated upstream", t.duplicated_upstream),
        ("errors", t.errors),
        *_error_kinds(t.error_codes),
        *_run_rows(report, run),
    ]
    if gateway is not None:
        stats = gateway.registry.stats()
        rows.append(("server: events journaled", stats.events_journaled))
        rows.append(("server: crashes / restarts", f"{stats.crashes} / {stats.restarts}"))
    for name, value in rows:
        table.add_row(name, str(value))
    ok = verdict(report, run)
    table.add_row("verdict", "[green]nothing lost or repeated[/]" if ok else "[red]FAILED[/]")
    return table


def _error_kinds(codes: dict[str, int]) -> list[tuple[str, object]]:
    """The errors' kinds, when there were any: a failed run says what it met."""
    if not codes:
        return []
    return [("errors by kind", ", ".join(f"{code} {n}" for code, n in sorted(codes.items())))]


def _run_rows(report: ChaosReport, run: RunFigures) -> list[tuple[str, object]]:
    """The table's rows of what the run did beside the clients (processes, workers)."""
    t, pool, figures = report.totals, run.pool, run.figures
    rows: list[tuple[str, object]] = []
    if run.processes > 1:
        rows.append(("resumes across processes", t.resumes_across_processes))
        rows.append(("takeovers (sessions of the killed process)", t.takeovers))
        rows.append(("stranded (never resumed)", t.stranded))
        rows.append(("store retries (store_unavailable, tried again)", t.store_retries))
    if pool is not None:
        rows.append(("takeovers (sessions of the killed worker)", t.takeovers))
        rows.append(("stranded (never resumed)", t.stranded))
        rows.append(
            (
                "workers killed / started again",
                f"{pool.workers_killed} / {pool.workers_started_again}",
            )
        )
    if figures is not None:
        rows.append(
            ("processes SIGKILLed", 1 if figures.process_killed else "0 (raise --duration)")
        )
        if figures.outage_asked:
            outage = figures.store_outage_s
            rows.append(
                ("store outage (s)", "not over at the end" if outage is None else f"{outage:.1f}")
            )
    if run.cluster is not None:
        rows += run.cluster.rows(report)
    if run.workers is not None:
        rows.append(("engine workers killed", run.workers.engine_workers_killed))
        rows.append(("inputs redelivered", run.workers.inputs_redelivered))
        rows.append(("fenced engine messages", run.workers.fenced_engine_messages))
    return rows


def totals_json(report: ChaosReport, gateway: Gateway | None, run: RunFigures) -> str:
    t = report.totals
    totals: dict[str, object] = {
        "sessions": t.sessions,
        "events_delivered": t.events_delivered,
        "disconnects": t.disconnects,
        "resumes": t.resumes,
        "replayed": t.replayed,
        "inputs": t.inputs,
        "answered": t.answered,
        "lost": t.lost,
        "duplicated": t.duplicated,
        "client_events_sent": t.client_events_sent,
        "client_events_received_once": t.client_events_received_once,
        "lost_upstream": t.lost_upstream,
        "duplicated_upstream": t.duplicated_upstream,
        "errors": t.errors,
        "error_codes": t.error_codes,
    }
    totals.update(_run_totals(report, run))
    result: dict[str, object] = {"totals": totals, "ok": verdict(report, run)}
    if gateway is not None:  # the table's "server:" rows
        stats = gateway.registry.stats()
        result["server"] = {
            "events_journaled": stats.events_journaled,
            "crashes": stats.crashes,
            "restarts": stats.restarts,
        }
    return json.dumps(result)


def _run_totals(report: ChaosReport, run: RunFigures) -> dict[str, object]:
    """``--json``'s totals of what the run did beside the clients (`_run_rows`)."""
    t, pool, figures, workers = report.totals, run.pool, run.figures, run.workers
    totals: dict[str, object] = {}
    if run.processes > 1:
        totals["processes"] = run.processes
        totals["resumes_across_processes"] = t.resumes_across_processes
        totals["takeovers"] = t.takeovers
        totals["stranded"] = t.stranded
        totals["store_retries"] = t.store_retries
    if pool is not None:
        totals["workers"] = pool.workers
        totals["takeovers"] = t.takeovers
        totals["stranded"] = t.stranded
        totals["workers_killed"] = pool.workers_killed
        totals["workers_started_again"] = pool.workers_started_again
    if figures is not None:
        totals["processes_killed"] = int(figures.process_killed)
        if figures.outage_asked:
            totals["store_outage_s"] = figures.store_outage_s
    if run.cluster is not None:
        totals.update(run.cluster.totals(report))
    if workers is not None:
        totals["engine_workers"] = workers.engine_workers
        totals["engine_workers_killed"] = workers.engine_workers_killed
        totals["inputs_redelivered"] = workers.inputs_redelivered
        totals["fenced_engine_messages"] = workers.fenced_engine_messages
    return totals


#: Seconds between two progress lines when stderr is no terminal (a log, a pipe).
PROGRESS_LINE_INTERVAL_S = 2.0


def _progress_text(totals: ClientReport) -> str:
    return (
        f"{totals.events_delivered} events, {totals.disconnects} cuts, "
        f"{totals.resumes} resumes, lost {totals.lost}, dup {totals.duplicated}"
    )


async def run_chaos_shown(
    url: str | Targets, config: ChaosConfig, console: Console, gateway: Gateway | None
) -> ChaosReport:
    if not console.is_terminal:
        # rich draws no bar off a terminal: a line every few seconds instead,
        # so a long run is never silent.
        last = -PROGRESS_LINE_INTERVAL_S

        def line(elapsed: float, totals: ClientReport) -> None:
            nonlocal last
            if elapsed - last >= PROGRESS_LINE_INTERVAL_S:
                last = elapsed
                console.print(
                    f"chaos: {min(elapsed, config.duration_s):.0f}/{config.duration_s:g} s, "
                    + _progress_text(totals),
                    highlight=False,
                )

        return await run_chaos(url, config, progress=line)
    with Progress(
        TextColumn("[bold]chaos[/]"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=config.duration_s)

        def progress(elapsed: float, totals: ClientReport) -> None:
            bar.update(
                task,
                completed=min(elapsed, config.duration_s),
                description=_progress_text(totals),
            )

        return await run_chaos(url, config, progress=progress)


def verdict(report: ChaosReport, run: RunFigures) -> bool:
    """Nothing lost or repeated, and the run did what it was asked (the killed
    worker started again, the process killed, the store outage over, the
    primary failed over): the table's verdict, ``--json``'s ``ok`` and the
    exit status alike."""
    pool, figures, cluster = run.pool, run.figures, run.cluster
    restarted = pool is None or pool.workers_started_again >= pool.workers_killed
    done = (figures is None or figures.ok) and (cluster is None or cluster.ok)
    return report.ok and restarted and done
