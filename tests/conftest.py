"""What every test module shares: one FakeClock and one Wire (from the plugin).

The package's pytest plugin, `supervisor.testing`, is loaded from its
entry point; its ``duplex_*`` fixtures are there too. The helpers for each
door (``trio_support``, ``asyncio_support``, ``actor_support``, ``helpers``)
build on these two classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.testing import FakeClock, Wire
from tests.redis_cluster_support import LocalCluster
from tests.redis_support import RedisServer, replicated_pair, running_server


@pytest.fixture
def clock(duplex_clock: FakeClock) -> FakeClock:
    """The plugin's fake clock, at 1000.0."""
    return duplex_clock


@pytest.fixture
def wire(duplex_wire: Wire) -> Wire:
    """The plugin's recording transport, for any door."""
    return duplex_wire


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server of this test's own (see tests/redis_support.py)."""
    yield from running_server(tmp_path)


@pytest.fixture
def replicated_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A redis-server and its replica, of this test's own (tests/redis_support.py)."""
    yield from replicated_pair(tmp_path)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One local Redis Cluster (3 primaries, 3 replicas) for the whole run:
    tests on it keep apart by key prefix (see tests/redis_cluster_support.py)."""
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
