"""The Redis Cluster client behind a ``redis+cluster://`` URL (`RedisStore`),
and the store's pipelined scripts on one Redis or a cluster (`send_scripts`).

``redis+cluster://[user:password@]host:port[,host:port...]`` (or
``rediss+cluster://`` for TLS) names some nodes of one cluster; redis-py's
`redis.cluster.RedisCluster` asks them for the slot map and then talks to
every primary itself. The store's keys carry one hash tag per session
(``<prefix>{<id>}:f``), so each script touches one slot; a pipeline of
many sessions' scripts is split by redis-py per node (one round trip each,
written to all nodes before any reply is read).

What redis-py does when the cluster moves (read in its ``cluster.py``): a
MOVED or ASK answer to a pipelined command sends that command again alone,
to the node named (after a MOVED, every ``reinitialize_steps``-th one
reloads the whole slot map); a node that refuses connections reloads the
slot map and the pipeline is sent again, up to the client's retry count; a
``CLUSTERDOWN`` answer (a failover under way) is retried with backoff too.
What is still failing after that is raised (a whole call) or answered per
command (a pipeline): the store answers `StoreUnavailableError` for it, as
for a single Redis that cannot be reached.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import redis
import redis.exceptions
from redis.cluster import ClusterNode, RedisCluster

_hiredis: Any
try:
    import hiredis as _hiredis
except ModuleNotFoundError:  # redis-py without its [hiredis] extra
    _hiredis = None

__all__ = [
    "UNREACHABLE",
    "Pool",
    "RedisCluster",
    "cluster_client",
    "is_cluster_url",
    "nothing_sent",
    "refused_for_replicas",
    "run_script",
    "send_scripts",
    "where",
]

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: What a Redis (or a cluster) that cannot serve a call raises: a node down or
#: timing out, a failover under way (CLUSTERDOWN, TRYAGAIN), a slot no node
#: covers, redirections that never settled.
UNREACHABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
    redis.exceptions.RedisClusterException,
)


class Pool(redis.BlockingConnectionPool):
    """redis-py's blocking pool, marking what it raises while it hands out a
    connection (none free, a connect refused, a handshake that failed): no
    command of ours was sent then, so no write can have been applied
    (`nothing_sent`). A failure after that (a reply lost to a broken
    connection, a read timeout) leaves a write's outcome unknown."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError as exc:
            setattr(exc, _NOTHING_SENT, True)
            raise


_NOTHING_SENT = "_duplex_nothing_sent"


def nothing_sent(error: BaseException) -> bool:
    """Whether ``error`` was raised before a command of ours left (see `Pool`)."""
    return bool(getattr(error, _NOTHING_SENT, False))


def refused_for_replicas(error: BaseException) -> bool:
    """A primary with fewer good replicas than its ``min-replicas-to-write``
    refusing a write (NOREPLICAS), before the write changed anything."""
    return isinstance(error, redis.exceptions.ResponseError) and str(error).startswith("NOREPLICAS")


def run_script(
    client: redis.Redis | RedisCluster, script: Any, keys: list[str], args: list[Any]
) -> Any:
    """One call of ``script`` (a registered `redis.commands.core.Script`) on
    its keys' node, by EVALSHA. A node that lacks the script (a restart, a
    replica just promoted: Redis does not replicate its script cache) runs it
    by EVAL, routed by the same keys, which also leaves it in that node's
    cache. Not loaded on "every primary" first: redis-py's `Script` does that
    and fails whole while one is down, and during a failover the client's map
    of primaries can miss the promoted one, which then answers NOSCRIPT again."""
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:  # nothing ran
        return client.eval(script.script, len(keys), *keys, *args)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in _SCHEMES


def _nodes(url: str) -> tuple[str, str, list[tuple[str, int]]]:
    """``(plain scheme, userinfo, [(host, port), ...])`` of a cluster URL."""
    scheme, _, rest = url.partition("://")
    plain = _SCHEMES[scheme.lower()]
    rest, _, query = rest.partition("?")
    if query:
        raise ValueError("a redis+cluster:// URL takes no query options")
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, database = hosts.partition("/")
    if database not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"a redis+cluster:// node is host:port, not {part.strip()!r}")
        nodes.append((host.strip("[]"), int(port)))
    return plain, userinfo, nodes


def where(url: str) -> str:
    """The nodes of a cluster URL, for messages: never its password."""
    _, _, nodes = _nodes(url)
    return "cluster " + ",".join(f"{host}:{port}" for host, port in nodes)


def cluster_client(url: str, *, max_connections: int, timeout_s: float) -> RedisCluster:
    """A `RedisCluster` on the nodes of ``url``: per node at most
    ``max_connections`` connections, a caller past them waiting up to
    ``timeout_s`` (a blocking pool, as the single-node store has).

    It connects now (redis-py loads the slot map in its constructor): an
    unreachable cluster raises one of `UNREACHABLE` here.
    """
    plain, userinfo, nodes = _nodes(url)
    (first_host, first_port), others = nodes[0], nodes[1:]
    credentials = f"{userinfo}@" if userinfo else ""
    host = f"[{first_host}]" if ":" in first_host else first_host
    # Through url= (not startup_nodes alone) so redis-py builds each node's
    # pool from connection_pool_class with these options.
    return RedisCluster(
        url=f"{plain}://{credentials}{host}:{first_port}/0",
        startup_nodes=[ClusterNode(unquote(h), p) for h, p in others],  # type: ignore[no-untyped-call]
        connection_pool_class=Pool,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


def send_scripts(
    client: redis.Redis | RedisCluster,
    script: tuple[str, str],
    calls: list[tuple[list[str], list[Any]]],
    *,
    wait_replicas: int,
    wait_ms: int,
) -> tuple[list[Any], list[bool]]:
    """Run ``script``, ``("EVALSHA", sha)`` or ``("EVAL", text)``, once per
    ``(keys, args)`` in one pipeline: each
    reply (or the error answered for that call alone), and for each whether
    ``wait_replicas`` replicas acknowledged it (always, when 0).

    On a cluster, a node that cannot be connected to makes redis-py's
    pipeline raise for every node's calls, before it wrote anything (it takes
    a connection to each node first): then each node's calls are sent again
    alone, so only the calls of the node that is down fail (the sessions on
    the other primaries do not notice its failover).
    """
    wait = (wait_replicas, wait_ms)
    try:
        return _send_once(client, script, calls, wait)
    except UNREACHABLE:
        if not isinstance(client, RedisCluster):
            raise
        by_node: dict[str, list[int]] = {}
        for i, (keys, _) in enumerate(calls):
            node = client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
            by_node.setdefault(node.name, []).append(i)
        if len(by_node) < 2:
            raise
    replies: list[Any] = [None] * len(calls)
    acknowledged = [False] * len(calls)
    for indexes in by_node.values():
        try:
            node_replies, node_acked = _send_once(client, script, [calls[i] for i in indexes], wait)
        except UNREACHABLE as exc:
            node_replies, node_acked = [exc] * len(indexes), [False] * len(indexes)
        for i, reply, acked in zip(indexes, node_replies, node_acked, strict=True):
            replies[i], acknowledged[i] = reply, acked
    return replies, acknowledged


def _send_plain(
    client: redis.Redis, script: tuple[str, str], calls: list[Any], wait: tuple[int, int]
) -> tuple[list[Any], list[bool]]:
    """`_send_once` on one Redis: the commands packed and written at once on
    one connection of the pool, then each reply read (an error reply is that
    command's answer alone). Not redis-py's `Pipeline`: its per-command
    objects, callbacks, retry wrapper and argument checks (a generator per
    command) cost more than the round trip's own work at the hundreds of
    batches a second a committer sends, and
    it would send a batch again after a broken connection, where a write's
    outcome must be unknown instead (the caller fences it)."""
    wait_replicas, wait_ms = wait
    commands: list[tuple[Any, ...]] = [(*script, len(keys), *keys, *args) for keys, args in calls]
    if wait_replicas:
        commands.append(("WAIT", wait_replicas, wait_ms))
    pool = client.connection_pool
    connection: Any = pool.get_connection()
    try:
        # hiredis packs str, bytes and int as they are: every argument here is one.
        if _hiredis is not None:
            packed = [b"".join([_hiredis.pack_command(command) for command in commands])]
        else:
            packed = connection.pack_commands(commands)
        connection.send_packed_command(packed, check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    if not wait_replicas:
        return replies, [True] * len(calls)
    waited = replies.pop()
    acked = not isinstance(waited, Exception) and int(waited) >= wait_replicas
    return replies, [acked] * len(calls)


def _send_once(
    client: redis.Redis | RedisCluster,
    script: tuple[str, str],
    calls: list[Any],
    wait: tuple[int, int],
) -> tuple[list[Any], list[bool]]:
    """`send_scripts` in one pipeline; ``wait`` is ``(wait_replicas, wait_ms)``.

    With ``wait_replicas``, a ``WAIT`` per node follows that node's scripts
    in the same pipeline: a node's commands go on one connection, in order
    (redis-py's cluster pipeline; `_send_plain` on one Redis), and WAIT
    counts the writes of its own connection.
    """
    if not isinstance(client, RedisCluster):
        return _send_plain(client, script, calls, wait)
    wait_replicas, wait_ms = wait
    cluster = client
    nodes: list[Any] = []  # per call, its node
    with cluster.pipeline(transaction=False) as pipe:  # type: ignore[no-untyped-call]
        for keys, args in calls:
            # Routed by our slot map: redis-py's cluster pipeline blocks its
            # evalsha and would ask the server for each command's keys
            # (COMMAND GETKEYS, a round trip per command).
            node = cluster.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
            nodes.append(node)
            pipe.execute_command(*script, len(keys), *keys, *args, target_nodes=node)
        waits = list({id(node): node for node in nodes}.values()) if wait_replicas else []
        for node in waits:
            pipe.execute_command("WAIT", wait_replicas, wait_ms, target_nodes=node)
        replies = list(pipe.execute(raise_on_error=False))
    acked = {
        id(node): not isinstance(reply, Exception) and int(reply) >= wait_replicas
        for node, reply in zip(waits, replies[len(calls) :], strict=True)
    }
    return replies[: len(calls)], [acked.get(id(node), True) for node in nodes]
