"""``serve --workers N``: N gateway processes on one listening socket, kept running.

The parent binds the socket once and every worker inherits it (``pass_fds``),
rather than each worker binding its own with ``SO_REUSEPORT``: the port is
bound (and a busy port said) once, ``--port 0`` gives every worker the same
port, and the socket outlives any worker, so a worker that dies or restarts
refuses no connection (with ``SO_REUSEPORT`` the connections waiting in a dead
worker's own queue are reset). Each worker is a whole ``serve`` process (its
loop, registry, engine, any ``--server``): the trio server and uvicorn take the
socket object, Hypercorn takes ``fd://N``. The kernel hands each connection to
whichever worker accepts first, so a resume can land on any worker: the
workers need a store they share (``--redis``).

The parent names a worker's descriptors in its environment (`WORKER_ENV`).
A worker tells the parent it listens by writing one byte to its ready pipe,
and watches a lifeline pipe the parent holds open: when the parent is gone
(even killed), the worker drains and exits as after SIGTERM. A worker that
exits is started again (its sessions are taken over by whichever worker their
client's next resume reaches): at once, and at once again after a run of
`RestartBackoff.stable_after_s`; after shorter runs, a delay that doubles with
each quick death. A worker that exits 2
(a usage or start-up error, said in its own one line) before any worker was
ready stops the pool: starting it again would not mend it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from supervisor._extras import require
from supervisor.cli._demo_processes import LOCAL_REDIS, local_redis
from supervisor.gateway._servers import NEEDS, SERVER_ALIASES, listening_socket

__all__ = [
    "WORKER_ENV",
    "RestartBackoff",
    "WorkerFds",
    "WorkerPool",
    "WorkerStartError",
    "announce_ready",
    "inherited_listener",
    "serve_workers",
    "watch_lifeline",
    "worker_fds",
]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: Exit status of a worker that could not start (the CLI's one-line errors).
_USAGE_ERROR = 2


NO_STORE = (
    "--workers needs a store the workers share (a client may resume on any of them): "
    "--redis redis://HOST:PORT/0, or --redis local to start a private redis-server"
)
#: The exit status after a signal, as for one ``serve`` process.
_EXIT_STATUS: dict[int, int] = {signal.SIGTERM: 0, signal.SIGINT: 130}


class WorkerStartError(ValueError):
    """A worker exited 2 before the pool was ever ready: its own line says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartBackoff:
    """How long the parent waits before starting a dead worker again (pure)."""

    first_s: float = 0.25
    max_s: float = 30.0
    #: A worker that ran this long had been fine: its death restarts it at once.
    stable_after_s: float = 30.0

    def delay(self, *, previous_s: float | None, ran_s: float) -> float:
        """The wait after a worker that ran ``ran_s``; ``previous_s``: the wait
        before this run (None: it was the first run)."""
        if previous_s is None or ran_s >= self.stable_after_s:
            return 0.0
        return min(max(previous_s * 2, self.first_s), self.max_s)


@dataclass(slots=True)
class _Worker:
    index: int
    process: trio.Process | None = None
    pid: int = 0
    starts: int = 0


@dataclass(slots=True)
class WorkerPool:
    """``count`` workers running ``command`` (a ``serve`` command line) on ``listener``.

    ``metrics_port``: with a port (not 0), worker ``k`` serves its metrics on
    ``metrics_port + k``; with 0 each takes any free port; None: none.
    """

    command: Sequence[str]
    count: int
    listener: socket.socket
    metrics_port: int | None = None
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    #: How long a worker may take to drain after the stop signal, then SIGKILL.
    drain_timeout_s: float = 30.0
    env: dict[str, str] | None = None
    #: The signal the workers get when the pool stops (``serve`` passes on its own).
    stop_signal: int = signal.SIGTERM
    workers: list[_Worker] = field(init=False)
    restarts: int = field(init=False, default=0)
    _ever_ready: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.workers = [_Worker(index) for index in range(self.count)]

    def _argv(self, worker: _Worker) -> list[str]:
        argv = list(self.command)
        if self.metrics_port is not None:
            port = self.metrics_port + worker.index if self.metrics_port else 0
            argv += ["--metrics-port", str(port)]
        return argv

    async def run(
        self, *, task_status: trio.TaskStatus[WorkerPool] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the workers until cancelled; started once every worker listens.
        Cancelled, it sends each worker `stop_signal` and waits for them to drain."""
        lifeline_read, lifeline_write = os.pipe()
        all_ready = trio.Event()
        waiting = set(range(self.count))

        def ready(worker: _Worker) -> None:
            waiting.discard(worker.index)
            if not waiting:
                all_ready.set()

        try:
            async with trio.open_nursery() as nursery:
                for worker in self.workers:
                    nursery.start_soon(self._keep, worker, lifeline_read, ready)
                await all_ready.wait()
                self._ever_ready = True
                task_status.started(self)
        finally:
            os.close(lifeline_read)
            os.close(lifeline_write)

    async def _keep(
        self, worker: _Worker, lifeline_fd: int, ready: Callable[[_Worker], None]
    ) -> None:
        """Start ``worker``, and again whenever it exits, until cancelled."""
        delay_s: float | None = None
        try:
            while True:
                began = trio.current_time()
                if await self._spawn(worker, lifeline_fd):
                    logger.info("worker %d (pid %d) listening", worker.index, worker.pid)
                    ready(worker)
                assert worker.process is not None  # noqa: S101 - set by _spawn
                status = await worker.process.wait()
                if status == _USAGE_ERROR and not self._ever_ready:
                    raise WorkerStartError(
                        f"worker {worker.index} could not start (exit status 2: its error is above)"
                    )
                ran_s = trio.current_time() - began
                delay_s = self.backoff.delay(previous_s=delay_s, ran_s=ran_s)
                logger.warning(
                    "worker %d (pid %d) exited %s; starting it again in %.2f s",
                    worker.index,
                    worker.pid,
                    _said(status),
                    delay_s,
                )
                await trio.sleep(delay_s)
                self.restarts += 1
        finally:
            with trio.CancelScope(shield=True):
                await self._stop(worker)

    async def _spawn(self, worker: _Worker, lifeline_fd: int) -> bool:
        """Start ``worker``'s process; True once it listens, False if it died first."""
        ready_read, ready_write = os.pipe()
        try:
            fds = WorkerFds(listen=self.listener.fileno(), ready=ready_write, lifeline=lifeline_fd)
            env = dict(os.environ if self.env is None else self.env)
            env[WORKER_ENV] = fds.said()
            worker.process = await trio.lowlevel.open_process(
                self._argv(worker),
                pass_fds=(fds.listen, fds.ready, fds.lifeline),
                env=env,
                # Its own session: a terminal's Ctrl-C reaches the parent alone,
                # which passes one signal on (a second would cut uvicorn's drain).
                start_new_session=True,
            )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        worker.pid = worker.process.pid
        worker.starts += 1
        ready = trio.lowlevel.FdStream(ready_read)
        try:
            return await ready.receive_some(1) != b""  # EOF: it exited first
        finally:
            await ready.aclose()

    async def _stop(self, worker: _Worker) -> None:
        process = worker.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(self.stop_signal)
        with trio.move_on_after(self.drain_timeout_s):
            await process.wait()
            return
        logger.warning("worker %d (pid %d) did not drain in time: killed", worker.index, worker.pid)
        process.kill()
        await process.wait()


def _said(status: int) -> str:
    if status < 0:
        return f"on {signal.Signals(-status).name}"
    return f"with status {status}"


#: How the parent tells a worker its descriptors: ``LISTEN,READY,LIFELINE``.
WORKER_ENV = "DUPLEX_SUPERVISOR_WORKER_FDS"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFds:
    """A worker's inherited descriptors: the shared listening socket, the pipe
    it says "ready" on, and the lifeline whose end tells it the parent is gone."""

    listen: int
    ready: int
    lifeline: int

    def said(self) -> str:
        return f"{self.listen},{self.ready},{self.lifeline}"


def worker_fds() -> WorkerFds | None:
    """In a worker (the parent set `WORKER_ENV`): its descriptors, taken out of
    the environment so the worker's own children do not think they are workers."""
    said = os.environ.pop(WORKER_ENV, None)
    if said is None:
        return None
    listen, ready, lifeline = (int(fd) for fd in said.split(","))
    return WorkerFds(listen=listen, ready=ready, lifeline=lifeline)


def inherited_listener(fd: int) -> socket.socket:
    """In a worker: the listening socket it inherited (family and type read from it)."""
    return socket.socket(fileno=fd)


def watch_lifeline(fd: int) -> None:
    """In a worker: when the parent is gone (the pipe's write end closed), send
    ourselves SIGTERM, so the worker drains as if the parent had asked."""

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            return
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="duplex-lifeline", daemon=True).start()


def announce_ready(fd: int) -> None:
    """In a worker: tell the parent it listens (once)."""
    try:
        os.write(fd, b"r")
    except OSError:  # the parent is gone; the lifeline says so too
        pass
    finally:
        os.close(fd)


def serve_workers(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``serve --workers N``: bind, start the workers, keep them, drain on a signal.

    Each worker runs this process's own command line (``argv``) with the
    socket, its pipes, the store's URL and its metrics port appended (the last
    of a flag given twice wins)."""
    if args.redis is None:
        raise ValueError(NO_STORE)
    require("redis", "--redis")
    server = SERVER_ALIASES.get(args.server, args.server)
    if server in NEEDS:
        require(NEEDS[server], f"--server {server}")
    if args.metrics_port and args.metrics_port + args.workers - 1 > 65_535:
        raise ValueError(
            f"--metrics-port {args.metrics_port}: worker k serves on it + k, past 65535"
        )
    try:
        listener = listening_socket(args.host, args.port)
        listener.listen(4096)  # the kernel caps it at net.core.somaxconn
    except OSError as exc:
        raise OSError(f"{args.host}:{args.port}: {exc.strerror or exc}") from None
    with contextlib.ExitStack() as stack:
        stack.enter_context(listener)
        url = args.redis
        if url == LOCAL_REDIS:
            url = stack.enter_context(local_redis())
        pool = WorkerPool(
            command=[sys.executable, "-m", "supervisor", *argv, "--redis", url],
            count=args.workers,
            listener=listener,
            metrics_port=args.metrics_port,
            drain_timeout_s=args.close_timeout + 10,
        )
        scheme = "wss" if args.tls_cert else "ws"
        port = listener.getsockname()[1]
        return trio.run(_run_parent, pool, f"{scheme}://{args.host}:{port}{args.path}")
    raise AssertionError("unreachable")  # pragma: no cover - the block returns


async def _run_parent(pool: WorkerPool, url: str) -> int:
    received: list[int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    received.append(signum)
                    pool.stop_signal = signum
                    logger.info(
                        "%s: draining %d workers (each closes its clients 1001), then stopping",
                        signal.Signals(signum).name,
                        pool.count,
                    )
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await nursery.start(pool.run)
            logger.info("%d workers listening on %s", pool.count, url)
    return _EXIT_STATUS.get(received[0], 0) if received else 0
