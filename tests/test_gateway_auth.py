"""Embedding the trio gateway: the ``authenticate`` hook, identities bound to sessions,
clients behind proxies, the registry's options; a real gateway in the test's nursery."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from supervisor import RegistryOptions
from supervisor.cli._wire_client import WireClient
from supervisor.gateway import Gateway, GatewayConfig, Handshake, Unauthorized, serve_gateway
from supervisor.gateway._auth import Authenticate
from supervisor.gateway._engine import DemoEngine, EngineConfig
from tests.gateway_support import LIMIT, errors, read_until, read_until_closed, seqs


async def user_from_query(handshake: Handshake) -> str | None:
    """An async hook: the identity is ``?user=``; ``?user=mallory`` is refused loudly."""
    users = handshake.query_params().get("user")
    if users == ["mallory"]:
        raise Unauthorized
    return users[0] if users else None


@contextlib.asynccontextmanager
async def gateway(
    config: GatewayConfig,
    authenticate: Authenticate | None,
    registry_options: RegistryOptions | None = None,
) -> AsyncIterator[Gateway]:
    async with trio.open_nursery() as nursery:
        served: Gateway = await nursery.start(
            lambda task_status: serve_gateway(
                config,
                engine=DemoEngine(EngineConfig(event_rate_hz=50)),
                authenticate=authenticate,
                registry_options=registry_options,
                task_status=task_status,
            )
        )
        yield served
        nursery.cancel_scope.cancel()


async def _refusal(url: str, **kw: object) -> tuple[list[object], int | None]:
    client = await WireClient.connect(url, **kw)  # type: ignore[arg-type]
    try:
        frames, closed = await read_until_closed(client)
    finally:
        await client.cut()
    return errors(frames), closed.code


async def test_the_hook_refuses_with_4401_and_throttles_an_address() -> None:
    config = GatewayConfig(port=0, secret_failures_allowed=2)
    with trio.fail_after(LIMIT):
        async with gateway(config, user_from_query) as gw:
            assert await _refusal(gw.url) == (["unauthorized"], 4401)
            assert await _refusal(gw.url + "?user=mallory") == (["unauthorized"], 4401)
            assert await _refusal(gw.url) == (["secret_throttled"], 4429)
            # Another address is not touched; a right identity is never throttled.
            client = await WireClient.connect(gw.url + "?user=ada")
            await client.send_json({"type": "session.open"})
            assert (await client.receive_json())["type"] == "session.created"
            await client.cut()
            client = await WireClient.connect(gw.url + "?user=ada", local_address="127.0.0.2")
            await client.send_json({"type": "session.open"})
            assert (await client.receive_json())["type"] == "session.created"
            await client.cut()


async def test_a_resume_must_come_from_the_identity_that_opened() -> None:
    config = GatewayConfig(port=0)
    with trio.fail_after(LIMIT):
        async with gateway(config, user_from_query) as gw:
            client = await WireClient.connect(gw.url + "?user=ada")
            await client.send_json({"type": "session.open"})
            created = await client.receive_json()
            first = await read_until(client, "response.output_text.delta")
            await client.cut()
            resume = {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": seqs(first)[-1],
            }
            bob = await WireClient.connect(gw.url + "?user=bob")
            await bob.send_json(resume)
            frames, closed = await read_until_closed(bob)
            await bob.cut()
            assert (errors(frames), closed.code) == (["unauthorized"], 4401)
            # The right token from the wrong identity did not consume the token.
            ada = await WireClient.connect(gw.url + "?user=ada")
            await ada.send_json(resume)
            resumed = await ada.receive_json()
            assert resumed["type"] == "session.resumed", resumed
            more = await read_until(ada, "response.output_text.delta")
            assert seqs(more)[0] == seqs(first)[-1] + 1
            await ada.cut()


async def test_behind_a_trusted_proxy_the_forwarded_client_is_throttled_not_the_proxy() -> None:
    # Loopback is the proxy; X-Forwarded-For names the clients.
    config = GatewayConfig(port=0, trusted_proxies=("127.0.0.0/8",), resume_failures_allowed=2)
    with trio.fail_after(LIMIT):
        async with gateway(config, None) as gw:
            owner = await WireClient.connect(gw.url)
            await owner.send_json({"type": "session.open"})
            created = await owner.receive_json()
            await owner.cut()

            async def resume(token: str, client: str) -> tuple[list[object], int | None]:
                ws = await WireClient.connect(gw.url, headers={"X-Forwarded-For": client})
                await ws.send_json(
                    {
                        "type": "session.resume",
                        "session_id": created["session_id"],
                        "resume_token": token,
                        "last_received_server_event_seq": 0,
                    }
                )
                frames, closed = await read_until_closed(ws)
                await ws.cut()
                return errors(frames)[:1], closed.code

            attacker = "198.51.100.7"
            assert await resume("bad", attacker) == (["invalid_resume_token"], 4403)
            assert await resume("bad", attacker) == (["invalid_resume_token"], 4403)
            assert await resume("bad", attacker) == (["resume_throttled"], 4429)
            # Another client behind the same proxy is not throttled.
            assert await resume("bad", "203.0.113.5") == (["invalid_resume_token"], 4403)


async def test_the_registrys_own_options_reach_it_through_the_gateway() -> None:
    # An event cap of 5 (a RegistryOptions field, not a GatewayConfig one): a
    # client that never acks overflows its journal at the 6th event (4413).
    seen: list[tuple[str, str]] = []
    options = RegistryOptions(
        replay_ttl_s=120,
        replay_max_bytes_per_session=1 << 20,
        replay_max_events_per_session=5,
        observer=lambda event: seen.append((event.kind, event.session_id)),
    )
    with trio.fail_after(LIMIT):
        async with gateway(GatewayConfig(port=0), None, options) as gw:
            client = await WireClient.connect(gw.url)
            await client.send_json({"type": "session.open"})
            frames, closed = await read_until_closed(client)
            await client.cut()
            # The gateway observed the end too: the session's place is free.
            assert gw.service.admission.sessions.total == 0
    assert (errors(frames), closed.code) == (["overflow"], 4413)
    assert len(seqs(frames)) == 5
    # The options' own observer is called as well as the gateway's.
    session_id = frames[0]["session_id"]
    assert ("closed", session_id) in seen, seen
