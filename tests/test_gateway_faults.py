"""Faults inside the registry cost one connection an error, never the gateway."""

from __future__ import annotations

import trio

from supervisor._faults import FaultPlan
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._protocol import CLOSE_CODES
from supervisor.gateway._server import GatewayConfig, serve_gateway
from tests.gateway_support import LIMIT, read_until, read_until_closed, seqs


async def test_a_supervisor_crash_during_open_fails_that_open_only() -> None:
    plan = FaultPlan()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway = await nursery.start(
                lambda task_status: serve_gateway(
                    GatewayConfig(port=0), faults=plan, task_status=task_status
                )
            )
            plan.crash_supervisor()
            doomed = await WireClient.connect(gateway.url)
            await doomed.send_json({"type": "session.open"})
            frames, closed = await read_until_closed(doomed)
            assert [f.get("code") for f in frames if f.get("type") == "error"] == ["session_failed"]
            assert closed.code == CLOSE_CODES["session_failed"]
            await doomed.cut()

            # The gateway serves on: the next open streams as usual.
            client = await WireClient.connect(gateway.url)
            await client.send_json({"type": "session.open"})
            created = await client.receive_json()
            assert created["type"] == "session.created"
            streamed = await read_until(client, "response.output_text.delta")
            assert seqs(streamed) == [1]
            await client.cut()
            nursery.cancel_scope.cancel()
