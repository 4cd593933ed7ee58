"""A TCP proxy in front of a real redis-server that loses one exchange on purpose.

`LossyProxy.lose_reply` makes the next request holding a marker reach Redis
(which applies it) and then cuts both connections before Redis's reply gets
back: the write's outcome is unknown to its sender, as when Redis is killed
between applying a commit and answering it. `LossyProxy.lose_request` cuts
them before the request is forwarded: nothing is applied, and the sender
cannot tell the two apart. `LossyProxy.answer_instead` answers a request
itself (a Redis still loading its data set answers ``-LOADING``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class LossyProxy:
    """Forwards 127.0.0.1:``port`` to Redis on ``upstream_port``, one thread pair
    per connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._forward_marked = True
        self._reply: bytes | None = None
        self._sockets: set[socket.socket] = set()
        #: Set once an armed loss happened (the exchange was cut).
        self.lost = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="lossy-proxy").start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose_reply(self, marker: bytes) -> None:
        """The next request holding ``marker`` reaches Redis; its reply does not
        come back (both connections are cut when it arrives)."""
        self._arm(marker, forward=True)

    def lose_request(self, marker: bytes) -> None:
        """The next request holding ``marker`` never reaches Redis (cut first)."""
        self._arm(marker, forward=False)

    def answer_instead(self, marker: bytes, reply: bytes) -> None:
        """The next request holding ``marker`` never reaches Redis: the proxy
        answers ``reply`` (raw RESP, e.g. ``-LOADING ...``) in its place."""
        self._arm(marker, forward=False, reply=reply)

    def _arm(self, marker: bytes, *, forward: bool, reply: bytes | None = None) -> None:
        with self._lock:
            self._marker, self._forward_marked, self._reply = marker, forward, reply
            self.lost.clear()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            _cut(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()  # Redis is down: as a refused connection
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            doomed = threading.Event()
            threading.Thread(
                target=self._requests, args=(client, upstream, doomed), daemon=True
            ).start()
            threading.Thread(
                target=self._replies, args=(upstream, client, doomed), daemon=True
            ).start()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, doomed: threading.Event
    ) -> None:
        for chunk in _chunks(client):
            with self._lock:
                marked = self._marker is not None and self._marker in chunk
                forward, reply = self._forward_marked, self._reply
                if marked:
                    self._marker = None
            if marked and reply is not None:
                with contextlib.suppress(OSError):
                    client.sendall(reply)
                self.lost.set()
                continue
            if marked and not forward:
                self._cut_both(client, upstream)
                return
            if marked:
                doomed.set()  # before it leaves: its reply is the next thing back
            try:
                upstream.sendall(chunk)
            except OSError:
                break
        self._cut_both(client, upstream, quiet=True)

    def _replies(
        self, upstream: socket.socket, client: socket.socket, doomed: threading.Event
    ) -> None:
        for chunk in _chunks(upstream):
            if doomed.is_set():
                self._cut_both(client, upstream)
                return
            try:
                client.sendall(chunk)
            except OSError:
                break
        self._cut_both(client, upstream, quiet=True)

    def _cut_both(
        self, client: socket.socket, upstream: socket.socket, *, quiet: bool = False
    ) -> None:
        _cut(client)
        _cut(upstream)
        if not quiet:
            self.lost.set()


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        yield chunk


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
