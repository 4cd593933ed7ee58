"""A real local Redis Cluster for the tests: the library's own
(`supervisor.cli._local_redis_cluster.LocalRedisCluster`, as ``demo --redis
cluster-local`` runs): 3 primaries and 3 replicas, each a redis-server on
127.0.0.1 in its own directory (``appendonly yes``, ``cluster-node-timeout``
1000 ms), joined by ``redis-cli --cluster create --cluster-replicas 1``.

Skipped without redis-server or redis-cli on PATH (both come with Debian's
redis-server package), failed instead under ``DUPLEX_REQUIRE_REDIS=1`` as
`tests.redis_support` does.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.cli._local_redis_cluster import NODE_TIMEOUT_MS, LocalRedisCluster
from tests.redis_support import redis_binary

__all__ = ["NODE_TIMEOUT_MS", "LocalCluster"]


class LocalCluster(LocalRedisCluster):
    """`LocalRedisCluster` on the binaries from PATH, or the test is skipped."""

    def __init__(self, directory: Path) -> None:
        super().__init__(redis_binary(), redis_binary("redis-cli"), directory)
