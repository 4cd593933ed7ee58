"""A client's WebSocket as the gateway uses it.

`Transport` is what a shell hands `GatewayService.converse`
(`supervisor.gateway._service`) for each accepted WebSocket; `_SocketSend`
is one as the registry's ``send``, each frame timed and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from supervisor.gateway._operations import OperatedGateway
from supervisor.gateway._protocol import frame_text

__all__ = ["Transport"]


class Transport(Protocol):
    """One accepted WebSocket, as a shell provides it."""

    async def receive(self) -> str | bytes:
        """The next whole message; `TransportClosedError` once closed."""
        ...

    async def send(self, text: str) -> None:
        """One text message; `TransportClosedError` if closed."""
        ...

    async def close(self, code: int, reason: str | None) -> None:
        """Close (bounded in time, idempotent)."""
        ...

    async def ping(self) -> None:
        """Ping and wait for the pong (only called when the shell keeps alive)."""
        ...


class _SocketSend:
    """A client's socket as the registry's ``send``: each frame timed and counted.

    With a socket that can write a frame at once (`ServerWebSocket.send_now`,
    the trio shell's, not TLS), its ``send_now`` lets the session's outbox
    write a lone event in its sender's step instead of its pump's; ``None``
    with any other socket.
    """

    __slots__ = ("_service", "_ws", "_ws_send_now", "send_now")

    def __init__(self, service: OperatedGateway, ws: Transport) -> None:
        self._service = service
        self._ws = ws
        self._ws_send_now: Callable[[bytes], bool] | None = getattr(ws, "send_now", None)
        self.send_now = self._send_now if self._ws_send_now is not None else None

    async def __call__(self, frame: Mapping[str, object]) -> None:
        # The real clock for a real latency, and far cheaper per frame than
        # anyio.current_time(), which looks the event loop up each call.
        service = self._service
        started = time.perf_counter()
        service.sends_in_progress += 1
        try:
            await self._ws.send(frame_text(frame))
        finally:
            service.sends_in_progress -= 1
        service.frames_delivered += 1
        service.metrics.send_latency.observe(time.perf_counter() - started)

    def _send_now(self, frame: Mapping[str, object], encoded: bytes | None) -> bool:
        """``frame`` written at once, or ``False``: nothing written (await the send).

        ``encoded``: the journal's compact JSON of the frame, which is
        `frame_text`'s (the same encoder options), so nothing is encoded here,
        in the session's turn. An unjournaled frame (``None``) goes the
        pump's way: a payload that is no JSON fails its send there, as an
        answer to its caller."""
        assert self._ws_send_now is not None  # noqa: S101 - set only with it
        if encoded is None:
            return False
        started = time.perf_counter()
        if not self._ws_send_now(encoded):
            return False
        service = self._service
        service.frames_delivered += 1
        service.metrics.send_latency.observe(time.perf_counter() - started)
        return True
