"""A client that vanishes at any point of its connection ends that connection only.

Each test runs ``duplex-supervisor serve`` as a real process, has a session
streaming through the whole attack, makes clients vanish at one point of the
connection (a close or a TCP reset), and then checks the server still runs,
the streaming session never noticed, and a new session opens and streams.
Before the fix, an upgrade request followed by a reset ended the whole
server (``[Errno 107] Transport endpoint is not connected``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.attack_support import (
    LIMIT,
    RawClient,
    ServerProcess,
    every_shell,  # noqa: F401
    json_frame,
    make_certificate,
    reset_on_close,
    server_process,
)

#: Each vanishing act is repeated: some races need a few tries to land.
ROUNDS = 5


async def _vanish(client: RawClient, *, reset: bool) -> None:
    if reset:
        reset_on_close(client.stream)
    await client.aclose()


async def _check_neighbour(server: ServerProcess, neighbour: RawClient, last: int) -> int:
    """The neighbour's stream goes on where it was: ``last + 1``, ``last + 2``, ..."""
    for expected in range(last + 1, last + 4):
        frame = await neighbour.frame()
        assert isinstance(frame, dict), frame
        assert frame.get("server_event_seq") == expected, (expected, frame)
    await server.serves()
    return last + 3


async def _act(server: ServerProcess, point: str, reset: bool) -> None:
    client = await server.client()
    if point == "during_accept":
        pass  # connected, not a byte sent
    elif point == "during_upgrade":
        await client.send(server.request(client)[:20])
    elif point == "after_request":
        await client.send(server.request(client))
    elif point == "after_upgrade":
        await client.send(server.request(client))
        await client.accepted()
    elif point == "after_open":
        frame = {"type": "session.open", "secret": server.secret}
        await client.send(server.request(client) + json_frame(frame))
    elif point == "reject_404":
        await client.send(server.request(client, "/nowhere"))
    elif point == "reject_403":
        await client.send(client.request(server.path, [(b"Origin", b"https://evil.example")]))
    elif point == "not_websocket":
        await client.send(b"GET /v1 HTTP/1.1\r\nHost: x\r\n\r\n")
    elif point == "garbage":
        await client.send(b"\x16\x03\x01\x00\xff" + b"\x00" * 64)
    await _vanish(client, reset=reset)


POINTS = [
    "during_accept",
    "during_upgrade",
    "after_request",
    "after_upgrade",
    "after_open",
    "reject_404",
    "reject_403",
    "not_websocket",
    "garbage",
]


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "close"])
async def test_clients_vanishing_at_every_point_leave_the_server_serving(reset: bool) -> None:
    flags = ["--allowed-origin", "https://ok.example"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags, "--event-rate", "50", secret="s3cret") as server:
            server.origin, server.secret = "https://ok.example", "s3cret"
            neighbour, created = await server.open_session()
            assert created["type"] == "session.created"
            last = 0
            try:
                for point in POINTS:
                    for _ in range(ROUNDS):
                        await _act(server, point, reset)
                    last = await _check_neighbour(server, neighbour, last)
            finally:
                await neighbour.aclose()


async def test_clients_vanishing_during_tls_leave_the_server_serving(tmp_path: Path) -> None:
    tls = make_certificate(tmp_path)
    with trio.fail_after(LIMIT):
        async with server_process("--event-rate", "50", tls=tls) as server:
            neighbour, created = await server.open_session()
            assert created["type"] == "session.created"
            last = 0
            try:
                for reset in (True, False):
                    for _ in range(ROUNDS):
                        # Mid-handshake: half a ClientHello, then gone.
                        tcp = await trio.open_tcp_stream(server.host, server.port)
                        await tcp.send_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
                        await _vanish(RawClient(tcp, server.host), reset=reset)
                        # Not TLS at all.
                        tcp = await trio.open_tcp_stream(server.host, server.port)
                        await tcp.send_all(b"GET /v1 HTTP/1.1\r\n\r\n")
                        await _vanish(RawClient(tcp, server.host), reset=reset)
                        # TLS done, then gone; TLS and the upgrade, then gone.
                        await _vanish(await server.client(), reset=reset)
                        client = await server.client()
                        await client.send(server.request(client))
                        await _vanish(client, reset=reset)
                    last = await _check_neighbour(server, neighbour, last)
            finally:
                await neighbour.aclose()
