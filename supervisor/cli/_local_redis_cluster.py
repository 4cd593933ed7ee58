"""A private Redis Cluster on loopback: 3 primaries and 3 replicas, each a
``redis-server --cluster-enabled yes`` in its own directory (``appendonly
yes``), joined by ``redis-cli --cluster create --cluster-replicas 1``.

``demo --redis cluster-local`` runs on one (`local_redis_cluster`), and so do
the cluster tests (tests/redis_cluster_support.py). Its nodes can be killed,
paused and started again, and it answers which node serves a slot now, so a
caller can watch a replica being promoted.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "CLUSTER_LOCAL",
    "NODE_TIMEOUT_MS",
    "LocalRedisCluster",
    "local_redis_cluster",
    "slot_of_session",
]

#: ``--redis cluster-local``: the demo starts (and stops) a cluster of its own.
CLUSTER_LOCAL = "cluster-local"

#: Small, so that a killed primary's replica is promoted within seconds.
NODE_TIMEOUT_MS = 1000

NO_CLUSTER_BINARIES = (
    "--redis cluster-local needs redis-server and redis-cli on PATH "
    "(Debian: apt-get install redis-server)"
)


def slot_of_session(session_id: str) -> int:
    """The cluster slot of a session's keys (they all carry the hash tag ``{id}``)."""
    from redis.crc import key_slot  # noqa: PLC0415 - only a cluster needs redis-py

    return int(key_slot(f"{{{session_id}}}".encode()))


def _free_cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (itself + 10000) is free and valid too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port + 10000 > 65535 or port in taken or port + 10000 in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def _node_port(address: str) -> int:
    """``127.0.0.1:7000@17000`` -> 7000."""
    return int(address.rpartition(":")[2].partition("@")[0])


class LocalRedisCluster:
    """Six redis-servers joined into one cluster (3 primaries, 3 replicas).

    ``min_replicas_to_write`` (``min-replicas-to-write``): a primary with fewer
    linked replicas refuses writes (NOREPLICAS), for ``--redis-durability``.
    """

    def __init__(
        self,
        server: str,
        cli: str,
        directory: Path,
        *,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        min_replicas_to_write: int = 0,
    ) -> None:
        self.server = server
        self.cli = cli
        self.directory = directory
        self.node_timeout_ms = node_timeout_ms
        self.min_replicas_to_write = min_replicas_to_write
        self.ports: list[int] = []
        for _ in range(6):
            self.ports.append(_free_cluster_port(self.ports))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:3])

    def command(self, port: int, *words: str) -> str:
        """One command through redis-cli: its text answer ("" if the node does not answer)."""
        done = subprocess.run(  # noqa: S603 - our own argv
            [self.cli, "-h", "127.0.0.1", "-p", str(port), *words],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return done.stdout.decode()

    def start(self) -> None:
        """Start the six nodes, join them, and wait until the cluster is whole."""
        for port in self.ports:
            (self.directory / str(port)).mkdir()
            self._start_node(port)
        for port in self.ports:
            self.wait(functools.partial(self._answers_ping, port), "PING")
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
        self.wait(self.settled, "cluster_state:ok and every replica linked to its primary")

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
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--appendonly", "yes",
                "--repl-diskless-sync-delay", "0",
                # Sessions on the other primaries' slots serve on while one
                # primary's slots fail over (with "yes" every node answers
                # CLUSTERDOWN until the replica is promoted).
                "--cluster-require-full-coverage", "no",
                "--min-replicas-to-write", str(self.min_replicas_to_write),
                "--save", "",
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _answers_ping(self, port: int) -> bool:
        return self.command(port, "PING").startswith("PONG")

    def restart(self, port: int) -> None:
        """Start a killed node again from its directory: it rejoins the cluster
        (as a replica, if its replica was promoted meanwhile)."""
        self.start_node(port)
        self.wait(self.settled, "cluster_state:ok and every replica linked to its primary")

    def start_node(self, port: int) -> None:
        """`restart` without the wait: the caller watches `settled` itself."""
        self._start_node(port)

    def alive(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def settled(self) -> bool:
        """Every live node says ``cluster_state:ok`` and each live replica is linked."""
        alive = self.alive()
        for port in alive:
            if "cluster_state:ok" not in self.command(port, "CLUSTER", "INFO"):
                return False
        linked = sum(
            "master_link_status:up" in self.command(port, "INFO", "replication") for port in alive
        )
        return linked >= len(alive) - 3

    def wait(self, condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        """Poll ``condition`` until true; `ValueError` naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.1)
        raise ValueError(f"the local Redis Cluster did not reach {what} in {timeout_s:g} s")

    def _nodes(self) -> list[list[str]]:
        """CLUSTER NODES as asked of a live node, one list of fields per node."""
        return [
            line.split() for line in self.command(self.alive()[0], "CLUSTER", "NODES").splitlines()
        ]

    def primaries(self) -> dict[int, list[tuple[int, int]]]:
        """The live primaries (not flagged ``fail``) by port, with their slot ranges."""
        served: dict[int, list[tuple[int, int]]] = {}
        for fields in self._nodes():
            if len(fields) < 8 or "master" not in fields[2] or "fail" in fields[2]:
                continue
            ranges = served.setdefault(_node_port(fields[1]), [])
            for text in fields[8:]:
                low, _, high = text.partition("-")
                if low.isdigit():
                    ranges.append((int(low), int(high or low)))
        return served

    def primary_of_slot(self, slot: int) -> int:
        """The port of the primary serving ``slot`` now (`LookupError`: none does)."""
        for port, ranges in self.primaries().items():
            if any(low <= slot <= high for low, high in ranges):
                return port
        raise LookupError(f"no primary serves slot {slot}")

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot now."""
        slot = int(self.command(self.alive()[0], "CLUSTER", "KEYSLOT", key))
        return self.primary_of_slot(slot)

    def failed_over(self, key: str, old_primary: int) -> bool:
        """Another node serves ``key``'s slot, and the cluster is whole again."""
        try:
            return self.primary_of(key) != old_primary and self.settled()
        except (OSError, subprocess.SubprocessError, LookupError, ValueError):
            return False

    def replicas_of(self, primary_port: int) -> list[int]:
        """The ports of the replicas following the primary on ``primary_port``."""
        lines = self._nodes()
        port_of = {fields[0]: _node_port(fields[1]) for fields in lines}
        primary_id = next(node_id for node_id, port in port_of.items() if port == primary_port)
        return [port_of[fields[0]] for fields in lines if fields[3] == primary_id]

    def kill(self, port: int) -> None:
        """SIGKILL one node: no goodbye, no flush."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def pause(self, port: int) -> None:
        """SIGSTOP: the node's socket takes commands, nothing answers."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


@contextlib.contextmanager
def local_redis_cluster(*, min_replicas_to_write: int = 0) -> Iterator[LocalRedisCluster]:
    """A started `LocalRedisCluster` in a temporary directory for the block,
    every node stopped at its end. `ValueError` naming the fix when
    ``redis-server`` or ``redis-cli`` is not on PATH."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise ValueError(NO_CLUSTER_BINARIES)
    with tempfile.TemporaryDirectory(prefix="duplex-demo-cluster-") as directory:
        cluster = LocalRedisCluster(
            server, cli, Path(directory), min_replicas_to_write=min_replicas_to_write
        )
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
