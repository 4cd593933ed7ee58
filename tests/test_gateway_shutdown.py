"""Stopping the gateway tells every connected client to go away (1001)."""

from __future__ import annotations

import trio

from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import EngineConfig, EngineSession
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway
from tests.gateway_support import (
    LIMIT,
    RATE_HZ,
    read_until,
    read_until_closed,
    reading_nothing,
    until_a_send_sticks,
)


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
                # Read one by one, as a slow client would. Were the mute one's
                # close waited for before the others', theirs would come after
                # the gateway's 2 s for closing: aborted, with no close frame.
                for client in clients:
                    _, closed = await read_until_closed(client)
                    assert (closed.code, closed.reason) == (1001, "going_away")
                _, closed = await read_until_closed(mute)
                assert (closed.code, closed.reason) == (1001, "going_away")
            finally:
                for client in [mute, *clients]:
                    await client.cut()


async def test_a_send_stuck_on_a_full_socket_when_stopping_still_ends_in_going_away() -> None:
    """Stopping must not cancel the registry's outbox pumps before the gateway
    said going-away: a pump cancelled in the middle of a send (here: stuck on
    a client's full TCP window) gives its socket up, and its client got no
    close frame at all."""
    stop = trio.CancelScope()
    config = GatewayConfig(port=0, send_timeout_s=LIMIT)

    async def run(task_status: trio.TaskStatus[Gateway]) -> None:
        with stop:
            await serve_gateway(
                config,
                engine_config=EngineConfig(event_rate_hz=400, delta_chars=2000),
                task_status=task_status,
            )

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(run)
            client = await reading_nothing(gateway)
            try:
                await client.send_json({"type": "session.open"})
                await until_a_send_sticks(gateway)
                stop.cancel()
                frames, closed = await read_until_closed(client)
                assert frames[0]["type"] == "session.created"
                assert (closed.code, closed.reason) == (1001, "going_away")
            finally:
                await client.cut()


class _Recording:
    """An engine that streams nothing and records ``stop``."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def start(self, session: EngineSession) -> None:
        await trio.sleep_forever()

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        pass

    def stop(self, session_id: str) -> None:
        self.stopped.append(session_id)


async def test_stopping_the_gateway_stops_the_engine_for_every_session() -> None:
    """The sessions end with the gateway (memory only): the engine hears ``stop``
    for each, once, as for any session that ended for good."""
    engine = _Recording()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            gateway: Gateway = await nursery.start(
                lambda task_status: serve_gateway(
                    GatewayConfig(port=0), engine=engine, task_status=task_status
                )
            )
            ids = []
            for _ in range(2):
                client = await WireClient.connect(gateway.url)
                await client.send_json({"type": "session.open"})
                ids.append(str((await client.receive_json())["session_id"]))
                await client.cut()
            nursery.cancel_scope.cancel()
    assert sorted(engine.stopped) == sorted(ids)
