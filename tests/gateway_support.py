"""Shared helpers for the gateway's tests (no tests here).

Every test runs a real gateway on 127.0.0.1, port 0, in its own trio
nursery, and talks to it through real sockets. `Harness` opens the
gateway and hands out `WireClient` connections it closes at the end
(an unclosed socket would be a ResourceWarning, an error under this suite's
``filterwarnings``). `Neighbour` is a session that streams in the
background and records every sequence it receives, so a test can check that
its own mischief touched no other session.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request

from supervisor.cli._wire_client import WireClient, WireClosedError
from supervisor.gateway._engine import Engine, EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway

#: Every async test body runs under ``trio.fail_after(LIMIT)`` (real time).
LIMIT = 20.0

#: Events per second per session: fast enough that a short wait journals some.
RATE_HZ = 50.0

Frame = dict[str, object]


def seq_of(frame: Frame) -> int | None:
    seq = frame.get("server_event_seq")
    return seq if isinstance(seq, int) else None


def seqs(frames: list[Frame]) -> list[int]:
    return [s for s in map(seq_of, frames) if s is not None]


def contiguous(first: int, numbers: list[int]) -> bool:
    """``numbers`` is ``first, first + 1, ...`` with nothing missing or repeated."""
    return numbers == list(range(first, first + len(numbers)))


@dataclass(slots=True)
class Opened:
    """A session a client opened: its connection and its ``session.created``."""

    client: WireClient
    session_id: str
    token: str
    generation: int


@dataclass(slots=True)
class Neighbour:
    """A session streaming in the background; ``frames`` holds all it received."""

    opened: Opened
    frames: list[Frame] = field(default_factory=list)
    _arrived: trio.Event = field(default_factory=trio.Event)

    async def run(self) -> None:
        while True:
            self.frames.append(await self.opened.client.receive_json())
            self._arrived.set()
            self._arrived = trio.Event()

    async def streams_on(self, more: int = 5) -> None:
        """Wait until ``more`` further events arrived."""
        target = len(seqs(self.frames)) + more
        while len(seqs(self.frames)) < target:
            await self._arrived.wait()

    async def check_undisturbed(self) -> None:
        """It keeps streaming; sequences 1, 2, ... with no gap, repeat or error."""
        await self.streams_on()
        received = seqs(self.frames)
        assert contiguous(1, received), received
        assert [f for f in self.frames if seq_of(f) is None] == []


@dataclass(slots=True)
class Harness:
    gateway: Gateway
    nursery: trio.Nursery
    clients: list[WireClient] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.gateway.url

    async def connect(
        self, *, answer_pings: bool = True, local_address: str | None = None
    ) -> WireClient:
        client = await WireClient.connect(
            self.url, answer_pings=answer_pings, local_address=local_address
        )
        self.clients.append(client)
        return client

    async def open(self, *, secret: str | None = None, answer_pings: bool = True) -> Opened:
        client = await self.connect(answer_pings=answer_pings)
        frame: Frame = {"type": "session.open"}
        if secret is not None:
            frame["secret"] = secret
        await client.send_json(frame)
        created = await client.receive_json()
        assert created["type"] == "session.created", created
        generation = created["attachment_generation"]
        assert isinstance(generation, int)
        return Opened(client, str(created["session_id"]), str(created["resume_token"]), generation)

    async def resume(
        self, session_id: str, token: str, last_seq: int, *, local_address: str | None = None
    ) -> WireClient:
        """Connect and send ``session.resume``; the answer is the caller's to read."""
        client = await self.connect(local_address=local_address)
        await client.send_json(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": last_seq,
            }
        )
        return client

    async def neighbour(self) -> Neighbour:
        neighbour = Neighbour(await self.open())
        self.nursery.start_soon(neighbour.run)
        await neighbour.streams_on(3)
        return neighbour

    async def wait_detached(self, session_id: str) -> None:
        while await self.gateway.registry.has_attachment(session_id):
            await trio.sleep(0.01)


async def read_until_closed(client: WireClient) -> tuple[list[Frame], WireClosedError]:
    """Every frame until the server closes: the frames and the close (code, reason)."""
    frames: list[Frame] = []
    while True:
        try:
            frames.append(await client.receive_json())
        except WireClosedError as closed:
            return frames, closed


async def resume_elsewhere(url: str, created: Frame, frames: list[Frame]) -> WireClient:
    """Connect to ``url`` (another gateway sharing the store) and resume the
    session of ``created`` after the last journaled event in ``frames``."""
    last = max(int(str(f["server_event_seq"])) for f in frames if "server_event_seq" in f)
    client = await WireClient.connect(url)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": last,
        }
    )
    return client


async def read_until(client: WireClient, kind: str, **fields: object) -> list[Frame]:
    """Frames up to and including the first of type ``kind`` with these fields."""
    frames: list[Frame] = []
    while True:
        frame = await client.receive_json()
        frames.append(frame)
        if frame.get("type") == kind and all(frame.get(k) == v for k, v in fields.items()):
            return frames


async def reading_nothing(gateway: Gateway) -> WireClient:
    """A client with a small receive window that reads nothing after its upgrade:
    the gateway's sends to it soon stick on a full TCP window."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", gateway.port))
    stream = trio.SocketStream(sock)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host="127.0.0.1", target=gateway.config.path)))
    while not any(isinstance(event, AcceptConnection) for event in ws.events()):
        ws.receive_data(await stream.receive_some(65_536))
    return WireClient(stream, ws, answer_pings=True)


async def until_a_send_sticks(gateway: Gateway) -> None:
    """Return once a send to some client is stuck: in progress, nothing delivered."""
    service = gateway.service
    while True:
        delivered = service.frames_delivered
        await trio.sleep(0.05)
        if service.sends_in_progress and service.frames_delivered == delivered:
            return


def errors(frames: list[Frame]) -> list[object]:
    return [f.get("code") for f in frames if f.get("type") == "error"]


@contextlib.asynccontextmanager
async def running_gateway(
    config: GatewayConfig | None = None,
    *,
    engine: EngineConfig | None = None,
    custom_engine: Engine | None = None,
) -> AsyncIterator[Harness]:
    """A gateway on a free loopback port; its clients are closed on the way out.
    ``custom_engine``: an engine of the test's own (else a demo engine)."""
    config = config or GatewayConfig(port=0)
    assert config.port == 0
    engine = engine or EngineConfig(event_rate_hz=RATE_HZ)
    try:
        async with _serving(config, engine, custom_engine) as harness:
            yield harness
    except BaseExceptionGroup as group:
        # A failed assertion reads better bare than nested three groups deep.
        sole = _sole_exception(group)
        if isinstance(sole, Exception):
            raise sole from None
        raise


def _sole_exception(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@contextlib.asynccontextmanager
async def _serving(
    config: GatewayConfig, engine: EngineConfig, custom_engine: Engine | None
) -> AsyncIterator[Harness]:
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(
            lambda task_status: serve_gateway(
                config, engine=custom_engine, engine_config=engine, task_status=task_status
            )
        )
        clients: list[WireClient] = []
        try:
            # The test's background readers stop before their sockets close.
            async with trio.open_nursery() as tasks:
                try:
                    yield Harness(gateway, tasks, clients)
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for client in clients:
                    await client.cut()
            nursery.cancel_scope.cancel()
