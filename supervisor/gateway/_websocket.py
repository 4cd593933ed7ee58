"""The gateway's WebSocket server side: h11 for the upgrade, wsproto for frames, trio for I/O.

Why not trio-websocket's server: its connection tasks run outside any error
boundary of ours (a peer gone during the upgrade ended the whole server), its
close handshake waits on the peer without a limit of ours, a protocol error
ends in a bare TCP close, and wsproto's server-side handshake drops the bytes
that follow the upgrade request in the same TCP segment (a ``session.open``
sent along with it was never seen). Here the upgrade is read with h11, whose
``trailing_data`` hands those bytes to the frame parser, and every wait on the
peer is bounded by its caller.

`read_upgrade` reads and checks the HTTP request; `reject` answers
it with an HTTP status (both in `supervisor.gateway._upgrade`, re-exported
here); `accept` answers 101 and returns a `ServerWebSocket`, whose
`run_reader` must run in a task of the connection's own nursery.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import struct

import h11
import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

from supervisor.gateway._sendgate import SendGate
from supervisor.gateway._upgrade import (
    ABNORMAL,
    STREAM_ERRORS,
    Upgrade,
    UpgradeRefusedError,
    WebSocketClosedError,
    read_upgrade,
    reject,
    send_all,
)

__all__ = [
    "STREAM_ERRORS",
    "ServerWebSocket",
    "Upgrade",
    "UpgradeRefusedError",
    "WebSocketClosedError",
    "accept",
    "read_upgrade",
    "reject",
    "text_frame",
]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MEDIUM_HEADER = struct.Struct("!BBH")
_LONG_HEADER = struct.Struct("!BBQ")
MESSAGE_TOO_BIG = 1009


def text_frame(text: bytes) -> bytes:
    """One unfragmented, unmasked text frame (RFC 6455 5.2) of UTF-8 ``text``.

    What wsproto's ``send(TextMessage(...))`` writes for a server without
    extensions (none is negotiated here), at a fraction of its cost per
    frame: a whole message leaves no state behind in wsproto, whose state is
    still what the close handshake and control frames go through.
    """
    n = len(text)
    if n < 126:
        return bytes((0x81, n)) + text
    if n < 65_536:
        return _MEDIUM_HEADER.pack(0x81, 126, n) + text
    return _LONG_HEADER.pack(0x81, 127, n) + text


async def accept(
    stream: trio.abc.Stream,
    upgrade: Upgrade,
    *,
    peer: str,
    max_message_bytes: int,
    close_timeout_s: float,
) -> ServerWebSocket:
    """Answer 101; frames that came with the request are parsed first."""
    digest = hashlib.sha1(upgrade.key + _GUID).digest()  # noqa: S324 - RFC 6455 says SHA-1
    response = h11.InformationalResponse(
        status_code=101,
        headers=[
            (b"Upgrade", b"websocket"),
            (b"Connection", b"Upgrade"),
            (b"Sec-WebSocket-Accept", base64.b64encode(digest)),
        ],
    )
    trailing, _ = upgrade.http.trailing_data
    data = upgrade.http.send(response) or b""
    await send_all(stream, data)
    frames = Connection(ConnectionType.SERVER, trailing_data=bytes(trailing))
    return ServerWebSocket(
        stream,
        frames,
        peer=peer,
        max_message_bytes=max_message_bytes,
        close_timeout_s=close_timeout_s,
    )


class ServerWebSocket:
    """One accepted connection; the API the gateway uses (get, send, ping, close)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        frames: Connection,
        *,
        peer: str,
        max_message_bytes: int,
        close_timeout_s: float,
    ) -> None:
        self.peer = peer
        self._stream = stream
        self._frames = frames
        self._max_message_bytes = max_message_bytes
        self._close_timeout_s = close_timeout_s
        # Not a trio.Lock: its acquire checkpoints even when free (see _sendgate).
        self._send_gate = SendGate(trio.Event)
        # Small: a peer that sends faster than the gateway reads waits in TCP.
        self._inbox_in, self._inbox = trio.open_memory_channel[str | bytes](4)
        self._parts: list[str | bytes] = []
        self._size = 0
        self._pings: dict[bytes, trio.Event] = {}
        self._reader_done = trio.Event()
        self._aborted = False
        #: Set once closed either way; what receive and send raise.
        self.closed: WebSocketClosedError | None = None
        # `send_now`'s socket (plain TCP only: TLS records are written by
        # trio's SSLStream) and the nursery that finishes a message the
        # socket took in part; None until `send_now_in`.
        self._plain: trio.socket.SocketType | None = None
        self._finishers: trio.Nursery | None = None

    def send_now_in(self, nursery: trio.Nursery) -> None:
        """Let `send_now` write at once; a message the socket takes only in
        part is finished by a task in ``nursery`` (the connection's)."""
        if isinstance(self._stream, trio.SocketStream):
            self._plain = self._stream.socket
            self._finishers = nursery

    # -- the reader task ---------------------------------------------------------------

    async def run_reader(self) -> None:
        """Read until the peer closes, breaks the protocol or vanishes; never raises
        for anything the peer does."""
        try:
            async with self._inbox_in:
                await self._dispatch()
                while not self._reader_done.is_set():
                    try:
                        data = await self._stream.receive_some(65_536)
                    except STREAM_ERRORS:
                        data = b""
                    if not data:
                        self._mark_closed(ABNORMAL, "peer gone")
                        break
                    if self._frames.state is ConnectionState.CLOSED:
                        continue
                    self._frames.receive_data(bytes(data))
                    await self._dispatch()
        except WebSocketClosedError:
            pass
        finally:
            self._mark_closed(ABNORMAL, "peer gone")
            self._reader_done.set()
            for event in self._pings.values():
                event.set()

    async def _dispatch(self) -> None:
        for event in self._frames.events():
            if isinstance(event, TextMessage | BytesMessage):
                self._size += len(event.data)
                if self._size > self._max_message_bytes:
                    await self._violation(MESSAGE_TOO_BIG, "message too big")
                    return
                self._parts.append(event.data if isinstance(event.data, str) else bytes(event.data))
                if event.message_finished:
                    parts, self._parts, self._size = self._parts, [], 0
                    message = "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)  # type: ignore[arg-type]
                    # Closed: the gateway stopped reading, it is closing.
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await self._inbox_in.send(message)
            elif isinstance(event, Ping):
                if self._frames.state is ConnectionState.OPEN:  # no pong once closing
                    await self._send_event(event.response())
            elif isinstance(event, Pong):
                self._wake_pings(bytes(event.payload))
            elif isinstance(event, CloseConnection):
                await self._on_close(event)
                return

    async def _on_close(self, event: CloseConnection) -> None:
        state = self._frames.state
        if state is ConnectionState.REMOTE_CLOSING:
            # The peer's close: answer it; the server then closes TCP (RFC 6455 7.1.1).
            self._mark_closed(event.code, event.reason or None)
            await self._send_event(event.response())
        elif state is ConnectionState.OPEN:
            # wsproto reports a frame it could not parse as a close with 1002
            # (protocol error) or 1007 (bad payload, e.g. text not UTF-8).
            await self._violation(event.code, event.reason or "protocol error")
        self._reader_done.set()

    async def _violation(self, code: int, reason: str) -> None:
        self._mark_closed(code, reason)
        self._reader_done.set()
        await self._send_event(CloseConnection(code=code, reason=reason[:120]))

    def _wake_pings(self, payload: bytes) -> None:
        if payload not in self._pings:
            return
        # A pong answers its ping and every earlier one.
        for key in list(self._pings):
            self._pings.pop(key).set()
            if key == payload:
                break

    def _mark_closed(self, code: int, reason: str | None) -> None:
        if self.closed is None:
            self.closed = WebSocketClosedError(code, reason)

    # -- sending -------------------------------------------------------------------------

    async def _send_event(self, event: CloseConnection | Ping | Pong | TextMessage) -> None:
        async with self._send_gate:
            if self._aborted:
                raise self._closed_error()
            try:
                # Built under the lock: frames leave in the order they were made.
                if isinstance(event, TextMessage) and self._frames.state is ConnectionState.OPEN:
                    data = text_frame(event.data.encode())
                else:
                    data = self._frames.send(event)
            except LocalProtocolError:
                raise self._closed_error() from None
            try:
                await self._stream.send_all(data)
            except STREAM_ERRORS:
                self._aborted = True
                self._mark_closed(ABNORMAL, "peer gone")
                raise self._closed_error() from None
            except BaseException:
                # Cancelled half-way: a partial frame may be on the wire, so
                # nothing more may follow it.
                self._aborted = True
                self._mark_closed(ABNORMAL, "send cancelled")
                raise

    def _closed_error(self) -> WebSocketClosedError:
        return self.closed or WebSocketClosedError(ABNORMAL, None)

    # -- the gateway's Transport -------------------------------------------------------

    async def send(self, text: str) -> None:
        if self.closed is not None:
            raise self.closed
        await self._send_event(TextMessage(data=text))

    def send_now(self, text: bytes) -> bool:
        """Write a text message (``text``: its UTF-8) in the caller's own
        step, without a checkpoint; ``False`` (nothing written) when that
        cannot be done at once: another send holds the socket, the socket's
        buffer is full, the connection is closing, or it is TLS. Then `send`
        must be awaited for it.

        A lone frame written by ``send`` costs its sender a trio checkpoint
        (a task switch) after the write; the gateway's outbox writes a lone
        event here instead, in the step of the engine that sent it. The
        socket may take a message in part: the rest is then sent by a task
        of the connection holding the send gate, so nothing overtakes it.
        """
        sock = self._plain
        if sock is None or self.closed is not None or not self._send_gate.try_enter():
            return False
        try:
            fd = sock.fileno()
            if fd < 0 or self._frames.state is not ConnectionState.OPEN:
                return self._not_now()
            data = text_frame(text)
            try:
                written = os.write(fd, data)
            except OSError:
                # Full (nothing written), or the peer is gone: `send` finds out.
                return self._not_now()
            if written < len(data):
                self._finish_later(data[written:])
                return True
        except BaseException:
            self._send_gate.release()
            raise
        self._send_gate.release()
        return True

    def _not_now(self) -> bool:
        self._send_gate.release()
        return False

    def _finish_later(self, rest: bytes) -> None:
        """The socket took a message in part: a task sends the rest, keeping the gate."""
        assert self._finishers is not None  # noqa: S101 - set with _plain
        try:
            self._finishers.start_soon(self._finish, rest)
        except RuntimeError:  # the connection's nursery has closed: it is over
            self._aborted = True
            self._mark_closed(ABNORMAL, "peer gone")
            self._send_gate.release()

    async def _finish(self, rest: bytes) -> None:
        try:
            await self._stream.send_all(rest)
        except STREAM_ERRORS:
            self._aborted = True
            self._mark_closed(ABNORMAL, "peer gone")
        except BaseException:
            self._aborted = True
            self._mark_closed(ABNORMAL, "send cancelled")
            raise
        finally:
            self._send_gate.release()

    async def receive(self) -> str | bytes:
        try:
            return await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self._closed_error() from None

    async def ping(self) -> None:
        """Send a ping and wait for its pong (or the end of the connection)."""
        if self.closed is not None:
            raise self.closed
        payload = os.urandom(4)
        event = trio.Event()
        self._pings[payload] = event
        await self._send_event(Ping(payload=payload))
        await event.wait()
        if self.closed is not None:
            raise self.closed

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close: a close frame, the peer's answer, then the TCP connection; the
        handshake gets ``close_timeout_s`` at most, then TCP is aborted.
        Idempotent, and safe to call from several tasks."""
        try:
            with trio.move_on_after(self._close_timeout_s):
                if self.closed is None and self._frames.state is ConnectionState.OPEN:
                    self.closed = WebSocketClosedError(code, reason)
                    # Nobody reads messages any more: the reader drops them
                    # instead of waiting for room, and sees the peer's close.
                    self._inbox.close()
                    await self._send_event(CloseConnection(code=code, reason=reason))
                    await self._reader_done.wait()
                elif self.closed is not None and not self._aborted:
                    # A close frame of ours or the peer's is already out; give
                    # the peer the same time to read it before TCP goes.
                    await self._reader_done.wait()
        except WebSocketClosedError:
            pass
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Drop the TCP connection now (no close handshake)."""
        self._aborted = True
        self._mark_closed(ABNORMAL, "aborted")
        self._inbox.close()
        await trio.aclose_forcefully(self._stream)
