"""The gateway's WebSocket upgrade, server side: h11 reads the HTTP request.

`read_upgrade` reads and checks one request (a plain GET a route answers is
answered here too); `reject` answers it with an HTTP status. What the
connection becomes after a 101 is `supervisor.gateway._websocket`'s
(`accept`, `ServerWebSocket`), which also re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import NoReturn

import h11
import trio

from supervisor.gateway._core import TransportClosedError

__all__ = [
    "ABNORMAL",
    "MAX_REQUEST_BYTES",
    "STREAM_ERRORS",
    "Route",
    "Upgrade",
    "UpgradeRefusedError",
    "WebSocketClosedError",
    "read_upgrade",
    "reject",
    "send_all",
]

#: Errors a stream raises when its peer is gone or it was closed under us.
STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
ABNORMAL = 1006
#: An upgrade request (request line and headers) larger than this is refused 431.
MAX_REQUEST_BYTES = 16_384


class WebSocketClosedError(TransportClosedError):
    """The connection is closed: ``code`` and ``reason`` of the close, if any."""

    def __init__(self, code: int | None, reason: str | None) -> None:
        super().__init__(f"websocket closed: {code} {reason or ''}".strip())
        self.code = code
        self.reason = reason


class UpgradeRefusedError(Exception):
    """The request was not a WebSocket upgrade; it was answered ``status``."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(f"{status}: {why}")
        self.status = status


@dataclass(frozen=True, slots=True, kw_only=True)
class Upgrade:
    """A valid upgrade request, read but not yet answered."""

    path: str
    headers: dict[bytes, bytes]
    key: bytes
    http: h11.Connection


async def send_all(stream: trio.abc.Stream, data: bytes) -> None:
    """``stream.send_all(data)``; a peer gone is `WebSocketClosedError`."""
    try:
        await stream.send_all(data)
    except STREAM_ERRORS as exc:
        raise WebSocketClosedError(ABNORMAL, "peer gone") from exc


#: A plain GET's answer: status, content type, body; ``None``: no such route.
Route = Callable[[str], "tuple[int, str, bytes] | None"]


async def read_upgrade(stream: trio.abc.Stream, routes: Route | None = None) -> Upgrade:
    """Read one HTTP request; answer and raise `UpgradeRefusedError` if it is
    no WebSocket upgrade, `WebSocketClosedError` if the peer leaves first.
    The caller bounds the time (a TLS handshake happens inside, on first read).
    """
    http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    request: h11.Request | None = None
    while True:
        try:
            event = http.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            await _refuse(stream, http, status if status >= 400 else 400, str(exc))
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65_536)
            except STREAM_ERRORS as exc:
                raise WebSocketClosedError(ABNORMAL, "peer gone during the upgrade") from exc
            if not data:
                raise WebSocketClosedError(ABNORMAL, "peer gone during the upgrade")
            http.receive_data(bytes(data))
        elif isinstance(event, h11.Request):
            request = event
            await _check_request(stream, http, request, routes)
        elif event is h11.PAUSED:
            # An upgrade request fully read: what follows is WebSocket frames.
            assert request is not None  # noqa: S101 - h11 pauses only after a request
            headers = {name.lower(): value for name, value in request.headers}
            return Upgrade(
                path=request.target.decode("latin-1"),
                headers=headers,
                key=headers[b"sec-websocket-key"],
                http=http,
            )
        elif isinstance(event, h11.ConnectionClosed):
            raise WebSocketClosedError(ABNORMAL, "peer gone during the upgrade")
        # Data / EndOfMessage of a request body: skipped; h11 pauses after it.


async def _check_request(
    stream: trio.abc.Stream, http: h11.Connection, req: h11.Request, routes: Route | None
) -> None:
    headers = {name.lower(): value for name, value in req.headers}
    connection = {t.strip().lower() for t in headers.get(b"connection", b"").split(b",")}
    upgrading = headers.get(b"upgrade", b"").lower() == b"websocket"
    if req.method == b"GET" and not upgrading and routes is not None:
        answer = routes(req.target.decode("latin-1").split("?", 1)[0])
        if answer is not None:
            status, content_type, body = answer
            await _answer(stream, http, status, content_type, body)
            raise UpgradeRefusedError(status, "a plain HTTP request, answered")
    if req.method != b"GET":
        await _refuse(stream, http, 405, "the upgrade must be a GET")
    if headers.get(b"upgrade", b"").lower() != b"websocket" or b"upgrade" not in connection:
        await _refuse(stream, http, 426, "this endpoint speaks WebSocket only")
    if headers.get(b"sec-websocket-version") != b"13":
        await _refuse(stream, http, 426, "Sec-WebSocket-Version must be 13")
    if not headers.get(b"sec-websocket-key"):
        await _refuse(stream, http, 400, "no Sec-WebSocket-Key")


async def _refuse(stream: trio.abc.Stream, http: h11.Connection, status: int, why: str) -> NoReturn:
    await reject(stream, http, status)
    raise UpgradeRefusedError(status, why)


async def _answer(
    stream: trio.abc.Stream, http: h11.Connection, status: int, content_type: str, body: bytes
) -> None:
    try:
        data = http.send(
            h11.Response(
                status_code=status,
                reason=HTTPStatus(status).phrase.encode(),
                headers=[
                    (b"Content-Type", content_type.encode()),
                    (b"Content-Length", str(len(body)).encode()),
                    (b"Connection", b"close"),
                ],
            )
        )
        data = (data or b"") + (http.send(h11.Data(data=body)) or b"")
        data += http.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError:
        return
    await send_all(stream, data)


async def reject(stream: trio.abc.Stream, http: h11.Connection, status: int) -> None:
    """Answer the request with ``status`` and no body; the caller closes the stream."""
    extra = [(b"Sec-WebSocket-Version", b"13")] if status == 426 else []
    try:
        data = http.send(
            h11.Response(
                status_code=status,
                reason=HTTPStatus(status).phrase.encode(),
                headers=[(b"Content-Length", b"0"), (b"Connection", b"close"), *extra],
            )
        )
        data = (data or b"") + (http.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return  # h11 cannot answer in this state (a broken request): just close
    await send_all(stream, data)
