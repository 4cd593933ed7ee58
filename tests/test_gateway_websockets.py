"""End to end with a client nobody on this project wrote: the ``websockets`` library.

The gateway runs in the test's trio nursery; the client is asyncio code in a
worker thread with its own event loop, and reaches back into trio (to ask the
registry whether the session is detached) with ``trio.from_thread``. Real
sockets on 127.0.0.1, a real gateway and engine, no mocks.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import trio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from supervisor.gateway._protocol import CLOSE_CODES, REPLACED_CLOSE_CODE
from supervisor.gateway._server import Gateway, GatewayConfig
from tests.gateway_support import LIMIT, Frame, contiguous, running_gateway, seq_of

#: The asyncio side's own limit, below the test's: a hung thread cannot be cancelled.
CLIENT_LIMIT = LIMIT - 5


async def _dial(url: str) -> ClientConnection:
    # proxy=None: an HTTP(S)_PROXY in the environment must not reroute loopback.
    return await connect(url, proxy=None, open_timeout=5, close_timeout=2)


async def _recv(ws: ClientConnection) -> Frame:
    message = await ws.recv()
    assert isinstance(message, str), "the gateway sends text frames only"
    frame = json.loads(message)
    assert isinstance(frame, dict)
    return frame


async def _resume(url: str, session_id: str, token: str, last_seq: int) -> ClientConnection:
    ws = await _dial(url)
    await ws.send(
        json.dumps(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": last_seq,
            }
        )
    )
    return ws


async def _events(ws: ClientConnection, count: int) -> list[int]:
    """The sequences of the next ``count`` events (other frames skipped)."""
    received: list[int] = []
    while len(received) < count:
        seq = seq_of(await _recv(ws))
        if seq is not None:
            received.append(seq)
    return received


async def _until_closed(ws: ClientConnection) -> tuple[list[Frame], ConnectionClosed]:
    frames: list[Frame] = []
    while True:
        try:
            frames.append(await _recv(ws))
        except ConnectionClosed as closed:
            return frames, closed


@dataclass
class Journey:
    """What the asyncio client saw, for the trio side to check after the thread."""

    first: list[int] = field(default_factory=list)
    resumed: Frame = field(default_factory=dict)
    after_resume: list[int] = field(default_factory=list)
    journaled_while_detached: int = 0


class Client:
    """The asyncio side. ``gateway`` is only touched through ``trio.from_thread``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.url = gateway.url
        self.journey = Journey()

    def _attached(self, session_id: str) -> bool:
        return bool(trio.from_thread.run(self.gateway.registry.has_attachment, session_id))

    def _head(self) -> int:
        # One session on this gateway: every journaled event is one of its.
        return trio.from_thread.run_sync(self.gateway.registry.stats).events_journaled

    async def run(self) -> None:
        async with asyncio.timeout(CLIENT_LIMIT):
            session_id, old_token = await self._open_and_drop()
            ws2, token = await self._resume_after_drop(session_id, old_token)
            await self._stale_token_is_refused(session_id, old_token, ws2)
            await self._takeover(session_id, token, old_token, ws2)

    async def _open_and_drop(self) -> tuple[str, str]:
        j = self.journey
        ws = await _dial(self.url)
        await ws.send(json.dumps({"type": "session.open"}))
        created = await _recv(ws)
        assert created["type"] == "session.created", created
        assert created["attachment_generation"] == 1
        session_id, old_token = str(created["session_id"]), str(created["resume_token"])
        assert session_id and old_token
        j.first = await _events(ws, 5)
        # A network drop: the TCP connection goes, no close frame either way.
        assert ws.transport is not None
        ws.transport.abort()
        while self._attached(session_id):
            await asyncio.sleep(0.01)
        detached_at = self._head()
        while self._head() < detached_at + 5:  # the engine journals while detached
            await asyncio.sleep(0.02)
        j.journaled_while_detached = self._head() - j.first[-1]
        return session_id, old_token

    async def _resume_after_drop(
        self, session_id: str, old_token: str
    ) -> tuple[ClientConnection, str]:
        j = self.journey
        ws2 = await _resume(self.url, session_id, old_token, j.first[-1])
        j.resumed = await _recv(ws2)
        j.after_resume = await _events(ws2, j.journaled_while_detached + 5)
        return ws2, str(j.resumed["resume_token"])

    async def _stale_token_is_refused(
        self, session_id: str, old_token: str, ws2: ClientConnection
    ) -> None:
        # The token the resume consumed is refused, and the resumed socket stays.
        j = self.journey
        stale = await _resume(self.url, session_id, old_token, j.first[-1])
        frames, closed = await _until_closed(stale)
        assert [f.get("code") for f in frames] == ["invalid_resume_token"], frames
        assert closed.rcvd is not None
        assert closed.rcvd.code == CLOSE_CODES["invalid_resume_token"] == 4403
        more = await _events(ws2, 3)
        assert contiguous(j.after_resume[-1] + 1, more), (j.after_resume[-1], more)
        j.after_resume += more

    async def _takeover(
        self, session_id: str, token: str, old_token: str, ws2: ClientConnection
    ) -> None:
        # A second connection resumes with the current token while ws2 is open.
        last = self.journey.after_resume[-1]
        ws3 = await _resume(self.url, session_id, token, last)
        taken = await _recv(ws3)
        assert taken["type"] == "session.resumed", taken
        assert taken["attachment_generation"] == 3
        assert taken["resume_token"] not in (token, old_token)
        _, replaced = await _until_closed(ws2)
        assert replaced.rcvd is not None, "the replaced socket got no close frame"
        assert (replaced.rcvd.code, replaced.rcvd.reason) == (REPLACED_CLOSE_CODE, "replaced")
        taken_seqs = await _events(ws3, 3)
        assert contiguous(last + 1, taken_seqs), (last, taken_seqs)
        await ws3.send(json.dumps({"type": "session.close"}))
        _, ended = await _until_closed(ws3)
        assert ended.rcvd is not None
        assert ended.rcvd.code == 1000


async def test_websockets_client_resumes_exactly_once_and_is_taken_over() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0)) as harness:
            client = Client(harness.gateway)
            await trio.to_thread.run_sync(lambda: asyncio.run(client.run()))
            j = client.journey
            assert contiguous(1, j.first), j.first

            resumed = j.resumed
            assert resumed["type"] == "session.resumed", resumed
            assert resumed["attachment_generation"] == 2
            assert isinstance(resumed["resume_token"], str)
            # Everything journaled after the client's last sequence was replayed...
            assert j.journaled_while_detached >= 5
            replayed = resumed["replayed"]
            assert isinstance(replayed, int)
            assert replayed >= j.journaled_while_detached
            # ...once each, in order, right after the last one received: no gap,
            # no repeat, and the live stream carries on from there.
            assert contiguous(j.first[-1] + 1, j.after_resume), (j.first, j.after_resume)
            assert not set(j.first) & set(j.after_resume)

            counters = harness.gateway.counters
            assert counters.sessions_opened == 1
            assert counters.resumes == 2
            assert counters.replaced == 1
            assert counters.errors == {"invalid_resume_token": 1}
