"""``demo --processes N --redis URL``: N gateway processes on one Redis, one killed.

Each process is ``serve --port 0 --redis URL`` in a child process. The chaos
clients connect and resume on a live process picked at random, so resumes
land on other processes and take sessions over; halfway through, one process
holding the most clients is killed with SIGKILL, and its clients resume
elsewhere. ``--redis local`` starts a redis-server of the demo's own on a free
loopback port (no persistence: it lives for the run) and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import trio

from supervisor._cli_flags import SECRET_ENV
from supervisor.gateway._chaos import ChaosConfig, ChaosReport, Targets

__all__ = [
    "LOCAL_REDIS",
    "drain",
    "listening_url",
    "local_redis",
    "run_processes_demo",
    "serve_command",
]

#: ``--redis local``: the demo starts (and stops) a redis-server of its own.
LOCAL_REDIS = "local"

NO_REDIS_SERVER = (
    "--redis local needs redis-server on PATH (Debian: apt-get install redis-server), "
    "or give a running Redis: --redis redis://HOST:PORT/0"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def local_redis(appendfsync: str | None = None) -> Iterator[str]:
    """A redis-server on a free 127.0.0.1 port for the block; its URL.

    No persistence, unless ``appendfsync`` (``always``, ``everysec``, ``no``)
    turns its append-only file on. `ValueError` naming the fix when
    ``redis-server`` is not on PATH.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise ValueError(NO_REDIS_SERVER)
    with tempfile.TemporaryDirectory(prefix="duplex-demo-redis-") as directory:
        port = _free_port()
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", directory]
        argv += ["--save", "", "--daemonize", "no"]
        if appendfsync is None:
            argv += ["--appendonly", "no"]
        else:
            argv += ["--appendonly", "yes", "--appendfsync", appendfsync]
        argv += ["--loglevel", "warning"]
        process = subprocess.Popen(  # noqa: S603 - our own argv
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 20
            while not _answers_ping(port):
                if process.poll() is not None:
                    raise ValueError(f"redis-server exited {process.returncode} at start")
                if time.monotonic() > deadline:
                    raise ValueError("redis-server did not answer PING within 20 s")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


async def listening_url(stream: trio.abc.ReceiveStream) -> str:
    """The URL a ``serve`` child logs (``listening on URL``) on ``stream``."""
    log = b""
    with trio.fail_after(30):
        while b"listening on" not in log or not log.endswith(b"\n"):
            chunk = await stream.receive_some()
            if not chunk:
                # The child's own one-line error already starts with our prefix.
                said = log.decode(errors="replace").strip().removeprefix("duplex-supervisor: ")
                raise ValueError(f"the server did not start: {said}")
            log += chunk
    line = next(ln for ln in log.decode().splitlines() if "listening on" in ln)
    return line.rsplit(" ", 1)[-1]


async def drain(stream: trio.abc.ReceiveStream) -> None:
    """Read ``stream`` to its end (a child's log, so its pipe never fills)."""
    while await stream.receive_some():
        pass


class _Gateway:
    """One ``serve --redis`` child process and the URL it listens on."""

    def __init__(self, process: trio.Process, url: str) -> None:
        self.process = process
        self.url = url


def serve_command(args: argparse.Namespace, server: str, redis_url: str | None) -> list[str]:
    """The demo's ``serve`` child: its engine flags, caps that fit the crowd
    (every client comes from 127.0.0.1), and ``--redis`` if given."""
    crowd = str(max(256, 2 * args.clients))
    command = [sys.executable, "-m", "supervisor", "serve", "--port", "0", "--server", server]
    command += [] if redis_url is None else ["--redis", redis_url]
    command += ["--max-connections-per-address", crowd, "--max-sessions-per-address", crowd]
    command += ["--event-rate", str(args.event_rate), "--delta-chars", str(args.delta_chars)]
    command += ["--max-inputs-per-session", str(args.max_inputs_per_session)]
    command += ["--log-level", "info", "--stats-interval", "3600"]
    return command


@contextlib.asynccontextmanager
async def _gateways(command: list[str], count: int) -> AsyncIterator[list[_Gateway]]:
    """``count`` gateway processes, each listening; SIGTERM (then SIGKILL) at the end."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    gateways: list[_Gateway] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=env)
                assert process.stderr is not None  # noqa: S101 - asked for above
                gateway = _Gateway(process, "")
                gateways.append(gateway)
                gateway.url = await listening_url(process.stderr)
                nursery.start_soon(drain, process.stderr)
            try:
                yield gateways
            finally:
                for gateway in gateways:
                    if gateway.process.returncode is None:
                        gateway.process.send_signal(signal.SIGTERM)
                with trio.move_on_after(30) as waiting:
                    waiting.shield = True  # bounded, yet not cut short by the run's end
                    for gateway in gateways:
                        await gateway.process.wait()
    finally:
        with trio.CancelScope(shield=True):
            for gateway in gateways:
                if gateway.process.returncode is None:
                    gateway.process.kill()
                await gateway.process.wait()
                if gateway.process.stderr is not None:
                    await gateway.process.stderr.aclose()


async def run_processes_demo(
    args: argparse.Namespace,
    server: str,
    redis_url: str,
    config: ChaosConfig,
    run: Callable[[Targets, ChaosConfig], Awaitable[ChaosReport]],
) -> ChaosReport:
    """Serve ``args.processes`` gateways on ``redis_url``, run the crowd with
    ``run(targets, config)``, and SIGKILL one gateway halfway through."""
    async with _gateways(serve_command(args, server, redis_url), args.processes) as gateways:
        targets = Targets([gateway.url for gateway in gateways])
        victim = -1

        async def kill_one() -> None:
            nonlocal victim
            await trio.sleep(config.duration_s / 2)
            victim = targets.busiest()
            # Marked down first: a client whose connection breaks knows why.
            targets.mark_down(victim)
            gateways[victim].process.kill()  # SIGKILL: no goodbye, no flush

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_one)
            report = await run(targets, config)
            nursery.cancel_scope.cancel()
        if victim < 0:
            raise ValueError("the run ended before a process was killed: raise --duration")
        return report
