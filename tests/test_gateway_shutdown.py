"""Stopping the gateway tells every connected client to go away (1001)."""

from __future__ import annotations

import trio

from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from supervisor.gateway._wire_client import WireClient
from tests.gateway_support import LIMIT, RATE_HZ, read_until, read_until_closed


async def test_stopping_the_gateway_closes_every_socket_going_away() -> None:
    stop = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[Gateway]) -> None:
        with stop:
            await serve_gateway(
                GatewayConfig(port=0),
                engine_config=EngineConfig(event_rate_hz=RATE_HZ),
                task_status=task_status,
            )

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(run)
            # One client never answers a close (its link is dead): it must not
            # hold up the others' going-away.
            mute = await WireClient.connect(gateway.url, answer_pings=False)
            clients = [await WireClient.connect(gateway.url) for _ in range(3)]
            try:
                for client in [mute, *clients]:
                    await client.send_json({"type": "session.open"})
                    await read_until(client, "response.output_text.delta")
                stop.cancel()  # what Ctrl-C does to `duplex-supervisor serve`
                with trio.fail_after(1):  # well inside the gateway's 2 s for closing
                    for client in clients:  # read one by one, as a slow client would
                        _, closed = await read_until_closed(client)
                        assert (closed.code, closed.reason) == (1001, "going_away")
                _, closed = await read_until_closed(mute)
                assert (closed.code, closed.reason) == (1001, "going_away")
            finally:
                for client in [mute, *clients]:
                    await client.cut()
