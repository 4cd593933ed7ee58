"""A minimal WebSocket client on wsproto, for chaos: it can cut its TCP cleanly.

A real network drop sends no close frame; neither does `WireClient.cut`,
which just closes the socket. Ping frames are answered (unless told not to,
to play a half-open peer), text frames decoded as JSON objects.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections import deque
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

__all__ = ["WireClient", "WireClosedError", "WireRejectedError"]


class WireClosedError(Exception):
    """The server closed the connection (``code``, ``reason``) or the stream ended."""

    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"connection closed: {code} {reason or ''}".strip())
        self.code = code
        self.reason = reason


class WireRejectedError(WireClosedError):
    """The server answered the upgrade with an HTTP status, not 101."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(status, f"{url}: the server answered HTTP {status}, not a WebSocket")
        self.status = status

    def __str__(self) -> str:
        return self.reason or ""


class WireClient:
    """One connection. Use `connect`; then send/receive; then close or cut."""

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, *, answer_pings: bool) -> None:
        self._stream = stream
        self._ws = ws
        self._answer_pings = answer_pings
        self._inbox: deque[dict[str, object]] = deque()
        self._text: list[str] = []
        self.closed: WireClosedError | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        answer_pings: bool = True,
        local_address: str | None = None,
        ca_file: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> WireClient:
        """Connect and complete the handshake. ``local_address``: the source
        address to connect from (e.g. another loopback address, 127.0.0.2).
        ``wss://`` verifies the server against ``ca_file`` (or the system's CAs)."""
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or parts.hostname is None or parts.port is None:
            raise ValueError(f"need a ws:// or wss://host:port/path URL, got {url!r}")
        stream: trio.abc.Stream = await trio.open_tcp_stream(
            parts.hostname, parts.port, local_address=local_address
        )
        if parts.scheme == "wss":
            context = ssl.create_default_context(cafile=ca_file)
            stream = trio.SSLStream(stream, context, server_hostname=parts.hostname)
        ws = WSConnection(ConnectionType.CLIENT)
        client = cls(stream, ws, answer_pings=answer_pings)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
            request = Request(host=parts.netloc, target=target, extra_headers=extra)
            await stream.send_all(ws.send(request))
            while True:
                data = await stream.receive_some(65_536)
                if not data:
                    raise WireClosedError(None, "no handshake answer")
                ws.receive_data(bytes(data))
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        return client
                    if isinstance(event, RejectConnection):
                        raise WireRejectedError(url, event.status_code)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def send_json(self, frame: dict[str, object]) -> None:
        await self.send_text(json.dumps(frame))

    async def send_text(self, text: str) -> None:
        await self._stream.send_all(self._ws.send(TextMessage(data=text)))

    async def send_bytes(self, data: bytes) -> None:
        await self._stream.send_all(self._ws.send(BytesMessage(data=data)))

    async def receive_json(self) -> dict[str, object]:
        """The next JSON object from the server; `WireClosedError` at the end."""
        while not self._inbox:
            if self.closed is not None:
                raise self.closed
            data = await self._stream.receive_some(65_536)
            if not data:
                self.closed = WireClosedError(None, "stream ended")
                raise self.closed
            self._ws.receive_data(bytes(data))
            await self._handle_events()
        return self._inbox.popleft()

    async def _handle_events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    decoded = json.loads("".join(self._text))
                    self._text.clear()
                    if isinstance(decoded, dict):
                        self._inbox.append(decoded)
            elif isinstance(event, Ping) and self._answer_pings:
                # Shielded: a pong cut half-way by a caller's timeout would
                # leave half a frame on the wire.
                with trio.CancelScope(shield=True):
                    await self._stream.send_all(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = WireClosedError(event.code, event.reason)
                if self._answer_pings:
                    with (
                        trio.CancelScope(shield=True),
                        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                    ):
                        await self._stream.send_all(self._ws.send(event.response()))

    async def cut(self) -> None:
        """Drop the TCP connection with no close handshake, as a network would."""
        await trio.aclose_forcefully(self._stream)

    async def close(self, code: int = 1000) -> None:
        """A polite close: send a close frame, then drop the stream."""
        # The server may have closed first (wsproto then refuses to send).
        with contextlib.suppress(Exception):
            await self._stream.send_all(self._ws.send(CloseConnection(code=code)))
        await self._stream.aclose()
