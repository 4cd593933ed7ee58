"""Operations: ``GET /healthz`` (live), ``/readyz`` (accepting), ``/metrics`` (Prometheus).

With ``GatewayConfig.metrics_port`` set, `serve_operations` answers these
three on an address of their own (``metrics_host``, loopback by default),
and the sessions' port no longer answers ``/metrics``: expose the sessions'
port to clients, keep the metrics port for the scraper.

The metrics are read from the registry's figures and the gateway's counters
at scrape time (a collector, so the two cannot drift); the send latency
histogram is counted by the gateway as it sends (`SendLatency`) and read the
same way. Each gateway has its own ``CollectorRegistry``: two gateways in
one process do not collide.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._demo_page import demo_page_routes

if TYPE_CHECKING:
    from supervisor.doors._door import AsyncSessionRegistry

__all__ = [
    "CONTENT_TYPE",
    "SEND_LATENCY_BUCKETS",
    "GatewayMetrics",
    "SendLatency",
    "http_routes",
    "serve_operations",
]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: A request's head past this is not a scraper's: the connection is dropped.
_MAX_REQUEST_HEAD = 8192
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ``duplex_send_latency_seconds``'s upper bounds, in seconds (then ``+Inf``).
SEND_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)
# The ``le`` labels, as prometheus_client writes them (``repr``; these bounds need no exponent).
_LE_LABELS = (*(repr(bound) for bound in SEND_LATENCY_BUCKETS), "+Inf")


class OperatedGateway(Protocol):
    """What operations read of a gateway (`supervisor.gateway._service.GatewayService`),
    named here because that module builds its metrics from this one."""

    config: GatewayConfig
    registry: AsyncSessionRegistry
    counters: GatewayCounters
    metrics: GatewayMetrics
    #: False once shutting down: ``/readyz`` answers 503.
    accepting: bool
    frames_delivered: int
    sends_in_progress: int
    #: The operations port bound (set by `serve_operations`).
    metrics_port: int | None

    def connections_open(self) -> int: ...


class SendLatency(Collector):
    """The ``duplex_send_latency_seconds`` histogram, counted in plain fields.

    prometheus_client's ``Histogram.observe`` takes a lock for its sum and
    another for its bucket; the gateway observes every frame it writes, where
    that was a measured share of its cost per event (~1.8 us a frame on the
    project's machine). These counts take none: observe only on the gateway's
    loop (every send is made there); the collector reads them at scrape time
    and shows what a ``Histogram`` with `SEND_LATENCY_BUCKETS` shows, but its
    ``_created`` sample.
    """

    __slots__ = ("_counts", "_sum")

    def __init__(self) -> None:
        # One count per bound, then one past the last (``+Inf``): not cumulative.
        self._counts = [0] * (len(SEND_LATENCY_BUCKETS) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value on a bound counts in that bound's bucket (``le``).
        self._counts[bisect.bisect_left(SEND_LATENCY_BUCKETS, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[Metric]:
        buckets: list[tuple[str, float]] = []
        total = 0
        for label, count in zip(_LE_LABELS, self._counts, strict=True):
            total += count
            buckets.append((label, total))
        yield HistogramMetricFamily(
            "duplex_send_latency_seconds",
            "Time one frame took to be written to a client",
            buckets=buckets,
            sum_value=self._sum,
        )


class _Figures(Collector):
    def __init__(self, service: OperatedGateway) -> None:
        self._service = service

    # Over ~60 lines: a flat list of metric families, in the order /metrics shows them.
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
        yield _by_label(
            "duplex_resumes", "Resumes, by outcome", "outcome", counters.resume_outcomes
        )
        yield _by_label(
            "duplex_journal_refusals",
            "Gaps and overflows, by reason",
            "reason",
            {"gap": stats.gap_errors, "overflow": stats.overflow_errors},
            ordered=True,
        )
        yield _by_label(
            "duplex_resume_gaps",
            "Resumes refused journal_gap, by what dropped the first missing event",
            "reason",
            counters.gap_reasons,
        )
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
        yield _by_label(
            "duplex_client_events",
            "Sequenced client events, by outcome: accepted, or a repeat dropped",
            "outcome",
            {
                "accepted": counters.client_events_accepted,
                "repeated": counters.client_events_repeated,
            },
            ordered=True,
        )
        yield _by_label(
            "duplex_protocol_errors", "Error frames sent, by code", "code", counters.errors
        )


def _by_label(
    name: str, documentation: str, label: str, values: Mapping[str, int], *, ordered: bool = False
) -> CounterMetricFamily:
    """A counter family with one sample per key of ``values`` (sorted, unless
    ``ordered``: then in the mapping's order)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, n in values.items() if ordered else sorted(values.items()):
        family.add_metric([key], n)
    return family


class GatewayMetrics:
    """One gateway's Prometheus registry."""

    def __init__(self, service: OperatedGateway) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Figures(service))
        self.send_latency = SendLatency()
        self.registry.register(self.send_latency)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def http_routes(
    service: OperatedGateway, *, operations_port: bool = False
) -> Callable[[str], tuple[int, str, bytes] | None]:
    """The plain GETs every shell answers: path -> (status, content type, body).
    ``/metrics`` only on the operations port, when the gateway has one."""
    metrics = operations_port or service.config.metrics_port is None
    # The demo page belongs with the sessions (it connects to its own origin).
    page = None
    if service.config.demo_page and not operations_port:
        page = demo_page_routes(service.config.path)

    def route(path: str) -> tuple[int, str, bytes] | None:
        if page is not None and (answer := page(path)) is not None:
            return answer
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if service.accepting:
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", b"shutting down\n"
        if path == "/metrics" and metrics:
            return 200, CONTENT_TYPE, service.metrics.render()
        return None

    return route


async def serve_operations(
    service: OperatedGateway, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Answer ``GET /metrics``, ``/healthz``, ``/readyz`` (HTTP/1.x, one request per
    connection) on ``metrics_host:metrics_port`` until cancelled; ``task_status``
    gets the bound port."""
    config = service.config
    if config.metrics_port is None:
        raise ValueError("serve_operations needs GatewayConfig.metrics_port")
    routes = http_routes(service, operations_port=True)
    listener = await anyio.create_tcp_listener(
        local_host=config.metrics_host, local_port=config.metrics_port
    )

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with (
                anyio.move_on_after(config.handshake_timeout_s),
                contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError),
            ):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < _MAX_REQUEST_HEAD:
                    head += await stream.receive(4096)
                method, _, rest = head.partition(b" ")
                path = rest.partition(b" ")[0].partition(b"?")[0].decode("latin-1")
                found = routes(path) if method == b"GET" else None
                status, kind, body = found or (404, "text/plain", b"not found\n")
                reason = _REASONS.get(status, "")
                await stream.send(
                    f"HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                    + body
                )

    async with listener:
        port = int(listener.extra(anyio.abc.SocketAttribute.local_port))  # noqa: S610
        service.metrics_port = port
        logger.info("metrics and health on http://%s:%d/metrics", config.metrics_host, port)
        task_status.started(port)
        await listener.serve(answer)
