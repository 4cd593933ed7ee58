"""The accept loop: every connection gets its own task; running out of descriptors
sheds new connections instead of ending the server.

When ``accept`` fails for lack of descriptors (EMFILE, ENFILE) or memory, the
pending connection would stay in the kernel's queue and make every later
accept fail at once. So one descriptor is kept in reserve: it is freed, the
pending connection accepted, told ``503`` (plain HTTP only) and closed, and the
reserve taken again. Connections already served go on untouched; the loop logs
one line per interval however many it sheds.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable

import trio

from supervisor._log_limit import LogLimiter

__all__ = ["REFUSALS", "accept_forever", "refuse_raw"]

#: accept() failing for want of descriptors or memory: shed, then go on.
_CAPACITY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
#: accept() failing because the peer was gone before it was accepted.
_PEER_GONE = {
    errno.ECONNABORTED,
    errno.EPROTO,
    errno.EPERM,
    errno.ENETDOWN,
    errno.ENOPROTOOPT,
    errno.EHOSTDOWN,
    errno.ENONET,
    errno.EHOSTUNREACH,
    errno.EOPNOTSUPP,
    errno.ENETUNREACH,
}

#: What a refused plain-HTTP connection is told, by the cap it hit.
REFUSALS = {
    "total": b"503 Service Unavailable",
    "address": b"429 Too Many Requests",
    "descriptors": b"503 Service Unavailable",
}

Handler = Callable[[trio.socket.SocketType, str], Awaitable[None]]


def _reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


async def refuse_raw(sock: trio.socket.SocketType, status: bytes, *, linger_s: float) -> None:
    """Answer a connection not yet read with an HTTP ``status`` and close it.

    The request is read and dropped for up to ``linger_s`` after the answer,
    so closing does not reset the connection before the client read it.
    """
    with sock:
        answer = b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        with trio.move_on_after(linger_s):
            try:
                await sock.send(answer)
                sock.shutdown(trio.socket.SHUT_WR)
                while await sock.recv(4096):
                    pass
            except OSError:
                pass


async def accept_forever(
    listener: trio.socket.SocketType,
    handler: Handler,
    nursery: trio.Nursery,
    *,
    log: LogLimiter,
    plain_http: bool,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on ``listener`` until cancelled; ``handler(sock, address)`` per connection.
    Closes ``listener`` at the end. Started (``nursery.start``) once its reserve
    descriptor is held, so a server that says it listens holds all it holds at rest."""
    reserve = _reserve()
    task_status.started()
    try:
        while True:
            try:
                sock, address = await listener.accept()
            except OSError as exc:
                if exc.errno in _PEER_GONE:
                    continue
                if exc.errno not in _CAPACITY:
                    log.log(
                        logging.ERROR,
                        "accept",
                        "accept failed: %s; retrying",
                        os.strerror(exc.errno or 0),
                        now=trio.current_time(),
                    )
                    await trio.sleep(0.1)
                    continue
                log.log(
                    logging.ERROR,
                    "descriptors",
                    "out of descriptors (%s): shedding new connections, serving the rest",
                    errno.errorcode.get(exc.errno or 0, "?"),
                    now=trio.current_time(),
                )
                reserve = await _shed_one(listener, reserve, plain_http=plain_http)
                continue
            peer = str(address[0]) if isinstance(address, tuple) else str(address)
            nursery.start_soon(handler, sock, peer)
    finally:
        listener.close()
        if reserve is not None:
            os.close(reserve)


async def _shed_one(
    listener: trio.socket.SocketType, reserve: int | None, *, plain_http: bool
) -> int | None:
    if reserve is None:
        # Nothing to free: wait for descriptors to come back.
        await trio.sleep(0.1)
        return _reserve()
    os.close(reserve)
    try:
        with trio.move_on_after(0.1):
            sock, _ = await listener.accept()
            if plain_http:
                # A short answer: the descriptor goes back to the reserve soon.
                await refuse_raw(sock, REFUSALS["descriptors"], linger_s=0.05)
            else:
                sock.close()
    except OSError:
        pass
    return _reserve()
