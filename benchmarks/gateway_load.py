"""The gateway benchmark's load generator: WebSocket clients in a process of their own.

``python -m benchmarks.gateway_load --url URL --clients N --warmup S --seconds S``

Connects ``N`` clients (asyncio protocols with a minimal RFC 6455 client of
ours, so parsing costs the generator as little as pure Python allows), opens
a session on each (``session.open``, waits for ``session.created``), prints
``ready`` and waits for a ``go`` line on stdin. Then it lets ``--warmup``
seconds pass and counts, for ``--seconds``, every event received
(``server_event_seq``), those that carry a stamp, and their latency: the
receive time minus the ``t`` the server's engine stamped just before it
called its send, both
``time.monotonic()`` (one system-wide clock on Linux). Clients ack every
20 events, as a real client would. At the end each client sends
``session.close``; one JSON line on stdout holds the figures, including the
share of one CPU the generator itself used in the window (near 1.0: the
generator, not the server, was the limit).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import resource
import sys
import time
from urllib.parse import urlsplit

__all__ = ["main"]

ACK_EVERY = 20
#: Latencies kept per generator (a random sample beyond it), enough for a p99.
MAX_SAMPLES = 200_000

_TEXT, _CLOSE, _PING, _PONG, _CONTINUATION = 0x1, 0x8, 0x9, 0xA, 0x0


def _frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 5.3: clients mask)."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    stream = (key * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
    return head + key + masked


class Tally:
    """What every client of this process adds to."""

    def __init__(self) -> None:
        self.window: tuple[float, float] | None = None
        self.received = 0
        self.latencies: list[float] = []
        self.seen = 0
        self.dropped = 0
        self.errors: dict[str, int] = {}

    def event(self, now: float, stamp: float | None) -> None:
        window = self.window
        if window is None or not window[0] <= now < window[1]:
            return
        self.received += 1
        if stamp is None:
            return
        self.seen += 1
        if len(self.latencies) < MAX_SAMPLES:
            self.latencies.append(now - stamp)
        else:
            slot = random.randrange(self.seen)
            if slot < MAX_SAMPLES:
                self.latencies[slot] = now - stamp

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


class Client(asyncio.Protocol):
    """One WebSocket client: upgrade, ``session.open``, then read, stamp and ack."""

    def __init__(self, host: str, path: str, tally: Tally) -> None:
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: "
            f"{base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self._tally = tally
        self._buffer = bytearray()
        self._upgraded = False
        self._parts: list[bytes] = []
        self._last_seq = 0
        self._unacked = 0
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed before session.created"))

    def send_json(self, message: dict[str, object]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(_TEXT, json.dumps(message).encode()))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self._upgraded:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buffer.startswith(b"HTTP/1.1 101"):
                self._tally.error("upgrade refused")
                self.opened.set_exception(ConnectionError(bytes(buffer[:end]).decode()))
                assert self.transport is not None
                self.transport.close()
                return
            del buffer[: end + 4]
            self._upgraded = True
            self.send_json({"type": "session.open"})
        start = 0
        size = len(buffer)
        while size - start >= 2:
            first, second = buffer[start], buffer[start + 1]
            length = second & 0x7F
            at = start + 2
            if length == 126:
                if size - start < 4:
                    break
                length = int.from_bytes(buffer[at : at + 2], "big")
                at += 2
            elif length == 127:
                if size - start < 10:
                    break
                length = int.from_bytes(buffer[at : at + 8], "big")
                at += 8
            if size - at < length:
                break
            payload = bytes(buffer[at : at + length])
            start = at + length
            self._on_frame(first & 0x80 != 0, first & 0x0F, payload)
        del buffer[:start]

    def _on_frame(self, final: bool, opcode: int, payload: bytes) -> None:
        if opcode in (_TEXT, _CONTINUATION):
            self._parts.append(payload)
            if final:
                whole = b"".join(self._parts)
                self._parts.clear()
                self._on_message(time.monotonic(), whole)
        elif opcode == _PING:
            assert self.transport is not None
            self.transport.write(_frame(_PONG, payload))
        elif opcode == _CLOSE and self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(_CLOSE, payload[:2]))
            self.transport.close()

    def _on_message(self, now: float, data: bytes) -> None:
        message = json.loads(data)
        seq = message.get("server_event_seq")
        if isinstance(seq, int):
            stamp = message.get("t")
            self._tally.event(now, stamp if isinstance(stamp, float) else None)
            self._last_seq = seq
            self._unacked += 1
            if self._unacked >= ACK_EVERY:
                self._unacked = 0
                self.send_json({"type": "ack", "server_event_seq": seq})
        elif message.get("type") == "session.created":
            if not self.opened.done():
                self.opened.set_result(None)
        elif message.get("type") == "error":
            self._tally.error(str(message.get("code")))

    def finish(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.send_json({"type": "session.close"})


async def _connect(url: str, tally: Tally, limit: asyncio.Semaphore) -> Client | None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    loop = asyncio.get_running_loop()
    async with limit:
        try:
            _, client = await loop.create_connection(
                lambda: Client(f"{host}:{port}", parts.path or "/", tally), host, port
            )
            await asyncio.wait_for(client.opened, 30)
        except (OSError, TimeoutError, ConnectionError) as exc:
            tally.error(type(exc).__name__)
            return None
    return client


async def run(url: str, clients: int, warmup: float, seconds: float) -> dict[str, object]:
    tally = Tally()
    limit = asyncio.Semaphore(64)
    connected = await asyncio.gather(*(_connect(url, tally, limit) for _ in range(clients)))
    crowd = [c for c in connected if c is not None]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    await asyncio.sleep(warmup)
    started, cpu_started = time.monotonic(), time.process_time()
    tally.window = (started, started + seconds)
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu_started
    dropped = sum(c.closed for c in crowd)
    for client in crowd:
        client.finish()
    await asyncio.sleep(0.2)
    for client in crowd:
        if client.transport is not None:
            client.transport.close()
    return {
        "clients": clients,
        "opened": len(crowd),
        "dropped": dropped,
        "received": tally.received,
        "stamped": tally.seen,
        "window_s": elapsed,
        "loader_cpu": cpu / elapsed,
        "latencies_s": tally.latencies,
        "errors": tally.errors,
    }


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    del soft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    _raise_descriptor_limit()
    figures = asyncio.run(run(args.url, args.clients, args.warmup, args.seconds))
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
