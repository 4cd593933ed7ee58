"""``serve --metrics-port``: /metrics (and health) on an address of their own,
and /metrics no longer on the sessions' port, under every server."""

from __future__ import annotations

import pytest
import trio

from tests.attack_support import http_get, server_process
from tests.redis_support import free_port

SERVERS = ["trio", "asgi-uvicorn", "asgi-hypercorn"]


async def _get(port: int, path: str) -> tuple[int, str]:
    return await http_get("127.0.0.1", port, path)


@pytest.mark.parametrize("server", SERVERS)
async def test_metrics_and_health_on_their_own_port(server: str) -> None:
    metrics_port = free_port()
    with trio.fail_after(30):
        async with server_process(
            "--server", server, "--metrics-port", str(metrics_port)
        ) as process:
            status, body = await _get(metrics_port, "/metrics")
            assert status == 200
            assert "duplex_sessions" in body
            assert await _get(metrics_port, "/healthz") == (200, "ok\n")
            assert (await _get(metrics_port, "/readyz"))[0] == 200
            assert (await _get(metrics_port, "/v1"))[0] == 404
            # The sessions' port: health for the load balancer, no metrics.
            # (The trio server answers any other GET 426, the ASGI servers 404.)
            status, body = await _get(process.port, "/metrics")
            assert status in (404, 426)
            assert "duplex_sessions" not in body
            assert (await _get(process.port, "/healthz"))[0] == 200
