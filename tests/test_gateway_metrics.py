"""What ``/metrics`` says about sessions: live (with a thread), parked, attached, detached.

A gateway whose registry parks idle detached sessions at once
(``passivate_after_s=0``): a session whose client left is parked by a sweep,
and the gauges must say so (``live`` counts sessions with an actor, not
every session the registry holds).
"""

from __future__ import annotations

import itertools
import logging

import pytest
import trio

from supervisor import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway import DemoEngine, EngineConfig, Gateway, GatewayConfig, serve_gateway
from supervisor.gateway._engine import EngineSession
from supervisor.gateway._servers import log_stats
from tests.gateway_support import (
    LIMIT,
    reading_nothing,
    until_a_send_sticks,
)


def _gauges(gateway: Gateway) -> dict[str, float]:
    text = gateway.service.metrics.render().decode()
    prefix = 'duplex_sessions{state="'
    gauges: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line[len(prefix) :].partition('"} ')
            gauges[name] = float(value)
    return gauges


async def test_the_sessions_gauge_counts_live_and_parked_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = RegistryOptions(
        replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, passivate_after_s=0
    )
    quiet = DemoEngine(EngineConfig(event_rate_hz=0))
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(
                lambda task_status: serve_gateway(
                    GatewayConfig(port=0),
                    engine=quiet,
                    registry_options=options,
                    task_status=task_status,
                )
            )
            stays, leaves = await WireClient.connect(gateway.url), None
            try:
                await stays.send_json({"type": "session.open"})
                assert (await stays.receive_json())["type"] == "session.created"
                leaves = await WireClient.connect(gateway.url)
                await leaves.send_json({"type": "session.open"})
                created = await leaves.receive_json()
                await leaves.cut()
                sid = str(created["session_id"])
                while await gateway.registry.has_attachment(sid):
                    await trio.sleep(0.01)
                while gateway.registry.stats().parked < 1:
                    await gateway.registry.sweep()
                    await trio.sleep(0.01)
                assert _gauges(gateway) == {"live": 1, "attached": 1, "detached": 1, "parked": 1}
                with caplog.at_level(logging.INFO, logger="duplex_supervisor"):
                    log_stats(gateway.service)
            finally:
                await stays.cut()
            nursery.cancel_scope.cancel()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sessions=")]
    assert line.startswith("sessions=2 live=1 parked=1 attached=1 detached=1 "), line


def _gauge(gateway: Gateway, name: str) -> float:
    text = gateway.service.metrics.render().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{name} "))
    return float(line.split()[1])


class _Flooding:
    """An engine that sends an event every few milliseconds, each send its own
    task: none waits for the one before it to reach the client."""

    async def start(self, session: EngineSession) -> None:
        async with trio.open_nursery() as nursery:
            for n in itertools.count():
                event = {"type": "response.output_text.delta", "n": n, "delta": "x" * 2000}
                nursery.start_soon(session.send, event)
                await trio.sleep(0.005)

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        pass

    def stop(self, session_id: str) -> None:
        pass


async def test_the_outbox_depth_gauge_counts_frames_a_stalled_client_has_not_taken() -> None:
    """A client that stops reading: its session's events wait in its outbox,
    and ``duplex_outbox_frames_queued`` says how many; once the gateway gives
    the connection up, they are dropped (a resume would replay them) and the
    gauge is back to 0."""
    config = GatewayConfig(port=0, send_timeout_s=LIMIT)
    name = "duplex_outbox_frames_queued"
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(
                lambda task_status: serve_gateway(
                    config, engine=_Flooding(), task_status=task_status
                )
            )
            assert _gauge(gateway, name) == 0
            client = await reading_nothing(gateway)
            try:
                await client.send_json({"type": "session.open"})
                await until_a_send_sticks(gateway)
                # The engine goes on: each event waits behind the stuck send.
                while (queued := _gauge(gateway, name)) < 10:
                    await trio.sleep(0.05)
                while _gauge(gateway, name) <= queued:
                    await trio.sleep(0.05)
            finally:
                await client.cut()
            while _gauge(gateway, name) > 0:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


def test_the_send_latency_histogram_renders_as_prometheus_client_would() -> None:
    """`SendLatency` counts without locks; ``/metrics`` shows what
    prometheus_client's own ``Histogram`` with the same buckets shows."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from supervisor.gateway._operations import SEND_LATENCY_BUCKETS, SendLatency

    ours = SendLatency()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ours)
    reference_registry = CollectorRegistry(auto_describe=False)
    reference = Histogram(
        "duplex_send_latency_seconds",
        "Time one frame took to be written to a client",
        registry=reference_registry,
        buckets=SEND_LATENCY_BUCKETS,
    )
    # On a bound, between bounds, below the first and past the last.
    for seconds in (0.0, 0.0005, 0.0007, 0.001, 0.3, 2.5, 11.0, 0.00001):
        ours.observe(seconds)
        reference.observe(seconds)

    def samples(text: bytes) -> list[str]:
        return [
            line
            for line in text.decode().splitlines()
            if line.startswith("duplex_send_latency_seconds")
            and not line.startswith("duplex_send_latency_seconds_created")
        ]

    assert samples(generate_latest(registry)) == samples(generate_latest(reference_registry))
    assert 'duplex_send_latency_seconds_bucket{le="0.0005"} 3.0' in samples(
        generate_latest(registry)
    )
