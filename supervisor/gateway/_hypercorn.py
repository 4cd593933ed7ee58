"""Hypercorn (trio worker), held to the trio server's limits where it can be.

Hypercorn counts no connections, refuses (400) a WebSocket whose client sent
a frame before the app accepted it (a first frame glued to the upgrade
request), and writes every byte with a shielded ``send_all``: a client that
stops reading holds the connection, and the app's task, for good. It takes no
protocol classes, so `HypercornShell.installed` puts ours in the place of its
two module-level names while ``serve`` runs it (one server per process):

- ``hypercorn.trio.run.TCPServer``: the connection caps (total and per
  address) before anything is read, refused ``503``/``429`` as the trio
  server does; a write stuck past ``--send-timeout`` plus ``--close-timeout``
  aborts the TCP connection (its shield kept against other cancellations).
- ``hypercorn.protocol.h11.WSStream``: the bytes that arrive before the app
  accepts are held (up to four frames' worth) and handed on at the accept; a
  frame that breaks the protocol is answered with its close code.
- ``trio.serve_listeners`` (which Hypercorn's trio worker calls): the trio
  server's accept loop for plain TCP listeners, which sheds connections when
  descriptors run out instead of leaving them waiting.

The handshake timeout is Hypercorn's own keep-alive timeout, set to
``--handshake-timeout`` (it runs from accept to the first request). What it
cannot do is in the README's shell table.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Body, Data, StreamClosed
from hypercorn.protocol.ws_stream import FrameTooLargeError, WSStream
from hypercorn.trio.tcp_server import TCPServer
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._listener import accept_forever
from supervisor.gateway._shell_limits import ShellLimits

__all__ = ["HypercornShell"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: trio's own, for the listeners ours leaves to it (TLS).
_TRIO_SERVE_LISTENERS = trio.serve_listeners


def _socket_of(stream: Any) -> Any:
    inner = getattr(stream, "transport_stream", stream)
    return getattr(inner, "socket", None)


def _peer(stream: Any) -> str:
    sock = _socket_of(stream)
    try:
        address = sock.getpeername() if sock is not None else None
    except OSError:
        address = None
    return str(address[0]) if isinstance(address, tuple) else "unknown"


class HypercornShell(ShellLimits):
    """What ``serve`` runs Hypercorn with; see the module docstring."""

    def __init__(self, config: GatewayConfig, counters: GatewayCounters | None = None) -> None:
        super().__init__(config, counters)
        self.tcp_server = self._tcp_server()
        #: Set once the accept loops run (their reserve descriptors held):
        #: ``serve`` says it listens after that, as the trio server does.
        self.accepting = trio.Event()
        self.ws_stream = self._ws_stream()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Hypercorn's TCPServer and WSStream are ours for the block."""
        import hypercorn.protocol.h11 as h11_protocol  # noqa: PLC0415
        import hypercorn.trio.run as trio_run  # noqa: PLC0415

        saved = trio_run.TCPServer, h11_protocol.WSStream, trio.serve_listeners  # type: ignore[attr-defined]
        trio_run.TCPServer = self.tcp_server  # type: ignore[attr-defined]
        h11_protocol.WSStream = self.ws_stream  # type: ignore[attr-defined]
        trio.serve_listeners = self.serve_listeners  # type: ignore[assignment]
        try:
            yield
        finally:
            trio_run.TCPServer, h11_protocol.WSStream, trio.serve_listeners = saved  # type: ignore[attr-defined]

    async def serve_listeners(
        self,
        handler: Callable[[trio.abc.Stream], Awaitable[object]],
        listeners: list[Any],
        *,
        handler_nursery: trio.Nursery | None = None,
        task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """``trio.serve_listeners`` as Hypercorn calls it, on the trio server's accept
        loop: out of descriptors, waiting connections are shed (503) and it is
        logged once per interval (trio's own loop only waits, and logs a traceback
        each time). TLS listeners keep trio's loop."""
        plain = [listener for listener in listeners if isinstance(listener, trio.SocketListener)]
        others = [listener for listener in listeners if listener not in plain]

        async def connection(sock: trio.socket.SocketType, peer: str) -> None:
            await handler(trio.SocketStream(sock))

        async with trio.open_nursery() as nursery:
            into = handler_nursery if handler_nursery is not None else nursery
            for listener in plain:
                await nursery.start(
                    lambda task_status, sock=listener.socket: accept_forever(
                        sock,
                        connection,
                        into,
                        log=self.log,
                        plain_http=True,
                        task_status=task_status,
                    )
                )
            if others:
                await nursery.start(
                    functools.partial(_TRIO_SERVE_LISTENERS, handler, others, handler_nursery=into)
                )
            task_status.started(listeners)
            self.accepting.set()

    def _tcp_server(self) -> type[TCPServer]:
        shell = self
        stuck_after = self.config.send_timeout_s + self.config.close_timeout_s

        class GatewayTCPServer(TCPServer):
            async def run(self) -> None:
                peer = _peer(self.stream)
                refusal = shell.admit(peer)
                if refusal is not None:
                    await self._refuse(refusal)
                    return
                try:
                    await super().run()
                finally:
                    shell.connections.release(peer)

            async def _refuse(self, answer: bytes) -> None:
                with trio.move_on_after(1.0):
                    if shell.config.tls_cert is None:
                        with contextlib.suppress(trio.BrokenResourceError, OSError):
                            await self.stream.send_all(answer)
                await trio.aclose_forcefully(self.stream)

            async def protocol_send(self, event: Any) -> None:
                if not isinstance(event, RawData):
                    await super().protocol_send(event)
                    return
                async with self.send_lock:
                    # Shielded as Hypercorn's (a cancelled write would cut a
                    # frame), but no longer than a send may take.
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + stuck_after
                        try:
                            await self.stream.send_all(event.data)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            await self.protocol.handle(Closed())
                            return
                if scope.cancelled_caught:
                    shell._log(
                        logging.INFO, "send_stuck", "a client stopped reading: connection aborted"
                    )
                    await trio.aclose_forcefully(self.stream)
                    await self.protocol.handle(Closed())

        GatewayTCPServer.__qualname__ = "GatewayTCPServer"
        return GatewayTCPServer

    def _ws_stream(self) -> type[WSStream]:
        most = self.config.max_frame_bytes * 4

        class GatewayWSStream(WSStream):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._early: list[Any] = []
                self._early_bytes = 0

            async def handle(self, event: Any) -> None:
                if (
                    isinstance(event, Body | Data)
                    and not self.closed
                    and getattr(self, "handshake", None) is not None
                    and not self.handshake.accepted
                    and self._early_bytes + len(event.data) <= most
                ):
                    # Glued to the upgrade request: for the app once it accepts.
                    self._early.append(event)
                    self._early_bytes += len(event.data)
                    return
                await super().handle(event)

            async def _handle_events(self) -> None:
                # Hypercorn's loop, but a frame that breaks the protocol is
                # answered with its close code (1002, 1007, ...) before the
                # stream closes, as the trio server does; Hypercorn dropped
                # the connection without a word.
                for event in self.connection.events():
                    if isinstance(event, Message):
                        try:
                            self.buffer.extend(event)
                        except FrameTooLargeError:
                            close = CloseConnection(code=CloseReason.MESSAGE_TOO_BIG)
                            await self._send_wsproto_event(close)
                            break
                        if event.message_finished:
                            await self.app_put(self.buffer.to_message())  # type: ignore[misc]
                            self.buffer.clear()
                    elif isinstance(event, Ping):
                        await self._send_wsproto_event(event.response())
                    elif isinstance(event, CloseConnection):
                        if self.connection.state == ConnectionState.REMOTE_CLOSING:
                            await self._send_wsproto_event(event.response())
                        elif self.connection.state == ConnectionState.OPEN:
                            violation = CloseConnection(code=event.code, reason=event.reason)
                            await self._send_wsproto_event(violation)
                        await self.send(StreamClosed(stream_id=self.stream_id))

            async def app_send(self, message: Any) -> None:
                await super().app_send(message)
                if message is not None and message.get("type") == "websocket.accept":
                    early, self._early = self._early, []
                    for event in early:
                        await super().handle(event)

        GatewayWSStream.__qualname__ = "GatewayWSStream"
        return GatewayWSStream
