"""A TCP proxy of the tests' own that cuts connections (loopback only), and a
``serve`` child process (no tests here).

`CuttingProxy` listens on 127.0.0.1, forwards each connection to its
``upstream`` port, and cuts every connection it holds (no close frame: both
sockets simply close, as a network drop would) when told to, or at random
with a seeded generator while `cut_at_random` runs. Its loops are bounded by
the test that runs it.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import anyio.abc

__all__ = ["CuttingProxy", "cutting_proxy", "serve_process"]


class CuttingProxy:
    def __init__(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], port: int, upstream: int
    ) -> None:
        self.listener = listener
        self.port = port
        #: The loopback port connections go to (a test may point it elsewhere).
        self.upstream = upstream
        self.cuts = 0
        self.connections = 0
        self._streams: set[anyio.abc.SocketStream] = set()

    async def cut_all(self) -> None:
        if self._streams:
            self.cuts += 1
        for stream in list(self._streams):
            await anyio.aclose_forcefully(stream)
        self._streams.clear()

    async def cut_at_random(self, rng: random.Random, mean_interval_s: float) -> None:
        """Cut everything at random moments until cancelled."""
        while True:
            await anyio.sleep(rng.expovariate(1 / mean_interval_s))
            await self.cut_all()

    async def _pipe(self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(
            anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
        ):
            async for chunk in source:
                await sink.send(chunk)
        await anyio.aclose_forcefully(sink)
        await anyio.aclose_forcefully(source)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        try:
            server = await anyio.connect_tcp("127.0.0.1", self.upstream)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(client)
            if isinstance(exc, OSError):
                return
            raise
        self._streams |= {client, server}
        try:
            async with anyio.create_task_group() as pipes:
                pipes.start_soon(self._pipe, client, server)
                pipes.start_soon(self._pipe, server, client)
        finally:
            self._streams -= {client, server}
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(client)
                await anyio.aclose_forcefully(server)


@contextlib.asynccontextmanager
async def cutting_proxy(upstream: int) -> AsyncIterator[CuttingProxy]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.listeners[0].extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610
    proxy = CuttingProxy(listener, port, upstream)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listener.serve, proxy._handle)
            try:
                yield proxy
            finally:
                tasks.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await proxy.cut_all()
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()


@contextlib.asynccontextmanager
async def serve_process(*flags: str) -> AsyncIterator[tuple[int, anyio.abc.Process]]:
    """``duplex-supervisor serve --port 0 FLAGS`` as a child; its port."""
    command = [sys.executable, "-m", "supervisor", "serve", "--port", "0", *flags]
    async with await anyio.open_process(command, stderr=subprocess.PIPE) as process:
        assert process.stderr is not None
        log = b""
        try:
            with anyio.fail_after(30):
                while b"listening on" not in log or not log.endswith(b"\n"):
                    log += await process.stderr.receive()
            line = next(ln for ln in log.decode().splitlines() if "listening on" in ln)
            url = line.rsplit(" ", 1)[-1]
            port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

            async def drain() -> None:
                assert process.stderr is not None
                with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                    while True:
                        await process.stderr.receive()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(drain)
                try:
                    yield port, process
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.terminate()
                    with anyio.move_on_after(10):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
