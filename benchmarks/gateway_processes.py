"""The gateway benchmark's processes: a server for one point, and reading them.

`benchmark_server` starts `benchmarks.gateway_server`; a `ServerFactory` of
another kind (``serve --workers``, `benchmarks.gateway_workers`) serves a
point the same way: `benchmarks.gateway.measure_point` takes either.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import trio

from benchmarks.gateway_server import RATE_HZ

__all__ = ["Lines", "Served", "ServerFactory", "benchmark_server", "cpu_seconds", "start", "stop"]

_TICKS = os.sysconf("SC_CLK_TCK")


class Lines:
    """Lines from a process's stdout."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError("the process ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system, every thread) process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def start(command: list[str], *, stdin: bool) -> tuple[trio.Process, Lines]:
    """``command`` started, its stdout read as lines (its stdin a pipe if ``stdin``)."""
    process = await trio.lowlevel.open_process(
        command,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    return process, Lines(process.stdout)


async def stop(process: trio.Process) -> None:
    """``process`` killed if it still runs, and reaped."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.kill()
        await process.wait()


@dataclass(frozen=True, slots=True)
class Served:
    """A server under load: where clients connect, and the CPU seconds used so
    far by every process serving them (read at the window's start and end)."""

    url: str
    cpu_seconds: Callable[[], float]


#: Starts a server for one point and stops it after (`benchmark_server`'s shape).
ServerFactory = Callable[[], AbstractAsyncContextManager[Served]]


@asynccontextmanager
async def benchmark_server(
    shell: str, mode: str, server_args: Sequence[str] = ()
) -> AsyncIterator[Served]:
    """A fresh `benchmarks.gateway_server` process, killed at the block's end."""
    command = [sys.executable, "-m", "benchmarks.gateway_server", "--shell", shell]
    command += ["--mode", mode, "--rate", str(RATE_HZ), *server_args]
    command += os.environ.get("BENCH_SERVER_ARGS", "").split()
    server, lines = await start(command, stdin=False)
    try:
        with trio.fail_after(30):
            url = (await lines.next()).split()[-1]
        yield Served(url, functools.partial(cpu_seconds, server.pid))
    finally:
        await stop(server)
