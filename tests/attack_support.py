"""Helpers for the attack tests (no tests here): a real server process and raw clients.

`server_process` runs ``python -m supervisor serve --port 0 --server SHELL ...``
(each shell in turn: a module that imports the `every_shell` fixture runs
each of its tests on every shell) as a subprocess on 127.0.0.1 (optionally
with TLS, or under a lowered
``RLIMIT_NOFILE``), reads its URL from its log, keeps draining its log, and
on the way out stops it with SIGINT and checks it exits 130 with no
traceback: a server that died during the test fails it there at the latest.

`RawClient` speaks WebSocket with hand-made bytes where a test needs
to misbehave (half a request, frames glued to the upgrade, unmasked or
non-UTF-8 frames, an abrupt reset) and wsproto to read the answers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import signal
import socket
import ssl
import struct
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from supervisor.cli._demo_processes import reap
from supervisor.cli._flags import SECRET_ENV

#: Every attack test body runs under ``trio.fail_after(LIMIT)`` (real time).
LIMIT = 30.0

#: The shells every attack test runs against (``serve --server``).
SHELLS = ("trio", "asgi-uvicorn", "asgi-hypercorn")

#: The shell of the test running now (`every_shell` sets it).
_SHELL = ["trio"]


@pytest.fixture(autouse=True, params=SHELLS)
def every_shell(request: pytest.FixtureRequest) -> Iterator[str]:
    """Import it into an attack test module: each of its tests runs on every shell,
    so a shell cannot drift from the others."""
    _SHELL[0] = request.param
    try:
        yield request.param
    finally:
        _SHELL[0] = "trio"


Frame = dict[str, object]

TEXT, BINARY, CLOSE = 0x1, 0x2, 0x8


def masked_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False) -> bytes:
    """One client frame, masked as RFC 6455 asks (or not: see ``unmasked_frame``)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    mask = os.urandom(4)
    return _header(first, len(payload), masked=True) + mask + _xor(payload, mask)


def unmasked_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame without a mask: a protocol error (1002) from a client."""
    return _header(0x80 | opcode, len(payload), masked=False) + payload


def _header(first: int, length: int, *, masked: bool) -> bytes:
    bit = 0x80 if masked else 0
    if length < 126:
        return bytes([first, bit | length])
    if length < 1 << 16:
        return bytes([first, bit | 126]) + struct.pack("!H", length)
    return bytes([first, bit | 127]) + struct.pack("!Q", length)


def _xor(payload: bytes, mask: bytes) -> bytes:
    return bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def json_frame(frame: Mapping[str, object]) -> bytes:
    return masked_frame(TEXT, json.dumps(frame).encode())


def reset_on_close(stream: trio.abc.Stream) -> None:
    """Make closing ``stream`` send a TCP reset (SO_LINGER 0), not a FIN."""
    sock = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket  # type: ignore[attr-defined]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class RawClient:
    """A connection whose bytes the test writes; wsproto reads the server's answers."""

    def __init__(self, stream: trio.abc.Stream, host: str) -> None:
        self.stream = stream
        self.host = host
        self.ws = WSConnection(ConnectionType.CLIENT)
        self._events: deque[Event] = deque()
        self._text: list[str] = []

    def request(self, path: str = "/v1", headers: list[tuple[bytes, bytes]] | None = None) -> bytes:
        """The bytes of an upgrade request (wsproto's, so it can read the answer)."""
        return self.ws.send(Request(host=self.host, target=path, extra_headers=headers or []))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def event(self) -> Event | None:
        """The next event from the server; ``None`` once the stream ended."""
        while not self._events:
            try:
                data = await self.stream.receive_some(65_536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return None
            self.ws.receive_data(bytes(data))
            self._events.extend(self.ws.events())
        return self._events.popleft()

    async def accepted(self) -> None:
        event = await self.event()
        assert isinstance(event, AcceptConnection), event

    async def rejected(self) -> int:
        event = await self.event()
        assert isinstance(event, RejectConnection), event
        return event.status_code

    async def frame(self) -> Frame | CloseConnection | None:
        """The next JSON frame, or the server's close, or ``None`` at the end."""
        while True:
            event = await self.event()
            if event is None or isinstance(event, CloseConnection):
                return event
            if isinstance(event, Ping):
                if self.ws.state is ConnectionState.OPEN:  # no pong after a close
                    await self.send(self.ws.send(event.response()))
            elif isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    decoded = json.loads("".join(self._text))
                    self._text.clear()
                    assert isinstance(decoded, dict)
                    return decoded

    async def until_closed(self) -> tuple[list[Frame], CloseConnection | None]:
        frames: list[Frame] = []
        while True:
            got = await self.frame()
            if got is None or isinstance(got, CloseConnection):
                return frames, got
            frames.append(got)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


@dataclass
class ServerProcess:
    """``duplex-supervisor serve`` in a subprocess; ``log`` is its stderr so far."""

    process: trio.Process
    host: str
    port: int
    path: str
    tls_ca: str | None
    log: bytearray = field(default_factory=bytearray)
    #: What an honest client presents, where the server asks for it.
    origin: str | None = None
    secret: str | None = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def log_count(self, text: str) -> int:
        return self.log.decode(errors="replace").count(text)

    async def wait_log(self, text: str, count: int = 1) -> None:
        while self.log_count(text) < count:
            assert self.alive, self.log.decode(errors="replace")
            await trio.sleep(0.02)

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    async def stream(self, *, local_address: str | None = None) -> trio.abc.Stream:
        tcp: trio.abc.Stream = await trio.open_tcp_stream(
            self.host, self.port, local_address=local_address
        )
        if self.tls_ca is None:
            return tcp
        context = ssl.create_default_context(cafile=self.tls_ca)
        tls = trio.SSLStream(tcp, context, server_hostname=self.host)
        try:
            await tls.do_handshake()
        except BaseException:
            # A failed handshake leaves the socket in a reference cycle: closed
            # here, not by a later garbage collection inside another test.
            await trio.aclose_forcefully(tcp)
            raise
        return tls

    async def client(self, *, local_address: str | None = None) -> RawClient:
        return RawClient(await self.stream(local_address=local_address), self.host)

    def request(self, client: RawClient, path: str | None = None) -> bytes:
        """An upgrade request as an honest client sends it (with the origin asked for)."""
        headers = [] if self.origin is None else [(b"Origin", self.origin.encode())]
        return client.request(self.path if path is None else path, headers)

    async def open_session(self, *, local_address: str | None = None) -> tuple[RawClient, Frame]:
        """A new session: the upgrade and ``session.open`` in one write; its created frame."""
        client = await self.client(local_address=local_address)
        frame: Frame = {"type": "session.open"}
        if self.secret is not None:
            frame["secret"] = self.secret
        try:
            await client.send(self.request(client) + json_frame(frame))
            await client.accepted()
            created = await client.frame()
            assert isinstance(created, dict), created
        except BaseException:
            await client.aclose()
            raise
        return client, created

    async def resume(
        self, session_id: str, token: str, last_seq: int
    ) -> tuple[RawClient, Frame | CloseConnection | None]:
        """The upgrade and ``session.resume`` in one write; the first answer."""
        client = await self.client()
        frame = {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": last_seq,
        }
        try:
            await client.send(self.request(client) + json_frame(frame))
            await client.accepted()
            return client, await client.frame()
        except BaseException:
            await client.aclose()
            raise

    async def serves(self) -> None:
        """Still up: a new session opens and answers an input."""
        assert self.alive, self.log.decode(errors="replace")
        client, created = await self.open_session()
        try:
            assert created["type"] == "session.created", created
            probe = {"type": "input", "client_event_id": "probe", "text": "?"}
            await client.send(json_frame(probe))
            while True:
                frame = await client.frame()
                assert isinstance(frame, dict), frame
                if frame.get("type") == "response.done":
                    assert frame.get("client_event_id") == "probe", frame
                    break
            await client.send(json_frame({"type": "session.close"}))
            _, closed = await client.until_closed()
            assert closed is not None and closed.code == 1000, closed
        finally:
            await client.aclose()


def _lower_descriptor_limit(soft: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def make_certificate(directory: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (openssl); (cert, key) paths."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(  # noqa: S603 - fixed arguments
        [  # noqa: S607 - openssl from PATH
            "openssl", "req", "-x509", "-nodes", "-days", "1",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(key), "-out", str(cert),
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


@contextlib.asynccontextmanager
async def server_process(
    *flags: str,
    nofile: int | None = None,
    tls: tuple[str, str] | None = None,
    secret: str | None = None,
) -> AsyncIterator[ServerProcess]:
    """Serve on 127.0.0.1 in a subprocess until the block ends, then SIGINT it
    (unless the test stopped it itself: then it must have exited 0).
    ``secret``: the gateway's secret, passed the way it must be (the environment)."""
    command = [sys.executable, "-m", "supervisor", "serve", "--port", "0", *flags]
    if "--server" not in flags:
        command += ["--server", _SHELL[0]]
    if tls is not None:
        command += ["--tls-cert", tls[0], "--tls-key", tls[1]]
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    env["PYTHONUNBUFFERED"] = "1"
    preexec: Callable[[], None] | None = None
    if nofile is not None:
        preexec = functools.partial(_lower_descriptor_limit, nofile)
    process = await trio.lowlevel.open_process(
        command, stderr=subprocess.PIPE, env=env, preexec_fn=preexec
    )
    assert process.stderr is not None
    server: ServerProcess | None = None
    try:
        async with trio.open_nursery() as nursery:
            log = bytearray()
            while b"listening on" not in log or not log.endswith(b"\n"):
                chunk = await process.stderr.receive_some()
                assert chunk, log.decode(errors="replace")
                log += chunk
            line = next(ln for ln in log.decode().splitlines() if "listening on" in ln)
            url = line.rsplit(" ", 1)[-1]
            host_port, _, path = url.split("://", 1)[1].partition("/")
            host, _, port = host_port.rpartition(":")
            server = ServerProcess(
                process, host, int(port), "/" + path, tls[0] if tls else None, log
            )

            async def drain(stderr: trio.abc.ReceiveStream, into: bytearray) -> None:
                while chunk := await stderr.receive_some():
                    into += chunk

            nursery.start_soon(drain, process.stderr, server.log)
            yield server
            stopped_by_test = process.returncode is not None
            if not stopped_by_test:
                process.send_signal(signal.SIGINT)
            with trio.move_on_after(15):
                await process.wait()
            text = server.log.decode(errors="replace")
            expected = 0 if stopped_by_test else 130
            assert process.returncode == expected, (process.returncode, text[-3000:])
            assert "Traceback" not in text, text[-3000:]
    finally:
        await reap(process)


async def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    """One plain ``GET``: the status and the body."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body
