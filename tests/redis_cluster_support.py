"""A real local Redis Cluster for the tests: 3 primaries and 3 replicas, each
a redis-server on 127.0.0.1 in its own temporary directory (``appendonly
yes``), joined by ``redis-cli --cluster create --cluster-replicas 1``.

Skipped without redis-server or redis-cli on PATH (both come with Debian's
redis-server package), failed instead under ``DUPLEX_REQUIRE_REDIS=1`` as
`tests.redis_support` does.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.redis_support import free_port, redis_binary

#: Small, so that a killed primary's replica is promoted within seconds.
NODE_TIMEOUT_MS = 1000


def _cli(cli: str, port: int, *words: str) -> str:
    """One command through redis-cli: its text answer ("" if the node does not answer)."""
    done = subprocess.run(  # noqa: S603 - our own argv
        [cli, "-h", "127.0.0.1", "-p", str(port), *words],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.stdout.decode()


def _cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (itself + 10000) is free and valid too."""
    while True:
        port = free_port()
        if port + 10000 > 65535 or port in taken or port + 10000 in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class LocalCluster:
    """Six redis-servers joined into one cluster (3 primaries, 3 replicas)."""

    def __init__(self, directory: Path) -> None:
        self.server = redis_binary()
        self.cli = redis_binary("redis-cli")
        self.directory = directory
        self.ports: list[int] = []
        for _ in range(6):
            self.ports.append(_cluster_port(self.ports))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:3])

    def start(self) -> None:
        for port in self.ports:
            (self.directory / str(port)).mkdir()
            self._start_node(port)
        for port in self.ports:
            self._wait(lambda port=port: _cli(self.cli, port, "PING").startswith("PONG"), "PING")
        subprocess.run(  # noqa: S603 - our own argv
            [
                self.cli,
                "--cluster", "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas", "1",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        self._wait(self._settled, "cluster_state:ok and every replica linked to its primary")

    def _start_node(self, port: int) -> None:
        node_dir = self.directory / str(port)
        self.processes[port] = subprocess.Popen(  # noqa: S603 - our own argv
            [
                self.server,
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--dir", str(node_dir),
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node_dir / "nodes.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--appendonly", "yes",
                "--repl-diskless-sync-delay", "0",
                # Sessions on the other primaries' slots serve on while one
                # primary's slots fail over (with "yes" every node answers
                # CLUSTERDOWN until the replica is promoted).
                "--cluster-require-full-coverage", "no",
                "--save", "",
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def restart(self, port: int) -> None:
        """Start a killed node again from its directory: it rejoins the cluster
        (as a replica, if its replica was promoted meanwhile)."""
        self._start_node(port)
        self._wait(self._settled, "cluster_state:ok and every replica linked to its primary")

    def failed_over(self, key: str, old_primary: int) -> bool:
        """Another node serves ``key``'s slot, and the cluster is whole again."""
        try:
            return self.primary_of(key) != old_primary and self._settled()
        except (OSError, subprocess.SubprocessError, LookupError, ValueError):
            return False

    def _settled(self) -> bool:
        alive = [port for port, process in self.processes.items() if process.poll() is None]
        for port in alive:
            if "cluster_state:ok" not in _cli(self.cli, port, "CLUSTER", "INFO"):
                return False
        linked = sum(
            "master_link_status:up" in _cli(self.cli, port, "INFO", "replication") for port in alive
        )
        return linked >= len(alive) - 3

    def _wait(self, condition: object, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if callable(condition) and condition():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the local Redis Cluster did not reach {what} in {timeout_s} s")

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot now."""
        alive = [port for port, process in self.processes.items() if process.poll() is None]
        slot = int(_cli(self.cli, alive[0], "CLUSTER", "KEYSLOT", key))
        for line in _cli(self.cli, alive[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if len(fields) < 9 or "master" not in fields[2] or "fail" in fields[2]:
                continue
            for ranges in fields[8:]:
                low, _, high = ranges.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(fields[1].split(":")[1].split("@")[0])
        raise LookupError(f"no primary serves slot {slot}")

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)

    def replicas_of(self, primary_port: int) -> list[int]:
        """The ports of the replicas following the primary on ``primary_port``."""
        alive = [port for port, process in self.processes.items() if process.poll() is None]
        lines = [line.split() for line in _cli(self.cli, alive[0], "CLUSTER", "NODES").splitlines()]
        port_of = {fields[0]: int(fields[1].split(":")[1].split("@")[0]) for fields in lines}
        primary_id = next(node_id for node_id, port in port_of.items() if port == primary_port)
        return [port_of[fields[0]] for fields in lines if fields[3] == primary_id]

    def pause(self, port: int) -> None:
        """SIGSTOP: the node's socket takes commands, nothing answers."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGCONT)
