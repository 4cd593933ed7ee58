"""A transport's ``send_now``: a lone event written in its sender's step, order kept.

The outbox hands a lone one-frame event to ``send.send_now`` (when the
transport's ``send`` has one) instead of waking its pump; anything else, or a
``send_now`` that declines, goes the pump's way, behind what is queued.
`ServerWebSocket.send_now` writes a frame at once, and a frame the socket
takes only in part is finished before anything that follows it.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from wsproto.connection import Connection, ConnectionType
from wsproto.events import TextMessage

from supervisor.doors._trio import TrioSessionRegistry
from supervisor.gateway._operations import SendLatency
from supervisor.gateway._protocol import frame_text
from supervisor.gateway._service import _SocketSend
from supervisor.gateway._websocket import ServerWebSocket, text_frame
from tests.trio_support import LIMIT, Wire, registry


class NowWire(Wire):
    """A `Wire` whose ``send`` also offers ``send_now`` (declining when told)."""

    def __init__(self) -> None:
        super().__init__()
        self.now: list[dict[str, object]] = []
        #: The journal's JSON handed along with each frame ``send_now`` took.
        self.encoded: list[bytes | None] = []
        self.declining = False

    @property
    def transport(self) -> NowSend:
        return NowSend(self)


class NowSend:
    def __init__(self, wire: NowWire) -> None:
        self._wire = wire

    async def __call__(self, frame: dict[str, object]) -> None:
        await self._wire.send(frame)

    def send_now(self, frame: dict[str, object], encoded: bytes | None) -> bool:
        if self._wire.declining:
            return False
        self._wire.now.append(frame)
        self._wire.encoded.append(encoded)
        return True


@asynccontextmanager
async def attached() -> AsyncIterator[tuple[TrioSessionRegistry, NowWire]]:
    """A registry with session ``s`` attached to a `NowWire`."""
    async with registry() as reg:
        wire = NowWire()
        await reg.create("s", send=wire.transport, close=wire.close)
        yield reg, wire


def _seqs(frames: list[dict[str, object]]) -> list[object]:
    return [f.get("server_event_seq") for f in frames]


async def test_a_lone_event_is_written_by_send_now_in_its_senders_step() -> None:
    with trio.fail_after(LIMIT):
        async with attached() as (reg, wire):
            entry = await reg.send_event("s", {"n": 1})
            assert entry is not None
            assert entry.sequence == 1
            assert _seqs(wire.now) == [1]
            assert wire.frames == []  # the pump's awaited send was never used
            # The journal's JSON of the frame, as the gateway would write it.
            assert wire.encoded == [frame_text(wire.now[0]).encode()]


async def test_a_declined_send_now_goes_the_pumps_way() -> None:
    with trio.fail_after(LIMIT):
        async with attached() as (reg, wire):
            wire.declining = True
            await reg.send_event("s", {"n": 1})
            wire.declining = False
            await reg.send_event("s", {"n": 2})
            assert _seqs(wire.frames) == [1]
            assert _seqs(wire.now) == [2]


async def test_an_event_behind_a_pending_send_waits_for_it() -> None:
    with trio.fail_after(LIMIT):
        async with attached() as (reg, wire):
            wire.declining = True
            gate = wire.hold(1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reg.send_event, "s", {"n": 1})
                await gate.entered.wait()
                wire.declining = False
                nursery.start_soon(reg.send_event, "s", {"n": 2})
                await trio.testing.wait_all_tasks_blocked()
                assert wire.now == []  # not ahead of the frame still being sent
                gate.release()
            assert _seqs(wire.frames) == [1, 2]


async def test_an_unjournaled_events_on_accepted_runs_in_the_pump() -> None:
    with trio.fail_after(LIMIT):
        async with attached() as (reg, wire):
            accepted: list[int] = []
            await reg.send_event(
                "s", {"n": 1}, journal=False, on_accepted=lambda: accepted.append(1)
            )
            assert accepted == [1]
            assert len(wire.frames) == 1
            assert wire.now == []


class Reader:
    """A client's side of the socket: whole text messages, in order."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self._client = Connection(ConnectionType.CLIENT)
        self._part = ""

    async def messages(self, count: int) -> list[str]:
        got: list[str] = []
        while len(got) < count:
            self._client.receive_data(await self._sock.recv(65_536))
            for event in self._client.events():
                assert isinstance(event, TextMessage)
                self._part += event.data
                if event.message_finished:
                    got.append(self._part)
                    self._part = ""
        return got


async def test_a_frame_the_socket_takes_in_part_is_finished_before_the_next() -> None:
    with trio.fail_after(LIMIT):
        server_sock, client_sock = trio.socket.socketpair()
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stream = trio.SocketStream(server_sock)
        ws = ServerWebSocket(
            stream,
            Connection(ConnectionType.SERVER),
            peer="test",
            max_message_bytes=1 << 20,
            close_timeout_s=1.0,
        )
        reader = Reader(client_sock)
        big = "x" * 500_000
        async with trio.open_nursery() as nursery:
            ws.send_now_in(nursery)
            assert ws.send_now(b"first")
            assert ws.send_now(big.encode())  # far more than the socket's buffers hold
            assert not ws.send_now(b"second")  # the rest of ``big`` is still going
            nursery.start_soon(ws.send, "third")
            assert await reader.messages(3) == ["first", big, "third"]
            await trio.testing.wait_all_tasks_blocked()
            assert ws.send_now(b"fourth")
            assert await reader.messages(1) == ["fourth"]
        stream.socket.close()
        client_sock.close()


def test_a_text_frame_is_what_wsproto_writes() -> None:
    for size in (0, 1, 125, 126, 65_535, 65_536, 70_000):
        text = "é" * (size // 2) + "x" * (size % 2)
        wsproto_frame = Connection(ConnectionType.SERVER).send(TextMessage(data=text))
        assert text_frame(text.encode()) == wsproto_frame


async def test_send_now_declines_without_a_nursery_or_once_closed() -> None:
    with trio.fail_after(LIMIT):
        server_sock, client_sock = trio.socket.socketpair()
        ws = ServerWebSocket(
            trio.SocketStream(server_sock),
            Connection(ConnectionType.SERVER),
            peer="test",
            max_message_bytes=1 << 20,
            close_timeout_s=0.1,
        )
        assert not ws.send_now(b"before send_now_in")
        async with trio.open_nursery() as nursery:
            ws.send_now_in(nursery)
            await ws.abort()
            assert not ws.send_now(b"after the abort")
        client_sock.close()


class FakeSocket:
    """A shell's socket with or without ``send_now``."""

    def __init__(self, *, taking: bool) -> None:
        self.taking = taking
        self.written: list[bytes] = []

    def send_now(self, text: bytes) -> bool:
        if self.taking:
            self.written.append(text)
        return self.taking


def _service() -> Any:
    return SimpleNamespace(
        frames_delivered=0,
        sends_in_progress=0,
        metrics=SimpleNamespace(send_latency=SendLatency()),
    )


def test_the_gateways_send_writes_the_journals_json_and_counts_it() -> None:
    service = _service()
    socket_ = FakeSocket(taking=True)
    send = _SocketSend(service, socket_)  # type: ignore[arg-type]
    assert send.send_now is not None
    frame = {"type": "x", "server_event_seq": 1}
    assert send.send_now(frame, b'{"type":"x","server_event_seq":1}')
    assert socket_.written == [b'{"type":"x","server_event_seq":1}']
    assert service.frames_delivered == 1
    # Unjournaled (no JSON made yet), or a full socket: the pump's way, uncounted.
    assert not send.send_now(frame, None)
    socket_.taking = False
    assert not send.send_now(frame, b"{}")
    assert service.frames_delivered == 1
    assert socket_.written == [b'{"type":"x","server_event_seq":1}']


def test_the_gateways_send_has_no_send_now_without_the_sockets() -> None:
    class Plain:
        async def send(self, text: str) -> None:
            return None

    assert _SocketSend(_service(), Plain()).send_now is None  # type: ignore[arg-type]
