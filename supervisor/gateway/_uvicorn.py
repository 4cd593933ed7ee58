"""uvicorn, held to the trio server's limits: the protocol classes ``serve`` gives it.

uvicorn leaves a connection alone until it sends a whole request, counts no
connections before the upgrade, drops the bytes a client glued after its
upgrade request, closes a WebSocket after a fixed 10 s with ``close()`` (which
waits for a peer that reads nothing), and lets asyncio log a traceback for
each failed ``accept()`` when descriptors run out. So, for ``serve --server
asgi-uvicorn``:

- `UvicornShell.http_protocol` (h11): the connection caps (total and per
  address) before anything is read, refused ``503``/``429`` as the trio server
  does; the handshake timeout from the accept to the upgrade (as the README says); the bytes
  after the upgrade request handed on to the WebSocket.
- `UvicornShell.ws_protocol` (websockets' sans-I/O): ``--close-timeout``, after
  which the TCP connection is aborted, not politely closed; a close that does
  not wait for a peer that stopped reading; an ``abort`` the ASGI app calls
  (``scope["extensions"]["duplex.abort"]``) when its close could not finish.
- `UvicornShell.exception_handler`: asyncio's out-of-descriptors ``accept``
  error sheds the waiting connections with a reserve descriptor and is logged
  once per interval, without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Generator
from types import FrameType
from typing import Any

import uvicorn
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from supervisor.gateway._config import GatewayConfig, GatewayCounters
from supervisor.gateway._listener import REFUSALS
from supervisor.gateway._shell_limits import ShellLimits, refusal_bytes
from supervisor.gateway.asgi import ABORT_EXTENSION

__all__ = ["GatewayServer", "UvicornShell"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: How many waiting connections one out-of-descriptors error sheds at most.
_SHED_AT_ONCE = 64

#: What h11 buffers of one request before refusing it (uvicorn's default).
_MAX_REQUEST_BYTES = DEFAULT_MAX_INCOMPLETE_EVENT_SIZE


def _peer(transport: asyncio.BaseTransport) -> str:
    peername = transport.get_extra_info("peername")
    return str(peername[0]) if isinstance(peername, tuple) else "unknown"


class UvicornShell(ShellLimits):
    """What ``serve`` runs uvicorn with, sharing one set of counts and one log limiter."""

    def __init__(self, config: GatewayConfig, counters: GatewayCounters | None = None) -> None:
        super().__init__(config, counters)
        self.listener: socket.socket | None = None
        self._reserve = _open_reserve()
        self.http_protocol = self._http_protocol()
        self.ws_protocol = self._ws_protocol()

    def close(self) -> None:
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    # -- accept() out of descriptors ---------------------------------------------------

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's handler: descriptors running out shed connections, one log line
        per interval; anything else as asyncio would log it, rate-limited by message."""
        exc = context.get("exception")
        message = str(context.get("message", "unhandled error in the event loop"))
        if isinstance(exc, OSError) and "accept" in message:
            self._log(
                logging.ERROR,
                "descriptors",
                "out of descriptors (%s): shedding new connections, serving the rest",
                errno.errorcode.get(exc.errno or 0, "?"),
            )
            self._shed()
            return
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else ""
        self._log(logging.ERROR, message, "event loop: %s %s", message, detail)

    def _shed(self) -> None:
        listener = self.listener
        if listener is None:
            return
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        for _ in range(_SHED_AT_ONCE):
            try:
                sock, _ = listener.accept()
            except OSError:
                break
            with sock:
                self.shed()
                if self.config.tls_cert is None:
                    _refuse_now(sock, REFUSALS["descriptors"])
        self._reserve = _open_reserve()

    # -- the protocol classes ----------------------------------------------------------

    def _http_protocol(self) -> type[H11Protocol]:
        """The module's protocol classes, bound to this shell (its caps, its log)."""
        bound = {"gateway_shell": self}
        self._ws_class = type("GatewayWebSocketProtocol", (GatewayWebSocketProtocol,), bound)
        return type("GatewayH11Protocol", (GatewayH11Protocol,), bound)

    def _ws_protocol(self) -> type[WebSocketsSansIOProtocol]:
        return self._ws_class


class GatewayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under the shell's connection caps and handshake timeout."""

    gateway_shell: UvicornShell
    _peer_counted: str | None = None
    _handshake_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = _peer(transport)
        refusal = self.gateway_shell.admit(peer)
        if refusal is not None:
            if self.gateway_shell.config.tls_cert is None:
                transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        self._peer_counted = peer
        super().connection_made(transport)  # type: ignore[arg-type]
        self._handshake_timer = self.loop.call_later(
            self.gateway_shell.config.handshake_timeout_s, self._handshake_expired
        )

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        self.gateway_shell._log(logging.INFO, "handshake", "a connection sent no upgrade in time")
        self.transport.abort()

    def _handshake_done(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def release(self) -> None:
        """The TCP connection is gone (whichever protocol held it last)."""
        self._handshake_done()
        peer, self._peer_counted = self._peer_counted, None
        if peer is not None:
            self.gateway_shell.connections.release(peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        if self.transport is not None:
            super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        if len(self.conn.trailing_data[0]) > _MAX_REQUEST_BYTES:
            # A request whose headers never end: 431, as the trio server.
            self.transport.write(refusal_bytes(b"431 Request Header Fields Too Large"))
            self.transport.close()
            return
        self.gateway_shell._log(logging.INFO, "bad_http", "a client sent a malformed HTTP request")
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        # An HTTP request answered: uvicorn's keep-alive timeout takes over.
        self._handshake_done()
        super().on_response_complete()

    def handle_websocket_upgrade(self, event: Any) -> None:
        self._handshake_done()
        trailing, _ = self.conn.trailing_data
        super().handle_websocket_upgrade(event)
        ws = self.transport.get_protocol()
        if isinstance(ws, GatewayWebSocketProtocol):
            ws.on_lost = self.release
        else:  # pragma: no cover - only ours is configured
            self.release()
        if trailing and not self.transport.is_closing():
            # uvicorn hands the WebSocket only the request: the first
            # frame a client glued to it would be lost.
            ws.data_received(bytes(trailing))  # type: ignore[attr-defined]


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol with the shell's close timeout and abort."""

    gateway_shell: UvicornShell
    on_lost: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = self.gateway_shell.config.close_timeout_s

    def connection_lost(self, exc: Exception | None) -> None:
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()
        super().connection_lost(exc)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][ABORT_EXTENSION] = self.abort

    def abort(self) -> None:
        """Drop the TCP connection now: a stuck send or close ends too
        (``close()`` would wait for the peer to read what is queued)."""
        if self.transport is not None:
            self.transport.abort()

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                # uvicorn logs each with a traceback: a client could
                # fill the log. Closed 1007 the same, logged per interval.
                self.frames = []
                self.gateway_shell._log(
                    logging.INFO, "utf8", "a client sent text that is not UTF-8 (1007)"
                )
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    async def send(self, message: Any) -> None:
        if message.get("type") == "websocket.close" and self.handshake_complete:
            # A close is written whatever the peer's window: the bytes
            # queue in the transport, and the close timer aborts it.
            self.writable.set()
        await super().send(message)
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = self.loop.call_later(self.close_timeout, self.abort)


class GatewayServer(uvicorn.Server):
    """uvicorn's server as ``serve`` runs it: SIGINT/SIGTERM recorded (for the
    exit status) instead of re-raised, and every client told to go away before
    uvicorn's own shutdown (which would close WebSockets 1012)."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        go_away: Callable[[], Awaitable[None]],
        on_signal: Callable[[int], None],
    ) -> None:
        super().__init__(config)
        self._go_away = go_away
        self._on_signal = on_signal
        #: The signal that stopped the server (the first only).
        self.signals_received: list[int] = []

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises the signal once stopped (SIGTERM would then
        # kill the process): record it instead, and exit with a status.
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.signals_received:
            self.signals_received.append(sig)
            self._on_signal(sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn's own (it would close WebSockets 1012).
        await self._go_away()
        await super().shutdown(sockets)


def _refuse_now(sock: socket.socket, status: bytes) -> None:
    """A best-effort answer on a connection closed right after (never blocks)."""
    try:
        sock.setblocking(False)
        sock.send(refusal_bytes(status))
    except OSError:
        pass


def _open_reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
