"""Caps per address and in total, exact under concurrency, each with its answer.

Against a real server process: connections per address (HTTP 429) and in
total (HTTP 503); sessions in total (``overloaded`` 4503, exactly the cap
even when hundreds open at once) and per address (``too_many_sessions``
4429); wrong secrets throttled per address (``secret_throttled`` 4429, the
right address unharmed); and one log line per kind per interval, however
many refusals.
"""

from __future__ import annotations

import trio
from wsproto.events import AcceptConnection, CloseConnection

from tests.attack_support import (
    LIMIT,
    Frame,
    RawClient,
    ServerProcess,
    every_shell,  # noqa: F401
    json_frame,
    server_process,
)

ATTACKER = "127.0.0.2"
OTHER = "127.0.0.1"


async def _upgraded(server: ServerProcess, address: str) -> RawClient:
    client = await server.client(local_address=address)
    await client.send(server.request(client))
    await client.accepted()
    return client


async def _refused_status(server: ServerProcess, address: str) -> int:
    client = await server.client(local_address=address)
    try:
        await client.send(server.request(client))
        return await client.rejected()
    finally:
        await client.aclose()


async def test_connections_per_address_and_in_total_are_capped() -> None:
    flags = ["--max-connections-per-address", "3", "--max-connections", "5"]
    flags += ["--log-interval", "600", "--handshake-timeout", "30"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as server:
            held = [await _upgraded(server, ATTACKER) for _ in range(3)]
            try:
                for _ in range(20):
                    assert await _refused_status(server, ATTACKER) == 429
                # Another address is not touched by the attacker's cap...
                held.append(await _upgraded(server, OTHER))
                held.append(await _upgraded(server, OTHER))
                # ...but the total is everyone's: 5 held, a sixth gets 503.
                assert await _refused_status(server, OTHER) == 503
                # Twenty-one refusals, one log line.
                assert server.log_count("refused a connection") == 1, server.log.decode()
                # A connection freed is a place again (once the server saw it go).
                await held.pop(0).aclose()
                while True:
                    client = await server.client(local_address=ATTACKER)
                    await client.send(server.request(client))
                    if isinstance(await client.event(), AcceptConnection):
                        held.append(client)
                        break
                    await client.aclose()
                    await trio.sleep(0.02)
            finally:
                for client in held:
                    await client.aclose()


async def _open(server: ServerProcess, address: str) -> tuple[RawClient, Frame | CloseConnection]:
    client, first = await server.open_session(local_address=address)
    if first.get("type") == "session.created":
        return client, first
    _, closed = await client.until_closed()
    assert closed is not None
    return client, {**first, "close_code": closed.code}


async def _open_at_once(
    server: ServerProcess, addresses: list[str], clients: list[RawClient]
) -> list[Frame]:
    """One ``session.open`` from each address, all at once; the first answers,
    in the order of ``clients`` (each error with its ``close_code``)."""
    answers: list[Frame] = []

    async def one(address: str) -> None:
        client, first = await _open(server, address)
        clients.append(client)
        assert isinstance(first, dict)
        answers.append(first)

    async with trio.open_nursery() as nursery:
        for address in addresses:
            nursery.start_soon(one, address)
    return answers


async def test_max_sessions_is_exact_when_many_open_at_once() -> None:
    flags = ["--max-sessions", "7", "--event-rate", "0", "--log-interval", "600"]
    clients: list[RawClient] = []
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as server:
            try:
                addresses = [f"127.0.0.{2 + n % 20}" for n in range(60)]
                answers = await _open_at_once(server, addresses, clients)
                created = [a for a in answers if a["type"] == "session.created"]
                refused = [a for a in answers if a["type"] == "error"]
                assert len(created) == 7, answers
                assert {(a["code"], a["close_code"]) for a in refused} == {("overloaded", 4503)}
                assert len(refused) == 53
                # A place freed by a close is a place again.
                await clients[answers.index(created[0])].send(json_frame({"type": "session.close"}))
                while True:
                    client, first = await _open(server, OTHER)
                    clients.append(client)
                    assert isinstance(first, dict)
                    if first["type"] == "session.created":
                        break
                    assert first["code"] == "overloaded"
                    await trio.sleep(0.02)
            finally:
                for client in clients:
                    await client.aclose()


async def test_sessions_per_address_are_capped_for_that_address_only() -> None:
    flags = ["--max-sessions-per-address", "3", "--event-rate", "0"]
    clients: list[RawClient] = []
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as server:
            try:
                answers = await _open_at_once(server, [ATTACKER] * 12, clients)
                codes = sorted(str(a.get("code", a["type"])) for a in answers)
                assert codes == ["session.created"] * 3 + ["too_many_sessions"] * 9, answers
                assert {a.get("close_code") for a in answers if "code" in a} == {4429}
                # Detached sessions still count: the attacker cannot cycle them.
                for client in clients:
                    await client.aclose()
                clients.clear()
                client, first = await _open(server, ATTACKER)
                clients.append(client)
                assert isinstance(first, dict) and first["code"] == "too_many_sessions"
                await server.serves()  # from 127.0.0.1: unharmed
            finally:
                for client in clients:
                    await client.aclose()


async def test_wrong_secrets_are_throttled_per_address() -> None:
    flags = ["--secret-failures", "2", "--event-rate", "0"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags, secret="s3cret") as server:

            async def attempt(secret: str, address: str) -> tuple[object, int | None]:
                server.secret = secret
                client, first = await _open(server, address)
                await client.aclose()
                assert isinstance(first, dict)
                return first.get("code", first["type"]), first.get("close_code")  # type: ignore[return-value]

            assert await attempt("guess", ATTACKER) == ("unauthorized", 4401)
            assert await attempt("guess", ATTACKER) == ("unauthorized", 4401)
            assert await attempt("guess", ATTACKER) == ("secret_throttled", 4429)
            # The right secret is never refused by the throttle (checked first).
            assert await attempt("s3cret", ATTACKER) == ("session.created", None)
            assert await attempt("guess", ATTACKER) == ("secret_throttled", 4429)
            # Another address with the right secret opens as usual.
            assert await attempt("s3cret", OTHER) == ("session.created", None)
