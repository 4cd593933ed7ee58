"""Real redis-server processes for the Redis tests: each on 127.0.0.1, a free
port and its own temporary directory, stopped (or killed) by the test.

Without ``redis-server`` on PATH the tests that need one are skipped with a
message saying how to run them; with ``DUPLEX_REQUIRE_REDIS=1`` (set by
``.ci/run``) they fail instead, so CI never skips them silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

HOW_TO_RUN = (
    "redis-server not on PATH: install it (Debian: apt-get install redis-server) "
    "to run the Redis store tests; .ci/run does, and sets DUPLEX_REQUIRE_REDIS=1"
)


def redis_binary(name: str = "redis-server") -> str:
    """The path of ``name`` (redis-server; redis-cli comes in Debian's package
    too), or skip (fail under DUPLEX_REQUIRE_REDIS=1)."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("DUPLEX_REQUIRE_REDIS") == "1":
            pytest.fail(HOW_TO_RUN)
        pytest.skip(HOW_TO_RUN)
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process; ``restart`` reuses its directory (its AOF)."""

    def __init__(self, binary: str, directory: Path, *, appendfsync: str = "always") -> None:
        self.binary = binary
        self.directory = directory
        self.appendfsync = appendfsync
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - our own argv
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 20 s")

    def kill(self) -> None:
        """SIGKILL: no shutdown save; what survives is what the AOF holds."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


def running_server(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary(), directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def replicated_pair(directory: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica (``REPLICAOF``), replicating when yielded."""
    primary = RedisServer(redis_binary(), directory / "primary")
    replica = RedisServer(redis_binary(), directory / "replica")
    for server in (primary, replica):
        server.directory.mkdir()
        server.start()
    try:
        with redis.Redis(host="127.0.0.1", port=replica.port) as node:
            node.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
            deadline = time.monotonic() + 20
            while node.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not link to its primary within 20 s")
                time.sleep(0.05)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()
