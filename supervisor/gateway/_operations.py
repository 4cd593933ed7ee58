"""Operations: ``GET /healthz`` (live), ``/readyz`` (accepting), ``/metrics`` (Prometheus).

The metrics are read from the registry's figures and the gateway's counters
at scrape time (a collector, so the two cannot drift), except the send
latency histogram, which the gateway observes as it sends. Each gateway has
its own ``CollectorRegistry``: two gateways in one process do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.gateway._demo_page import demo_page_routes

if TYPE_CHECKING:
    from supervisor.gateway._service import GatewayService

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "http_routes"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Figures(Collector):
    def __init__(self, service: GatewayService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        stats = service.registry.stats()
        counters = service.counters
        sessions = GaugeMetricFamily(
            "duplex_sessions",
            "Sessions held, by state: live (an actor) or parked; attached or detached",
            labels=["state"],
        )
        sessions.add_metric(["live"], stats.live)
        sessions.add_metric(["attached"], stats.attached)
        sessions.add_metric(["detached"], stats.detached)
        sessions.add_metric(["parked"], stats.parked)
        yield sessions
        yield GaugeMetricFamily(
            "duplex_connections", "WebSocket connections open", value=service.connections_open()
        )
        yield CounterMetricFamily(
            "duplex_events_journaled", "Events journaled", value=stats.events_journaled
        )
        yield CounterMetricFamily(
            "duplex_events_delivered",
            "Frames the gateway put on a client's wire",
            value=service.frames_delivered,
        )
        resumes = CounterMetricFamily("duplex_resumes", "Resumes, by outcome", labels=["outcome"])
        for outcome, n in sorted(counters.resume_outcomes.items()):
            resumes.add_metric([outcome], n)
        yield resumes
        refused = CounterMetricFamily(
            "duplex_journal_refusals", "Gaps and overflows, by reason", labels=["reason"]
        )
        refused.add_metric(["gap"], stats.gap_errors)
        refused.add_metric(["overflow"], stats.overflow_errors)
        yield refused
        gaps = CounterMetricFamily(
            "duplex_resume_gaps",
            "Resumes refused journal_gap, by what dropped the first missing event",
            labels=["reason"],
        )
        for reason, n in sorted(counters.gap_reasons.items()):
            gaps.add_metric([reason], n)
        yield gaps
        yield CounterMetricFamily("duplex_session_crashes", "Session crashes", value=stats.crashes)
        yield CounterMetricFamily(
            "duplex_session_restarts", "Session restarts", value=stats.restarts
        )
        yield GaugeMetricFamily(
            "duplex_outbox_sends_in_progress",
            "Sends to clients started and not finished",
            value=service.sends_in_progress,
        )
        yield GaugeMetricFamily(
            "duplex_outbox_frames_queued",
            "Frames accepted for delivery to clients and not yet written, over every outbox",
            value=service.registry.frames_queued(),
        )
        errors = CounterMetricFamily(
            "duplex_protocol_errors", "Error frames sent, by code", labels=["code"]
        )
        for code, n in sorted(counters.errors.items()):
            errors.add_metric([code], n)
        yield errors


class GatewayMetrics:
    """One gateway's Prometheus registry."""

    def __init__(self, service: GatewayService) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Figures(service))
        self.send_latency = Histogram(
            "duplex_send_latency_seconds",
            "Time one frame took to be written to a client",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def http_routes(service: GatewayService) -> Callable[[str], tuple[int, str, bytes] | None]:
    """The plain GETs every shell answers: path -> (status, content type, body)."""

    page = demo_page_routes(service.config.path) if service.config.demo_page else None

    def route(path: str) -> tuple[int, str, bytes] | None:
        if page is not None and (answer := page(path)) is not None:
            return answer
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if service.accepting:
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", b"shutting down\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE, service.metrics.render()
        return None

    return route
