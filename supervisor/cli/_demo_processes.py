"""``demo --processes N --redis URL``: N gateway processes on one Redis, one killed.

Each process is ``serve --port 0 --redis URL`` in a child process. The chaos
clients connect and resume on a live process picked at random, so resumes
land on other processes and take sessions over; halfway through, one process
holding the most clients is killed with SIGKILL, and its clients resume
elsewhere. ``--redis local`` starts a redis-server of the demo's own on a free
loopback port (no persistence: it lives for the run) and stops it at the end.
With ``--store-outage AT:SECONDS`` that redis-server keeps an append-only file
(``appendfsync always``), is SIGKILLed ``AT`` seconds into the run and started
again from that file ``SECONDS`` later (see `StoreOutage`).
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
from dataclasses import dataclass

import trio

from supervisor.cli._chaos import ChaosConfig, ChaosReport, Targets
from supervisor.cli._flags import SECRET_ENV

__all__ = [
    "LOCAL_REDIS",
    "LocalRedis",
    "ProcessesFigures",
    "StoreOutage",
    "drain",
    "gateway_processes",
    "listening_url",
    "local_redis",
    "local_redis_server",
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


class LocalRedis:
    """A redis-server of the demo's own: 127.0.0.1, a free port, a temporary
    directory; `kill` it and `start` it again on the same port and directory
    (with an append-only file, it comes back with what it had)."""

    def __init__(self, binary: str, directory: str, appendfsync: str | None) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", directory]
        argv += ["--save", "", "--daemonize", "no"]
        if appendfsync is None:
            argv += ["--appendonly", "no"]
        else:
            argv += ["--appendonly", "yes", "--appendfsync", appendfsync]
        self._argv = [*argv, "--loglevel", "warning"]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it answers PING; `ValueError` if it does not."""
        process = self._process = subprocess.Popen(  # noqa: S603 - our own argv
            self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while not _answers_ping(self.port):
            if process.poll() is not None:
                raise ValueError(f"redis-server exited {process.returncode} at start")
            if time.monotonic() > deadline:
                raise ValueError("redis-server did not answer PING within 20 s")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no goodbye; what comes back is what its append-only file holds."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)


@contextlib.contextmanager
def local_redis_server(appendfsync: str | None = None) -> Iterator[LocalRedis]:
    """A started `LocalRedis` for the block, stopped at its end.

    No persistence, unless ``appendfsync`` (``always``, ``everysec``, ``no``)
    turns its append-only file on. `ValueError` naming the fix when
    ``redis-server`` is not on PATH.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise ValueError(NO_REDIS_SERVER)
    with tempfile.TemporaryDirectory(prefix="duplex-demo-redis-") as directory:
        server = LocalRedis(binary, directory, appendfsync)
        try:
            server.start()
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def local_redis(appendfsync: str | None = None) -> Iterator[str]:
    """`local_redis_server`'s URL."""
    with local_redis_server(appendfsync) as server:
        yield server.url


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


async def reap(process: trio.Process) -> None:
    """Kill ``process`` if it still runs, wait for it and close its stderr,
    shielded: a cancelled caller leaves no child and no open pipe behind."""
    if process.returncode is None:
        process.kill()
    with trio.CancelScope(shield=True):
        await process.wait()
        if process.stderr is not None:
            await process.stderr.aclose()


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
    (every client comes from 127.0.0.1), and ``--redis`` (and
    ``--redis-durability``) if given."""
    crowd = str(max(256, 2 * args.clients))
    command = [sys.executable, "-m", "supervisor", "serve", "--port", "0", "--server", server]
    command += [] if redis_url is None else ["--redis", redis_url]
    command += ["--max-connections-per-address", crowd, "--max-sessions-per-address", crowd]
    command += ["--event-rate", str(args.event_rate), "--delta-chars", str(args.delta_chars)]
    command += ["--max-inputs-per-session", str(args.max_inputs_per_session)]
    command += ["--log-level", "info", "--stats-interval", "3600"]
    durability = getattr(args, "redis_durability", 0)
    command += [] if not durability else ["--redis-durability", f"replicas={durability}"]
    return command


@contextlib.asynccontextmanager
async def gateway_processes(command: list[str], count: int) -> AsyncIterator[list[_Gateway]]:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOutage:
    """``demo --store-outage AT:SECONDS``: the demo's own redis-server is
    SIGKILLed ``at_s`` into the run and started again from its append-only
    file (``appendfsync always``) ``seconds`` later, on the same port."""

    at_s: float
    seconds: float


@dataclass(slots=True)
class ProcessesFigures:
    """What the demo did to the processes and the store, beside the clients' report."""

    #: A process was SIGKILLed (not if the run ended first).
    process_killed: bool = False
    #: ``--store-outage`` was given.
    outage_asked: bool = False
    #: Seconds from the store's SIGKILL to its answering PING again (``None``:
    #: no outage asked for, or the run ended before the store was back).
    store_outage_s: float | None = None

    @property
    def ok(self) -> bool:
        """The run did what it was to: a process killed, the outage over."""
        return self.process_killed and (not self.outage_asked or self.store_outage_s is not None)


async def run_processes_demo(
    args: argparse.Namespace,
    server: str,
    redis_url: str,
    config: ChaosConfig,
    run: Callable[[Targets, ChaosConfig], Awaitable[ChaosReport]],
    *,
    outage: StoreOutage | None = None,
    redis: LocalRedis | None = None,
) -> tuple[ChaosReport, ProcessesFigures]:
    """Serve ``args.processes`` gateways on ``redis_url``, run the crowd with
    ``run(targets, config)``, and SIGKILL one gateway halfway through; with
    ``outage``, also kill ``redis`` (the one at ``redis_url``) and start it again."""
    figures = ProcessesFigures(outage_asked=outage is not None)
    async with gateway_processes(
        serve_command(args, server, redis_url), args.processes
    ) as gateways:
        targets = Targets([gateway.url for gateway in gateways])

        async def kill_one() -> None:
            await trio.sleep(config.duration_s / 2)
            victim = targets.busiest()
            # Marked down first: a client whose connection breaks knows why.
            targets.mark_down(victim)
            gateways[victim].process.kill()  # SIGKILL: no goodbye, no flush
            figures.process_killed = True

        async def break_store(outage: StoreOutage, redis: LocalRedis) -> None:
            await trio.sleep(outage.at_s)
            began = trio.current_time()
            redis.kill()
            await trio.sleep(outage.seconds)
            await trio.to_thread.run_sync(redis.start)
            figures.store_outage_s = trio.current_time() - began

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_one)
            if outage is not None:
                if redis is None:
                    raise ValueError("a store outage needs the demo's own redis-server")
                nursery.start_soon(break_store, outage, redis)
            report = await run(targets, config)
            nursery.cancel_scope.cancel()
        return report, figures
