"""Peers that never finish a close, and a server out of descriptors.

A close handshake is bounded: a peer that never answers the close frame has
its TCP connection aborted after ``--close-timeout``, so the descriptor comes
back whatever the peer does. Out of descriptors (a lowered RLIMIT_NOFILE),
the server sheds new connections with a 503, logs that once per interval,
keeps streaming to the sessions it has, and serves again once descriptors
come back.
"""

from __future__ import annotations

import re

import trio
from wsproto.events import AcceptConnection, CloseConnection

from tests.attack_support import (
    LIMIT,
    TEXT,
    RawClient,
    ServerProcess,
    every_shell,  # noqa: F401
    json_frame,
    masked_frame,
    server_process,
)

#: HTTP 503 as a status in a log line, not as digits of a longer number.
_STATUS_503 = re.compile(r"(?<![\w.:/-])503(?![\w.:/-])")

#: Only the close is timed short: a short handshake timeout would also cut a
#: client whose upgrade request a loaded machine sends late (a flaky test).
CLOSE_FAST = ["--close-timeout", "0.3"]
FAST = ["--handshake-timeout", "0.3", *CLOSE_FAST]


async def _upgrades_with_a_bad_first_frame(count: int, server: ServerProcess) -> list[RawClient]:
    """Peers whose upgrade and first frame (not JSON) go in one write."""
    clients = []
    for _ in range(count):
        client = await server.client()
        await client.send(server.request(client) + masked_frame(TEXT, b"not json"))
        await client.accepted()
        clients.append(client)
    return clients


async def test_peers_that_never_answer_a_close_are_cut_after_the_close_timeout() -> None:
    with trio.fail_after(LIMIT):
        async with server_process(*CLOSE_FAST, "--event-rate", "0") as server:
            baseline = server.descriptors()
            # A bad first frame: the server says bad_request and closes 4400;
            # these peers read that but never answer, and never close their end.
            clients = await _upgrades_with_a_bad_first_frame(30, server)
            try:
                for client in clients:
                    frames, closed = await client.until_closed()
                    assert [f.get("code") for f in frames] == ["bad_request"]
                    assert isinstance(closed, CloseConnection) and closed.code == 4400
                    # Unanswered, the close ends in a TCP abort: the stream ends.
                    assert await client.event() is None
                while server.descriptors() > baseline:
                    await trio.sleep(0.02)
                await server.serves()
            finally:
                for client in clients:
                    await client.aclose()


async def test_an_overflow_close_is_bounded_too() -> None:
    flags = [*CLOSE_FAST, "--replay-max-bytes", "2000", "--event-rate", "200"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as server:
            client, created = await server.open_session()
            try:
                assert created["type"] == "session.created"
                # Never acknowledged, the journal overflows; the close is not answered.
                frames, closed = await client.until_closed()
                assert [f.get("code") for f in frames if f.get("type") == "error"] == ["overflow"]
                assert isinstance(closed, CloseConnection) and closed.code == 4413
                assert await client.event() is None
                await server.serves()
            finally:
                await client.aclose()


async def test_out_of_descriptors_sheds_new_connections_and_serves_the_rest() -> None:
    flood = 80  # connections, against a limit of 48 descriptors
    flags = ["--handshake-timeout", "30", "--log-interval", "600", "--event-rate", "50"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags, nofile=48) as server:
            neighbour, created = await server.open_session()
            held: list[RawClient] = []
            try:
                assert created["type"] == "session.created"
                for _ in range(flood):
                    held.append(await server.client())
                # Each asks for an upgrade: those the server holds get 101, the
                # shed ones got a 503 (or, closed already, nothing).
                accepted = 0
                for client in held:
                    try:
                        await client.send(server.request(client))
                    except trio.BrokenResourceError:
                        continue
                    event = await client.event()
                    accepted += isinstance(event, AcceptConnection)
                assert 0 < accepted < flood
                await server.wait_log("out of descriptors")
                # The answer goes to clients, not the log: no line tells of a
                # 503 (a port, an id or a close code 4503 may hold the digits).
                told = [
                    line
                    for line in server.log.decode(errors="replace").splitlines()
                    if _STATUS_503.search(line)
                ]
                assert told == []
                # The session it had streams on, without a gap.
                last = 0
                for _ in range(20):
                    frame = await neighbour.frame()
                    assert isinstance(frame, dict), frame
                    seq = frame.get("server_event_seq")
                    assert seq == last + 1, (last, frame)
                    last = seq
                    assert isinstance(last, int)
                await neighbour.send(json_frame({"type": "ack", "server_event_seq": last}))
                # One log line for the whole flood (the interval is longer than the test).
                assert server.log_count("out of descriptors") == 1, server.log.decode()
            finally:
                for client in held:
                    await client.aclose()
            # Descriptors back: new sessions open again.
            while True:
                try:
                    await server.serves()
                    break
                except (AssertionError, trio.BrokenResourceError):
                    await trio.sleep(0.05)
            await neighbour.aclose()


async def test_a_trickled_upgrade_is_cut_at_the_handshake_timeout() -> None:
    with trio.fail_after(LIMIT):
        async with server_process(*FAST, "--event-rate", "0") as server:
            baseline = server.descriptors()
            client = await server.client()
            try:
                request = server.request(client)
                sent = 0
                # One byte every 50 ms: the request would take seconds; the
                # server gives the whole upgrade 0.3 s, then drops the socket.
                with trio.move_on_after(LIMIT / 2):
                    while sent < len(request):
                        await client.send(request[sent : sent + 1])
                        sent += 1
                        await trio.sleep(0.05)
                assert sent < len(request)
            except trio.BrokenResourceError:
                pass  # cut: what the test is after
            finally:
                await client.aclose()
            while server.descriptors() > baseline:
                await trio.sleep(0.02)
            await server.serves()
