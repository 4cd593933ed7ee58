"""``serve --workers`` parents in subprocesses for the tests (no tests here).

`serving_workers` starts one, reads its stderr as it goes (the parent's and
its workers' lines), and waits for ``N workers listening on URL``. The log
names each worker's pid (``worker K (pid P) listening``), and with
``--metrics-port B`` worker K answers ``/metrics`` on ``B + K``: `holder`
asks each which one holds a connection. `stream_until_killed` and
`resume_after` are a session whose worker is killed, and its resume.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import trio

from supervisor.cli._demo_processes import reap
from supervisor.cli._wire_client import WireClient
from tests.gateway_support import Frame, read_until, read_until_closed, seqs
from tests.test_cli import _env

_LISTENING = re.compile(rb"worker (\d+) \(pid (\d+)\) listening")
_READY = re.compile(rb"(\d+) workers listening on (\S+)")


@dataclass(slots=True)
class Workers:
    """A running ``serve --workers`` parent and what its log said so far."""

    process: trio.Process
    log: bytearray = field(default_factory=bytearray)
    url: str = ""
    changed: trio.Event = field(default_factory=trio.Event)

    def pids(self) -> dict[int, int]:
        """Each worker's latest pid, by index."""
        return {int(k): int(p) for k, p in _LISTENING.findall(bytes(self.log))}

    async def wait_for(self, pattern: bytes, count: int = 1) -> None:
        """Until the log holds ``pattern`` (a regex) ``count`` times."""
        while len(re.findall(pattern, bytes(self.log))) < count:
            if self.process.returncode is not None:
                raise AssertionError(f"the parent exited: {self.log.decode()}")
            await self.changed.wait()


async def _read(workers: Workers, stream: trio.abc.ReceiveStream) -> None:
    while chunk := await stream.receive_some():
        workers.log += chunk
        workers.changed.set()
        workers.changed = trio.Event()
    workers.changed.set()


@contextlib.asynccontextmanager
async def serving_workers(command: list[str]) -> AsyncIterator[Workers]:
    """The parent of ``command`` (a ``serve --workers`` command line), listening."""
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=_env())
    assert process.stderr is not None
    workers = Workers(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read, workers, process.stderr)
            await workers.wait_for(_READY.pattern)
            match = _READY.search(bytes(workers.log))
            assert match is not None
            workers.url = match.group(2).decode()
            yield workers
            with trio.fail_after(60):
                await process.wait()
    finally:
        await reap(process)


def free_ports(count: int) -> int:
    """A port ``B`` with ``B .. B + count - 1`` all free on 127.0.0.1 (just now)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base + count > 65_535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base


def connections_of(metrics_port: int) -> float:
    """``duplex_connections`` of the worker answering ``/metrics`` on ``metrics_port``."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("duplex_connections "))
    return float(line.split()[1])


async def holder(metrics_base: int, count: int) -> int:
    """The index of the one worker (of ``count`` on ``metrics_base + k``) with a connection."""
    with trio.fail_after(10):
        while True:
            counts = [
                await trio.to_thread.run_sync(connections_of, metrics_base + k)
                for k in range(count)
            ]
            holding = [k for k, n in enumerate(counts) if n > 0]
            if len(holding) == 1:
                return holding[0]
            await trio.sleep(0.05)


async def stream_until_killed(url: str, kill: Callable[[], Awaitable[None]]) -> list[Frame]:
    """Open a session at ``url``, read 5 events, ``await kill()`` (its worker's
    death) and read until the connection closes: every frame from ``session.created``."""
    client = await WireClient.connect(url)
    try:
        await client.send_json({"type": "session.open"})
        frames = await read_until(client, "session.created")
        for _ in range(5):
            frames.append(await client.receive_json())
        await kill()
        more, _ = await read_until_closed(client)
        return frames + more
    finally:
        await client.cut()


async def resume_after(url: str, frames: list[Frame]) -> tuple[WireClient, list[Frame]]:
    """Resume the session ``frames`` opened, from their last event, at ``url``;
    the connection (the caller closes it) and its frames through 5 more events."""
    created = next(f for f in frames if f.get("type") == "session.created")
    client = await WireClient.connect(url)
    try:
        await client.send_json(
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": seqs(frames)[-1],
            }
        )
        after = await read_until(client, "session.resumed")
        while len(seqs(after)) < 5:
            after.append(await client.receive_json())
    except BaseException:
        await client.cut()
        raise
    return client, after
