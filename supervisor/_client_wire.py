"""One WebSocket connection of `supervisor.client`, on anyio and wsproto.

It moves whole messages: text frames decoded as JSON objects, binary
messages and pings out, pings answered. A write is shielded from the caller's
cancellation (half a frame would break the connection) but bounded by a
timeout: a peer that stops reading ends the connection, not the client.
"""

from __future__ import annotations

import contextlib
import json
import ssl as _ssl
from urllib.parse import urlsplit

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

__all__ = ["Connection", "ConnectionEnded"]


class ConnectionEnded(Exception):  # noqa: N818 - an outcome the client resumes from
    """The connection is over: a close frame (``code``, ``reason``) or a drop (``None``)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"connection ended: {code} {reason}".strip())
        self.code = code
        self.reason = reason


#: What ends a connection under the client (a drop, a reset, a stalled write).
DROPS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


class Connection:
    """A connected, upgraded WebSocket. Use `Connection.open`."""

    def __init__(
        self, stream: anyio.abc.ByteStream, ws: WSConnection, *, write_timeout_s: float
    ) -> None:
        self._stream = stream
        self._ws = ws
        self._write_timeout_s = write_timeout_s
        self._write_lock = anyio.Lock()
        self._text: list[str] = []
        self._binary: list[bytes] = []
        self.ended: ConnectionEnded | None = None
        #: Set by every message or pong received (what the heartbeat watches).
        self.heard_from = 0.0

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        ssl: _ssl.SSLContext | None,
        timeout_s: float,
        write_timeout_s: float,
    ) -> Connection:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "wss" else 80)
        if parts.scheme not in ("ws", "wss") or host is None:
            raise ValueError(f"need a ws:// or wss:// URL, got {url!r}")
        if parts.scheme == "wss" and ssl is None:
            ssl = _ssl.create_default_context()
        with anyio.fail_after(timeout_s):
            stream: anyio.abc.ByteStream
            if parts.scheme == "wss":
                stream = await anyio.connect_tcp(host, port, ssl_context=ssl, tls_hostname=host)
            else:
                stream = await anyio.connect_tcp(host, port)
            ws = WSConnection(ConnectionType.CLIENT)
            connection = cls(stream, ws, write_timeout_s=write_timeout_s)
            try:
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                await stream.send(ws.send(Request(host=parts.netloc, target=target)))
                while True:
                    ws.receive_data(await stream.receive(65_536))
                    for event in ws.events():
                        if isinstance(event, AcceptConnection):
                            connection.heard_from = anyio.current_time()
                            return connection
                        if isinstance(event, RejectConnection):
                            raise ConnectionEnded(None, f"HTTP {event.status_code}")
            except BaseException:
                await anyio.aclose_forcefully(stream)
                raise

    async def _write(self, event: Event) -> None:
        if self.ended is not None:
            raise self.ended
        async with self._write_lock:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._write_timeout_s) as t:
                try:
                    await self._stream.send(self._ws.send(event))
                except DROPS:
                    self.ended = ConnectionEnded(None, "dropped")
            if t.cancelled_caught:
                self.ended = ConnectionEnded(None, "write timed out")
            if self.ended is not None:
                await anyio.aclose_forcefully(self._stream)
                raise self.ended

    async def send_json(self, frame: dict[str, object]) -> None:
        await self._write(TextMessage(data=json.dumps(frame, separators=(",", ":"))))

    async def send_text(self, text: str) -> None:
        await self._write(TextMessage(data=text))

    async def send_bytes(self, data: bytes) -> None:
        await self._write(BytesMessage(data=data))

    async def ping(self) -> None:
        await self._write(Ping(payload=b"hb"))

    async def receive(self) -> dict[str, object] | bytes:
        """The next message (a JSON object, or bytes); `ConnectionEnded` at the end."""
        while True:
            for event in self._ws.events():
                message = await self._handle(event)
                if message is not None:
                    return message
            if self.ended is not None:
                raise self.ended
            try:
                data = await self._stream.receive(65_536)
            except DROPS:
                self.ended = ConnectionEnded(None, "dropped")
                raise self.ended from None
            self.heard_from = anyio.current_time()
            self._ws.receive_data(data)

    async def _handle(self, event: Event) -> dict[str, object] | bytes | None:
        if isinstance(event, TextMessage):
            self._text.append(event.data)
            if event.message_finished:
                decoded = json.loads("".join(self._text))
                self._text.clear()
                return decoded if isinstance(decoded, dict) else None
        elif isinstance(event, BytesMessage):
            self._binary.append(bytes(event.data))
            if event.message_finished:
                data = b"".join(self._binary)
                self._binary.clear()
                return data
        elif isinstance(event, Ping):
            with contextlib.suppress(ConnectionEnded):
                await self._write(event.response())
        elif isinstance(event, Pong):
            pass
        elif isinstance(event, CloseConnection):
            ended = ConnectionEnded(event.code, event.reason or "")
            with contextlib.suppress(ConnectionEnded):
                await self._write(event.response())
            self.ended = ended
            await anyio.aclose_forcefully(self._stream)
        return None

    async def close(self, code: int = 1000) -> None:
        """A polite close frame, then the socket."""
        if self.ended is None:
            # wsproto refuses to send once the peer closed first: nothing to say then.
            with contextlib.suppress(ConnectionEnded, LocalProtocolError, *DROPS):
                await self._write(CloseConnection(code=code))
            self.ended = ConnectionEnded(code, "closed by the client")
        await anyio.aclose_forcefully(self._stream)

    async def abort(self) -> None:
        """Drop the TCP connection with no close frame, as a network would."""
        if self.ended is None:
            self.ended = ConnectionEnded(None, "cut by the client")
        await anyio.aclose_forcefully(self._stream)
