"""What one connection may ask, and a slow client that is not a dead session.

Against a real server process: inputs past the rate or the in-flight cap are
refused with an error carrying their id (never answered, so they can be sent
again); input ids are deduplicated for the session's whole life, far past the
old 4,096-id window, and past the stated bound (``--max-inputs-per-session``)
a new id is refused, never answered; and a client that stops reading until
its send times out loses its connection, not its session: after a resume the
stream and the answers go on.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import trio

from tests.attack_support import (
    LIMIT,
    Frame,
    RawClient,
    ServerProcess,
    every_shell,  # noqa: F401
    json_frame,
    server_process,
)

QUIET = ["--event-rate", "0"]


def _input(cid: str) -> bytes:
    return json_frame({"type": "input", "client_event_id": cid, "text": "hi"})


class Replies:
    """Reads one connection, checking its sequences run 1, 2, 3, ... throughout."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.last = 0

    async def __call__(self, ids: list[str]) -> dict[str, list[str]]:
        """Read until every id got a reply: ``response.done``, ``input.duplicate``
        or an error carrying it; what each got (an answer's deltas are no reply)."""
        got: dict[str, list[str]] = {cid: [] for cid in ids}
        waiting = set(ids)
        while waiting:
            frame = await self.client.frame()
            assert isinstance(frame, dict), frame
            seq = frame.get("server_event_seq")
            if isinstance(seq, int):
                assert seq == self.last + 1, (self.last, frame)
                self.last = seq
                if seq % 500 == 0:
                    await self.client.send(json_frame({"type": "ack", "server_event_seq": seq}))
            cid = frame.get("client_event_id")
            if cid is None or frame["type"] == "response.output_text.delta":
                continue
            reply = str(frame["code"] if frame["type"] == "error" else frame["type"])
            got[str(cid)].append(reply)
            waiting.discard(str(cid))
        return got


@contextlib.asynccontextmanager
async def _session(*flags: str) -> AsyncIterator[tuple[ServerProcess, RawClient, Replies]]:
    """A server process and one session on it, closed on the way out."""
    async with server_process(*flags) as server:
        client, _ = await server.open_session()
        try:
            yield server, client, Replies(client)
        finally:
            await client.aclose()


async def test_inputs_past_the_rate_are_refused_and_named() -> None:
    flags = [*QUIET, "--max-inputs-per-second", "0.01"]
    with trio.fail_after(LIMIT):
        async with _session(*flags) as (server, client, replies):
            ids = [f"x{n}" for n in range(30)]
            await client.send(b"".join(map(_input, ids)))
            got = await replies(ids)
            # A burst of one, then one every 100 s: the first only.
            assert got == {"x0": ["response.done"]} | {cid: ["rate_limited"] for cid in ids[1:]}, (
                got
            )
            await server.serves()  # another connection has its own rate


async def test_inputs_past_the_in_flight_cap_are_refused_busy() -> None:
    flags = [*QUIET, "--max-inputs-in-flight", "1", "--max-inputs-per-second", "1000"]
    with trio.fail_after(LIMIT):
        async with _session(*flags) as (_, client, replies):
            ids = [f"b{n}" for n in range(20)]
            await client.send(b"".join(map(_input, ids)))
            got = await replies(ids)
            assert all(len(replies) == 1 for replies in got.values()), got
            assert {r[0] for r in got.values()} == {"response.done", "busy"}, got
            assert got["b0"] == ["response.done"]
            # A refused input is not remembered: sent again, it is answered,
            # never called a duplicate. (It may be refused busy once more: an
            # answer is in flight until the engine's ``answer`` returns, which
            # can be just after its last frame reached this client.)
            busy = next(cid for cid, r in got.items() if r == ["busy"])
            while True:
                await client.send(_input(busy))
                again = (await replies([busy]))[busy]
                assert again in (["busy"], ["response.done"]), again
                if again == ["response.done"]:
                    break


async def test_dedupe_holds_for_the_session_lifetime_past_4096_ids() -> None:
    flags = [*QUIET, "--max-inputs-per-second", "1e9", "--max-inputs-in-flight", "100000"]
    # 4,200 answers of four frames each: 3.5 s on a quiet 2-core machine, past
    # 30 s on a loaded one. The bound only stops a hang, so it fits the work.
    with trio.fail_after(3 * LIMIT):
        async with _session(*flags) as (_, client, replies):
            ids = [f"d{n}" for n in range(4200)]
            await client.send(b"".join(map(_input, ids)))
            got = await replies(ids)
            assert {r[0] for r in got.values()} == {"response.done"}
            # The 4,201st id later, the first ones are still known.
            repeats = ["d0", "d1", "d4199"]
            await client.send(b"".join(map(_input, repeats)))
            got = await replies(repeats)
            assert got == {cid: ["input.duplicate"] for cid in repeats}, got


async def test_past_the_stated_bound_a_new_id_is_refused_never_answered() -> None:
    flags = [*QUIET, "--max-inputs-per-session", "5"]
    with trio.fail_after(LIMIT):
        async with _session(*flags) as (_, client, replies):
            ids = [f"k{n}" for n in range(5)]
            for cid in ids:  # one at a time: under the in-flight cap
                await client.send(_input(cid))
                assert await replies([cid]) == {cid: ["response.done"]}
            await client.send(_input("k5"))
            assert await replies(["k5"]) == {"k5": ["input_limit"]}
            await client.send(_input("k0") + _input("k5"))
            got = await replies(["k0", "k5"])
            assert got == {"k0": ["input.duplicate"], "k5": ["input_limit"]}


async def _slow_client(server: ServerProcess) -> tuple[RawClient, Frame]:
    """A session whose client reads nothing, through a small receive window."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((server.host, server.port))
    client = RawClient(trio.SocketStream(sock), server.host)
    try:
        await client.send(server.request(client) + json_frame({"type": "session.open"}))
        await client.accepted()
        created = await client.frame()
        assert isinstance(created, dict) and created["type"] == "session.created", created
    except BaseException:
        await client.aclose()
        raise
    return client, created


async def test_a_send_timeout_ends_the_connection_not_the_session() -> None:
    flags = ["--send-timeout", "0.3", "--event-rate", "400", "--delta-chars", "2000"]
    flags += ["--replay-max-bytes", "100000000"]
    with trio.fail_after(LIMIT):
        async with server_process(*flags) as server:
            slow, created = await _slow_client(server)
            try:
                await server.wait_log("gave up a client's connection (send_timeout)")
                # Read what made it before the cut: sequences 1..last.
                last = 0
                while isinstance(frame := await slow.frame(), dict):
                    assert frame.get("server_event_seq") == last + 1, (last, frame)
                    last += 1
            finally:
                await slow.aclose()
            client, resumed = await server.resume(
                str(created["session_id"]), str(created["resume_token"]), last
            )
            try:
                assert isinstance(resumed, dict) and resumed["type"] == "session.resumed", resumed
                replayed = resumed["replayed"]
                assert isinstance(replayed, int)
                # The replay, then live events: the engine never stopped.
                for _ in range(replayed + 20):
                    frame = await client.frame()
                    assert isinstance(frame, dict), frame
                    assert frame.get("server_event_seq") == last + 1, (last, frame)
                    last += 1
                await client.send(json_frame({"type": "ack", "server_event_seq": last}))
                await client.send(_input("fresh"))
                while (frame := await client.frame()) is not None:
                    assert isinstance(frame, dict), frame
                    assert frame["type"] != "input.duplicate", frame
                    if frame["type"] == "response.done":
                        assert frame["client_event_id"] == "fresh"
                        break
            finally:
                await client.aclose()
